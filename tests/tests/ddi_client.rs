//! updraft as a hawkBit DDI client (`server.kind = "hawkbit"`), against the
//! hawkBit conformance server of the test support: what gooseBit cannot
//! show. The release a deployment names is verified as in static mode;
//! the server only orchestrates. Every feedback body is checked field by
//! field against hawkBit's schema by the server.

use std::time::Duration;

use serde_json::{Value, json};
use updraft::slot::SlotName;
use updraft_tests::ddi_rig::{self, CONTROLLER, DdiAuth, Release, Rig, TOKEN};
use updraft_tests::ddi_server::{
    ActionStatus, Artifact, Auth, Channel, Chunk, DdiServer, Deployment, Execution, Finished,
    Handling, MaintenanceWindow, Origin,
};
use updraft_tests::outage;
use updraft_tests::proxied::wait_downloading;
use updraft_tests::proxy::{Behaviour, Proxy};

const WAIT: Duration = Duration::from_secs(120);
const IMAGE: usize = 3 * 1024 * 1024 + 123;

/// A device in DDI mode polling `server` every second.
fn device(name: &str, server: &DdiServer, auth: DdiAuth, token: &str) -> Rig {
    let mut rig = Rig::new(name);
    let toml = ddi_rig::server_toml(
        &server.base_url(),
        server.tenant(),
        server.ca_file(),
        auth,
        "1s",
    );
    rig.dev.reconfigure(|s| s.server = toml);
    ddi_rig::provision(&rig.dev, token);
    rig.dev.init();
    rig
}

/// A conformance server asking for polls every second, knowing the
/// device's target token.
fn server() -> DdiServer {
    let s = DdiServer::builder("DEFAULT")
        .sleep("00:00:01")
        .start()
        .expect("starting the DDI server");
    s.add_controller(CONTROLLER, TOKEN);
    s
}

fn executions(server: &DdiServer, action: u64) -> Vec<(Execution, Finished)> {
    server
        .feedback(action)
        .iter()
        .filter(|f| f.channel == Channel::Deployment)
        .filter_map(|f| Some((f.execution?, f.finished?)))
        .collect()
}

/// Every feedback the server saw was accepted and broke no rule of the
/// documented schema.
fn assert_conforming(server: &DdiServer) {
    let v = server.violations();
    assert!(v.is_empty(), "schema violations: {v:#?}");
    for f in server.feedback_log() {
        assert!(
            f.accepted() || f.status == 410,
            "feedback answered {}: {:?} {}",
            f.status,
            f.execution,
            String::from_utf8_lossy(&f.body)
        );
    }
}

fn closed_with(server: &DdiServer, action: u64, finished: Finished) -> String {
    let fb = server.feedback(action);
    let last = fb
        .iter()
        .rev()
        .find(|f| f.execution == Some(Execution::Closed))
        .unwrap_or_else(|| panic!("no closed feedback for action {action}: {fb:#?}"));
    assert_eq!(last.finished, Some(finished), "{last:#?}");
    last.details.join("\n")
}

/// The n-th `PUT configData` request's position among all requests, and
/// the position of the first closed feedback of `action`.
///
/// The server records a request once it has answered it, after its
/// handler logged the body: the feedback and configData logs are read
/// first, and again until every entry in them has its request recorded.
fn request_positions(server: &DdiServer, action: u64) -> (Vec<(usize, Option<String>)>, usize) {
    let feedback_path = format!("/deploymentBase/{action}/feedback");
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let versions: Vec<Option<String>> = server
            .config_data_log()
            .iter()
            .map(|c| c.data.get("sw_version").cloned().flatten())
            .collect();
        let log: Vec<_> = server
            .feedback_log()
            .into_iter()
            .filter(|f| f.action_id == Some(action) && f.channel == Channel::Deployment)
            .collect();
        let reqs = server.requests();
        let puts: Vec<usize> = reqs
            .iter()
            .filter(|r| r.method == "PUT" && r.path().ends_with("/configData"))
            .map(|r| r.seq)
            .collect();
        let posts: Vec<usize> = reqs
            .iter()
            .filter(|r| r.method == "POST" && r.path().ends_with(&feedback_path))
            .map(|r| r.seq)
            .collect();
        if posts.len() < log.len() || puts.len() < versions.len() {
            assert!(
                std::time::Instant::now() < deadline,
                "{} feedback and {} configData logged, but only {} and {} requests recorded",
                log.len(),
                versions.len(),
                posts.len(),
                puts.len()
            );
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let closed = log
            .iter()
            .position(|f| f.execution == Some(Execution::Closed))
            .map(|i| posts[i])
            .unwrap_or(usize::MAX);
        return (puts.into_iter().zip(versions).collect(), closed);
    }
}

fn deploy(server: &DdiServer, d: Deployment) {
    server.deploy(CONTROLLER, d);
}

#[test]
fn an_assigned_release_is_installed_and_closed_with_success_only_after_its_commit() {
    let server = server();
    let mut rig = device("ddi-cycle", &server, DdiAuth::TargetToken, TOKEN);
    let rel = rig.publish("1.1", 11, IMAGE, &[]);
    deploy(&server, Deployment::new(1).chunk(rel.chunk()));
    rig.dev.start_daemon();
    rig.dev.wait_reboot_requested(WAIT);
    let st = rig
        .dev
        .wait_for("rebooting", WAIT, |s| s["state"] == json!("rebooting"));
    assert_eq!(st["job"]["ddi"]["id"], json!("1"), "{st:#}");
    assert!(
        server.action(1).active,
        "the action must stay open until the commit"
    );
    let before = executions(&server, 1);
    assert!(
        !before.iter().any(|(e, _)| *e == Execution::Closed),
        "{before:?}"
    );
    assert_eq!(rig.dev.reboot(), SlotName::B);
    rig.dev.start_daemon();
    rig.dev.wait_for("1.1 committed", WAIT, |s| {
        s["state"] == json!("idle") && s["running_version"] == json!("1.1")
    });
    let action = server.wait_for_closed(1, WAIT);
    assert!(action.finished(), "{action:#?}");
    let why = closed_with(&server, 1, Finished::Success);
    assert!(why.starts_with("release 1.1 committed in slot B"), "{why}");
    let seq = executions(&server, 1);
    assert_eq!(
        seq.first(),
        Some(&(Execution::Proceeding, Finished::None)),
        "{seq:?}"
    );
    let downloaded = seq
        .iter()
        .position(|e| *e == (Execution::Downloaded, Finished::None))
        .unwrap_or_else(|| panic!("no downloaded feedback: {seq:?}"));
    assert_eq!(seq.last(), Some(&(Execution::Closed, Finished::Success)));
    assert!(downloaded < seq.len() - 1);
    // Download progress went as percent of the artifact, reaching 100.
    let progress: Vec<_> = server
        .feedback(1)
        .iter()
        .filter_map(|f| f.progress)
        .collect();
    assert!(
        progress
            .iter()
            .all(|p| p.of == Some(100) && p.cnt.is_some_and(|c| (0..=100).contains(&c))),
        "{progress:?}"
    );
    assert!(progress.iter().any(|p| p.cnt == Some(100)), "{progress:?}");
    assert_conforming(&server);
    // The server heard of 1.1 as the running version only after the
    // commit's closed feedback.
    let (puts, closed) = request_positions(&server, 1);
    assert!(!puts.is_empty(), "no configData");
    for (at, version) in &puts {
        if version.as_deref() == Some("1.1") {
            assert!(
                *at > closed,
                "sw_version 1.1 sent before the commit: {puts:?}, closed at {closed}"
            );
        }
    }
    assert_eq!(
        server
            .attributes(CONTROLLER)
            .get("sw_version")
            .map(String::as_str),
        Some("1.1")
    );
    assert_eq!(
        server
            .attributes(CONTROLLER)
            .get("hw_revision")
            .map(String::as_str),
        Some("testboard")
    );
    // Every feedback is signed by the device key the configData and the
    // status name, with counters that only go up; a row sent again after
    // its answer was not taken in (DDI has no idempotency key) repeats
    // its counter byte for byte.
    let hex = server
        .attributes(CONTROLLER)
        .get("device_key")
        .cloned()
        .expect("no device_key in configData");
    let st = rig.dev.status();
    let public = updraft::envelope::decode_base64(
        st["identity"]["public_key"]
            .as_str()
            .expect("no device key in the status"),
        "public_key",
    )
    .unwrap();
    assert_eq!(updraft::hash::hex(&public), hex);
    let key = updraft::trust::PublicKey::from_bytes(&public.try_into().unwrap()).unwrap();
    let mut last = (0, Vec::new());
    for f in server.feedback(1) {
        if f.body == last.1 {
            continue;
        }
        let body: Value = serde_json::from_slice(&f.body).unwrap();
        let signed =
            updraft_publish::reports::check_ddi_feedback("deploymentBase/1/feedback", &body, &key)
                .unwrap_or_else(|e| panic!("feedback {} {e}: {body:#}", f.seq));
        assert!(
            signed.counter > last.0,
            "counter {} after {}",
            signed.counter,
            last.0
        );
        last = (signed.counter, f.body.clone());
    }
    // Every request carried the device's own token; nothing used the
    // plain-http links.
    for r in server.requests_to(Origin::Ddi) {
        assert_eq!(
            r.authorization.as_deref(),
            Some(format!("TargetToken {TOKEN}").as_str()),
            "{r:?}"
        );
    }
    assert!(server.requests_to(Origin::Http).is_empty());
}

#[test]
fn a_failed_health_check_is_closed_with_failure_and_the_image_is_not_taken_again() {
    let server = server();
    let mut rig = device("ddi-rollback", &server, DdiAuth::TargetToken, TOKEN);
    rig.with_marker("1.0");
    rig.dev
        .health_check("10-fails", "echo 'app did not start' >&2; exit 1");
    let rel = rig.publish("1.1", 12, IMAGE, &[]);
    deploy(&server, Deployment::new(1).chunk(rel.chunk()));
    rig.dev.start_daemon();
    rig.dev.wait_reboot_requested(WAIT);
    assert_eq!(rig.dev.reboot(), SlotName::B);
    rig.dev.start_daemon();
    // The failed trial reboots back into A. A poll while that reboot is
    // pending still tells the server about the committed release.
    rig.dev.wait_reboot_requested(WAIT);
    let puts = server.config_data_log().len();
    rig.dev.ok(&["check"]);
    assert!(
        server.wait_until(WAIT, |s| s.config_data_log().len() > puts),
        "no configData from slot B"
    );
    assert_eq!(rig.dev.reboot(), SlotName::A);
    rig.dev.start_daemon();
    let action = server.wait_for_closed(1, WAIT);
    assert_eq!(action.status, ActionStatus::Error, "{action:#?}");
    let why = closed_with(&server, 1, Finished::Failure);
    assert!(why.contains("rolled back"), "{why}");
    // Through the trial boot and after it, the server heard of 1.0 as the
    // running release (named by slot A's marker) and of nothing else.
    let (puts, _) = request_positions(&server, 1);
    assert!(!puts.is_empty(), "no configData");
    assert!(
        puts.iter().all(|(_, v)| v.as_deref() == Some("1.0")),
        "{puts:?}"
    );
    // The same image assigned again is declined without a download.
    let served = server.bytes_served(&artifact_name(&rel));
    deploy(&server, Deployment::new(2).chunk(rel.chunk()));
    server.wait_for_closed(2, WAIT);
    let why = closed_with(&server, 2, Finished::Failure);
    assert!(why.contains("was rolled back before"), "{why}");
    assert_eq!(server.bytes_served(&artifact_name(&rel)), served);
    assert_eq!(rig.dev.booted(), SlotName::A);
    assert_conforming(&server);
}

/// The file name of a release's full artifact as the chunk lists it.
fn artifact_name(rel: &Release) -> String {
    rel.repo
        .artifact()
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[test]
fn a_download_only_action_writes_the_slot_and_a_later_forced_one_switches_without_downloading_again()
 {
    let server = server();
    let mut rig = device("ddi-download-only", &server, DdiAuth::TargetToken, TOKEN);
    let rel = rig.publish("1.1", 13, IMAGE, &[]);
    deploy(
        &server,
        Deployment::new(1).download_only().chunk(rel.chunk()),
    );
    rig.dev.start_daemon();
    let action = server.wait_for_closed(1, WAIT);
    assert_eq!(action.status, ActionStatus::Downloaded, "{action:#?}");
    let st = rig.dev.wait_for("held by the server", WAIT, |s| {
        s["policy"]["waiting_for"] == json!("server")
    });
    assert_eq!(st["state"], json!("installed"), "{st:#}");
    assert!(
        !rig.dev.reboot_marker.exists(),
        "no reboot for a download-only action"
    );
    let served = server.bytes_served(&artifact_name(&rel));
    assert!(served > 0);
    // Feedback after the action closed is answered 410 and counted as
    // delivered: the outbox drains.
    rig.dev
        .wait_for("the outbox drained", WAIT, |s| s["outbox"] == json!(0));
    // An action that installs the same release switches the written slot.
    deploy(&server, Deployment::new(2).chunk(rel.chunk()));
    rig.dev.wait_reboot_requested(WAIT);
    assert_eq!(
        server.bytes_served(&artifact_name(&rel)),
        served,
        "downloaded again"
    );
    assert_eq!(rig.dev.reboot(), SlotName::B);
    rig.dev.start_daemon();
    assert!(server.wait_for_closed(2, WAIT).finished());
    assert_conforming(&server);
}

#[test]
fn a_closed_maintenance_window_holds_the_switch_until_the_server_opens_it() {
    let server = server();
    let mut rig = device("ddi-window", &server, DdiAuth::TargetToken, TOKEN);
    let rel = rig.publish("1.1", 14, IMAGE, &[]);
    deploy(
        &server,
        Deployment::new(1)
            .maintenance_window(MaintenanceWindow::Unavailable)
            .chunk(rel.chunk()),
    );
    rig.dev.start_daemon();
    let st = rig.dev.wait_for("held by the server's window", WAIT, |s| {
        s["state"] == json!("installed") && s["policy"]["waiting_for"] == json!("server")
    });
    assert_eq!(st["job"]["ddi"]["maintenance_window"], json!("unavailable"));
    // Several polls later, still held.
    std::thread::sleep(Duration::from_secs(4));
    assert!(!rig.dev.reboot_marker.exists());
    assert!(server.action(1).active);
    server.set_maintenance_window(1, Some(MaintenanceWindow::Available));
    rig.dev.wait_reboot_requested(WAIT);
    assert_eq!(rig.dev.reboot(), SlotName::B);
    rig.dev.start_daemon();
    assert!(server.wait_for_closed(1, WAIT).finished());
    assert_conforming(&server);
}

#[test]
fn download_skip_starts_nothing_until_the_server_changes_its_mind() {
    let server = server();
    let mut rig = device("ddi-skip", &server, DdiAuth::TargetToken, TOKEN);
    let rel = rig.publish("1.1", 15, IMAGE, &[]);
    deploy(
        &server,
        Deployment::new(1)
            .soft()
            .handling(Handling::Skip, Handling::Skip)
            .chunk(rel.chunk()),
    );
    rig.dev.start_daemon();
    rig.dev.wait_log("download = skip", WAIT);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(server.bytes_served(&artifact_name(&rel)), 0);
    assert_eq!(rig.dev.status()["state"], json!("idle"));
    assert!(executions(&server, 1).is_empty());
    // Polled every second, but the waiting action was read once: each
    // read is an entry in the action's history on a hawkBit server.
    let polls = server
        .requests_to(Origin::Ddi)
        .iter()
        .filter(|r| {
            r.method == "GET" && r.path().ends_with(&format!("/controller/v1/{CONTROLLER}"))
        })
        .count();
    let reads = server
        .requests_to(Origin::Ddi)
        .iter()
        .filter(|r| r.method == "GET" && r.path().ends_with("/deploymentBase/1"))
        .count();
    assert!(polls >= 3, "{polls} polls");
    assert_eq!(
        reads, 1,
        "deploymentBase read {reads} times in {polls} polls"
    );
}

/// A forced action against `policy.switch = "manual"`: the server may skip
/// windows, never the local operator. The release is written and held
/// until `updraft apply`, and the log names who decided.
#[test]
fn a_forced_action_does_not_pass_a_manual_gate() {
    let server = server();
    let mut rig = device("ddi-forced-manual", &server, DdiAuth::TargetToken, TOKEN);
    rig.dev
        .reconfigure(|s| s.policy = "switch = \"manual\"".into());
    let rel = rig.publish("1.1", 31, IMAGE, &[]);
    deploy(&server, Deployment::new(1).chunk(rel.chunk()));
    rig.dev.start_daemon();
    let st = rig.dev.wait_for("written and held", WAIT, |s| {
        s["state"] == json!("installed") && s["policy"]["held_since"].is_string()
    });
    assert_eq!(st["policy"]["waiting_for"], json!("operator"), "{st:#}");
    // Several polls of the forced action later, still held.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(rig.dev.status()["state"], json!("installed"));
    assert_eq!(rig.dev.boot_script(), Some(SlotName::A));
    let log = rig.dev.log();
    assert!(!log.contains("applied by the operator"), "{log}");
    assert!(!log.contains("forced by DDI action"), "{log}");
    // The operator decides.
    rig.dev.ok(&["apply"]);
    rig.dev.wait_reboot_requested(WAIT);
    assert!(
        rig.dev
            .log()
            .contains("applied by the operator (updraft apply)"),
        "{}",
        rig.dev.log_tail()
    );
    assert_eq!(rig.dev.boot_script(), Some(SlotName::B));
}

/// An operator's own install (`updraft install`) is the operator's. A
/// server's action for another release waits for it rather than replacing
/// it, and one for the same release does not take it over: the action is
/// answered once the operator's install has committed, and hears nothing
/// of its download.
#[test]
fn an_operators_install_is_neither_replaced_nor_taken_over_by_a_server_action() {
    let server = server();
    let mut rig = device("ddi-operator-install", &server, DdiAuth::TargetToken, TOKEN);
    let own = rig.publish("1.1", 41, IMAGE, &[]);
    let other = rig.publish("1.2", 42, IMAGE, &[]);
    rig.dev.start_daemon();
    rig.dev.ok(&["install", &own.repo.manifest_str()]);
    // Written and switched in; the reboot waits for the test.
    rig.dev.wait_reboot_requested(WAIT);

    // Another release: the action waits, the operator's job goes on.
    deploy(&server, Deployment::new(1).chunk(other.chunk()));
    rig.dev.wait_log(
        "action 1 waits: the operator's install of release 1.1 is in progress (rebooting)",
        WAIT,
    );
    server.cancel(CONTROLLER, 1);
    server.wait_for_closed(1, WAIT);

    // The same release: not taken over.
    deploy(&server, Deployment::new(2).chunk(own.chunk()));
    rig.dev.wait_log(
        "action 2 waits: the operator's install of release 1.1 is in progress (rebooting)",
        WAIT,
    );
    let st = rig.dev.status();
    assert_eq!(st["job"]["version"], json!("1.1"), "{st:#}");
    assert_eq!(st["job"]["ddi"], Value::Null, "{st:#}");

    assert_eq!(rig.dev.reboot(), SlotName::B);
    rig.dev.start_daemon();
    rig.dev.wait_for("1.1 committed", WAIT, |s| {
        s["state"] == json!("idle") && s["running_version"] == json!("1.1")
    });
    server.wait_for_closed(2, WAIT);
    let why = closed_with(&server, 2, Finished::Success);
    assert!(why.contains("1.1"), "{why}");
    // Action 2 heard nothing of the operator's download: its only feedback
    // is the answer after the commit.
    assert_eq!(
        executions(&server, 2),
        vec![(Execution::Closed, Finished::Success)],
        "{:#?}",
        server.feedback(2)
    );
    assert_eq!(server.bytes_served(&artifact_name(&own)), 0);
    assert_eq!(server.bytes_served(&artifact_name(&other)), 0);
    let log = rig.dev.log();
    assert!(!log.contains("takes over from"), "{log}");
    assert_conforming(&server);
}

/// A black hole in the middle of a download, between the device and the
/// whole server (its API and its downloads): every connection accepted,
/// nothing answered, for longer than eight attempts take (the budget of
/// earlier releases; here with one-second timeouts). The download waits it
/// out, resumes where the verified frames end (at most one frame crosses
/// the network twice), and the release commits. The action hears of the
/// outage as `proceeding` with a note once the network is back, and never
/// of a failure.
#[test]
fn a_black_hole_in_the_middle_of_a_download_is_waited_out_and_never_fails_the_action() {
    let proxy =
        Proxy::start(std::net::SocketAddr::from(([127, 0, 0, 1], 9))).expect("starting the proxy");
    let server = DdiServer::builder("DEFAULT")
        .sleep("00:00:01")
        .ddi_behind(proxy.addr())
        .start()
        .expect("starting the DDI server");
    server.add_controller(CONTROLLER, TOKEN);
    proxy.set_upstream(server.addr(Origin::Ddi));
    // About ten seconds for the artifact, until the network goes.
    proxy.set_default(Behaviour::Drip {
        bytes_per_sec: 400_000,
    });
    let mut rig = device("ddi-black-hole", &server, DdiAuth::TargetToken, TOKEN);
    rig.dev.reconfigure(|s| {
        s.server
            .push_str("stall_timeout = \"1s\"\nconnect_timeout = \"1s\"\n");
    });
    const LARGE: usize = 8 * 1024 * 1024;
    let rel = rig.publish("1.1", 51, LARGE, &[]);
    deploy(&server, Deployment::new(1).chunk(rel.chunk()));
    rig.dev.start_daemon();
    let during = wait_downloading(&rig.dev, 1_500_000, WAIT);
    // The network goes.
    proxy.set_default(Behaviour::Stall);
    proxy.reset_all();
    outage::wait_failed_attempts(&rig.dev, 10, WAIT);
    outage::assert_waiting_for_network(&rig.dev, &during);
    // The network comes back.
    proxy.set_default(Behaviour::Pass);
    rig.dev.wait_reboot_requested(WAIT);
    let st = rig.dev.status();
    assert_eq!(st["job"]["id"], during["job"]["id"], "{st:#}");
    outage::assert_at_most_one_frame_twice(&st, &rel.repo.payload());
    assert_eq!(rig.dev.reboot(), SlotName::B);
    rig.dev.start_daemon();
    rig.dev.wait_for("1.1 committed", WAIT, |s| {
        s["state"] == json!("idle") && s["running_version"] == json!("1.1")
    });
    server.wait_for_closed(1, WAIT);
    closed_with(&server, 1, Finished::Success);
    let seq = executions(&server, 1);
    assert!(
        seq[..seq.len() - 1]
            .iter()
            .all(|(_, f)| *f == Finished::None),
        "{seq:?}"
    );
    let notes: Vec<String> = server
        .feedback(1)
        .iter()
        .filter(|f| f.execution == Some(Execution::Proceeding))
        .flat_map(|f| f.details.clone())
        .filter(|d| d.starts_with("waiting for the network since"))
        .collect();
    assert_eq!(notes.len(), 1, "{:#?}", server.feedback(1));
    assert!(
        notes[0].ends_with("the download resumes when it returns"),
        "{notes:?}"
    );
    assert_conforming(&server);
}

#[test]
fn a_cancel_during_the_download_stops_it_leaves_slot_a_alone_and_is_accepted() {
    let server = server();
    let mut rig = device("ddi-cancel", &server, DdiAuth::TargetToken, TOKEN);
    rig.dev
        .reconfigure(|s| s.policy = "max_rate = \"128K\"".into());
    let before = rig.dev.slot_bytes(SlotName::A);
    let rel = rig.publish("1.1", 16, IMAGE, &[]);
    deploy(&server, Deployment::new(1).chunk(rel.chunk()));
    rig.dev.start_daemon();
    rig.dev
        .wait_for("downloading", WAIT, |s| s["state"] == json!("downloading"));
    server.wait_until(WAIT, |s| {
        s.feedback(1)
            .iter()
            .any(|f| f.progress.is_some_and(|p| p.cnt >= Some(10)))
    });
    server.cancel(CONTROLLER, 1);
    let action = server.wait_for_closed(1, WAIT);
    assert_eq!(action.status, ActionStatus::Canceled, "{action:#?}");
    let st = rig
        .dev
        .wait_for("back to idle", WAIT, |s| s["state"] == json!("idle"));
    assert_eq!(st["last_install"]["result"], json!("cancelled"), "{st:#}");
    let answer: Vec<_> = server
        .feedback(1)
        .into_iter()
        .filter(|f| f.channel == Channel::Cancel)
        .collect();
    assert_eq!(answer.len(), 1, "{answer:#?}");
    assert_eq!(
        (answer[0].execution, answer[0].finished),
        (Some(Execution::Closed), Some(Finished::Success))
    );
    // Stopped part-way: the download never reached its end.
    assert!(
        !server
            .feedback(1)
            .iter()
            .any(|f| f.progress.is_some_and(|p| p.cnt == Some(100))),
        "{:#?}",
        server.feedback(1)
    );
    assert!(
        !executions(&server, 1)
            .iter()
            .any(|(e, _)| *e == Execution::Downloaded),
        "{:?}",
        executions(&server, 1)
    );
    assert_eq!(rig.dev.slot_bytes(SlotName::A), before, "slot A changed");
    assert_eq!(rig.dev.boot_script(), Some(SlotName::A));
    assert!(!rig.dev.reboot_marker.exists());
    assert_conforming(&server);
}

#[test]
fn a_cancel_after_the_reboot_was_requested_is_rejected() {
    let server = server();
    let mut rig = device("ddi-cancel-late", &server, DdiAuth::TargetToken, TOKEN);
    let rel = rig.publish("1.1", 17, IMAGE, &[]);
    deploy(&server, Deployment::new(1).chunk(rel.chunk()));
    rig.dev.start_daemon();
    rig.dev.wait_reboot_requested(WAIT);
    server.cancel(CONTROLLER, 1);
    server.wait_until(WAIT, |s| {
        s.feedback(1).iter().any(|f| f.channel == Channel::Cancel)
    });
    let answer = server
        .feedback(1)
        .into_iter()
        .find(|f| f.channel == Channel::Cancel)
        .expect("a cancel answer");
    assert_eq!(answer.execution, Some(Execution::Rejected), "{answer:#?}");
    assert!(
        answer
            .details
            .join(" ")
            .contains("cannot be cancelled past its switch"),
        "{answer:#?}"
    );
    // hawkBit runs the action again; the device goes on with it.
    assert_eq!(rig.dev.reboot(), SlotName::B);
    rig.dev.start_daemon();
    assert!(server.wait_for_closed(1, WAIT).finished());
    assert_conforming(&server);
}

#[test]
fn a_gateway_token_goes_to_the_ddi_server_and_no_credentials_to_another_origin() {
    let server = DdiServer::builder("DEFAULT")
        .sleep("00:00:01")
        .auth(Auth::GatewayToken("gw-tenant-secret".into()))
        .start()
        .expect("starting the DDI server");
    server.add_controller(CONTROLLER, "unused");
    let mut rig = device(
        "ddi-gateway",
        &server,
        DdiAuth::GatewayToken,
        "gw-tenant-secret",
    );
    let rel = rig.publish("1.1", 18, IMAGE, &[]);
    let mut chunk = Chunk::new("os", "rootfs", "1.1");
    for (rel_path, path) in rel.files() {
        let name = rel_path.rsplit('/').next().unwrap_or(&rel_path).to_string();
        chunk = chunk.artifact(Artifact::named(&name, path).from_cdn());
    }
    deploy(&server, Deployment::new(1).chunk(chunk));
    rig.dev.start_daemon();
    rig.dev.wait_reboot_requested(WAIT);
    let cdn = server.requests_to(Origin::Cdn);
    assert!(!cdn.is_empty(), "nothing fetched from the other origin");
    for r in &cdn {
        assert_eq!(
            r.authorization, None,
            "credentials sent to another origin: {r:?}"
        );
    }
    for r in server.requests_to(Origin::Ddi) {
        assert_eq!(
            r.authorization.as_deref(),
            Some("GatewayToken gw-tenant-secret"),
            "{r:?}"
        );
    }
    assert_conforming(&server);
}

#[test]
fn a_throttled_server_is_polled_again_only_after_its_retry_after() {
    let server = server();
    let mut rig = device("ddi-throttle", &server, DdiAuth::TargetToken, TOKEN);
    let rel = rig.publish("1.1", 19, IMAGE, &[]);
    server.throttle(2, Some(3));
    deploy(&server, Deployment::new(1).chunk(rel.chunk()));
    rig.dev.start_daemon();
    rig.dev.wait_reboot_requested(WAIT);
    let reqs = server.requests_to(Origin::Ddi);
    let throttled: Vec<_> = reqs.iter().filter(|r| r.status == 429).collect();
    assert_eq!(throttled.len(), 2, "{reqs:#?}");
    for t in throttled {
        let next = reqs
            .iter()
            .find(|r| r.seq > t.seq)
            .expect("a request after the 429");
        let gap = next.received.duration_since(t.received).unwrap_or_default();
        assert!(
            gap >= Duration::from_millis(2900),
            "asked again {gap:?} after a 429 with Retry-After: 3"
        );
    }
}

#[test]
fn a_manifest_that_does_not_verify_is_refused_closed_with_failure_and_nothing_is_written() {
    let server = server();
    let mut rig = device("ddi-badsig", &server, DdiAuth::TargetToken, TOKEN);
    let stranger = rig.stranger_key();
    let rel = rig.publish("1.1", 20, IMAGE, &[]);
    rel.repo.resign(&[&stranger], |_| {});
    let snap = rig.dev.snapshot();
    deploy(&server, Deployment::new(1).chunk(rel.chunk()));
    rig.dev.start_daemon();
    server.wait_for_closed(1, WAIT);
    let why = closed_with(&server, 1, Finished::Failure);
    assert!(why.contains("signature"), "{why}");
    assert_eq!(server.bytes_served(&artifact_name(&rel)), 0);
    rig.dev.stop_daemon();
    snap.assert_unchanged(&rig.dev.snapshot());
    assert_conforming(&server);
}

#[test]
fn a_listing_whose_hash_differs_from_the_signed_one_is_refused_before_the_download() {
    let server = server();
    let mut rig = device("ddi-listing", &server, DdiAuth::TargetToken, TOKEN);
    let rel = rig.publish("1.1", 21, IMAGE, &[]);
    let other = rig.publish("9.9", 99, IMAGE, &[]);
    let name = artifact_name(&rel);
    // The chunk lists the artifact's name with another file's bytes (and
    // so another sha256 and size).
    let mut chunk = Chunk::new("os", "rootfs", "1.1");
    for (rel_path, path) in rel.files() {
        let n = rel_path.rsplit('/').next().unwrap_or(&rel_path).to_string();
        let path = if n == name {
            other.repo.artifact()
        } else {
            path
        };
        chunk = chunk.artifact(Artifact::named(&n, path));
    }
    let snap = rig.dev.snapshot();
    deploy(&server, Deployment::new(1).chunk(chunk));
    rig.dev.start_daemon();
    server.wait_for_closed(1, WAIT);
    let why = closed_with(&server, 1, Finished::Failure);
    assert!(why.contains("the signed manifest says"), "{why}");
    assert_eq!(server.bytes_served(&name), 0);
    rig.dev.stop_daemon();
    // The manifest itself verified (its serial is taken, as any verified
    // poll's); nothing was written and nothing switched.
    let after = rig.dev.snapshot();
    assert_eq!((&snap.slot_a, &snap.slot_b), (&after.slot_a, &after.slot_b));
    assert_eq!(
        (&snap.state, &snap.boot_state),
        (&after.state, &after.boot_state)
    );
}

#[test]
fn an_oversized_deployment_is_refused_and_closed_with_failure() {
    let server = server();
    let mut rig = device("ddi-oversized", &server, DdiAuth::TargetToken, TOKEN);
    let rel = rig.publish("1.1", 22, IMAGE, &[]);
    let mut chunk = rel.chunk();
    for i in 0..70 {
        chunk = chunk.artifact(Artifact::named(
            &format!("pad-{i}.bin"),
            rel.repo.manifest(),
        ));
    }
    let snap = rig.dev.snapshot();
    deploy(&server, Deployment::new(1).chunk(chunk));
    rig.dev.start_daemon();
    server.wait_for_closed(1, WAIT);
    let why = closed_with(&server, 1, Finished::Failure);
    assert!(why.contains("at most 64"), "{why}");
    rig.dev.stop_daemon();
    snap.assert_unchanged(&rig.dev.snapshot());
}

#[test]
fn a_hostile_bundle_is_refused_and_closed_with_failure() {
    let server = server();
    let mut rig = device("ddi-bad-bundle", &server, DdiAuth::TargetToken, TOKEN);
    let rel = rig.publish("1.1", 23, IMAGE, &[]);
    let bundle = rel.bundle(&rig.dev.path("release-1.1.updraft"));
    // A name far beyond the cap in the first header: the walker must stop
    // there, naming it.
    let mut bytes = std::fs::read(&bundle).expect("reading the bundle");
    let namesize = b"00100000";
    bytes[94..102].copy_from_slice(namesize);
    let hostile = rig.dev.path("hostile.updraft");
    std::fs::write(&hostile, &bytes).expect("writing the hostile bundle");
    let snap = rig.dev.snapshot();
    deploy(
        &server,
        Deployment::new(1)
            .chunk(Chunk::new("os", "rootfs", "1.1").artifact(Artifact::file(&hostile))),
    );
    rig.dev.start_daemon();
    server.wait_for_closed(1, WAIT);
    let why = closed_with(&server, 1, Finished::Failure);
    assert!(why.contains("bundle"), "{why}");
    rig.dev.stop_daemon();
    snap.assert_unchanged(&rig.dev.snapshot());
}

#[test]
fn a_release_the_device_runs_already_is_closed_with_success_and_nothing_is_written() {
    let server = server();
    let mut rig = device("ddi-factory", &server, DdiAuth::TargetToken, TOKEN);
    // The device was flashed with 1.0: its marker says so.
    let rel = rig.publish("1.0", 24, IMAGE, &[]);
    let payload: Value = rel.repo.payload();
    let marker = rig.dev.path("release");
    std::fs::write(
        &marker,
        format!(
            "UPDRAFT_RELEASE=1.0\nUPDRAFT_IMAGE_SHA256={}\n",
            payload["image"]["sha256"].as_str().expect("image sha256")
        ),
    )
    .expect("writing the release marker");
    let marker_line = format!("release_file = {:?}", marker.display().to_string());
    rig.dev.reconfigure(|s| s.device = marker_line);
    let b_before = rig.dev.slot_bytes(SlotName::B);
    deploy(&server, Deployment::new(1).chunk(rel.chunk()));
    rig.dev.start_daemon();
    assert!(server.wait_for_closed(1, WAIT).finished());
    let why = closed_with(&server, 1, Finished::Success);
    assert!(why.contains("already running"), "{why}");
    assert_eq!(server.bytes_served(&artifact_name(&rel)), 0);
    assert_eq!(rig.dev.slot_bytes(SlotName::B), b_before);
    assert!(!rig.dev.reboot_marker.exists());
    server.wait_until(WAIT, |s| {
        s.attributes(CONTROLLER)
            .get("sw_version")
            .map(String::as_str)
            == Some("1.0")
    });
    assert_eq!(
        server
            .attributes(CONTROLLER)
            .get("sw_version")
            .map(String::as_str),
        Some("1.0")
    );
}

/// Action 1 (release 1.1) installed and committed while the DDI API
/// answers nothing but `429` (with `Retry-After: retry_after` seconds
/// when given); its artifacts come from another origin, so the download
/// goes on. Returns with the device idle on 1.1 and at least three
/// feedback rows queued that the server has not heard.
fn commit_while_the_api_refuses(name: &str, retry_after: Option<u32>) -> (DdiServer, Rig) {
    let server = server();
    let mut rig = device(name, &server, DdiAuth::TargetToken, TOKEN);
    let rel = rig.publish("1.1", 25, IMAGE, &[]);
    // The artifacts come from another origin, so the download goes on
    // while the DDI server itself answers nothing but 429.
    let mut chunk = Chunk::new("os", "rootfs", "1.1");
    for (rel_path, path) in rel.files() {
        let name = rel_path.rsplit('/').next().unwrap_or(&rel_path).to_string();
        let a = Artifact::named(&name, path);
        chunk = chunk.artifact(if name == "manifest.json" {
            a
        } else {
            a.from_cdn()
        });
    }
    deploy(&server, Deployment::new(1).chunk(chunk));
    rig.dev.start_daemon();
    rig.dev.wait_for("downloading", WAIT, |s| {
        s["state"] == json!("downloading") || s["state"] == json!("rebooting")
    });
    server.throttle_origin(Origin::Ddi, u32::MAX, retry_after);
    rig.dev.wait_reboot_requested(WAIT);
    // Power is cut instead of the reboot: nothing queued is lost.
    rig.dev.kill_daemon();
    assert_eq!(rig.dev.boot_script(), Some(SlotName::B));
    rig.dev.reboot_into(SlotName::B);
    rig.dev.start_daemon();
    rig.dev.wait_for("1.1 committed while offline", WAIT, |s| {
        s["state"] == json!("idle") && s["running_version"] == json!("1.1")
    });
    let queued = rig.dev.status()["outbox"].as_u64().unwrap_or(0);
    assert!(queued >= 3, "{queued} rows queued while offline");
    assert!(server.action(1).active, "the server heard nothing yet");
    (server, rig)
}

#[test]
fn feedback_made_while_the_server_was_unreachable_arrives_complete_and_in_order() {
    let (server, rig) = commit_while_the_api_refuses("ddi-offline", None);
    server.throttle_origin(Origin::Ddi, 0, None);
    let action = server.wait_for_closed(1, WAIT);
    assert!(action.finished(), "{action:#?}");
    rig.dev
        .wait_for("the outbox drained", WAIT, |s| s["outbox"] == json!(0));
    let seq: Vec<Execution> = executions(&server, 1).into_iter().map(|(e, _)| e).collect();
    let order = |e: Execution| seq.iter().position(|x| *x == e);
    assert!(
        order(Execution::Downloaded) < order(Execution::Closed),
        "{seq:?}"
    );
    assert_eq!(seq.last(), Some(&Execution::Closed), "{seq:?}");
    assert_eq!(
        seq.iter().filter(|e| **e == Execution::Closed).count(),
        1,
        "{seq:?}"
    );
    // The device's own times, not the delivery's: they never go back.
    let times: Vec<i64> = server
        .feedback(1)
        .iter()
        .filter_map(|f| f.timestamp)
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    let details: Vec<String> = server
        .feedback(1)
        .iter()
        .flat_map(|f| f.details.clone())
        .collect();
    assert!(
        details
            .iter()
            .any(|d| d.contains("booted slot B, running health checks")),
        "{details:#?}"
    );
    assert_conforming(&server);
}

/// A server back from an outage in which it asked for an hour's pause
/// (`Retry-After: 3600`): once it answers a poll, the feedback queued
/// meanwhile follows at once, not an hour later.
#[test]
fn queued_feedback_follows_the_first_poll_the_server_answers() {
    let (server, rig) = commit_while_the_api_refuses("ddi-returns", Some(3600));
    server.throttle_origin(Origin::Ddi, 0, None);
    // The device's own poll timer waits out the hour too: an operator's
    // check is the poll that finds the server back.
    rig.dev.ok(&["check"]);
    let action = server.wait_for_closed(1, Duration::from_secs(20));
    assert!(action.finished(), "{action:#?}");
    rig.dev
        .wait_for("the outbox drained", WAIT, |s| s["outbox"] == json!(0));
    assert!(
        rig.dev
            .log()
            .contains("the server answered a poll: delivering the queued reports now"),
        "{}",
        rig.dev.log_tail()
    );
    assert_conforming(&server);
}

#[test]
fn a_token_file_others_can_read_is_refused_and_never_sent() {
    use std::os::unix::fs::PermissionsExt;
    let server = server();
    let mut rig = device("ddi-token-mode", &server, DdiAuth::TargetToken, TOKEN);
    let token = rig.dev.state_dir.join("ddi-token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).expect("chmod 644");
    rig.dev.start_daemon();
    let st = rig.dev.wait_for("the token refused", WAIT, |s| {
        s["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("has mode 0644") && e.contains("chmod 600"))
    });
    assert_eq!(st["state"], json!("idle"));
    assert!(
        server.requests().is_empty(),
        "a request went out: {:#?}",
        server.requests()
    );
    // Made private, it is used at the next poll without a restart.
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod 600");
    server.wait_until(WAIT, |s| !s.requests().is_empty());
    let first = &server.requests()[0];
    assert_eq!(
        first.authorization.as_deref(),
        Some(format!("TargetToken {TOKEN}").as_str())
    );
}

/// A release of an app in a bundle, the one artifact of a deployment: its
/// slot runs already (the release marker says so), so the app is installed
/// from the bundle's pack without a reboot and the action closed with
/// success.
/// Action `action` closed with success, naming app web `version`, which
/// is active, and no reboot asked for.
fn app_installed_without_a_reboot(server: &DdiServer, rig: &Rig, action: u64, version: &str) {
    use updraft_tests::apps::active_file;
    server.wait_for_closed(action, WAIT);
    let why = closed_with(server, action, Finished::Success);
    assert!(why.contains(&format!("web {version}")), "{why}");
    assert_eq!(
        active_file(&rig.dev, "web", "VERSION").as_deref(),
        Some(version)
    );
    assert!(
        !rig.dev.reboot_marker.exists(),
        "an app release needs no reboot"
    );
}

#[test]
fn an_app_release_in_a_bundle_is_installed_without_a_reboot_and_closed() {
    use updraft_tests::apps::write_tree;
    let server = server();
    let mut rig = device("ddi-app", &server, DdiAuth::TargetToken, TOKEN);
    rig.with_app("1.0", "web");
    let tree = rig.dev.path("web-1.3");
    write_tree(&tree, &[("bin/web", "web binary"), ("VERSION", "1.3")]);
    let rel = rig.publish(
        "1.0",
        31,
        IMAGE,
        &["--app", &format!("web@1.3={}", tree.display())],
    );
    let bundle = rel.bundle(&rig.dev.path("release-1.0.updraft"));
    deploy(
        &server,
        Deployment::new(1)
            .chunk(Chunk::new("os", "rootfs", "1.0").artifact(Artifact::file(&bundle))),
    );
    rig.dev.start_daemon();
    app_installed_without_a_reboot(&server, &rig, 1, "1.3");
    assert_conforming(&server);
    rig.dev.stop_daemon();
}

#[test]
fn a_distribution_set_of_one_module_per_component_installs_only_the_changed_app() {
    use updraft_tests::apps::{active_file, write_tree};
    let server = server();
    let mut rig = device("ddi-modules", &server, DdiAuth::TargetToken, TOKEN);
    rig.with_app("1.0", "web");
    // More files than a hawkBit module holds by default (50): the module
    // carries the app's index and its pack, not a file per blob.
    let with_app = |rig: &Rig, release: &str, app: &str, extra: &[&str]| {
        let tree = rig.dev.path(&format!("web-{app}"));
        let pages: Vec<(String, String)> = (0..120)
            .map(|i| (format!("www/page-{i}.html"), format!("<p>page {i}</p>")))
            .collect();
        let mut files: Vec<(&str, &str)> = pages
            .iter()
            .map(|(p, c)| (p.as_str(), c.as_str()))
            .collect();
        files.extend([("bin/web", "web binary"), ("VERSION", app)]);
        write_tree(&tree, &files);
        let mut flags = vec!["--app".to_string(), format!("web@{app}={}", tree.display())];
        flags.extend(extra.iter().map(|f| f.to_string()));
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        rig.publish(release, 32, IMAGE, &flags)
    };
    let set = |action: u64, chunks: Vec<Chunk>| {
        chunks
            .into_iter()
            .fold(Deployment::new(action), |d, c| d.chunk(c))
    };

    // Release 1.0: module rootfs 1.0 (running already) and module web 1.3.
    let rel = with_app(&rig, "1.0", "1.3", &[]);
    let modules = rel.modules(&rig.dev.path("modules-1.0"));
    assert_eq!(
        modules
            .iter()
            .map(|c| (c.name(), c.artifacts()))
            .collect::<Vec<_>>(),
        [("rootfs", 2), ("web", 2)],
        "manifest.json and the image (the rig's device trusts the release key itself); the index and the pack"
    );
    deploy(&server, set(1, modules));
    rig.dev.start_daemon();
    app_installed_without_a_reboot(&server, &rig, 1, "1.3");

    // Release 1.1 changes the app; a distribution set whose web module is
    // still 1.3 is not the release it carries, and is refused.
    let rel = with_app(&rig, "1.1", "1.4", &["--serial", "2"]);
    let set11 = rel.modules(&rig.dev.path("modules-1.1"));
    let mut stale = set11.clone();
    stale[1] = stale[1].clone().with_version("1.3");
    deploy(&server, set(2, stale));
    server.wait_for_closed(2, WAIT);
    let why = closed_with(&server, 2, Finished::Failure);
    assert!(
        why.contains("software module web is version 1.3") && why.contains("component web 1.4"),
        "{why}"
    );
    assert_eq!(
        active_file(&rig.dev, "web", "VERSION").as_deref(),
        Some("1.3")
    );

    // The right set installs web 1.4 alone, without a reboot.
    deploy(&server, set(3, set11));
    app_installed_without_a_reboot(&server, &rig, 3, "1.4");
    assert_conforming(&server);
    rig.dev.stop_daemon();
}

#[test]
fn a_refused_or_missing_token_says_what_to_check() {
    let server = server();
    // A token the server does not hold for this device: 401, explained.
    let mut rig = device(
        "ddi-token-wrong",
        &server,
        DdiAuth::TargetToken,
        "not-the-token",
    );
    rig.dev.start_daemon();
    let st = rig
        .dev
        .wait_for("the token refused by the server", WAIT, |s| {
            s["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("HTTP status 401"))
        });
    let e = st["last_error"].as_str().unwrap_or_default();
    assert!(
        e.contains("the server refused the token this device sent")
            && e.contains("TargetToken")
            && e.contains("server.token_file")
            && e.contains("server.ddi_auth"),
        "{e}"
    );
    rig.dev.stop_daemon();

    // No token at all under the default ddi_auth: the way to a server
    // without authentication is named.
    let mut rig = device("ddi-token-missing", &server, DdiAuth::TargetToken, TOKEN);
    std::fs::remove_file(rig.dev.state_dir.join("ddi-token")).expect("removing the token");
    rig.dev.start_daemon();
    let st = rig.dev.wait_for("the missing token named", WAIT, |s| {
        s["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("reading server.token_file"))
    });
    let e = st["last_error"].as_str().unwrap_or_default();
    assert!(
        e.contains("No such file") && e.contains("server.ddi_auth = \"none\""),
        "{e}"
    );
    rig.dev.stop_daemon();
}
