//! The gooseBit harness, and the DDI behaviour of the pinned gooseBit that
//! updraft's DDI client relies on, driven by a DDI client scripted here
//! with ureq (not updraft): registration through configData, an assigned
//! real `updraft-publish bundle` offered as deploymentBase, its download
//! whole and by Range, progress and closed feedback, the installed version
//! gooseBit records, rollouts, and the `TargetToken` checks.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use updraft_tests::ca::TestCa;
use updraft_tests::goosebit::{
    self, Assignment, DeviceAuth, DevicePatch, GooseBit, Hardware, UpdateState,
};
use updraft_tests::publisher::{Repo, image, keygen, publish_ok};
use updraft_tests::require_goosebit;
use updraft_tests::tmp::TempDir;

/// The hardware id the test releases are published for.
const BOARD: &str = "testboard";

/// A DDI client as a device would be, scripted: one controller base, an
/// optional `Authorization` header on every request.
struct Ddi {
    agent: ureq::Agent,
    base: String,
    auth: Option<String>,
}

/// One DDI answer.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {:?} (status {})",
                String::from_utf8_lossy(&self.body),
                self.status
            )
        })
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

impl Ddi {
    fn new(gb: &GooseBit, ca: &TestCa, controller_id: &str) -> Ddi {
        Ddi {
            agent: goosebit::tls_agent(&ca.cert_pem(), Duration::from_secs(30)).unwrap(),
            base: gb.controller_url(controller_id),
            auth: None,
        }
    }

    fn with_auth(mut self, header: &str) -> Ddi {
        self.auth = Some(header.to_string());
        self
    }

    fn finish(resp: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Answer {
        let mut resp = resp.expect("a DDI request gets an answer");
        let status = resp.status().as_u16();
        let headers = resp
            .headers()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("?").to_string()))
            .collect();
        let body = resp
            .body_mut()
            .with_config()
            .limit(64 * 1024 * 1024)
            .read_to_vec()
            .expect("reading a DDI body");
        Answer {
            status,
            headers,
            body,
        }
    }

    fn get_with(&self, url: &str, range: Option<&str>) -> Answer {
        let mut req = self.agent.get(url);
        if let Some(a) = &self.auth {
            req = req.header("Authorization", a);
        }
        if let Some(r) = range {
            req = req.header("Range", r);
        }
        Ddi::finish(req.call())
    }

    fn get(&self, url: &str) -> Answer {
        self.get_with(url, None)
    }

    fn send(&self, method: &str, url: &str, body: &Value) -> Answer {
        let mut req = match method {
            "PUT" => self.agent.put(url),
            _ => self.agent.post(url),
        }
        .header("Content-Type", "application/json");
        if let Some(a) = &self.auth {
            req = req.header("Authorization", a);
        }
        Ddi::finish(req.send(body.to_string().as_bytes()))
    }

    /// `GET {controller}`: the controller base.
    fn poll(&self) -> Answer {
        self.get(&self.base)
    }

    /// `PUT {controller}/configData`.
    fn config_data(&self, data: Value) -> Answer {
        self.send(
            "PUT",
            &format!("{}/configData", self.base),
            &json!({ "mode": "merge", "data": data }),
        )
    }

    /// `POST {controller}/deploymentBase/{action}/feedback`.
    fn feedback(&self, action: &str, status: Value) -> Answer {
        self.send(
            "POST",
            &format!("{}/deploymentBase/{action}/feedback", self.base),
            &json!({ "status": status }),
        )
    }
}

/// A real release bundle made by `updraft-publish bundle`.
struct Bundle {
    path: PathBuf,
    bytes: Vec<u8>,
    _dir: TempDir,
}

fn bundle(name: &str, version: &str) -> Bundle {
    let dir = TempDir::new(name);
    let key = keygen(dir.path(), "release");
    let repo = Repo::new(dir.join("repo"));
    let img = dir.join("image.img");
    image(&img, 96 * 1024, 7);
    repo.release(&[&key], version, &img, &["--compatible", BOARD]);
    let path = dir.join(format!("release-{version}.updraft"));
    publish_ok(&[
        "bundle",
        "--dir",
        &repo.dir.display().to_string(),
        "--out",
        &path.display().to_string(),
    ]);
    let bytes = std::fs::read(&path).unwrap();
    Bundle {
        path,
        bytes,
        _dir: dir,
    }
}

fn sha1_hex(data: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, data)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn start(ca: &TestCa) -> GooseBit {
    let gb = GooseBit::builder(ca)
        .poll_time("00:00:30")
        .start()
        .expect("starting gooseBit");
    eprintln!(
        "gooseBit {} on {}: tables in {:?}, answering {:?} after spawn, RSS {:?} KiB",
        goosebit::pinned_version().unwrap_or_default(),
        gb.base_url(),
        gb.migrate_time(),
        gb.startup_time(),
        gb.rss_kib()
    );
    gb
}

/// A device that registered with `sw_version` and this board's revision.
fn registered(gb: &GooseBit, ca: &TestCa, id: &str, sw_version: &str) -> Ddi {
    let ddi = Ddi::new(gb, ca, id);
    assert_eq!(ddi.poll().status, 200);
    let put = ddi.config_data(json!({ "sw_version": sw_version, "hw_revision": BOARD }));
    assert_eq!(put.status, 200, "{}", String::from_utf8_lossy(&put.body));
    ddi
}

fn device(gb: &GooseBit, id: &str) -> goosebit::DeviceInfo {
    gb.device(id)
        .unwrap()
        .unwrap_or_else(|| panic!("gooseBit does not list {id}"))
}

/// The href of link `name` in a controller base, if offered.
fn link(base: &Value, name: &str) -> Option<String> {
    base["_links"][name]["href"].as_str().map(str::to_string)
}

#[test]
fn a_device_registers_gets_its_assigned_bundle_whole_and_by_range_and_reports_success() {
    require_goosebit!();
    let b = bundle("gb-cycle", "1.0");
    let ca = TestCa::new("gooseBit test CA").unwrap();
    let gb = start(&ca);

    // gooseBit takes the real bundle: version and compatibility come from
    // its sw-description, the hash is the file's SHA-1.
    let id = gb
        .upload_software(&b.path)
        .expect("gooseBit takes the bundle");
    let software = gb.software().unwrap();
    assert_eq!(software.len(), 1);
    let s = &software[0];
    assert_eq!((s.id, s.version.as_str()), (id, "1.0"));
    assert_eq!(s.size, b.bytes.len() as u64);
    assert_eq!(s.hash, sha1_hex(&b.bytes));
    assert_eq!(s.name, "release-1.0.updraft");
    assert_eq!(
        s.compatibility,
        vec![Hardware {
            model: "default".into(),
            revision: BOARD.into()
        }]
    );

    // First poll: registration is asked for (configData), nothing offered,
    // and the device polls again in 10 s.
    let ddi = Ddi::new(&gb, &ca, "dev-1");
    let first = ddi.poll();
    assert_eq!(first.status, 200);
    let first = first.json();
    eprintln!("controller base, unregistered: {first}");
    assert_eq!(first["config"]["polling"]["sleep"], "00:00:10");
    assert_eq!(
        link(&first, "configData"),
        Some(format!("{}/configData", gb.controller_url("dev-1")))
    );
    assert_eq!(link(&first, "deploymentBase"), None);
    assert_eq!(device(&gb, "dev-1").last_state, UpdateState::Unknown);

    let put = ddi.config_data(json!({ "sw_version": "0.9", "hw_revision": BOARD }));
    assert_eq!(put.status, 200);
    eprintln!("configData answer: {}", put.json());
    assert_eq!(put.json()["success"], true);
    let d = device(&gb, "dev-1");
    assert_eq!(d.last_state, UpdateState::Registered);
    assert_eq!(d.sw_version.as_deref(), Some("0.9"));
    assert_eq!(
        d.hardware,
        Some(Hardware {
            model: "default".into(),
            revision: BOARD.into()
        })
    );
    assert_eq!(d.last_ip.as_deref(), Some("127.0.0.1"));

    // Registered, nothing assigned: the configured sleep, no links.
    let idle = ddi.poll().json();
    eprintln!("controller base, registered, no action: {idle}");
    assert_eq!(
        idle,
        json!({ "config": { "polling": { "sleep": "00:00:30" } }, "_links": {} })
    );

    // Assigned: deploymentBase/{software id}.
    gb.assign("dev-1", id).unwrap();
    assert_eq!(device(&gb, "dev-1").update_mode, "Assigned");
    let offered = ddi.poll().json();
    eprintln!("controller base with an action: {offered}");
    let deployment_url = format!("{}/deploymentBase/{id}", gb.controller_url("dev-1"));
    assert_eq!(
        link(&offered, "deploymentBase"),
        Some(deployment_url.clone())
    );
    assert_eq!(link(&offered, "configData"), None);
    assert_eq!(offered["config"]["polling"]["sleep"], "00:00:30");

    let deployment = ddi.get(&deployment_url);
    assert_eq!(deployment.status, 200);
    let deployment = deployment.json();
    eprintln!("deploymentBase: {deployment}");
    let download_url = format!("{}/download", gb.controller_url("dev-1"));
    assert_eq!(
        deployment,
        json!({
            "id": id.to_string(),
            "deployment": {
                "download": "forced",
                "update": "forced",
                "chunks": [{
                    "part": "os",
                    "version": "1.0",
                    "name": "release-1.0.updraft",
                    "artifacts": [{
                        "filename": "release-1.0.updraft",
                        "hashes": { "sha1": sha1_hex(&b.bytes) },
                        "size": b.bytes.len(),
                        "_links": { "download": { "href": download_url } }
                    }]
                }]
            }
        })
    );
    assert!(download_url.starts_with(&format!("https://127.0.0.1:{}/", gb.addr().port())));

    // The artifact, whole and by ranges.
    let whole = ddi.get(&download_url);
    assert_eq!(whole.status, 200);
    assert_eq!(whole.header("accept-ranges"), Some("bytes"));
    assert_eq!(whole.body, b.bytes, "the whole download is the bundle");
    let len = b.bytes.len();
    let part = ddi.get_with(&download_url, Some("bytes=1000-5095"));
    assert_eq!(part.status, 206);
    assert_eq!(
        part.header("content-range"),
        Some(format!("bytes 1000-5095/{len}").as_str())
    );
    assert_eq!(part.body, b.bytes[1000..5096]);
    let rest = ddi.get_with(&download_url, Some(&format!("bytes={}-", len - 700)));
    assert_eq!(rest.status, 206);
    assert_eq!(rest.body, b.bytes[len - 700..]);
    let suffix = ddi.get_with(&download_url, Some("bytes=-100"));
    assert_eq!(suffix.status, 206);
    assert_eq!(suffix.body, b.bytes[len - 100..]);
    let beyond = ddi.get_with(&download_url, Some(&format!("bytes={len}-")));
    assert_eq!(beyond.status, 416);
    assert_eq!(
        beyond.header("content-range"),
        Some(format!("bytes */{len}").as_str())
    );
    let etag = whole.header("etag").expect("an ETag").to_string();
    let if_range = {
        let mut req = ddi.agent.get(&download_url);
        req = req.header("Range", "bytes=0-9").header("If-Range", &etag);
        Ddi::finish(req.call())
    };
    assert_eq!(if_range.status, 206, "If-Range with the current ETag");
    eprintln!(
        "download headers: {:?}; range headers: {:?}",
        whole.headers, part.headers
    );

    // hawkBit's cancelAction and installedBase do not exist here.
    for path in [format!("cancelAction/{id}"), format!("installedBase/{id}")] {
        let a = ddi.get(&format!("{}/{path}", gb.controller_url("dev-1")));
        assert_eq!(a.status, 404, "{path}");
    }

    // Progress: state Running, progress reset to 0 then taken from a
    // "Downloaded N%" detail, details appended to the device's log.
    let fb = ddi.feedback(
        &id.to_string(),
        json!({
            "execution": "proceeding",
            "result": { "finished": "none", "progress": { "cnt": 1, "of": 3 } },
            "details": ["updraft: downloading release 1.0", "Downloaded 40%"]
        }),
    );
    assert_eq!(fb.status, 200);
    assert_eq!(fb.json(), json!({ "id": id.to_string() }));
    let d = device(&gb, "dev-1");
    assert_eq!(d.last_state, UpdateState::Running);
    assert_eq!(d.progress, Some(40));
    let log = gb.device_log("dev-1").unwrap();
    assert_eq!(
        log.log.as_deref(),
        Some("updraft: downloading release 1.0\nDownloaded 40%\n")
    );
    // While running the action is still offered.
    assert_eq!(
        link(&ddi.poll().json(), "deploymentBase"),
        Some(deployment_url.clone())
    );

    // Closed with success: Finished, progress 100, and the installed
    // version is the software's, before any configData says so.
    let fb = ddi.feedback(
        &id.to_string(),
        json!({
            "execution": "closed",
            "result": { "finished": "success" },
            "details": ["updraft: release 1.0 committed"]
        }),
    );
    assert_eq!(fb.status, 200);
    let d = device(&gb, "dev-1");
    assert_eq!(d.last_state, UpdateState::Finished);
    assert_eq!(d.sw_version.as_deref(), Some("1.0"));
    assert_eq!(d.progress, Some(100));
    assert_eq!(d.target_software, Some(id));
    assert_eq!(
        gb.device_log("dev-1").unwrap().log.as_deref(),
        Some("updraft: downloading release 1.0\nDownloaded 40%\nupdraft: release 1.0 committed\n")
    );
    eprintln!("device after success: {}", d.json);
    // Installed: nothing offered any more; the deploymentBase answers null.
    let after = ddi.poll().json();
    assert_eq!(
        after,
        json!({ "config": { "polling": { "sleep": "00:00:30" } }, "_links": {} })
    );
    let stale = ddi.get(&deployment_url);
    assert_eq!((stale.status, stale.json()), (200, Value::Null));

    // configData's sw_version is taken as it is.
    assert_eq!(
        ddi.config_data(json!({ "sw_version": "1.0", "hw_revision": BOARD }))
            .status,
        200
    );
    assert_eq!(device(&gb, "dev-1").sw_version.as_deref(), Some("1.0"));
    assert_eq!(device(&gb, "dev-1").last_state, UpdateState::Finished);

    // Whatever the mode, configData sets sw_version and the hardware from
    // what it holds now: without sw_version the version is forgotten, and
    // the software is offered again.
    let put = ddi.send(
        "PUT",
        &format!("{}/configData", gb.controller_url("dev-1")),
        &json!({ "mode": "merge", "data": { "hw_revision": BOARD } }),
    );
    assert_eq!(put.status, 200);
    assert_eq!(device(&gb, "dev-1").sw_version, None);
    assert_eq!(
        link(&ddi.poll().json(), "deploymentBase"),
        Some(deployment_url.clone())
    );
    // Without hw_revision the device is "default" hardware, which the
    // assigned software does not fit: refused.
    let put = ddi.config_data(json!({ "sw_version": "1.0" }));
    assert_eq!(put.status, 422, "{}", String::from_utf8_lossy(&put.body));
    assert_eq!(
        ddi.config_data(json!({ "sw_version": "1.0", "hw_revision": BOARD }))
            .status,
        200
    );
    assert_eq!(link(&ddi.poll().json(), "deploymentBase"), None);

    // Feedback is validated: result is required, progress needs "of"
    // (null is allowed), the action id must be an integer.
    let status_of = |action: &str, status: Value| ddi.feedback(action, status).status;
    let action = id.to_string();
    assert_eq!(
        status_of(&action, json!({ "execution": "proceeding" })),
        422
    );
    assert_eq!(
        status_of(
            &action,
            json!({ "execution": "proceeding", "result": { "finished": "none", "progress": { "cnt": 1 } } })
        ),
        422
    );
    assert_eq!(
        status_of(
            &action,
            json!({ "execution": "proceeding", "result": { "finished": "none", "progress": { "cnt": 1, "of": null } } })
        ),
        200
    );
    assert_eq!(
        status_of(
            "latest",
            json!({ "execution": "proceeding", "result": { "finished": "none" } })
        ),
        422
    );
    assert_eq!(device(&gb, "dev-1").last_state, UpdateState::Running);
    // Other hawkBit execution states are taken (200) and change nothing.
    assert_eq!(
        status_of(
            &action,
            json!({ "execution": "downloaded", "result": { "finished": "failure" } })
        ),
        200
    );
    assert_eq!(device(&gb, "dev-1").last_state, UpdateState::Running);
}

#[test]
fn a_failed_install_is_recorded_and_not_offered_again_until_forced() {
    require_goosebit!();
    let b = bundle("gb-fail", "2.0");
    let ca = TestCa::new("gooseBit test CA").unwrap();
    let gb = start(&ca);
    let id = gb.upload_software(&b.path).unwrap();
    let ddi = registered(&gb, &ca, "dev-f", "1.0");
    gb.assign("dev-f", id).unwrap();
    let action = id.to_string();
    assert!(link(&ddi.poll().json(), "deploymentBase").is_some());

    assert_eq!(
        ddi.feedback(
            &action,
            json!({ "execution": "proceeding", "result": { "finished": "none" } })
        )
        .status,
        200
    );
    let fb = ddi.feedback(
        &action,
        json!({
            "execution": "closed",
            "result": { "finished": "failure" },
            "details": ["updraft: health check failed, rolled back"]
        }),
    );
    assert_eq!(fb.status, 200);
    let d = device(&gb, "dev-f");
    assert_eq!(d.last_state, UpdateState::Error);
    assert_eq!(
        d.sw_version.as_deref(),
        Some("1.0"),
        "a failure keeps the version"
    );
    assert!(
        gb.device_log("dev-f")
            .unwrap()
            .log
            .unwrap()
            .contains("health check failed")
    );

    // In Error the action is no longer offered, nor its deploymentBase.
    assert_eq!(link(&ddi.poll().json(), "deploymentBase"), None);
    let db = ddi.get(&format!(
        "{}/deploymentBase/{action}",
        gb.controller_url("dev-f")
    ));
    assert_eq!((db.status, db.json()), (200, Value::Null));

    // Feedback on an action that is no longer offered is still taken (200)
    // and applied: there is no action bookkeeping.
    let late = ddi.feedback(
        &action,
        json!({ "execution": "closed", "result": { "finished": "success" } }),
    );
    assert_eq!(late.status, 200);
    let d = device(&gb, "dev-f");
    assert_eq!(d.last_state, UpdateState::Finished);
    assert_eq!(d.sw_version.as_deref(), Some("2.0"));
    // ... for any action id, even one that names no software.
    assert_eq!(
        ddi.feedback(
            "999",
            json!({ "execution": "closed", "result": { "finished": "failure" } })
        )
        .status,
        200
    );
    assert_eq!(device(&gb, "dev-f").last_state, UpdateState::Error);
    assert_eq!(device(&gb, "dev-f").sw_version.as_deref(), Some("2.0"));

    // force_update offers it again, even in Error and even installed; a
    // closed feedback clears the flag.
    gb.patch_devices(
        &["dev-f"],
        &DevicePatch {
            force_update: Some(true),
            ..DevicePatch::default()
        },
    )
    .unwrap();
    assert_eq!(
        link(&ddi.poll().json(), "deploymentBase"),
        Some(format!(
            "{}/deploymentBase/{action}",
            gb.controller_url("dev-f")
        ))
    );
    ddi.feedback(
        &action,
        json!({ "execution": "closed", "result": { "finished": "success" } }),
    );
    let d = device(&gb, "dev-f");
    assert!(!d.force_update);
    assert_eq!(d.last_state, UpdateState::Finished);
    assert_eq!(link(&ddi.poll().json(), "deploymentBase"), None);
}

#[test]
fn a_rollout_offers_its_software_to_the_devices_of_its_feed_and_counts_outcomes() {
    require_goosebit!();
    let b = bundle("gb-rollout", "3.1");
    let ca = TestCa::new("gooseBit test CA").unwrap();
    let gb = start(&ca);
    let id = gb.upload_software(&b.path).unwrap();
    let ok = registered(&gb, &ca, "dev-r1", "3.0");
    let bad = registered(&gb, &ca, "dev-r2", "3.0");
    assert_eq!(device(&gb, "dev-r1").update_mode, "Rollout");
    assert_eq!(device(&gb, "dev-r1").feed.as_deref(), Some("default"));
    assert_eq!(link(&ok.poll().json(), "deploymentBase"), None);

    let rollout = gb.create_rollout("updraft 3.1", "default", id).unwrap();
    let action = format!("{}/deploymentBase/{id}", gb.controller_url("dev-r1"));
    assert_eq!(link(&ok.poll().json(), "deploymentBase"), Some(action));
    assert!(link(&bad.poll().json(), "deploymentBase").is_some());

    // Paused: offered to nobody.
    gb.pause_rollouts(&[rollout], true).unwrap();
    assert_eq!(link(&ok.poll().json(), "deploymentBase"), None);
    gb.pause_rollouts(&[rollout], false).unwrap();
    assert!(link(&ok.poll().json(), "deploymentBase").is_some());

    let closed = |ddi: &Ddi, finished: &str| {
        let fb = ddi.feedback(
            &id.to_string(),
            json!({ "execution": "closed", "result": { "finished": finished } }),
        );
        assert_eq!(fb.status, 200);
    };
    closed(&ok, "success");
    closed(&bad, "failure");
    let r = gb.rollouts().unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].id, rollout);
    assert_eq!(r[0].feed, "default");
    assert_eq!(r[0].software, id);
    assert_eq!((r[0].success_count, r[0].failure_count), (1, 1));
    assert_eq!(device(&gb, "dev-r1").sw_version.as_deref(), Some("3.1"));
    assert_eq!(device(&gb, "dev-r2").last_state, UpdateState::Error);

    // A device on another feed is not offered it.
    let other = registered(&gb, &ca, "dev-r3", "3.0");
    gb.patch_devices(
        &["dev-r3"],
        &DevicePatch {
            feed: Some("canary".into()),
            ..DevicePatch::default()
        },
    )
    .unwrap();
    assert_eq!(link(&other.poll().json(), "deploymentBase"), None);
    // Back to rollout mode on the default feed: offered.
    gb.patch_devices(
        &["dev-r3"],
        &DevicePatch {
            software: Some(Assignment::Rollout),
            feed: Some("default".into()),
            ..DevicePatch::default()
        },
    )
    .unwrap();
    assert!(link(&other.poll().json(), "deploymentBase").is_some());
}

#[test]
fn strict_device_auth_takes_only_the_target_token_set_through_the_api() {
    require_goosebit!();
    let ca = TestCa::new("gooseBit test CA").unwrap();
    let gb = GooseBit::builder(&ca)
        .device_auth(DeviceAuth::Strict)
        .start()
        .expect("starting gooseBit");
    let url = gb.controller_url("dev-s");
    let status = |auth: Option<&str>| {
        let ddi = Ddi::new(&gb, &ca, "dev-s");
        let ddi = match auth {
            Some(a) => ddi.with_auth(a),
            None => ddi,
        };
        let a = ddi.get(&url);
        (
            a.status,
            a.json()["detail"].as_str().unwrap_or("").to_string(),
        )
    };

    // Unknown device: refused, and not registered.
    assert_eq!(
        status(Some("TargetToken s3cret")),
        (401, "Cannot register a new device in strict mode.".into())
    );
    assert!(gb.device("dev-s").unwrap().is_none());

    gb.put_devices(
        &["dev-s"],
        &DevicePatch {
            auth_token: Some("s3cret".into()),
            ..DevicePatch::default()
        },
    )
    .unwrap();
    assert_eq!(device(&gb, "dev-s").auth_token.as_deref(), Some("s3cret"));
    assert_eq!(status(Some("TargetToken s3cret")).0, 200);
    assert_eq!(
        status(Some("TargetToken wrong")),
        (401, "Device authentication token does not match.".into())
    );
    let required = (
        401,
        "Device authentication token is required in strict mode.".to_string(),
    );
    assert_eq!(status(None), required);
    // GatewayToken is not a TargetToken: gooseBit treats it as no token.
    assert_eq!(status(Some("GatewayToken s3cret")), required);
    // The scheme is matched case-sensitively.
    assert_eq!(status(Some("targettoken s3cret")), required);

    // Every DDI route is guarded, the download too.
    let anonymous = Ddi::new(&gb, &ca, "dev-s");
    assert_eq!(
        anonymous.config_data(json!({ "sw_version": "1" })).status,
        401
    );
    assert_eq!(anonymous.get(&format!("{url}/download")).status, 401);
    let authed = Ddi::new(&gb, &ca, "dev-s").with_auth("TargetToken s3cret");
    assert_eq!(authed.config_data(json!({ "sw_version": "1" })).status, 200);

    // A token is at most 32 characters.
    let long = gb
        .patch_devices(
            &["dev-s"],
            &DevicePatch {
                auth_token: Some("x".repeat(33)),
                ..DevicePatch::default()
            },
        )
        .unwrap_err();
    assert_eq!(long.status, Some(422), "{long}");
}

#[test]
fn setup_device_auth_records_the_token_of_a_polling_device() {
    require_goosebit!();
    let ca = TestCa::new("gooseBit test CA").unwrap();
    let gb = GooseBit::builder(&ca)
        .device_auth(DeviceAuth::Setup)
        .start()
        .expect("starting gooseBit");
    let ddi = Ddi::new(&gb, &ca, "dev-t").with_auth("TargetToken first-token");
    assert_eq!(ddi.poll().status, 200);
    assert_eq!(
        device(&gb, "dev-t").auth_token.as_deref(),
        Some("first-token")
    );
    // Setup mode lets anything through and records each new token.
    assert_eq!(Ddi::new(&gb, &ca, "dev-t").poll().status, 200);
    let again = Ddi::new(&gb, &ca, "dev-t").with_auth("TargetToken second");
    assert_eq!(again.poll().status, 200);
    assert_eq!(device(&gb, "dev-t").auth_token.as_deref(), Some("second"));
}

#[test]
fn goosebit_refuses_files_it_cannot_parse_and_a_version_twice() {
    require_goosebit!();
    let ca = TestCa::new("gooseBit test CA").unwrap();
    let gb = start(&ca);
    let dir = TempDir::new("gb-refuse");

    let junk = dir.join("junk.bin");
    std::fs::write(&junk, b"not an update file at all").unwrap();
    let e = gb.upload_software(&junk).unwrap_err();
    assert_eq!(
        (e.status, e.detail.as_str()),
        (Some(422), "Software image header cannot be parsed")
    );

    let b = bundle("gb-twice", "4.0");
    gb.upload_software(&b.path).unwrap();
    let e = gb.upload_software(&b.path).unwrap_err();
    assert_eq!(
        (e.status, e.detail.as_str()),
        (
            Some(409),
            "Software with same version and overlapping compatibility already exists"
        )
    );

    // updraft allows any version without whitespace; gooseBit only
    // SWUpdate's numeric or semantic versions.
    let v = bundle("gb-vversion", "v4.1");
    let e = gb.upload_software(&v.path).unwrap_err();
    assert_eq!(
        (e.status, e.detail.as_str()),
        (Some(422), "Software image header cannot be parsed")
    );
    assert_eq!(gb.software().unwrap().len(), 1);

    // A device gooseBit has not seen cannot be patched (gooseBit 0.2.12
    // means a 404 and raises the wrong exception type: 500); put_devices
    // registers it.
    let id = gb.software().unwrap()[0].id;
    let e = gb.assign("never-seen", id).unwrap_err();
    assert_eq!(e.status, Some(500), "{e}");
}

#[test]
fn software_is_offered_only_to_devices_reporting_its_compatible_as_hw_revision() {
    require_goosebit!();
    let b = bundle("gb-compat", "5.0");
    let ca = TestCa::new("gooseBit test CA").unwrap();
    let gb = start(&ca);
    let id = gb.upload_software(&b.path).unwrap();
    gb.create_rollout("updraft 5.0", "default", id).unwrap();

    // The sw-description's hardware-compatibility lists revisions of
    // gooseBit's "default" board: a device naming its compatible as
    // hw_boardname is another board.
    let as_board = Ddi::new(&gb, &ca, "dev-board");
    as_board.poll();
    let put = as_board.config_data(json!({ "sw_version": "4.0", "hw_boardname": BOARD }));
    assert_eq!(put.status, 200);
    assert_eq!(
        device(&gb, "dev-board").hardware,
        Some(Hardware {
            model: BOARD.into(),
            revision: "default".into()
        })
    );
    assert_eq!(link(&as_board.poll().json(), "deploymentBase"), None);
    let e = gb.assign("dev-board", id).unwrap_err();
    assert_eq!(
        (e.status, e.detail.as_str()),
        (
            Some(422),
            "The assigned software is not compatible with the device's hardware."
        )
    );

    let as_revision = registered(&gb, &ca, "dev-revision", "4.0");
    assert!(link(&as_revision.poll().json(), "deploymentBase").is_some());

    // The single-device read of the management API fails once the device
    // has software to offer (why GooseBit::device reads the list).
    gb.assign("dev-revision", id).unwrap();
    let agent = goosebit::tls_agent(&ca.cert_pem(), Duration::from_secs(30)).unwrap();
    let resp = agent
        .get(gb.url("/api/v1/devices/dev-revision"))
        .header("Authorization", &format!("Bearer {}", gb.admin_token()))
        .call()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 500);
    assert_eq!(device(&gb, "dev-revision").target_software, Some(id));
}

#[test]
fn the_server_stops_by_its_pid_and_keeps_nothing_running() {
    require_goosebit!();
    let ca = TestCa::new("gooseBit test CA").unwrap();
    let mut gb = start(&ca);
    let pid = gb.pid().unwrap();
    let dir: PathBuf = gb.dir().to_path_buf();
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    assert!(
        gb.log().contains("Application startup complete"),
        "{}",
        gb.log()
    );
    let status = gb.stop().unwrap().expect("it was running");
    eprintln!("gooseBit exited with {status}");
    assert!(gb.pid().is_none());
    drop(gb);
    assert!(!dir.exists(), "the directory of a passing test is removed");
}
