//! The hawkBit DDI conformance server (`tests/src/ddi_server.rs`), driven
//! over HTTPS with ureq: it answers each documented request with the
//! documented shape (the example bodies in `tests/fixtures/ddi/`), its
//! documents parse with updraft's own DDI parser, it takes a correct
//! feedback and names what is wrong in an incorrect one, and it answers as
//! hawkBit does: `410` on a closed action, `429` past the status quota,
//! `401` for missing or wrong credentials, `405` for cancel feedback on an
//! action that is not canceling, download-only actions closed by
//! `downloaded`. Its scripted faults work: `429` with `Retry-After` for the
//! next requests, a download cut once, ranges, credentials asked per
//! origin.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use updraft::ddi;
use updraft_tests::ddi_server::{
    ActionStatus, ActionType, Artifact, Auth, Channel, Chunk, DdiServer, Deployment, EntryStatus,
    Execution, Finished, Links, MaintenanceWindow, Origin, fixture, shape_differences,
};
use updraft_tests::tmp::TempDir;

const TENANT: &str = "DEFAULT";
const DEV: &str = "dev-1";
const TOKEN: &str = "tok-dev-1";
const WAIT: Duration = Duration::from_secs(10);

fn target_token() -> String {
    format!("TargetToken {TOKEN}")
}

/// An answer, with the body or why it could not be read.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    body_error: Option<String>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }
}

/// A ureq agent that trusts exactly the server's CA, with HTTP error
/// statuses returned as answers.
struct Client {
    agent: ureq::Agent,
}

impl Client {
    fn new(ca_file: &Path) -> Client {
        let pem = std::fs::read(ca_file).expect("read CA file");
        let certs: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(&pem)
            .filter_map(|item| match item.expect("PEM item") {
                ureq::tls::PemItem::Certificate(c) => Some(c),
                _ => None,
            })
            .collect();
        let tls = ureq::tls::TlsConfig::builder()
            .root_certs(ureq::tls::RootCerts::Specific(Arc::new(certs)))
            .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .build();
        let agent = ureq::Agent::config_builder()
            .tls_config(tls)
            .http_status_as_error(false)
            .timeout_global(Some(WAIT))
            .build()
            .into();
        Client { agent }
    }

    fn answer(r: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Answer {
        let mut r = r.expect("an HTTP answer");
        let headers = r
            .headers()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
            .collect();
        let status = r.status().as_u16();
        let (body, body_error) = match r.body_mut().read_to_vec() {
            Ok(b) => (b, None),
            Err(e) => (Vec::new(), Some(e.to_string())),
        };
        Answer {
            status,
            headers,
            body,
            body_error,
        }
    }

    fn get(&self, url: &str, auth: Option<&str>) -> Answer {
        self.get_with(url, auth, &[])
    }

    fn get_with(&self, url: &str, auth: Option<&str>, headers: &[(&str, &str)]) -> Answer {
        let mut req = self.agent.get(url);
        if let Some(a) = auth {
            req = req.header("Authorization", a);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        Client::answer(req.call())
    }

    fn post(&self, url: &str, auth: Option<&str>, body: &[u8]) -> Answer {
        let mut req = self
            .agent
            .post(url)
            .header("Content-Type", "application/json");
        if let Some(a) = auth {
            req = req.header("Authorization", a);
        }
        Client::answer(req.send(body))
    }

    fn put(&self, url: &str, auth: Option<&str>, body: &[u8]) -> Answer {
        let mut req = self
            .agent
            .put(url)
            .header("Content-Type", "application/json");
        if let Some(a) = auth {
            req = req.header("Authorization", a);
        }
        Client::answer(req.send(body))
    }
}

/// A server of tenant `DEFAULT` with controller `dev-1`, a client that
/// trusts it, and a directory for artifacts.
struct Setup {
    server: DdiServer,
    client: Client,
    dir: TempDir,
}

impl Setup {
    fn new() -> Setup {
        Setup::with(DdiServer::builder(TENANT))
    }

    fn with(b: updraft_tests::ddi_server::DdiServerBuilder<'_>) -> Setup {
        let server = b.start().expect("starting the DDI server");
        server.add_controller(DEV, TOKEN);
        let client = Client::new(server.ca_file());
        Setup {
            server,
            client,
            dir: TempDir::new("ddi-server"),
        }
    }

    /// A file of `len` bytes that differ at every offset that matters.
    fn file(&self, name: &str, len: usize) -> PathBuf {
        let mut x: u32 = 0x9e37_79b9 ^ len as u32;
        let data: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x >> 24) as u8
            })
            .collect();
        let path = self.dir.join(name);
        std::fs::write(&path, data).unwrap();
        path
    }

    /// `…/controller/v1/dev-1` + `rest`.
    fn url(&self, rest: &str) -> String {
        format!("{}{rest}", self.server.controller_url(DEV))
    }

    fn base(&self) -> Answer {
        self.client.get(&self.url(""), Some(&target_token()))
    }

    /// A forced action `id` with one `os` chunk holding `image.bin`.
    fn deploy_simple(&self, id: u64) -> PathBuf {
        let image = self.file(&format!("image-{id}.bin"), 4096);
        self.server.deploy(
            DEV,
            Deployment::new(id)
                .chunk(Chunk::new("os", "gateway image", "1.0").artifact(Artifact::file(&image))),
        );
        image
    }

    fn feedback(&self, id: u64, body: &Value) -> Answer {
        self.client.post(
            &self.url(&format!("/deploymentBase/{id}/feedback")),
            Some(&target_token()),
            body.to_string().as_bytes(),
        )
    }

    fn cancel_feedback(&self, id: u64, body: &Value) -> Answer {
        self.client.post(
            &self.url(&format!("/cancelAction/{id}/feedback")),
            Some(&target_token()),
            body.to_string().as_bytes(),
        )
    }
}

fn status(execution: &str, finished: &str, details: &[&str]) -> Value {
    json!({
        "timestamp": 1_700_000_000_000u64,
        "status": {
            "execution": execution,
            "result": { "finished": finished },
            "details": details,
        }
    })
}

fn assert_same_shape(documented: &Value, ours: &Value) {
    let d = shape_differences(documented, ours);
    assert!(d.is_empty(), "{}\nours: {ours:#}", d.join("\n"));
}

fn link(doc: &Value, rel: &str) -> Option<String> {
    doc["_links"][rel]["href"].as_str().map(str::to_string)
}

#[test]
fn the_controller_base_has_the_documented_shape_and_updraft_reads_it() {
    let s = Setup::new();
    s.server.deploy(
        DEV,
        Deployment::new(4)
            .chunk(Chunk::new("os", "image", "0.9"))
            .installed(),
    );
    s.deploy_simple(5);
    let a = s.base();
    assert_eq!(a.status, 200);
    assert_eq!(a.header("content-type"), Some("application/hal+json"));
    let doc = a.json();
    assert_same_shape(&fixture("controller_base"), &doc);
    assert_eq!(doc["config"]["polling"]["sleep"], "00:05:00");
    let deployment = link(&doc, "deploymentBase").unwrap();
    let prefix = format!(
        "{}/{TENANT}/controller/v1/{DEV}/deploymentBase/5?c=",
        s.server.base_url()
    );
    let hash = deployment.strip_prefix(&prefix).expect(&deployment);
    hash.parse::<i32>()
        .expect("?c= is an int as hawkBit writes it");
    assert_eq!(
        link(&doc, "installedBase").unwrap(),
        s.url("/installedBase/4")
    );
    assert_eq!(link(&doc, "configData").unwrap(), s.url("/configData"));

    // updraft's parser agrees.
    let parsed = ddi::controller_base(&a.body).unwrap();
    assert_eq!(parsed.sleep, Some(Duration::from_secs(300)));
    assert_eq!(parsed.deployment.unwrap().action_id, "5");
    assert_eq!(parsed.cancel, None);
    assert_eq!(parsed.config_data.unwrap(), s.url("/configData"));

    // application/json on request; the ETag answers 304.
    let j = s.client.get_with(
        &s.url(""),
        Some(&target_token()),
        &[("Accept", "application/json")],
    );
    assert_eq!(j.header("content-type"), Some("application/json"));
    let tag = a.header("etag").unwrap().to_string();
    assert!(tag.starts_with("\"0") && tag.len() == 35, "{tag}");
    let again = s.client.get_with(
        &s.url(""),
        Some(&target_token()),
        &[("If-None-Match", tag.as_str())],
    );
    assert_eq!(again.status, 304);
    let odd = s
        .client
        .get_with(&s.url(""), Some(&target_token()), &[("Accept", "text/xml")]);
    assert_eq!(odd.status, 406);

    // The hash follows the action's handling.
    s.server
        .set_maintenance_window(5, Some(MaintenanceWindow::Unavailable));
    let moved = link(&s.base().json(), "deploymentBase").unwrap();
    assert_ne!(moved, deployment);

    // A new target is asked for its attributes; once it sent them and
    // has nothing to do, there are no links at all.
    let idle = DdiServer::builder(TENANT)
        .sleep("00:00:30")
        .start()
        .unwrap();
    idle.add_controller("idle", "t");
    let c = Client::new(idle.ca_file());
    let url = idle.controller_url("idle");
    assert_eq!(
        c.get(&url, Some("TargetToken t")).json(),
        json!({"config": {"polling": {"sleep": "00:00:30"}},
               "_links": {"configData": {"href": format!("{url}/configData")}}})
    );
    let attrs = ddi::config_data(&[("hwRevision", "2")]).unwrap();
    assert_eq!(
        c.put(&format!("{url}/configData"), Some("TargetToken t"), &attrs)
            .status,
        200
    );
    assert_eq!(
        c.get(&url, Some("TargetToken t")).body,
        br#"{"config":{"polling":{"sleep":"00:00:30"}}}"#
    );
}

/// The deployment of the documented example: three chunks with two
/// artifacts each, metadata on the last, a maintenance window.
fn documented_deployment(s: &Setup) -> Deployment {
    let mut d = Deployment::new(8).maintenance_window(MaintenanceWindow::Available);
    for (part, name, version, len) in [
        ("jvm", "oneapp runtime", "1.0.75", 13),
        ("os", "one Firmware", "1.0.79", 13),
        ("bApp", "oneapplication", "1.0.91", 11),
    ] {
        let mut c = Chunk::new(part, name, version)
            .artifact(Artifact::named(
                "binary.tgz",
                s.file(&format!("{part}-binary.tgz"), len),
            ))
            .artifact(Artifact::named(
                "file.signature",
                s.file(&format!("{part}-file.signature"), len),
            ));
        if part == "bApp" {
            c = c.metadata(
                "aMetadataKey",
                "Metadata value as defined in software module",
            );
        }
        d = d.chunk(c);
    }
    d
}

#[test]
fn the_deployment_base_has_the_documented_shape_and_updraft_reads_it() {
    let s = Setup::new();
    s.server.deploy(DEV, documented_deployment(&s));
    for detail in ["Started download", "Download done"] {
        assert_eq!(
            s.feedback(8, &status("proceeding", "none", &[detail]))
                .status,
            200
        );
    }
    let href = link(&s.base().json(), "deploymentBase").unwrap();
    let a = s
        .client
        .get(&format!("{href}&actionHistory=10"), Some(&target_token()));
    assert_eq!(a.status, 200);
    let doc = a.json();
    assert_same_shape(&fixture("deployment_base"), &doc);
    assert_same_shape(
        &fixture("artifact"),
        &doc["deployment"]["chunks"][2]["artifacts"][1],
    );
    // The documented order of the members.
    let text = String::from_utf8(a.body.clone()).unwrap();
    let at = |k: &str| text.find(&format!("\"{k}\"")).unwrap();
    assert!(at("id") < at("deployment") && at("deployment") < at("actionHistory"));
    assert!(at("download") < at("update") && at("maintenanceWindow") < at("chunks"));
    assert_eq!(
        doc["actionHistory"],
        json!({"status": "RUNNING", "messages": ["Download done", "Started download"]})
    );
    // Without the query parameter there is no history.
    let plain = s.client.get(&href, Some(&target_token())).json();
    assert!(plain.get("actionHistory").is_none());

    // updraft's parser agrees, hashes and sizes included.
    let d = ddi::deployment(&a.body).unwrap();
    assert_eq!(d.action_id, "8");
    assert_eq!(
        (d.download, d.update),
        (ddi::Handling::Forced, ddi::Handling::Forced)
    );
    assert_eq!(
        d.maintenance_window,
        Some(ddi::MaintenanceWindow::Available)
    );
    assert_eq!(
        d.chunks.iter().map(|c| c.part.as_str()).collect::<Vec<_>>(),
        ["jvm", "os", "bApp"]
    );
    for c in &d.chunks {
        for art in &c.artifacts {
            let local = s.dir.join(format!("{}-{}", c.part, art.filename));
            let bytes = std::fs::read(&local).unwrap();
            assert_eq!(art.size, Some(bytes.len() as u64));
            assert_eq!(art.sha256, Some(updraft::hash::Sha256::of(&bytes)));
            let url = art.download.as_deref().unwrap();
            assert!(url.starts_with(&s.server.base_url()), "{url}");
            let got = s.client.get(url, Some(&target_token()));
            assert_eq!(got.status, 200);
            assert_eq!(got.body, bytes);
        }
    }
    // sha1 and md5 are the files' too.
    let jvm = &doc["deployment"]["chunks"][0]["artifacts"][0];
    let bytes = std::fs::read(s.dir.join("jvm-binary.tgz")).unwrap();
    let sha1 = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, &bytes);
    assert_eq!(jvm["hashes"]["sha1"], updraft::hash::hex(sha1.as_ref()));
    let md5sum = s.client.get(
        jvm["_links"]["md5sum"]["href"].as_str().unwrap(),
        Some(&target_token()),
    );
    assert_eq!(
        String::from_utf8(md5sum.body).unwrap(),
        format!("{}  binary.tgz", jvm["hashes"]["md5"].as_str().unwrap())
    );
    assert!(
        jvm["_links"]["download-http"]["href"]
            .as_str()
            .unwrap()
            .starts_with(&s.server.http_url())
    );
    // Downloads of the DDI API are logged in the action's history.
    let downloads = s
        .server
        .action(8)
        .history
        .iter()
        .filter(|e| e.status == EntryStatus::Download)
        .count();
    assert_eq!(downloads, 7, "six artifacts and one MD5SUM");
}

#[test]
fn the_cancel_action_has_the_documented_shape_and_the_device_accepts_it() {
    let s = Setup::new();
    s.deploy_simple(10);
    s.server.cancel(DEV, 10);
    let base = s.base().json();
    assert_eq!(base["_links"].get("deploymentBase"), None);
    // No `?c=` on a cancel link.
    assert_eq!(
        link(&base, "cancelAction").unwrap(),
        s.url("/cancelAction/10")
    );
    let parsed = ddi::controller_base(&serde_json::to_vec(&base).unwrap()).unwrap();
    assert_eq!(parsed.cancel.unwrap().action_id, "10");
    // The action being canceled is no deployment any more.
    assert_eq!(
        s.client
            .get(&s.url("/deploymentBase/10"), Some(&target_token()))
            .status,
        404
    );
    let a = s
        .client
        .get(&s.url("/cancelAction/10"), Some(&target_token()));
    assert_eq!(a.status, 200);
    assert_same_shape(&fixture("cancel"), &a.json());
    let c = ddi::cancel(&a.body).unwrap();
    assert_eq!((c.action_id.as_str(), c.stop_id.as_str()), ("10", "10"));

    // Progress on the cancel keeps it canceling; `closed` accepts it.
    assert_eq!(
        s.cancel_feedback(10, &status("proceeding", "none", &["stopping"]))
            .status,
        200
    );
    assert_eq!(s.server.action(10).status, ActionStatus::Canceling);
    assert_eq!(
        s.cancel_feedback(10, &status("closed", "success", &["canceled"]))
            .status,
        200
    );
    let action = s.server.action(10);
    assert!(!action.active);
    assert_eq!(action.status, ActionStatus::Canceled);
    let fb = s.server.feedback(10);
    assert!(fb.iter().all(|f| f.channel == Channel::Cancel));
    assert_eq!(
        fb.iter().map(|f| f.execution.unwrap()).collect::<Vec<_>>(),
        [Execution::Proceeding, Execution::Closed]
    );
    // Closed: no link, and the deployment takes no feedback.
    assert!(link(&s.base().json(), "cancelAction").is_none());
    assert_eq!(
        s.feedback(10, &status("closed", "success", &[])).status,
        410
    );
}

#[test]
fn a_rejected_cancel_puts_the_action_back_to_running() {
    let s = Setup::new();
    s.deploy_simple(11);
    s.server.cancel(DEV, 11);
    assert_eq!(
        s.cancel_feedback(11, &status("rejected", "none", &["installing already"]))
            .status,
        200
    );
    let action = s.server.action(11);
    assert!(action.active);
    assert_eq!(action.status, ActionStatus::Running);
    assert_eq!(
        action.history.last().unwrap().status,
        EntryStatus::CancelRejected
    );
    assert!(link(&s.base().json(), "deploymentBase").is_some());
    // No longer canceling: cancel feedback is not allowed.
    let again = s.cancel_feedback(11, &status("closed", "success", &[]));
    assert_eq!(again.status, 405);
    assert_eq!(
        again.json()["errorCode"],
        "hawkbit.server.error.action.notCancelable"
    );
    // The deployment goes on and finishes.
    assert_eq!(
        s.feedback(11, &status("closed", "success", &[])).status,
        200
    );
    assert!(s.server.action(11).finished());
}

#[test]
fn a_correct_feedback_is_taken_and_each_incorrect_one_is_named() {
    let s = Setup::new();
    s.deploy_simple(20);
    let url = s.url("/deploymentBase/20/feedback");
    let auth = target_token();
    let refused = [
        (json!({"timestamp": 1}), "status"),
        (
            json!({"status": {"execution": "done", "result": {"finished": "none"}}}),
            "status.execution",
        ),
        (
            json!({"status": {"execution": "Closed", "result": {"finished": "none"}}}),
            "status.execution",
        ),
        (json!({"status": {"execution": "closed"}}), "status.result"),
        (
            json!({"status": {"execution": "closed", "result": {"finished": "partly"}}}),
            "status.result.finished",
        ),
        (
            json!({"status": {"execution": "proceeding", "result": {"finished": "none", "progress": {"cnt": 4_000_000_000u64, "of": 5}}}}),
            "status.result.progress.cnt",
        ),
        (
            json!({"status": {"execution": "proceeding", "result": {"finished": "none"}, "details": [1]}}),
            "status.details[0]",
        ),
        (
            json!({"timestamp": "yesterday", "status": {"execution": "proceeding", "result": {"finished": "none"}}}),
            "timestamp",
        ),
    ];
    for (body, field) in &refused {
        let a = s
            .client
            .post(&url, Some(&auth), body.to_string().as_bytes());
        assert_eq!(a.status, 400, "{body}");
        assert_eq!(
            a.json()["exceptionClass"],
            "org.eclipse.hawkbit.rest.exception.MessageNotReadableException"
        );
        let last = s.server.feedback_log().pop().unwrap();
        assert!(!last.accepted());
        assert!(
            last.violations
                .iter()
                .any(|v| v.field == *field && v.refused),
            "{field} not named for {body}: {:?}",
            last.violations
        );
    }
    let not_json = s.client.post(&url, Some(&auth), b"{\"status\":");
    assert_eq!(not_json.status, 400);
    // Not declared JSON: 415.
    let plain = s
        .client
        .agent
        .post(&url)
        .header("Authorization", &auth)
        .send("x");
    assert_eq!(Client::answer(plain).status, 415);

    // Progress without `cnt` is documented as wrong, but hawkBit takes it.
    let lax = json!({"status": {"execution": "proceeding", "result": {"finished": "none", "progress": {"of": 5}}}});
    assert_eq!(s.feedback(20, &lax).status, 200);
    let taken = s.server.feedback(20);
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].violations.len(), 1);
    assert_eq!(taken[0].violations[0].field, "status.result.progress.cnt");
    assert!(!taken[0].violations[0].refused);

    // updraft's own feedback body conforms; its `id` is ignored.
    let f = ddi::Feedback {
        action_id: "20".into(),
        execution: ddi::Execution::Proceeding,
        finished: ddi::Finished::None,
        progress: Some((1, 3)),
        details: vec!["writing slot B".into()],
        timestamp_ms: 1_700_000_000_123,
    };
    assert_eq!(s.client.post(&url, Some(&auth), &f.to_json()).status, 200);
    let last = s.server.feedback(20).pop().unwrap();
    assert!(last.violations.is_empty(), "{:?}", last.violations);
    assert_eq!(last.ignored_fields, ["id"]);
    assert_eq!(last.details, ["writing slot B"]);
    assert_eq!(last.timestamp, Some(1_700_000_000_123));

    // The documented example closes the action.
    let documented = fixture("action_feedback");
    assert_eq!(s.feedback(20, &documented).status, 200);
    let last = s.server.feedback(20).pop().unwrap();
    assert!(last.violations.is_empty() && last.ignored_fields.is_empty());
    assert_eq!(
        (last.execution, last.finished, last.code),
        (Some(Execution::Closed), Some(Finished::Success), Some(200))
    );
    assert!(s.server.action(20).finished());
    assert_eq!(
        s.server.violations().len(),
        refused.len() + 2,
        "every refused body, the bad JSON and the lax progress"
    );
}

#[test]
fn feedback_on_a_closed_action_is_gone() {
    let s = Setup::new();
    s.deploy_simple(30);
    assert_eq!(
        s.feedback(30, &status("proceeding", "none", &[])).status,
        200
    );
    assert_eq!(
        s.feedback(30, &status("closed", "failure", &["hash mismatch"]))
            .status,
        200
    );
    let action = s.server.action(30);
    assert_eq!((action.active, action.status), (false, ActionStatus::Error));
    for late in [
        status("closed", "success", &[]),
        status("proceeding", "none", &[]),
    ] {
        let a = s.feedback(30, &late);
        assert_eq!(a.status, 410);
        assert!(a.body.is_empty());
    }
    assert_eq!(s.server.feedback(30).len(), 2);
    assert_eq!(
        s.server
            .feedback_log()
            .iter()
            .filter(|f| f.status == 410)
            .count(),
        2
    );
    // An unknown action, or another target's, is 404.
    assert_eq!(
        s.feedback(99, &status("proceeding", "none", &[])).status,
        404
    );
    assert_eq!(
        s.client
            .post(
                &s.url("/deploymentBase/x/feedback"),
                Some(&target_token()),
                status("proceeding", "none", &[]).to_string().as_bytes()
            )
            .status,
        400,
        "an action id that is not a number"
    );
}

#[test]
fn the_status_quota_refuses_progress_but_takes_the_closing_feedback() {
    let s = Setup::with(DdiServer::builder(TENANT).status_quota(5));
    s.deploy_simple(40);
    // The assignment and the retrieval are entries too.
    let href = link(&s.base().json(), "deploymentBase").unwrap();
    assert_eq!(s.client.get(&href, Some(&target_token())).status, 200);
    for _ in 0..3 {
        assert_eq!(
            s.feedback(40, &status("proceeding", "none", &[])).status,
            200
        );
    }
    let over = s.feedback(40, &status("proceeding", "none", &[]));
    assert_eq!(over.status, 429);
    assert_eq!(
        over.json()["errorCode"],
        "hawkbit.server.error.quota.tooManyEntries"
    );
    assert_eq!(s.server.action(40).history.len(), 5);
    assert_eq!(
        s.feedback(40, &status("closed", "success", &[])).status,
        200
    );
    assert!(s.server.action(40).finished());

    // At most 50 messages per status: the details, the code line, and a
    // detail longer than 512 characters once per 512.
    s.deploy_simple(41);
    let many: Vec<String> = (0..51).map(|i| i.to_string()).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    assert_eq!(
        s.feedback(41, &status("proceeding", "none", &many)).status,
        429
    );
    let mut body = status("proceeding", "none", &many[..49]);
    body["status"]["code"] = json!(7);
    assert_eq!(s.feedback(41, &body).status, 200);
    let long = "x".repeat(513);
    let mut details: Vec<&str> = many[..50].to_vec();
    details[0] = &long;
    assert_eq!(
        s.feedback(41, &status("proceeding", "none", &details))
            .status,
        429
    );
    assert_eq!(
        s.feedback(41, &status("proceeding", "none", &many[..50]))
            .status,
        200
    );
}

#[test]
fn a_download_only_action_is_closed_by_downloaded() {
    let s = Setup::new();
    let image = s.file("image.bin", 2048);
    s.server.deploy(
        DEV,
        Deployment::new(50)
            .download_only()
            .chunk(Chunk::new("os", "image", "2.0").artifact(Artifact::file(&image))),
    );
    let href = link(&s.base().json(), "deploymentBase").unwrap();
    let d = ddi::deployment(&s.client.get(&href, Some(&target_token())).body).unwrap();
    assert_eq!(
        (d.download, d.update),
        (ddi::Handling::Forced, ddi::Handling::Skip)
    );
    assert_eq!(s.server.action(50).action_type, ActionType::DownloadOnly);
    assert_eq!(s.feedback(50, &status("download", "none", &[])).status, 200);
    assert!(s.server.action(50).active);
    assert_eq!(
        s.feedback(50, &status("downloaded", "none", &[])).status,
        200
    );
    let action = s.server.action(50);
    assert_eq!(
        (action.active, action.status),
        (false, ActionStatus::Downloaded)
    );
    let base = s.base().json();
    assert!(link(&base, "deploymentBase").is_none());
    assert!(
        link(&base, "installedBase").is_none(),
        "downloaded is not installed"
    );
    assert!(link(&base, "configData").is_some());
    assert_eq!(
        s.feedback(50, &status("closed", "success", &[])).status,
        410
    );

    // An action whose window is closed also says `update: skip`, but
    // `downloaded` does not close it.
    s.server.deploy(
        DEV,
        Deployment::new(51)
            .soft()
            .maintenance_window(MaintenanceWindow::Unavailable)
            .chunk(Chunk::new("os", "image", "2.1").artifact(Artifact::file(&image))),
    );
    let href = link(&s.base().json(), "deploymentBase").unwrap();
    let d = ddi::deployment(&s.client.get(&href, Some(&target_token())).body).unwrap();
    assert_eq!(
        (d.download, d.update),
        (ddi::Handling::Attempt, ddi::Handling::Skip)
    );
    assert_eq!(
        d.maintenance_window,
        Some(ddi::MaintenanceWindow::Unavailable)
    );
    assert_eq!(
        s.feedback(51, &status("downloaded", "none", &[])).status,
        200
    );
    assert!(s.server.action(51).active);
    s.server
        .set_maintenance_window(51, Some(MaintenanceWindow::Available));
    let d = ddi::deployment(&s.client.get(&href, Some(&target_token())).body).unwrap();
    assert_eq!(d.update, ddi::Handling::Attempt);
}

#[test]
fn a_finished_action_becomes_the_installed_base() {
    let s = Setup::new();
    s.deploy_simple(60);
    assert_eq!(
        s.client
            .get(&s.url("/installedBase/60"), Some(&target_token()))
            .status,
        404,
        "an open action is not installed"
    );
    assert_eq!(s.feedback(60, &status("closed", "none", &[])).status, 200);
    let base = s.base().json();
    assert_eq!(
        link(&base, "installedBase").unwrap(),
        s.url("/installedBase/60")
    );
    let a = s
        .client
        .get(&s.url("/installedBase/60"), Some(&target_token()));
    assert_eq!(a.status, 200);
    assert_same_shape(
        &fixture("deployment_base")["deployment"]["chunks"][1],
        &a.json()["deployment"]["chunks"][0],
    );
    assert_eq!(ddi::deployment(&a.body).unwrap().action_id, "60");
}

#[test]
fn config_data_is_checked_stored_and_asked_for_again_after_an_update() {
    let s = Setup::new();
    let url = s.url("/configData");
    let auth = target_token();
    assert!(s.server.wants_config_data(DEV));
    let documented = fixture("config_data");
    assert_eq!(
        s.client
            .put(&url, Some(&auth), documented.to_string().as_bytes())
            .status,
        200
    );
    assert_eq!(
        s.server.attributes(DEV).get("VIN").map(String::as_str),
        Some("JH4TB2H26CC000000")
    );
    assert!(!s.server.wants_config_data(DEV));
    assert!(link(&s.base().json(), "configData").is_none());

    // updraft's body merges.
    let body = ddi::config_data(&[("compatible", "acme-gw"), ("hwRevision", "3")]).unwrap();
    assert_eq!(s.client.put(&url, Some(&auth), &body).status, 200);
    let attrs = s.server.attributes(DEV);
    assert_eq!(attrs.len(), 3);
    assert_eq!(attrs["hwRevision"], "3");
    assert!(s.server.violations().is_empty());

    // What hawkBit refuses.
    for (body, code) in [
        (
            json!({"mode": "merge"}),
            "hawkbit.server.error.rest.body.notReadable",
        ),
        (
            json!({"data": {}}),
            "hawkbit.server.error.rest.body.notReadable",
        ),
        (
            json!({"mode": "append", "data": {"a": "b"}}),
            "hawkbit.server.error.rest.body.notReadable",
        ),
        (
            json!({"data": {"owner": "Jörg"}}),
            "hawkbit.server.error.repo.invalidTargetAttributes",
        ),
        (
            json!({"data": {"k".repeat(129): "v"}}),
            "hawkbit.server.error.repo.invalidTargetAttributes",
        ),
    ] {
        let a = s.client.put(&url, Some(&auth), body.to_string().as_bytes());
        assert_eq!(a.status, 400, "{body}");
        assert_eq!(a.json()["errorCode"], code, "{body}");
    }
    assert_eq!(s.server.attributes(DEV).len(), 3);

    // remove, then replace.
    let remove = json!({"mode": "remove", "data": {"VIN": ""}});
    assert_eq!(
        s.client
            .put(&url, Some(&auth), remove.to_string().as_bytes())
            .status,
        200
    );
    assert!(!s.server.attributes(DEV).contains_key("VIN"));
    let replace = json!({"mode": "replace", "data": {"only": "this"}});
    assert_eq!(
        s.client
            .put(&url, Some(&auth), replace.to_string().as_bytes())
            .status,
        200
    );
    assert_eq!(
        s.server.attributes(DEV).keys().collect::<Vec<_>>(),
        ["only"]
    );

    // A finished action asks again.
    s.deploy_simple(70);
    assert_eq!(
        s.feedback(70, &status("closed", "success", &[])).status,
        200
    );
    assert!(link(&s.base().json(), "configData").is_some());
}

#[test]
fn throttled_requests_get_429_with_retry_after_then_an_answer() {
    let s = Setup::new();
    s.server.throttle(2, Some(7));
    for _ in 0..2 {
        let a = s.base();
        assert_eq!(a.status, 429);
        assert_eq!(a.header("retry-after"), Some("7"));
        assert!(a.body.is_empty());
    }
    assert_eq!(s.base().status, 200);
    let statuses: Vec<u16> = s.server.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [429, 429, 200]);
    // hawkBit's own filter sends no Retry-After.
    s.server.throttle(1, None);
    let a = s.base();
    assert_eq!((a.status, a.header("retry-after")), (429, None));
}

#[test]
fn downloads_honour_ranges_and_resume_after_a_cut() {
    let s = Setup::new();
    let image = s.deploy_simple(80);
    let bytes = std::fs::read(&image).unwrap();
    let len = bytes.len();
    let href = link(&s.base().json(), "deploymentBase").unwrap();
    let d = ddi::deployment(&s.client.get(&href, Some(&target_token())).body).unwrap();
    let url = d.chunks[0].artifacts[0].download.clone().unwrap();
    let auth = target_token();
    let name = "image-80.bin";

    let part = s
        .client
        .get_with(&url, Some(&auth), &[("Range", "bytes=1000-1999")]);
    assert_eq!(part.status, 206);
    assert_eq!(
        part.header("content-range"),
        Some(format!("bytes 1000-1999/{len}").as_str())
    );
    assert_eq!(part.body, bytes[1000..2000]);
    let beyond = s
        .client
        .get_with(&url, Some(&auth), &[("Range", &format!("bytes={len}-"))]);
    assert_eq!(beyond.status, 416);
    assert_eq!(
        beyond.header("content-range"),
        Some(format!("bytes */{len}").as_str())
    );
    let served_before = s.server.bytes_served(name);
    assert_eq!(served_before, 1000);

    s.server.cut_once(name, 1500);
    let cut = s.client.get(&url, Some(&auth));
    assert_eq!(cut.status, 200);
    assert!(cut.body_error.is_some(), "the body was cut: {cut:?}");
    assert_eq!(s.server.bytes_served(name), served_before + 1500);
    let rest = s
        .client
        .get_with(&url, Some(&auth), &[("Range", "bytes=1500-")]);
    assert_eq!(rest.status, 206);
    assert_eq!(rest.body, bytes[1500..]);
    assert_eq!(
        s.server.bytes_served(name),
        served_before + len as u64,
        "1500 before the cut and the rest"
    );
    // The fault was once.
    let whole = s.client.get(&url, Some(&auth));
    assert_eq!((whole.status, whole.body.len()), (200, len));
    assert_eq!(
        whole.header("etag").map(str::to_string),
        Some(format!(
            "\"{}\"",
            updraft::hash::hex(
                ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, &bytes).as_ref()
            )
        ))
    );
    let ranges: Vec<Option<String>> = s
        .server
        .requests_to(Origin::Ddi)
        .iter()
        .filter(|r| r.path().ends_with(name))
        .map(|r| r.range.clone())
        .collect();
    assert_eq!(
        ranges,
        [
            Some("bytes=1000-1999".to_string()),
            Some(format!("bytes={len}-")),
            None,
            Some("bytes=1500-".to_string()),
            None
        ]
    );
}

#[test]
fn credentials_are_asked_by_the_ddi_origin_and_never_by_the_download_server() {
    let s = Setup::new();
    s.server.add_controller("dev-2", "tok-dev-2");
    let image = s.file("cdn.bin", 3000);
    s.server.deploy(
        DEV,
        Deployment::new(90)
            .chunk(Chunk::new("os", "image", "3.0").artifact(Artifact::file(&image).from_cdn())),
    );
    let base_url = s.url("");
    // Missing, wrong, another controller's, or another scheme: 401.
    for auth in [
        None,
        Some("TargetToken nope".to_string()),
        Some("TargetToken tok-dev-2".to_string()),
        Some(format!("targettoken {TOKEN}")),
        Some(format!("Bearer {TOKEN}")),
        Some(format!("GatewayToken {TOKEN}")),
    ] {
        let a = s.client.get(&base_url, auth.as_deref());
        assert_eq!(a.status, 401, "{auth:?}");
        assert!(a.body.is_empty());
    }
    let wrong_tenant = s.server.controller_url(DEV).replace(TENANT, "OTHER");
    assert_eq!(
        s.client.get(&wrong_tenant, Some(&target_token())).status,
        401
    );

    let href = link(&s.base().json(), "deploymentBase").unwrap();
    let d = ddi::deployment(&s.client.get(&href, Some(&target_token())).body).unwrap();
    let url = d.chunks[0].artifacts[0].download.clone().unwrap();
    assert!(url.starts_with(&s.server.cdn_url()), "{url}");
    let a = s.client.get(&url, None);
    assert_eq!(a.status, 200);
    assert_eq!(a.body, std::fs::read(&image).unwrap());
    assert_eq!(s.server.bytes_served_by(Origin::Cdn, "cdn.bin"), 3000);
    let cdn = s.server.requests_to(Origin::Cdn);
    assert_eq!(cdn.len(), 1);
    assert_eq!(cdn[0].authorization, None);
    // Every DDI request carried what the test sent, and nothing reached
    // the plain-HTTP origin.
    let ddi_auth: Vec<Option<String>> = s
        .server
        .requests_to(Origin::Ddi)
        .iter()
        .map(|r| r.authorization.clone())
        .collect();
    assert_eq!(ddi_auth.len(), 9);
    assert_eq!(ddi_auth[0], None);
    assert!(
        ddi_auth[7..]
            .iter()
            .all(|a| a.as_deref() == Some(target_token().as_str()))
    );
    assert!(s.server.requests_to(Origin::Http).is_empty());

    // The DDI links need the token there, even for downloads.
    let ddi_download = format!(
        "{}/softwaremodules/1/artifacts/cdn.bin",
        s.server.controller_url(DEV)
    );
    assert_eq!(s.client.get(&ddi_download, None).status, 401);
    assert_eq!(
        s.client.get(&ddi_download, Some(&target_token())).status,
        200
    );
}

#[test]
fn a_gateway_token_serves_every_controller_and_registers_new_ones() {
    let s = Setup::with(DdiServer::builder(TENANT).auth(Auth::GatewayToken("gw-secret".into())));
    let new = s.server.controller_url("dev-new");
    assert!(!s.server.has_controller("dev-new"));
    assert_eq!(
        s.client.get(&new, Some("GatewayToken gw-secret")).status,
        200
    );
    assert!(s.server.has_controller("dev-new"));
    assert_eq!(s.base().status, 401, "target tokens are not enabled");
    assert_eq!(s.client.get(&new, Some("GatewayToken other")).status, 401);
    // Through the plain-HTTP origin the same rules hold.
    let http = new.replace(&s.server.base_url(), &s.server.http_url());
    assert_eq!(s.client.get(&http, None).status, 401);
    assert_eq!(
        s.client.get(&http, Some("GatewayToken gw-secret")).status,
        200
    );
    assert_eq!(s.server.requests_to(Origin::Http).len(), 2);
}

#[test]
fn the_waiting_helpers_see_feedback_as_it_arrives() {
    let s = Setup::new();
    s.deploy_simple(100);
    let url = s.url("/deploymentBase/100/feedback");
    let ca = s.server.ca_file().to_path_buf();
    let poster = std::thread::spawn(move || {
        let c = Client::new(&ca);
        for body in [
            status("proceeding", "none", &["1"]),
            status("closed", "success", &["2"]),
        ] {
            assert_eq!(
                c.post(&url, Some(&target_token()), body.to_string().as_bytes())
                    .status,
                200
            );
        }
    });
    let fb = s.server.wait_for_feedback(100, 2, WAIT);
    poster.join().unwrap();
    assert_eq!(fb.len(), 2);
    assert_eq!(
        s.server.wait_for_closed(100, WAIT).status,
        ActionStatus::Finished
    );
    assert!(
        !s.server
            .wait_until(Duration::from_millis(50), |s| s.feedback(100).len() > 2)
    );
}

#[test]
fn with_hawkbits_default_links_only_download_http_is_given_at_the_requests_scheme() {
    let s = Setup::with(DdiServer::builder(TENANT).links(Links::HawkbitDefaults));
    s.deploy_simple(110);
    let href = link(&s.base().json(), "deploymentBase").unwrap();
    let a = s.client.get(&href, Some(&target_token()));
    let links = &a.json()["deployment"]["chunks"][0]["artifacts"][0]["_links"];
    let names: Vec<&String> = links.as_object().unwrap().keys().collect();
    assert_eq!(names, ["download-http", "md5sum-http"]);
    let url = links["download-http"]["href"].as_str().unwrap();
    assert_eq!(
        url,
        s.url("/softwaremodules/1/artifacts/image-110.bin"),
        "https, as the request was"
    );
    // updraft's parser finds no `download` link in such a document.
    let d = ddi::deployment(&a.body).unwrap();
    assert_eq!(d.chunks[0].artifacts[0].download, None);
    assert_eq!(s.client.get(url, Some(&target_token())).status, 200);
    // Asked over plain HTTP, the link is plain HTTP.
    let plain = href.replace(&s.server.base_url(), &s.server.http_url());
    let doc = s.client.get(&plain, Some(&target_token())).json();
    let url = doc["deployment"]["chunks"][0]["artifacts"][0]["_links"]["download-http"]["href"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(url.starts_with(&s.server.http_url()), "{url}");
}
