//! Rollback safety: the previous release of updraft runs on the state the
//! current one wrote, and the other way round.
//!
//! A rollback boots the previous release on the data partition the new one
//! has been using, so the database in `state_dir` only ever grows
//! additively. Here one release runs a whole update cycle on a simulated
//! device (nginx over TLS, file-backed slots, the report collector down so
//! reports stay queued in the outbox), then the other release is started on
//! the same `state_dir` and configuration after a reboot into the committed
//! slot: it must accept the database, show the committed slot, its version,
//! the serial, the history and the same outbox, keep its daemon running,
//! and deliver the outbox it was left once the collector is back.
//!
//! The previous release is the commit pinned in `updraft_tests::previous`,
//! built from source on first use (see docs/compatibility.md).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use updraft::hash::Sha256;
use updraft_tests::collector::Mode;
use updraft_tests::device::{Device, DeviceSpec};
use updraft_tests::publisher::{image, keygen};
use updraft_tests::server::UpdateServer;
use updraft_tests::tmp::TempDir;

const WAIT: Duration = Duration::from_secs(90);
const IMAGE: usize = 2 * 1024 * 1024 + 333;
/// How long a daemon must stay up on the other release's state: more than
/// one poll interval (2 s) and one report retry.
const STAY_UP: Duration = Duration::from_secs(5);

/// An updraft release: the workspace's binary or another one.
#[derive(Clone, Debug)]
struct Release {
    name: &'static str,
    exe: Option<PathBuf>,
}

fn current() -> Release {
    Release {
        name: "the current release",
        exe: None,
    }
}

fn previous_release(exe: PathBuf) -> Release {
    Release {
        name: "the previous release",
        exe: Some(exe),
    }
}

#[test]
fn the_previous_release_runs_on_the_state_the_current_one_wrote() {
    updraft_tests::require!("nginx");
    let old = updraft_tests::previous_release!();
    hand_over("new-to-old", current(), previous_release(old));
}

#[test]
fn the_current_release_runs_on_the_state_the_previous_one_wrote() {
    updraft_tests::require!("nginx");
    let old = updraft_tests::previous_release!();
    hand_over("old-to-new", previous_release(old), current());
}

/// `first` runs an update cycle to a committed release with reports queued
/// and undelivered; after a reboot into the committed slot `second` takes
/// over the same device.
fn hand_over(name: &str, first: Release, second: Release) {
    let keys = TempDir::new(&format!("{name}-keys"));
    let key = keygen(keys.path(), "release");
    let mut dev = Device::new(name, DeviceSpec::simple(&key));
    let server = UpdateServer::start(&dev.path("site"), true);
    let collector = server.collector.as_ref().expect("a report collector");
    collector
        .set_mode(Mode::Refusing)
        .expect("taking the collector offline");
    let server_toml = server.server_toml("2s", "1s");
    dev.reconfigure(|s| s.server = server_toml);

    // ---- the first release: a whole update cycle, reports kept offline.
    dev.use_binary(first.exe.clone());
    dev.init();
    let img = dev.path("1.0.img");
    let bytes = image(&img, IMAGE, 11);
    let image_sha = Sha256::of(&bytes).to_string();
    server.repo.release(&[&key], "1.0", &img, &[]);
    dev.start_daemon();
    dev.wait_reboot_requested(WAIT);
    dev.wait_for("the rebooting state", WAIT, |s| {
        s["state"] == json!("rebooting")
    });
    assert_eq!(dev.reboot().as_str(), "B", "the trial boot did not pick B");
    dev.start_daemon();
    dev.wait_for("release 1.0 committed", WAIT, |s| {
        s["state"] == json!("idle") && s["running_version"] == json!("1.0")
    });
    dev.stop_daemon();

    let written = status(&dev, &first);
    assert_committed(&written, &image_sha, &first);
    let queued = written["outbox"].as_u64().expect("outbox count");
    assert!(
        queued >= 5,
        "{}: only {queued} report(s) queued for a whole update cycle offline",
        first.name
    );
    assert!(
        collector.reports().is_empty(),
        "reports reached the collector while it was offline"
    );
    let db = Db::read(&dev.state_dir.join("updraft.db"));
    db.assert_matches(&written, &image_sha, &first);
    let history = dev.ok(&["history", "--json"]);
    assert!(
        history.contains("\"committed\""),
        "{}: no committed event in the history:\n{history}",
        first.name
    );

    // ---- a reboot into the committed slot, now running the other release.
    assert_eq!(dev.reboot().as_str(), "B", "the boot script left slot B");
    let tries_after_boot = dev.boot_vars();
    dev.use_binary(second.exe.clone());

    let read = status(&dev, &second);
    assert_committed(&read, &image_sha, &second);
    for field in [
        "state",
        "device_id",
        "booted_slot",
        "running_version",
        "serial",
        "keys_version",
        "outbox",
    ] {
        assert_eq!(
            read[field], written[field],
            "{} reads {field} differently from what {} wrote",
            second.name, first.name
        );
    }
    for i in 0..2 {
        for field in ["slot", "version", "sha256"] {
            assert_eq!(
                read["slots"][i][field], written["slots"][i][field],
                "{} reads slot {i}'s {field} differently from what {} wrote",
                second.name, first.name
            );
        }
    }
    assert_eq!(
        dev.ok(&["history", "--json"]),
        history,
        "{} reads another history than {} wrote",
        second.name,
        first.name
    );
    let reread = Db::read(&dev.state_dir.join("updraft.db"));
    assert_eq!(
        reread.meta.get("schema_version"),
        db.meta.get("schema_version"),
        "{} changed the schema version by reading the database",
        second.name
    );

    // ---- the other release's daemon comes up on that state and stays up.
    let log_before = dev.log().len();
    dev.start_daemon();
    let pid = dev.daemon_pid().expect("the daemon's pid");
    // Every boot on the committed slot marks it good again: the counter the
    // boot script spent is restored, from the slot records it was left.
    let st = dev.wait_for("slot B marked good again", WAIT, |s| {
        s["slots"][1]["tries_left"] == json!(3) && s["next_boot"] == json!("B")
    });
    assert_ne!(
        tries_after_boot.get("BOOT_B_LEFT").map(String::as_str),
        Some("3"),
        "the boot script did not count the boot, so marking good proves nothing: {tries_after_boot:?}"
    );
    assert_eq!(st["state"], json!("idle"), "{st:#}");
    // A poll finds the manifest it already accepted: the serial and the
    // running release were read from the database.
    let check = dev.ok(&["check"]);
    assert!(
        check.contains("manifest serial 1 is unchanged; release 1.0 is running"),
        "{} after {}: check said {check:?}",
        second.name,
        first.name
    );
    let started = Instant::now();
    while started.elapsed() < STAY_UP {
        assert!(
            dev.daemon_running(),
            "the daemon of {} exited on the state {} wrote:\n{}",
            second.name,
            first.name,
            dev.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let st = dev.status();
    assert!(
        st["last_check"].is_string(),
        "status did not come from a running daemon: {st:#}"
    );
    assert!(
        st["outbox"].as_u64().expect("outbox count") >= queued,
        "{} lost queued reports while the collector was offline: {st:#}",
        second.name
    );

    // ---- the collector is back: the outbox the first release left is
    // delivered, in order.
    collector.set_mode(Mode::Up).expect("the collector back up");
    dev.wait_for("the outbox delivered", WAIT, |s| s["outbox"] == json!(0));
    let delivered: Vec<String> = collector
        .unique_reports()
        .iter()
        .filter_map(|r| r.idempotency_key.clone())
        .collect();
    let position: HashMap<&str, usize> = delivered
        .iter()
        .enumerate()
        .map(|(i, k)| (k.as_str(), i))
        .collect();
    let mut last = None;
    for key in &db.outbox_keys {
        let Some(&at) = position.get(key.as_str()) else {
            panic!(
                "{} did not deliver report {key} that {} queued; delivered: {delivered:?}",
                second.name, first.name
            );
        };
        assert!(
            last < Some(at),
            "{} delivered the queued reports out of order: {delivered:?}",
            second.name
        );
        last = Some(at);
    }
    assert!(
        dev.daemon_running(),
        "the daemon of {} exited:\n{}",
        second.name,
        dev.log_tail()
    );
    assert_eq!(dev.daemon_pid(), Some(pid), "the daemon was restarted");
    // SIGTERM, by its pid.
    dev.stop_daemon();
    let log = dev.log();
    let errors: Vec<&str> = log
        .get(log_before..)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("<3>") || l.contains("Z ERROR "))
        .collect();
    assert!(
        errors.is_empty(),
        "the daemon of {} logged errors on the state {} wrote:\n{}",
        second.name,
        first.name,
        errors.join("\n")
    );
}

/// `updraft status --json` without a daemon, by `release`.
fn status(dev: &Device, release: &Release) -> Value {
    let out = dev.updraft(&["status", "--json"]);
    assert!(
        out.status.success(),
        "{} refused the database ({}):\n{}",
        release.name,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("status --json is JSON")
}

/// Release 1.0 is committed in slot B, serial 1, and booted.
fn assert_committed(st: &Value, image_sha: &str, release: &Release) {
    let who = release.name;
    assert_eq!(st["state"], json!("idle"), "{who}: {st:#}");
    assert_eq!(st["booted_slot"], json!("B"), "{who}: {st:#}");
    assert_eq!(st["running_version"], json!("1.0"), "{who}: {st:#}");
    assert_eq!(st["slots"][1]["slot"], json!("B"), "{who}: {st:#}");
    assert_eq!(st["slots"][1]["version"], json!("1.0"), "{who}: {st:#}");
    assert_eq!(st["slots"][1]["sha256"], json!(image_sha), "{who}: {st:#}");
    assert_eq!(st["serial"], json!(1), "{who}: {st:#}");
    assert!(st["outbox"].is_u64(), "{who}: {st:#}");
}

/// What the database holds, read directly.
struct Db {
    meta: HashMap<String, String>,
    slots: HashMap<String, (String, String, i64)>,
    state: Value,
    outbox_keys: Vec<String>,
}

impl Db {
    fn read(path: &Path) -> Db {
        let conn =
            rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
        let meta = conn
            .prepare("SELECT key, value FROM meta")
            .and_then(|mut s| {
                s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<HashMap<String, String>, _>>()
            })
            .expect("reading meta");
        let slots = conn
            .prepare("SELECT name, version, sha256, size FROM slots")
            .and_then(|mut s| {
                s.query_map([], |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?, r.get(3)?))))?
                    .collect::<Result<HashMap<String, (String, String, i64)>, _>>()
            })
            .expect("reading slots");
        let body: String = conn
            .query_row("SELECT body FROM state WHERE id = 1", [], |r| r.get(0))
            .expect("reading the state");
        let state = serde_json::from_str(&body).expect("the state is JSON");
        let outbox_keys = conn
            .prepare("SELECT key FROM outbox ORDER BY seq")
            .and_then(|mut s| {
                s.query_map([], |r| r.get(0))?
                    .collect::<Result<Vec<String>, _>>()
            })
            .expect("reading the outbox");
        Db {
            meta,
            slots,
            state,
            outbox_keys,
        }
    }

    /// The database says what status said: schema, serial, the committed
    /// slot's record, the outbox.
    fn assert_matches(&self, st: &Value, image_sha: &str, release: &Release) {
        let who = release.name;
        let schema: i64 = self
            .meta
            .get("schema_version")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{who}: no numeric schema_version in meta: {:?}", self.meta));
        assert!(schema >= 1, "{who}: schema_version {schema}");
        assert_eq!(
            self.meta.get("serial").map(String::as_str),
            Some("1"),
            "{who}: meta serial"
        );
        let b = self
            .slots
            .get("B")
            .unwrap_or_else(|| panic!("{who}: no record of slot B: {:?}", self.slots));
        assert_eq!(b.0, "1.0", "{who}: slot B's version");
        assert_eq!(b.1, image_sha, "{who}: slot B's image hash");
        assert_eq!(b.2, IMAGE as i64, "{who}: slot B's image size");
        assert_eq!(
            self.state["state"],
            json!("idle"),
            "{who}: persisted state {}",
            self.state
        );
        assert_eq!(
            Some(self.outbox_keys.len() as u64),
            st["outbox"].as_u64(),
            "{who}: outbox rows against status"
        );
    }
}

/// A slot the current release holds for the policy (written, verified,
/// waiting for `updraft apply`): the previous release knows the switch
/// gate and the hold, keeps the slot out of the boot order under the same
/// configuration, and switches it when the operator applies it, as
/// docs/compatibility.md says.
#[test]
fn the_previous_release_keeps_a_held_slot_held_until_updraft_apply() {
    updraft_tests::require!("nginx");
    let old = updraft_tests::previous_release!();
    let ps = updraft_tests::proxied::ProxiedServer::start("held-to-old", false);
    ps.publish("1.0", 41, IMAGE, &[]);
    let mut spec = ps.device_spec("1h", "");
    spec.policy = "switch = \"manual\"\n".into();
    let mut dev = Device::new("held-to-old", spec);
    dev.init();
    dev.start_daemon();
    let held = dev.wait_for("a release held for `updraft apply`", WAIT, |s| {
        s["state"] == json!("installed") && s["policy"]["held_since"].is_string()
    });
    assert_eq!(held["next_boot"], json!("A"), "{held:#}");
    dev.stop_daemon();
    dev.use_binary(Some(old));
    dev.start_daemon();
    let st = dev.wait_for("the previous release holding the slot", WAIT, |s| {
        s["state"] == json!("installed") && s["policy"]["held_since"].is_string()
    });
    assert_eq!(st["next_boot"], json!("A"), "{st:#}");
    assert_eq!(st["job"]["id"], held["job"]["id"], "{st:#}");
    assert!(!dev.reboot_marker.exists(), "the previous release rebooted");
    dev.ok(&["apply"]);
    dev.wait_reboot_requested(WAIT);
    let st = dev.status();
    assert_eq!(st["state"], json!("rebooting"), "{st:#}");
    assert_eq!(st["next_boot"], json!("B"), "{st:#}");
    dev.stop_daemon();
}

#[test]
fn the_previous_release_switches_a_slot_inhibitors_hold() {
    updraft_tests::require!("nginx");
    let old = updraft_tests::previous_release!();
    let ps = updraft_tests::proxied::ProxiedServer::start("inhibited-to-old", false);
    ps.publish("1.0", 42, IMAGE, &[]);
    let spec = ps.device_spec("1h", "");
    let mut dev = Device::new("inhibited-to-old", spec);
    let dir = dev.own_inhibitors("");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("backup"), "copying\n").unwrap();
    dev.init();
    dev.start_daemon();
    let st = dev.wait_for("a release inhibitors hold", WAIT, |s| {
        s["policy"]["waiting_for"] == json!("inhibitor")
    });
    assert!(st["job"]["inhibited"].is_string(), "{st:#}");
    dev.stop_daemon();
    dev.reconfigure(|s| s.policy.clear());
    dev.use_binary(Some(old));
    dev.start_daemon();
    dev.wait_reboot_requested(WAIT);
    assert_eq!(dev.status()["next_boot"], json!("B"));
    dev.stop_daemon();
}

#[test]
fn the_previous_release_settles_a_job_the_current_one_cancelled() {
    updraft_tests::require!("nginx");
    let old = updraft_tests::previous_release!();
    let ps = updraft_tests::proxied::ProxiedServer::start("cancelled-to-old", false);
    ps.publish("1.0", 43, IMAGE, &[]);
    let mut spec = ps.device_spec("1h", "");
    spec.policy = "switch = \"manual\"\n".into();
    let mut dev = Device::new("cancelled-to-old", spec);
    dev.init();
    dev.start_daemon();
    dev.wait_for("a release held for `updraft apply`", WAIT, |s| {
        s["state"] == json!("installed") && s["policy"]["held_since"].is_string()
    });
    dev.ok(&["cancel"]);
    dev.wait_for("the cancelled job settled", WAIT, |s| {
        s["state"] == json!("idle") && s["last_install"]["result"] == json!("cancelled")
    });
    dev.stop_daemon();
    dev.reconfigure(|s| s.policy.clear());
    dev.use_binary(Some(old));
    // Offline, then with its daemon: the state, the history with its
    // `cancelled` line, and the boot selection read as they are.
    let st = dev.status();
    assert_eq!(st["state"], json!("idle"), "{st:#}");
    assert_eq!(st["next_boot"], json!("A"), "{st:#}");
    let history = dev.ok(&["history"]);
    assert!(history.contains("cancelled"), "{history}");
    // Its daemon comes up and stays up. It does not know the cancel, so
    // its first poll may install the release again (compatibility.md).
    dev.start_daemon();
    std::thread::sleep(Duration::from_secs(2));
    assert!(dev.daemon_running(), "{}", dev.log_tail());
    dev.stop_daemon();
}

/// A release of components left stored state the previous release never
/// knew: `component.<name>` keys, a slot job carrying `components` and its
/// manifest of version 2 beside `job_manifest`. The previous release reads
/// the status offline, its daemon comes up and waits for the reboot the
/// job asked for, and after it commits the slot, refusing the manifests
/// of version 2 it polls meanwhile.
#[test]
fn the_previous_release_runs_a_slot_job_a_release_of_components_started() {
    updraft_tests::require!("nginx");
    let old = updraft_tests::previous_release!();
    let ps = updraft_tests::proxied::ProxiedServer::start("components-to-old", false);
    let trees = TempDir::new("components-to-old-trees");
    let web = |v: &str| {
        let dir = trees.join(format!("web-{v}"));
        updraft_tests::apps::write_tree(&dir, &[("VERSION", v)]);
        format!("web@{v}={}", dir.display())
    };
    ps.publish("1.0", 44, IMAGE, &["--app", &web("1.0")]);
    let mut dev = updraft_tests::apps::app_device(&ps, "components-to-old", "1.0", "web");
    dev.start_daemon();
    updraft_tests::proxied::wait_history(&dev, "release 1.0 committed", WAIT, |e| {
        e["event"] == json!("committed") && e["release"] == json!("1.0")
    });
    let image = ps.publish("2.0", 45, IMAGE, &["--app", &web("2.0")]);
    dev.wait_reboot_requested(WAIT);
    dev.stop_daemon();
    assert_eq!(dev.status()["job"]["components"][0]["name"], json!("web"));
    // The previous release's image carries its own configuration.
    dev.reconfigure(|s| s.sections.clear());
    dev.use_binary(Some(old));
    let st = dev.status();
    assert_eq!(st["state"], json!("rebooting"), "{st:#}");
    assert_eq!(st["job"]["version"], json!("2.0"), "{st:#}");
    dev.start_daemon();
    std::thread::sleep(STAY_UP);
    assert!(dev.daemon_running(), "{}", dev.log_tail());
    assert_eq!(dev.reboot(), updraft::slot::SlotName::B);
    dev.start_daemon();
    let st = dev.wait_for("the previous release committing 2.0", WAIT, |s| {
        s["state"] == json!("committed") || s["last_install"]["result"] == json!("committed")
    });
    assert_eq!(st["running_version"], json!("2.0"), "{st:#}");
    assert_eq!(
        &dev.slot_bytes(updraft::slot::SlotName::B)[..image.len()],
        &image[..]
    );
    std::thread::sleep(STAY_UP);
    assert!(dev.daemon_running(), "{}", dev.log_tail());
    dev.stop_daemon();
}
