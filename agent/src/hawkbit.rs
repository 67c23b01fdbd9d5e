//! The device side of hawkBit's Direct Device Integration (DDI) API
//! (`server.kind = "hawkbit"`): Eclipse hawkBit, gooseBit and other servers
//! that implement it.
//!
//! A DDI server orchestrates: it says which release a device should run
//! (an *action* assigning a distribution set), when (`download`/`update`:
//! skip, attempt, forced; a maintenance window), and it keeps each action's
//! history from the device's feedback. It is not trusted with what is
//! installed: the release it points at is a signed manifest, verified
//! exactly as in static mode, and every byte written is checked against
//! it. What this module owns:
//!
//! * **Requests to the controller resource**
//!   (`{ddi_url}/{tenant}/controller/v1/{controller_id}`): the controller
//!   base, the deploymentBase and cancelAction an action link names, and
//!   feedback and configData from the outbox. Links the server gives for
//!   the controller's own resources are followed on the configured
//!   `ddi_url` (their path and query kept), so the device's credentials
//!   never go to a host the server names; artifact download links are used
//!   as given, and the fetcher sends no credentials off `ddi_url`'s origin.
//! * **Where a deployment's release is** ([`release_origin`]): a single
//!   bundle artifact, or the software modules of a distribution set
//!   holding `manifest.json` and the files the manifest names, each under
//!   its last path segment (`3.json` for `keys/3.json`, `<sha256>.zst` for
//!   `artifacts/<sha256>.zst` or an app's `artifacts/blobs/<sha256>.zst`),
//!   and the check that the server's listing agrees with the signed
//!   release ([`check_listing`]): sizes and hashes, and a module named
//!   after a component carrying that component's signed version, so a
//!   distribution set of an OS module and an application module is the
//!   signed release of that slot and that app, one module per component.
//! * **The outbox rows of this mode** ([`feedback`], [`progress`],
//!   [`config_data`]) and their delivery in order ([`deliver`]). DDI has no
//!   idempotency key: an answer 410 (the action is no longer active) counts
//!   as delivered, so the in-order outbox never stalls on an action the
//!   server closed or cancelled meanwhile. A feedback goes out with a
//!   last `details` line carrying its report counter and the device key's
//!   signature ([`signed`]).
//!
//! It never decides what is installed, in which state the update is, or
//! what a feedback says: that is the state machine's (`machine/fleet.rs`).

use serde_json::{Value, json};

use crate::config::Server;
use crate::ddi::{self, ActionLink, Cancel, ControllerBase, Deployment, Feedback};
use crate::device_key::DeviceKey;
use crate::error::{Context, Result};
use crate::fetch::{Fetched, Fetcher};
use crate::hash::truncate;
use crate::manifest::Manifest;
use crate::progress::Ticker;
use crate::report::{Pending, new_key};
use crate::source::Origin;
use crate::store::{OutboxEntry, Store};
use crate::{bail, err};

// The outbox kinds of this mode are the outbox's ([`crate::report`] keeps
// the list of every kind and which are results).
pub use crate::report::is_ddi_kind;
pub use crate::report::{DDI_CONFIG as CONFIG, DDI_FEEDBACK as FEEDBACK, DDI_PROGRESS as PROGRESS};

/// The controller resource of this device on the configured DDI server.
#[derive(Clone)]
pub struct Controller {
    /// `{ddi_url}/{tenant}/controller/v1/{controller_id}`.
    url: String,
    fetcher: Fetcher,
}

impl Controller {
    /// The controller of `device_id` (or of `server.controller_id`).
    pub fn new(server: &Server, device_id: &str, fetcher: Fetcher) -> Controller {
        let id = if server.controller_id.is_empty() {
            device_id
        } else {
            &server.controller_id
        };
        Controller {
            url: format!(
                "{}/{}/controller/v1/{id}",
                server.ddi_url.trim_end_matches('/'),
                server.tenant
            ),
            fetcher,
        }
    }

    /// `GET` one of the controller's documents at `url`, within the DDI
    /// document cap.
    fn get(&self, url: &str) -> Result<Vec<u8>> {
        match self
            .fetcher
            .get_small(url, ddi::MAX_DOCUMENT_BYTES as u64, None)?
        {
            Fetched::Body { bytes, .. } => Ok(bytes),
            Fetched::NotModified => bail!(
                Network,
                "GET {}: the server answered 304 to an unconditional request",
                truncate(url, 200)
            ),
        }
    }

    /// The controller base: polling interval and links to what the server
    /// wants of this device.
    pub fn base(&self) -> Result<ControllerBase> {
        let bytes = self.get(&self.url)?;
        ddi::controller_base(&bytes).context("DDI controller base")
    }

    /// `link` (a deploymentBase or cancelAction link from the base) on the
    /// configured server: its path from the action kind on, and its query.
    fn own(&self, link: &ActionLink, kind: &str) -> String {
        let query = link
            .href
            .split_once('?')
            .map(|(_, q)| q.split('#').next().unwrap_or(""))
            .filter(|q| !q.is_empty());
        match query {
            Some(q) => format!("{}/{kind}/{}?{q}", self.url, link.action_id),
            None => format!("{}/{kind}/{}", self.url, link.action_id),
        }
    }

    /// The deployment an action link names.
    pub fn deployment(&self, link: &ActionLink) -> Result<Deployment> {
        let bytes = self.get(&self.own(link, "deploymentBase"))?;
        let d = ddi::deployment(&bytes)?;
        if d.action_id != link.action_id {
            bail!(
                Malformed,
                "deploymentBase {} describes action {}",
                link.action_id,
                d.action_id
            );
        }
        Ok(d)
    }

    /// The cancelAction a link names.
    pub fn cancel(&self, link: &ActionLink) -> Result<Cancel> {
        let bytes = self.get(&self.own(link, "cancelAction"))?;
        let c = ddi::cancel(&bytes)?;
        if c.action_id != link.action_id {
            bail!(
                Malformed,
                "cancelAction {} describes action {}",
                link.action_id,
                c.action_id
            );
        }
        Ok(c)
    }

    /// Send one outbox row of this mode.
    pub fn send(&self, entry: &OutboxEntry) -> Result<Sent> {
        let row = Row::parse(&entry.body)
            .with_context(|| format!("outbox row {} ({})", entry.seq, entry.kind))?;
        let url = format!("{}/{}", self.url, row.path);
        let body = row.body.to_string().into_bytes();
        let status = self.fetcher.send_json(row.method, &url, None, &body)?;
        Ok(match status {
            200..=299 => Sent::Delivered,
            410 => Sent::Gone,
            400 | 404 | 409 | 422 => Sent::Refused(status),
            _ => bail!(
                Network,
                "{} {}: HTTP status {status}{}",
                row.method,
                truncate(&url, 200),
                if matches!(status, 401 | 403) {
                    " (check server.ddi_auth and the token in server.token_file)"
                } else {
                    ""
                }
            ),
        })
    }
}

/// Whether `entry` is a queued feedback that closes deployment `action`
/// (`closed`, or a cancel of it accepted).
pub fn closes(entry: &OutboxEntry, action: &str) -> bool {
    if entry.kind != FEEDBACK {
        return false;
    }
    let Ok(row) = Row::parse(&entry.body) else {
        return false;
    };
    row.path == format!("deploymentBase/{action}/feedback")
        && row.body["status"]["execution"] == "closed"
}

/// How the server took a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// 2xx.
    Delivered,
    /// 410: the action is no longer active (closed, cancelled or deleted
    /// on the server); nothing more can be said about it.
    Gone,
    /// A 4xx that sending again cannot change (the request is refused as
    /// it is, or the action is unknown).
    Refused(u16),
}

/// What an outbox row of this mode holds: the request to make on the
/// controller resource.
struct Row {
    method: &'static str,
    /// Below the controller resource, e.g. `deploymentBase/8/feedback`.
    path: String,
    body: Value,
}

impl Row {
    fn to_json(&self) -> String {
        json!({ "method": self.method, "path": self.path, "body": self.body }).to_string()
    }

    fn parse(text: &str) -> Result<Row> {
        let v: Value =
            serde_json::from_slice(text.as_bytes()).map_err(|e| err!(Store, "not JSON: {e}"))?;
        let method = match v["method"].as_str() {
            Some("POST") => "POST",
            Some("PUT") => "PUT",
            other => bail!(Store, "unknown method {other:?}"),
        };
        let Some(path) = v["path"].as_str() else {
            bail!(Store, "no path");
        };
        // Written by this module: segments of the controller resource.
        if path.is_empty() || !path.split('/').all(ddi::is_path_token) {
            bail!(Store, "path {path:?} is not below the controller resource");
        }
        Ok(Row {
            method,
            path: path.to_string(),
            body: v["body"].clone(),
        })
    }
}

/// Which resource a feedback answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answering {
    Deployment,
    Cancel,
}

impl Answering {
    fn path(self) -> &'static str {
        match self {
            Answering::Deployment => "deploymentBase",
            Answering::Cancel => "cancelAction",
        }
    }
}

/// The outbox row of a feedback that changes an action's state.
pub fn feedback(to: Answering, f: &Feedback) -> Pending {
    row(FEEDBACK, false, to, f)
}

/// The outbox row of a progress feedback (`proceeding`, with `cnt` of
/// `of`): folded into the newest queued row when that is a progress row
/// too, so an offline device does not queue one per step, and hawkBit's
/// per-action status quota (`maxStatusEntriesPerAction`) is never reached.
pub fn progress(f: &Feedback) -> Pending {
    row(PROGRESS, true, Answering::Deployment, f)
}

fn row(kind: &'static str, foldable: bool, to: Answering, f: &Feedback) -> Pending {
    let body: Value = serde_json::from_slice(&f.to_json()).unwrap_or(Value::Null);
    Pending {
        key: new_key(),
        kind,
        foldable,
        body: Row {
            method: "POST",
            path: format!("{}/{}/feedback", to.path(), f.action_id),
            body,
        }
        .to_json(),
    }
}

/// The outbox row of a configData `PUT`.
pub fn config_data(attributes: &[(&str, &str)]) -> Result<Pending> {
    let body: Value = serde_json::from_slice(&ddi::config_data(attributes)?)
        .map_err(|e| err!(Malformed, "configData: {e}"))?;
    Ok(Pending {
        key: new_key(),
        kind: CONFIG,
        foldable: true,
        body: Row {
            method: "PUT",
            path: "configData".into(),
            body,
        }
        .to_json(),
    })
}

/// The row as it is sent: a feedback with a report counter, on a device
/// with a usable key, gets a last `details` line carrying the counter,
/// `previous` (the counter of the newest row a server took) and the
/// device key's signature ([`crate::signed_report::ddi_line`]), in place
/// of its last line when all [`ddi::MAX_DETAILS`] are taken. Anything
/// else goes as queued.
pub fn signed(entry: &OutboxEntry, key: Option<&DeviceKey>, previous: u64) -> OutboxEntry {
    use crate::signed_report::{DDI_LINE_PREFIX, DdiSigned, ddi_line};
    let (Some(key), Some(counter)) = (key, entry.counter) else {
        return entry.clone();
    };
    if entry.kind != FEEDBACK && entry.kind != PROGRESS {
        return entry.clone();
    }
    let Ok(mut row) = Row::parse(&entry.body) else {
        return entry.clone();
    };
    let Some(details) = row.body["status"]["details"].as_array_mut() else {
        return entry.clone();
    };
    details.retain(|d| !d.as_str().is_some_and(|s| s.starts_with(DDI_LINE_PREFIX)));
    details.truncate(ddi::MAX_DETAILS - 1);
    let Some(line) =
        DdiSigned::of(&row.path, &row.body, counter, previous).map(|s| ddi_line(&s, key))
    else {
        return entry.clone();
    };
    if let Some(details) = row.body["status"]["details"].as_array_mut() {
        details.push(Value::String(line));
    }
    OutboxEntry {
        body: row.to_json(),
        ..entry.clone()
    }
}

/// Deliver queued rows in order until the outbox is empty or a request
/// fails; rows of static mode (queued for a `report_url` the
/// configuration no longer has) are dropped with a warning. Returns how
/// many went out.
pub fn deliver(
    store: &Store,
    controller: &Controller,
    key: Option<&DeviceKey>,
    t: &mut dyn Ticker,
) -> Result<usize> {
    crate::report::drain(
        store,
        is_ddi_kind,
        ("server.report_url", "a DDI server"),
        |e| {
            let c = controller.clone();
            let row = signed(e, key, store.report_counter_delivered()?);
            match crate::worker::offload("report", move || c.send(&row), t)?? {
                Sent::Delivered => {}
                Sent::Gone => log::info!(
                    "{}: the DDI server answered 410 (the action is no longer active); counted as delivered",
                    describe(e)
                ),
                Sent::Refused(status) => log::error!(
                    "{}: the DDI server refused it with {status}; dropped (sending it again cannot change that)",
                    describe(e)
                ),
            }
            Ok(())
        },
    )
}

/// An outbox row for the log: its request.
fn describe(e: &OutboxEntry) -> String {
    match Row::parse(&e.body) {
        Ok(r) => format!("{} {}", r.method, r.path),
        Err(_) => format!("outbox row {}", e.seq),
    }
}

/// Where the release a deployment assigns is: the one bundle artifact of
/// the deployment, or a `manifest.json` with the files beside it in any
/// of its chunks (software modules). Files are named by their last path
/// segment; a key document `N.json` stands for `keys/N.json`, anything
/// else for `artifacts/NAME` (and for any path below `artifacts/` ending
/// in NAME, such as an app's blobs: [`crate::source`] looks a name up by
/// its last segment). One name in two modules must be listed with the
/// same sha256 in both (a blob two components share).
pub fn release_origin(d: &Deployment) -> Result<Origin> {
    let all: Vec<&ddi::Artifact> = d.chunks.iter().flat_map(|c| &c.artifacts).collect();
    let link = |a: &ddi::Artifact| -> Result<String> {
        a.download.clone().ok_or_else(|| {
            err!(
                Malformed,
                "deployment {}: artifact {:?} has no `download` link (only `download` links are used, never `download-http`; hawkBit writes them when hawkbit.artifact.url.protocols names a `download` protocol over https)",
                d.action_id,
                a.filename
            )
        })
    };
    if all.iter().any(|a| a.filename == crate::bundle::MANIFEST) {
        let manifest = link(d.artifact(crate::bundle::MANIFEST)?)?;
        let mut files = std::collections::BTreeMap::new();
        let mut listed: std::collections::BTreeMap<&str, Option<crate::hash::Sha256>> =
            std::collections::BTreeMap::new();
        for a in all.iter().filter(|a| a.filename != crate::bundle::MANIFEST) {
            let Some(href) = &a.download else { continue };
            let name = &a.filename;
            let rel = if name.ends_with(".json")
                && name.len() > 5
                && name[..name.len() - 5].bytes().all(|b| b.is_ascii_digit())
            {
                format!("keys/{name}")
            } else {
                format!("artifacts/{name}")
            };
            if let Some(first) = listed.insert(name, a.sha256) {
                if first.is_none() || first != a.sha256 {
                    bail!(
                        Malformed,
                        "deployment {}: two artifacts stand for {rel} (one name in two software modules must be listed with the same sha256 in both)",
                        d.action_id
                    );
                }
                continue;
            }
            files.insert(rel, href.clone());
        }
        return Ok(Origin::Links { manifest, files });
    }
    match all.as_slice() {
        [one] => Ok(Origin::RemoteBundle { url: link(one)? }),
        [] => bail!(
            Malformed,
            "deployment {}: no artifacts (expected a release bundle, or manifest.json with the files it names)",
            d.action_id
        ),
        many => bail!(
            Malformed,
            "deployment {}: {} artifacts but no manifest.json (expected one release bundle, or manifest.json with the files it names)",
            d.action_id,
            many.len()
        ),
    }
}

/// The server's listing of the files the signed manifest names must agree
/// with it where it says anything: a size or a sha256 that differs is
/// refused before a byte is downloaded (the download would fail its hash
/// anyway; this names the culprit).
///
/// A chunk named after a component of the release (the slot's name
/// included) is that component's software module: its version must be the
/// component's signed one, or the distribution set is not the release it
/// names and is refused, naming both versions.
pub fn check_listing(d: &Deployment, m: &Manifest) -> Result<()> {
    let named = m
        .slot
        .iter()
        .map(|s| (s.name.as_str(), s.version.as_str()))
        .chain(
            m.components
                .iter()
                .map(|c| (c.name.as_str(), c.version.as_str())),
        );
    for (name, version) in named {
        if let Some(chunk) = d.chunks.iter().find(|c| c.name == name) {
            if chunk.version != version {
                bail!(
                    Integrity,
                    "deployment {}: software module {name} is version {} in the distribution set, \
                     the signed release {} has component {name} {version}",
                    d.action_id,
                    truncate(&chunk.version, 80),
                    m.release.version
                );
            }
        }
    }
    let components = m.components.iter().map(|c| c.artifact());
    let signed = std::iter::once((&m.artifact.url, m.artifact.size, &m.artifact.sha256))
        .chain(m.deltas.iter().map(|x| (&x.url, x.size, &x.sha256)))
        .chain(components.map(|a| (&a.url, a.size, &a.sha256)));
    for (url, size, sha256) in signed {
        let name = url.rsplit('/').next().unwrap_or(url);
        let Some(a) = d
            .chunks
            .iter()
            .flat_map(|c| &c.artifacts)
            .find(|a| a.filename == name)
        else {
            continue;
        };
        if let Some(s) = a.size {
            if s != size {
                bail!(
                    Integrity,
                    "deployment {}: artifact {name:?} is listed with {s} bytes, the signed manifest says {size}",
                    d.action_id
                );
            }
        }
        if let Some(h) = &a.sha256 {
            if h != sha256 {
                bail!(
                    Integrity,
                    "deployment {}: artifact {name:?} is listed with sha256 {}, the signed manifest says {}",
                    d.action_id,
                    h.short(),
                    sha256.short()
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::Sha256;

    fn deployment(artifacts: &str) -> Deployment {
        ddi::deployment(
            format!(
                r#"{{"id":"8","deployment":{{"chunks":[{{"part":"os","version":"1.1","name":"rootfs","artifacts":[{artifacts}]}}]}}}}"#
            )
            .as_bytes(),
        )
        .unwrap()
    }

    fn artifact(name: &str) -> String {
        format!(
            r#"{{"filename":"{name}","size":3,"_links":{{"download":{{"href":"https://cdn.example/{name}"}}}}}}"#
        )
    }

    #[test]
    fn a_chunk_with_manifest_json_is_a_release_directory_by_file_name() {
        let d = deployment(
            &[
                artifact("manifest.json"),
                artifact("3.json"),
                artifact("ab.zst"),
            ]
            .join(","),
        );
        let Origin::Links { manifest, files } = release_origin(&d).unwrap() else {
            panic!("not links");
        };
        assert_eq!(manifest, "https://cdn.example/manifest.json");
        assert_eq!(
            files.into_iter().collect::<Vec<_>>(),
            vec![
                (
                    "artifacts/ab.zst".to_string(),
                    "https://cdn.example/ab.zst".to_string()
                ),
                (
                    "keys/3.json".to_string(),
                    "https://cdn.example/3.json".to_string()
                ),
            ]
        );
    }

    /// A deployment of `chunks` (name, version, artifacts as JSON).
    fn modules(chunks: &[(&str, &str, String)]) -> Deployment {
        let chunks: Vec<String> = chunks
            .iter()
            .map(|(name, version, artifacts)| {
                format!(
                    r#"{{"part":"os","version":"{version}","name":"{name}","artifacts":[{artifacts}]}}"#
                )
            })
            .collect();
        ddi::deployment(
            format!(
                r#"{{"id":"8","deployment":{{"chunks":[{}]}}}}"#,
                chunks.join(",")
            )
            .as_bytes(),
        )
        .unwrap()
    }

    fn listed(name: &str, sha: &str) -> String {
        format!(
            r#"{{"filename":"{name}","size":3,"hashes":{{"sha256":"{sha}"}},"_links":{{"download":{{"href":"https://cdn.example/{name}"}}}}}}"#
        )
    }

    #[test]
    fn a_release_may_span_software_modules_and_share_a_file_listed_alike() {
        let sha = Sha256::of(b"blob").to_hex();
        let other = Sha256::of(b"other").to_hex();
        let d = modules(&[
            (
                "rootfs",
                "2.0",
                [artifact("manifest.json"), artifact("1.json")].join(","),
            ),
            (
                "web",
                "1.4",
                [artifact("i.index.zst"), listed("b1.zst", &sha)].join(","),
            ),
            ("firmware", "2.0", listed("b1.zst", &sha)),
        ]);
        let Origin::Links { files, .. } = release_origin(&d).unwrap() else {
            panic!("not links");
        };
        assert!(
            files.contains_key("artifacts/i.index.zst") && files.contains_key("artifacts/b1.zst")
        );
        let d = modules(&[
            ("rootfs", "2.0", artifact("manifest.json")),
            ("web", "1.4", listed("b1.zst", &sha)),
            ("firmware", "2.0", listed("b1.zst", &other)),
        ]);
        let e = release_origin(&d).unwrap_err().to_string();
        assert!(
            e.contains("two artifacts stand for artifacts/b1.zst"),
            "{e}"
        );
    }

    #[test]
    fn a_module_named_after_a_component_carries_its_signed_version() {
        let h = Sha256::of(b"x").to_hex();
        let art = |url: &str| {
            json!({"url": url, "size": 3, "sha256": h,
                   "frames": [{"offset": 0, "size": 3, "out_size": 1, "out_sha256": h}]})
        };
        let payload = json!({
            "spec_version": 2, "serial": 7,
            "issued": "2027-01-15T08:00:00Z", "expires": "2030-03-17T17:46:40Z",
            "release": {"version": "2026.12.1", "compatible": ["rpi4"]},
            "components": [
                {"name": "rootfs", "kind": "slot", "version": "2.0",
                 "image": {"size": 1, "sha256": h}, "artifact": art("artifacts/r.zst")},
                {"name": "web", "kind": "app", "version": "1.4",
                 "tree": {"entries": 1, "bytes": 1},
                 "index": art("artifacts/i.index.zst"), "blobs": "artifacts/blobs/"},
            ],
        });
        let m = Manifest::parse(&serde_json::to_vec(&payload).unwrap()).unwrap();
        let ok = modules(&[
            ("rootfs", "2.0", artifact("manifest.json")),
            ("web", "1.4", artifact("i.index.zst")),
            ("release-notes", "9", artifact("notes.txt")),
        ]);
        check_listing(&ok, &m).unwrap();
        let stale = modules(&[
            ("rootfs", "2.0", artifact("manifest.json")),
            ("web", "1.3", artifact("i.index.zst")),
        ]);
        let e = check_listing(&stale, &m).unwrap_err().to_string();
        assert!(
            e.contains("software module web is version 1.3") && e.contains("component web 1.4"),
            "{e}"
        );
        // The app's index listed with another size than signed.
        let wrong = modules(&[
            ("rootfs", "2.0", artifact("manifest.json")),
            ("web", "1.4", r#"{"filename":"i.index.zst","size":4,"_links":{"download":{"href":"https://cdn.example/i"}}}"#.to_string()),
        ]);
        let e = check_listing(&wrong, &m).unwrap_err().to_string();
        assert!(e.contains("\"i.index.zst\" is listed with 4 bytes"), "{e}");
    }

    #[test]
    fn a_single_artifact_is_a_bundle_and_anything_else_is_refused() {
        let d = deployment(&artifact("release-1.1.updraft"));
        assert_eq!(
            release_origin(&d).unwrap(),
            Origin::RemoteBundle {
                url: "https://cdn.example/release-1.1.updraft".into()
            }
        );
        let e = release_origin(&deployment(&[artifact("a"), artifact("b")].join(",")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("2 artifacts but no manifest.json"), "{e}");
        let e = release_origin(&deployment("")).unwrap_err().to_string();
        assert!(e.contains("no artifacts"), "{e}");
        let e = release_origin(&deployment(r#"{"filename":"x.updraft","size":1}"#))
            .unwrap_err()
            .to_string();
        assert!(e.contains("has no `download` link"), "{e}");
    }

    #[test]
    fn rows_name_the_request_and_refuse_paths_outside_the_controller() {
        let f = Feedback {
            action_id: "8".into(),
            execution: ddi::Execution::Closed,
            finished: ddi::Finished::Success,
            progress: None,
            details: vec!["committed".into()],
            timestamp_ms: 1,
        };
        let p = feedback(Answering::Deployment, &f);
        let row = Row::parse(&p.body).unwrap();
        assert_eq!(
            (row.method, row.path.as_str()),
            ("POST", "deploymentBase/8/feedback")
        );
        assert_eq!(row.body["status"]["result"]["finished"], "success");
        let c = feedback(Answering::Cancel, &f);
        assert_eq!(Row::parse(&c.body).unwrap().path, "cancelAction/8/feedback");
        assert!(progress(&f).foldable && !p.foldable);
        let cd = config_data(&[("sw_version", "1.1")]).unwrap();
        let row = Row::parse(&cd.body).unwrap();
        assert_eq!((row.method, row.path.as_str()), ("PUT", "configData"));
        for bad in [
            r#"{"method":"POST","path":"../x"}"#,
            r#"{"method":"POST","path":"a//b"}"#,
            r#"{"method":"GET","path":"configData"}"#,
            r#"{"method":"POST"}"#,
            "nonsense",
        ] {
            assert!(Row::parse(bad).is_err(), "{bad}");
        }
    }
}
