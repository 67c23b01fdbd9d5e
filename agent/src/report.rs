//! Reports to the fleet server: built here, queued in the store's outbox,
//! delivered in order when the server is reachable.
//!
//! Every report is written to SQLite first — in the same transaction as the
//! state change it describes — and only then sent, as a JSON `POST` to
//! `server.report_url` with an `Idempotency-Key` header. Delivery is
//! at-least-once and in order: a report is removed from the outbox only
//! after a 2xx answer, and delivery stops at the first failure so nothing
//! overtakes it. The key lets the server drop duplicates. The outbox stays
//! bounded because heartbeats and repeated check failures are folded into
//! the newest queued report of their kind (with a count and the first and
//! last time); install results and state changes are never folded or
//! dropped. The format is documented in `docs/reports.md`.
//!
//! This module builds and sends; it never decides when to poll or retry
//! (that is the daemon's backoff).

use serde_json::{Value, json};

use crate::error::Result;
use crate::fetch::Fetcher;
use crate::hash::hex;
use crate::identity::random_bytes;
use crate::progress::Ticker;
use crate::slot::SlotName;
use crate::state::{Job, State};
use crate::store::{OutboxEntry, Report, Store};
use crate::timestamp::Timestamp;

/// Report kinds.
pub const STATE: &str = "state";
pub const INSTALL: &str = "install";
pub const HEARTBEAT: &str = "heartbeat";
pub const CHECK_FAILED: &str = "check_failed";
pub const WAITING: &str = "waiting";
pub const RUNNING: &str = "running";

/// A queued report ready to hand to [`Store::transition`] or
/// [`Store::push_report`].
pub struct Pending {
    pub key: String,
    pub kind: &'static str,
    pub foldable: bool,
    pub body: String,
}

impl Pending {
    pub fn as_report(&self) -> Report<'_> {
        Report {
            key: &self.key,
            kind: self.kind,
            foldable: self.foldable,
            body: &self.body,
        }
    }
}

/// A fresh idempotency key.
pub fn new_key() -> String {
    match random_bytes::<16>() {
        Ok(b) => hex(&b),
        // No randomness: fall back to time and pid, still unique enough for
        // de-duplication on one device.
        Err(_) => format!(
            "{:x}-{:x}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
            std::process::id()
        ),
    }
}

fn pending(kind: &'static str, foldable: bool, body: Value) -> Pending {
    Pending {
        key: new_key(),
        kind,
        foldable,
        body: body.to_string(),
    }
}

fn job_fields(job: &Job) -> Value {
    json!({
        "job": job.id,
        "release": job.version,
        "serial": job.serial,
        "target_slot": job.target.as_str(),
        "image_sha256": job.image.sha256,
        "method": match &job.method { crate::state::Method::Full => "full", crate::state::Method::Delta { .. } => "delta" },
    })
}

/// A state change.
pub fn state_change(device: &str, booted: SlotName, state: &State) -> Pending {
    let mut body = json!({
        "kind": STATE,
        "device_id": device,
        "time": Timestamp::now(),
        "booted_slot": booted.as_str(),
        "state": state.name(),
    });
    if let Some(job) = state.job() {
        body["job"] = job_fields(job);
    }
    match state {
        State::Failed { reason, .. } => body["reason"] = json!(reason),
        _ => {
            if let Some(reason) = state.job().and_then(|j| j.reason.as_ref()) {
                body["reason"] = json!(reason);
            }
        }
    }
    pending(STATE, false, body)
}

/// The result of an install attempt (committed, rolled back or failed).
pub fn install_result(
    device: &str,
    booted: SlotName,
    result: &str,
    job: &Job,
    reason: Option<&str>,
) -> Pending {
    let now = Timestamp::now();
    pending(
        INSTALL,
        false,
        json!({
            "kind": INSTALL,
            "device_id": device,
            "time": now,
            "booted_slot": booted.as_str(),
            "result": result,
            "job": job_fields(job),
            "duration_s": (now.0 - job.started.0).max(0),
            "bytes_downloaded": job.bytes_downloaded,
            "reason": reason,
        }),
    )
}

/// A verified release waits before its switch or reboot: for a
/// maintenance window, an operator's `updraft apply`, or an application
/// inhibitor (`waiting_for`). Sent when the job starts waiting and when
/// what it waits for changes.
pub fn waiting(device: &str, booted: SlotName, job: &Job, waiting_for: &str, why: &str) -> Pending {
    pending(
        WAITING,
        false,
        json!({
            "kind": WAITING,
            "device_id": device,
            "time": Timestamp::now(),
            "booted_slot": booted.as_str(),
            "job": job_fields(job),
            "waiting_for": waiting_for,
            "reason": why,
            "held_since": job.held,
            "inhibited_since": job.inhibited,
        }),
    )
}

/// A release found running in the booted slot with no install recorded
/// (a freshly provisioned device): `how` says what showed it, the release
/// marker or the slot's hash.
pub fn running(
    device: &str,
    booted: SlotName,
    version: &str,
    image_sha256: &crate::hash::Sha256,
    how: &str,
) -> Pending {
    pending(
        RUNNING,
        false,
        json!({
            "kind": RUNNING,
            "device_id": device,
            "time": Timestamp::now(),
            "booted_slot": booted.as_str(),
            "release": version,
            "image_sha256": image_sha256,
            "evidence": how,
        }),
    )
}

/// A periodic sign of life.
pub fn heartbeat(device: &str, booted: SlotName, state: &State, running: Option<&str>) -> Pending {
    pending(
        HEARTBEAT,
        true,
        json!({
            "kind": HEARTBEAT,
            "device_id": device,
            "time": Timestamp::now(),
            "booted_slot": booted.as_str(),
            "state": state.name(),
            "release": running,
        }),
    )
}

/// A failed poll (network, signature, policy); repeated ones fold.
pub fn check_failed(device: &str, booted: SlotName, kind: &str, reason: &str) -> Pending {
    pending(
        CHECK_FAILED,
        true,
        json!({
            "kind": CHECK_FAILED,
            "device_id": device,
            "time": Timestamp::now(),
            "booted_slot": booted.as_str(),
            "error_kind": kind,
            "reason": reason,
        }),
    )
}

/// The JSON actually sent for an outbox row: the stored body plus the
/// delivery fields.
pub fn wire_body(e: &OutboxEntry) -> Vec<u8> {
    let mut v: Value =
        serde_json::from_slice(e.body.as_bytes()).unwrap_or_else(|_| json!({ "raw": e.body }));
    if let Value::Object(map) = &mut v {
        map.insert("idempotency_key".into(), json!(e.key));
        map.insert("sequence".into(), json!(e.seq));
        map.insert("count".into(), json!(e.count));
        map.insert("first_time".into(), json!(e.created));
        map.insert("last_time".into(), json!(e.updated));
    }
    v.to_string().into_bytes()
}

/// Deliver queued reports in order until the outbox is empty or a POST
/// fails. Returns how many were delivered.
pub fn deliver(
    store: &Store,
    fetcher: &Fetcher,
    url: &str,
    ticker: &mut dyn Ticker,
) -> Result<usize> {
    drain(
        store,
        |kind| !crate::hawkbit::is_ddi_kind(kind),
        ("a DDI server", "server.report_url"),
        |e| {
            let body = wire_body(e);
            let f = fetcher.clone();
            let u = url.to_string();
            let key = e.key.clone();
            crate::worker::offload("report", move || f.post_json(&u, &key, &body), ticker)??;
            Ok(())
        },
    )
}

/// Hand queued rows to `send` in order, oldest first, acknowledging each it
/// takes, until the outbox is empty or `send` fails. A row `ours` refuses
/// was queued for the other kind of server (`servers`: that one, this one)
/// before the configuration changed, and means nothing to this one: it is
/// dropped with a warning. Returns how many rows `send` took.
pub(crate) fn drain(
    store: &Store,
    ours: impl Fn(&str) -> bool,
    servers: (&str, &str),
    mut send: impl FnMut(&OutboxEntry) -> Result<()>,
) -> Result<usize> {
    let mut sent = 0;
    loop {
        let batch = store.outbox_peek(16)?;
        if batch.is_empty() {
            return Ok(sent);
        }
        for e in batch {
            if ours(&e.kind) {
                send(&e)?;
                sent += 1;
            } else {
                log::warn!(
                    "dropping queued {} row {}: it was queued for {}, and this device now reports to {}",
                    e.kind,
                    e.key,
                    servers.0,
                    servers.1
                );
            }
            store.outbox_ack(e.seq)?;
        }
    }
}
