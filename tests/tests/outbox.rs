//! Offline catch-up: reports are queued in SQLite while the report server is
//! down and delivered in order, exactly once per idempotency key, when it
//! returns; heartbeats made meanwhile are folded, state changes never are.
//! Every report is signed by the device key with a counter that a crash
//! while reports are queued never reuses, and `updraft-publish
//! verify-reports` accepts what was delivered and refuses it replayed,
//! reordered, with a gap or altered.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use updraft_tests::collector::{Mode, json_lines};
use updraft_tests::publisher::{image, publish};
use updraft_tests::server::ReportingRig;
use updraft_tests::tmp::TempDir;

const WAIT: Duration = Duration::from_secs(90);

#[test]
fn reports_made_offline_arrive_in_order_with_heartbeats_folded() {
    updraft_tests::require!("nginx");
    let rig = ReportingRig::new("outbox");
    let ReportingRig {
        key,
        server,
        mut dev,
        ..
    } = rig;
    let collector = server.collector.as_ref().unwrap();
    collector.set_mode(Mode::Refusing).unwrap();
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

#[test]
fn signed_reports_verify_and_a_crash_never_reuses_a_counter() {
    updraft_tests::require!("nginx");
    let rig = ReportingRig::new("signed-reports");
    let ReportingRig {
        key,
        server,
        mut dev,
        ..
    } = rig;
    let collector = server.collector.as_ref().unwrap();
    collector.set_mode(Mode::Refusing).unwrap();
    dev.start_daemon();
    let img = dev.path("v1.img");
    image(&img, 2 * 1024 * 1024, 5);
    server.repo.release(&[&key], "1.0", &img, &[]);
    dev.wait_reboot_requested(WAIT);
    let st = dev.status();
    assert!(st["outbox"].as_u64().unwrap() >= 3, "{st:#}");
    let public = st["identity"]["public_key"]
        .as_str()
        .unwrap_or_else(|| panic!("no device key in the status: {st:#}"))
        .to_string();
    let human = dev.ok(&["status"]);
    assert!(
        human.contains(&format!("identity:     ed25519 {public}")),
        "{human}"
    );
    // A crash while reports are queued, then more reports: none may take
    // a counter already handed out.
    dev.kill_daemon();
    dev.start_daemon();
    std::thread::sleep(Duration::from_secs(3));
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
    dev.stop_daemon();
    let reports = collector.unique_reports();
    let first = reports[0].json().unwrap();
    assert_eq!(first["device_key"], json!(public), "{first:#}");
    assert_eq!(first["report_counter"], json!(1), "{first:#}");
    let counters: Vec<u64> = reports
        .iter()
        .map(|r| r.json().unwrap()["report_counter"].as_u64().unwrap())
        .collect();
    for w in counters.windows(2) {
        assert_eq!(w[1], w[0] + 1, "counters not consecutive: {counters:?}");
    }
    let installed = reports
        .iter()
        .filter_map(|r| r.json().ok())
        .find(|j| j["kind"] == json!("state") && j["state"] == json!("installed"))
        .expect("no installed state report");
    assert_eq!(installed["manifest_serial"], installed["job"]["serial"]);

    // What was delivered verifies; each kind of tampering is named.
    let dir = TempDir::new("signed-reports");
    let bodies: Vec<&[u8]> = reports.iter().map(|r| r.body.as_slice()).collect();
    let verify = |name: &str, lines: Vec<&[u8]>| {
        let file = dir.join(name);
        std::fs::write(&file, json_lines(lines)).unwrap();
        let out = publish(&[
            "verify-reports",
            "--device-key",
            &public,
            file.to_str().unwrap(),
        ]);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    let (code, text) = verify("delivered.jsonl", bodies.clone());
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains(&format!("{} reports verified", bodies.len())),
        "{text}"
    );

    let mut replayed = bodies.clone();
    replayed.push(bodies[1]);
    let mut reordered = bodies.clone();
    reordered.swap(1, 2);
    let mut gapped = bodies.clone();
    gapped.remove(1);
    let mut altered: serde_json::Value = reports[2].json().unwrap();
    altered["booted_slot"] = json!("B");
    let altered = altered.to_string().into_bytes();
    let mut forged = bodies.clone();
    forged[2] = &altered;
    // (file, its lines, what the refusals say)
    type Case<'a> = (&'a str, Vec<&'a [u8]>, &'a [&'a str]);
    let cases: [Case; 4] = [
        (
            "replayed.jsonl",
            replayed,
            &["counter 2: refused: a replay, counter 2 was accepted in"],
        ),
        (
            "reordered.jsonl",
            reordered,
            &[
                "counter 3: refused: counters 2 to 2 are missing before it",
                "counter 2: refused: out of order, it arrives after counter 3",
            ],
        ),
        (
            "gapped.jsonl",
            gapped,
            &["counter 3: refused: counters 2 to 2 are missing before it"],
        ),
        (
            "forged.jsonl",
            forged,
            &[
                "forged.jsonl:3: refused: it (claiming counter 3) field \"booted_slot\" differs from its signed payload",
            ],
        ),
    ];
    for (name, lines, words) in cases {
        let (code, text) = verify(name, lines);
        assert_eq!(code, Some(1), "{name}: {text}");
        for w in words {
            assert!(text.contains(w), "{name}: no {w:?} in\n{text}");
        }
        assert!(text.contains("reports refused"), "{name}: {text}");
    }
}

#[test]
fn a_damaged_device_key_is_kept_shown_and_reports_go_unsigned() {
    updraft_tests::require!("nginx");
    let rig = ReportingRig::new("damaged-key");
    let ReportingRig {
        server, mut dev, ..
    } = rig;
    let collector = server.collector.as_ref().unwrap();
    let key_file = dev.state_dir.join("device-key.pem");
    let damaged = b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
    std::fs::write(&key_file, damaged).unwrap();
    dev.start_daemon();
    let reports = collector.wait_for_reports(2, WAIT);
    assert!(dev.daemon_running(), "{}", dev.log_tail());
    let st = dev.status();
    let why = st["identity"]["unusable"].as_str().unwrap_or_default();
    assert!(
        why.contains("device-key.pem") && why.contains("PKCS#8"),
        "{st:#}"
    );
    assert!(st["identity"].get("public_key").is_none(), "{st:#}");
    let human = dev.ok(&["status"]);
    assert!(
        human.contains("identity:     unusable: device key "),
        "{human}"
    );
    assert!(
        dev.log().contains("reports are sent unsigned"),
        "{}",
        dev.log_tail()
    );
    for r in &reports {
        let j = r.json().unwrap();
        assert!(j.get("signed").is_none(), "{j:#}");
        assert!(j["report_counter"].as_u64().is_some(), "{j:#}");
    }
    dev.stop_daemon();
    assert_eq!(std::fs::read(&key_file).unwrap(), damaged);
}
