//! Offline catch-up: reports are queued in SQLite while the report server is
//! down and delivered in order, exactly once per idempotency key, when it
//! returns; heartbeats made meanwhile are folded, state changes never are.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use updraft_tests::collector::Mode;
use updraft_tests::device::{Device, DeviceSpec};
use updraft_tests::publisher::{image, keygen};
use updraft_tests::server::UpdateServer;
use updraft_tests::tmp::TempDir;

const WAIT: Duration = Duration::from_secs(90);

#[test]
fn reports_made_offline_arrive_in_order_with_heartbeats_folded() {
    updraft_tests::require!("nginx");
    let keys = TempDir::new("outbox-keys");
    let key = keygen(keys.path(), "release");
    let server = UpdateServer::start(&keys.join("site"), true);
    let collector = server.collector.as_ref().unwrap();
    collector.set_mode(Mode::Refusing).unwrap();
    let mut spec = DeviceSpec::simple(&key);
    spec.server = format!(
        "{}heartbeat_interval = \"1s\"\n",
        server.server_toml("2s", "1s")
    );
    let mut dev = Device::new("outbox", spec);
    dev.init();
    dev.start_daemon();
    // Offline: heartbeats pile up, then a whole install happens.
    std::thread::sleep(Duration::from_secs(4));
    let img = dev.path("v1.img");
    image(&img, 2 * 1024 * 1024, 3);
    server.repo.release(&[&key], "1.0", &img, &[]);
    dev.wait_reboot_requested(WAIT);
    std::thread::sleep(Duration::from_secs(3));
    let queued = dev.status()["outbox"].as_u64().unwrap();
    assert!(queued >= 5, "only {queued} reports queued while offline");
    assert_eq!(
        collector.reports().len(),
        0,
        "reports delivered while the server was down"
    );
    // Back online: everything arrives.
    collector.set_mode(Mode::Up).unwrap();
    let t = Instant::now();
    while dev.status()["outbox"].as_u64().unwrap() > 0 {
        assert!(
            t.elapsed() < WAIT,
            "outbox not drained:\n{}",
            dev.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let reports: Vec<Value> = collector
        .unique_reports()
        .iter()
        .map(|r| r.json().unwrap())
        .collect();
    assert!(
        reports.len() as u64 >= queued,
        "{} delivered, {queued} were queued",
        reports.len()
    );
    // In order, no gaps: the outbox sequence numbers are consecutive.
    let seqs: Vec<i64> = reports
        .iter()
        .map(|r| r["sequence"].as_i64().unwrap())
        .collect();
    for w in seqs.windows(2) {
        assert_eq!(w[1], w[0] + 1, "reports out of order or missing: {seqs:?}");
    }
    // Each key once after de-duplication, and every POST carried its key.
    for r in collector.reports() {
        assert!(
            r.idempotency_key.is_some(),
            "a report without Idempotency-Key"
        );
    }
    // The state changes of the install are all there, in order.
    let states: Vec<&str> = reports
        .iter()
        .filter(|r| r["kind"] == json!("state"))
        .filter_map(|r| r["state"].as_str())
        .collect();
    let want = ["downloading", "installing", "installed", "rebooting"];
    let mut it = states.iter();
    for w in want {
        assert!(
            it.any(|s| *s == w),
            "state {w} missing or out of order in {states:?}"
        );
    }
    // Heartbeats made offline were folded: a run of them arrives as one
    // report with a count. (Once online, each heartbeat is sent as it is
    // made, so only the backlog is looked at.)
    let backlog = &reports[..(queued as usize).min(reports.len())];
    let beats: Vec<&Value> = backlog
        .iter()
        .filter(|r| r["kind"] == json!("heartbeat"))
        .collect();
    assert!(!beats.is_empty(), "no heartbeat delivered");
    let folded: i64 = beats.iter().map(|b| b["count"].as_i64().unwrap()).sum();
    assert!(
        folded > beats.len() as i64,
        "heartbeats were not folded: {beats:#?}"
    );
    for w in backlog.windows(2) {
        assert!(
            !(w[0]["kind"] == json!("heartbeat") && w[1]["kind"] == json!("heartbeat")),
            "two consecutive heartbeat rows: folding failed"
        );
    }
    // Online again, each new heartbeat goes out as soon as it is made, not
    // at the next poll or state change.
    let before = collector.reports().len();
    let later = collector.wait_for_reports(before + 2, Duration::from_secs(20));
    let fresh_beats = later[before..]
        .iter()
        .filter(|r| r.json().is_ok_and(|j| j["kind"] == json!("heartbeat")))
        .count();
    assert!(
        fresh_beats >= 2,
        "heartbeats made while online were not delivered: {} new report(s)",
        later.len() - before
    );
    dev.stop_daemon();
}
