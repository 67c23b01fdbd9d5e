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
//! dropped. Each row has a report counter (allocated with the row, in
//! [`crate::store`]); when sent, a row carries it and is signed with the
//! device key ([`crate::signed_report`]). The format is documented in
//! `docs/reports.md`.
//!
//! This module builds and sends; it never decides when to poll or retry
//! (that is the daemon's backoff).

use serde_json::{Value, json};

use crate::device_key::DeviceKey;
use crate::error::Result;
use crate::fetch::Fetcher;
use crate::hash::hex;
use crate::progress::Ticker;
use crate::slot::SlotName;
use crate::state::{Job, State};
use crate::store::{OutboxEntry, Queued, Report, Store};
use crate::timestamp::Timestamp;

/// Report kinds.
pub const STATE: &str = "state";
pub const INSTALL: &str = "install";
/// How a release of components whose slot ran already ended.
pub const COMPONENTS: &str = "components";
pub const HEARTBEAT: &str = "heartbeat";
pub const CHECK_FAILED: &str = "check_failed";
pub const WAITING: &str = "waiting";
pub const RUNNING: &str = "running";
pub const DEGRADED: &str = "degraded";
pub const DATABASE_RECOVERED: &str = "database_recovered";

/// The kinds of a DDI server's rows (made and sent by [`crate::hawkbit`]):
/// a feedback that changes an action's state, a progress feedback (folded
/// into the newest one while nothing else is queued after it), the
/// configuration data.
pub const DDI_FEEDBACK: &str = "ddi_feedback";
pub const DDI_PROGRESS: &str = "ddi_progress";
pub const DDI_CONFIG: &str = "ddi_config";

/// Whether an outbox row is addressed to a DDI server.
pub fn is_ddi_kind(kind: &str) -> bool {
    matches!(kind, DDI_FEEDBACK | DDI_PROGRESS | DDI_CONFIG)
}

/// The outbox's bounds: a device offline for months must not fill its
/// state partition with reports. Past either bound the oldest rows that
/// are not results are dropped and counted ([`bound_outbox`]).
pub const OUTBOX_MAX_ROWS: u64 = 1000;
pub const OUTBOX_MAX_BYTES: u64 = 1024 * 1024;

/// Whether rows of `kind` carry a job's outcome — an install result, a
/// DDI feedback (the one that closes the server's action among them) —
/// and are therefore never dropped from a full outbox. There are a few
/// per job, so they stay few whatever the outage.
pub fn is_result(kind: &str) -> bool {
    kind == INSTALL || kind == COMPONENTS || kind == DDI_FEEDBACK
}

/// The rows to drop (by `seq`) so that `rows` (oldest first) fit
/// `max_rows` and `max_bytes`: the oldest rows that are not results, as
/// few as will do. Results are kept even when they alone exceed a bound.
pub fn outbox_excess(rows: &[Queued], max_rows: u64, max_bytes: u64) -> Vec<i64> {
    let mut count = rows.len() as u64;
    let mut bytes: u64 = rows.iter().map(|r| r.bytes).sum();
    let mut drop = Vec::new();
    for r in rows.iter().filter(|r| !is_result(&r.kind)) {
        if count <= max_rows && bytes <= max_bytes {
            break;
        }
        drop.push(r.seq);
        count -= 1;
        bytes = bytes.saturating_sub(r.bytes);
    }
    drop
}

/// Rows dropped from a full outbox by [`bound_outbox`].
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Dropped {
    pub rows: u64,
    /// The kinds dropped, each once, oldest first.
    pub kinds: Vec<String>,
    /// All rows dropped since the database was made.
    pub total: u64,
}

/// Keep the outbox within [`OUTBOX_MAX_ROWS`] and [`OUTBOX_MAX_BYTES`].
/// `None` when nothing had to go (the common case costs one query).
pub fn bound_outbox(store: &Store) -> Result<Option<Dropped>> {
    let (rows, bytes) = store.outbox_usage()?;
    if rows <= OUTBOX_MAX_ROWS && bytes <= OUTBOX_MAX_BYTES {
        return Ok(None);
    }
    let queued = store.outbox_sizes()?;
    let excess = outbox_excess(&queued, OUTBOX_MAX_ROWS, OUTBOX_MAX_BYTES);
    if excess.is_empty() {
        return Ok(None);
    }
    let mut kinds: Vec<String> = Vec::new();
    for q in queued.iter().filter(|q| excess.contains(&q.seq)) {
        if !kinds.contains(&q.kind) {
            kinds.push(q.kind.clone());
        }
    }
    let total = store.outbox_drop(&excess)?;
    Ok(Some(Dropped {
        rows: excess.len() as u64,
        kinds,
        total,
    }))
}

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
    match crate::random::bytes::<16>() {
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
    let mut v = json!({
        "job": job.id,
        "release": job.version,
        "serial": job.serial,
        "target_slot": job.target.as_str(),
        "image_sha256": job.image.sha256,
        "method": match &job.method { crate::state::Method::Full => "full", crate::state::Method::Delta { .. } => "delta" },
    });
    if !job.components.is_empty() {
        v["components"] = component_fields(&job.components);
    }
    v
}

/// The components of a release as reports list them.
fn component_fields(records: &[crate::state::Record]) -> Value {
    records
        .iter()
        .map(|r| {
            json!({
                "name": r.name,
                "kind": r.kind,
                "version": r.version,
                "content_sha256": r.content,
                "generation": r.generation,
                "bytes_downloaded": r.bytes,
            })
        })
        .collect()
}

/// How a release of components whose slot ran already ended: `result`
/// `committed`, `rolled_back`, `failed` or `interrupted`.
#[allow(clippy::too_many_arguments)]
pub fn components_result(
    device: &str,
    booted: SlotName,
    release: &str,
    serial: u64,
    result: &str,
    records: &[crate::state::Record],
    duration_s: u64,
    reason: Option<&str>,
) -> Pending {
    pending(
        COMPONENTS,
        false,
        json!({
            "kind": COMPONENTS,
            "device_id": device,
            "time": Timestamp::now(),
            "booted_slot": booted.as_str(),
            "release": release,
            "serial": serial,
            "result": result,
            "components": component_fields(records),
            "duration_s": duration_s,
            "reason": reason,
        }),
    )
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

/// The daemon could not start and runs degraded (`daemon::degraded`):
/// `reason` names what failed. Sent straight to the report server, never
/// queued: the database may be what failed. `device` is `None` when the
/// id file cannot be read.
pub fn degraded(device: Option<&str>, error: &crate::error::Error, since: Timestamp) -> Pending {
    pending(
        DEGRADED,
        false,
        json!({
            "kind": DEGRADED,
            "device_id": device,
            "time": Timestamp::now(),
            "since": since,
            "error_kind": error.kind().as_str(),
            "reason": error.to_string(),
            "version": env!("CARGO_PKG_VERSION"),
        }),
    )
}

/// The database could not be used at start and was rebuilt
/// ([`crate::protect`]): `what` says why, where the damaged file went and
/// what was restored.
pub fn database_recovered(device: &str, booted: SlotName, what: &str) -> Pending {
    pending(
        DATABASE_RECOVERED,
        false,
        json!({
            "kind": DATABASE_RECOVERED,
            "device_id": device,
            "time": Timestamp::now(),
            "booted_slot": booted.as_str(),
            "reason": what,
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
/// delivery fields and, for a row with a report counter, the counter,
/// `previous_counter` (the counter of the newest report a server took
/// before this one), the manifest serial it answers, and the device key's
/// signature when the device has a usable key
/// ([`crate::signed_report::seal`]).
pub fn wire_body(e: &OutboxEntry, key: Option<&DeviceKey>, previous: u64) -> Vec<u8> {
    let mut v: Value =
        serde_json::from_slice(e.body.as_bytes()).unwrap_or_else(|_| json!({ "raw": e.body }));
    if let Value::Object(map) = &mut v {
        map.insert("idempotency_key".into(), json!(e.key));
        map.insert("sequence".into(), json!(e.seq));
        map.insert("count".into(), json!(e.count));
        map.insert("first_time".into(), json!(e.created));
        map.insert("last_time".into(), json!(e.updated));
        if let Some(counter) = e.counter {
            map.insert("report_counter".into(), json!(counter));
            map.insert("previous_counter".into(), json!(previous));
            if let Some(serial) = crate::signed_report::manifest_serial(map) {
                map.insert("manifest_serial".into(), json!(serial));
            }
        }
        if let Some(key) = key {
            let sealed = crate::signed_report::seal(std::mem::take(map), key);
            *map = sealed;
        }
    }
    v.to_string().into_bytes()
}

/// Deliver queued reports in order until the outbox is empty or a POST
/// fails, signed with `key` when there is one. Returns how many were
/// delivered.
pub fn deliver(
    store: &Store,
    fetcher: &Fetcher,
    url: &str,
    key: Option<&DeviceKey>,
    ticker: &mut dyn Ticker,
) -> Result<usize> {
    drain(
        store,
        |kind| !is_ddi_kind(kind),
        ("a DDI server", "server.report_url"),
        |e| {
            let body = wire_body(e, key, store.report_counter_delivered()?);
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
                store.outbox_ack_delivered(e.seq, e.counter)?;
            } else {
                log::warn!(
                    "dropping queued {} row {}: it was queued for {}, and this device now reports to {}",
                    e.kind,
                    e.key,
                    servers.0,
                    servers.1
                );
                store.outbox_ack(e.seq)?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(seq: i64, kind: &str, bytes: u64) -> Queued {
        Queued {
            seq,
            kind: kind.to_string(),
            bytes,
        }
    }

    #[test]
    fn a_full_outbox_drops_the_oldest_rows_that_are_not_results() {
        let rows = [
            q(1, INSTALL, 10),
            q(2, HEARTBEAT, 10),
            q(3, STATE, 10),
            q(4, DDI_FEEDBACK, 10),
            q(5, CHECK_FAILED, 10),
            q(6, DDI_PROGRESS, 10),
        ];
        // (max rows, max bytes) → the rows dropped
        let cases: [(u64, u64, &[i64]); 6] = [
            (6, 60, &[]),
            (5, 60, &[2]),
            (4, 60, &[2, 3]),
            (6, 35, &[2, 3, 5]),
            // Only results would be left: they stay, over the bound.
            (1, 60, &[2, 3, 5, 6]),
            (0, 0, &[2, 3, 5, 6]),
        ];
        for (max_rows, max_bytes, want) in cases {
            assert_eq!(
                outbox_excess(&rows, max_rows, max_bytes),
                want,
                "max {max_rows} rows, {max_bytes} bytes"
            );
        }
    }

    #[test]
    fn a_real_outbox_past_its_bound_keeps_its_results_and_counts_the_drops() {
        let dir = crate::test_support::scratch_dir("report", "outbox-bound");
        let store = Store::open(&dir.join("updraft.db")).unwrap();
        let job = crate::test_support::job_into(SlotName::B);
        let result = install_result("dev", SlotName::A, "committed", &job, None);
        store.push_report(&result.as_report()).unwrap();
        for _ in 0..OUTBOX_MAX_ROWS + 10 {
            let s = state_change("dev", SlotName::A, &State::Idle);
            store.push_report(&s.as_report()).unwrap();
        }
        assert_eq!(store.outbox_len().unwrap(), OUTBOX_MAX_ROWS + 11);
        let dropped = bound_outbox(&store).unwrap().unwrap();
        assert_eq!(dropped.rows, 11);
        assert_eq!(dropped.kinds, [STATE]);
        assert_eq!(dropped.total, 11);
        assert_eq!(store.outbox_len().unwrap(), OUTBOX_MAX_ROWS);
        // The result is still the oldest row.
        assert_eq!(store.outbox_peek(1).unwrap()[0].kind, INSTALL);
        assert_eq!(bound_outbox(&store).unwrap(), None);
        // Large rows: the byte bound holds too, and the count goes on.
        let big = "x".repeat(200 * 1024);
        for _ in 0..6 {
            let r = Report {
                key: &new_key(),
                kind: HEARTBEAT,
                foldable: false,
                body: &big,
            };
            store.push_report(&r).unwrap();
        }
        let dropped = bound_outbox(&store).unwrap().unwrap();
        assert!(store.outbox_usage().unwrap().1 <= OUTBOX_MAX_BYTES);
        assert_eq!(dropped.total, 11 + dropped.rows);
        assert_eq!(store.outbox_peek(1).unwrap()[0].kind, INSTALL);
    }
}
