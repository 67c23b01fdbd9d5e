//! Fleet-scale behaviour: jittered first polls, staged rollout, and the
//! promise that the daemon never listens on the network.

use std::process::Command;
use std::time::{Duration, SystemTime};

use serde_json::json;
use updraft_tests::device::{Device, DeviceSpec};
use updraft_tests::publisher::{image, keygen};
use updraft_tests::server::UpdateServer;
use updraft_tests::tmp::TempDir;

/// 50 agents started together spread their first polls over the jitter
/// window instead of arriving at once.
#[test]
fn fifty_agents_spread_their_first_polls_over_the_jitter_window() {
    updraft_tests::require!("nginx");
    const AGENTS: usize = 50;
    const WINDOW: f64 = 10.0;
    let keys = TempDir::new("fleet50-keys");
    let key = keygen(keys.path(), "release");
    let server = UpdateServer::start(&keys.join("site"), false);
    let img = keys.join("v1.img");
    image(&img, 256 * 1024, 5);
    // Not for these devices: each polls once, finds nothing to do, and waits
    // an hour.
    server
        .repo
        .release(&[&key], "1.0", &img, &["--rollout", "0"]);
    // Each device polls its own copy of the manifest, so the access log
    // tells the devices apart.
    let mut devices: Vec<Device> = (0..AGENTS)
        .map(|i| {
            let dir = server.repo.dir.join(format!("dev-{i}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::copy(server.repo.manifest(), dir.join("manifest.json")).unwrap();
            let mut spec = DeviceSpec::simple(&key);
            spec.slot_size = 1024 * 1024;
            spec.server = server
                .server_toml("1h", "10s")
                .replace("/manifest.json", &format!("/dev-{i}/manifest.json"));
            let d = Device::new(&format!("fleet50-{i}"), spec);
            d.init();
            d
        })
        .collect();
    let mut started = Vec::new();
    for d in devices.iter_mut() {
        started.push(SystemTime::now());
        d.start_daemon();
    }
    let log = server
        .nginx
        .wait_access_log(Duration::from_secs(60), |l| {
            l.iter()
                .filter(|e| e.uri.ends_with("/manifest.json"))
                .count()
                >= AGENTS
        })
        .expect("reading the access log");
    let mut delays = Vec::new();
    for (i, t0) in started.iter().enumerate() {
        let uri = format!("/dev-{i}/manifest.json");
        let polls: Vec<_> = log.iter().filter(|e| e.uri == uri).collect();
        assert_eq!(polls.len(), 1, "device {i} polled {} times", polls.len());
        delays.push(
            polls[0]
                .time
                .duration_since(*t0)
                .unwrap_or_default()
                .as_secs_f64(),
        );
    }
    let mut sorted = delays.clone();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
    eprintln!(
        "{AGENTS} daemons: first poll {:.2} s to {:.2} s after start (median {:.2} s)",
        sorted[0],
        sorted[AGENTS - 1],
        sorted[AGENTS / 2]
    );
    assert!(
        sorted[AGENTS - 1] <= WINDOW + 5.0,
        "a first poll came long after the jitter window"
    );
    let mut bins = [0usize; 5];
    for t in &delays {
        bins[((t / (WINDOW / 5.0)) as usize).min(4)] += 1;
    }
    eprintln!("first polls per 2 s of the 10 s window: {bins:?}");
    // Uniform over the window: 10 expected per bin; fewer than 3 in a bin
    // would be a one-in-a-thousand event for a uniform spread.
    for (i, n) in bins.iter().enumerate() {
        assert!(
            *n >= 3,
            "only {n} first polls {}..{} s after start: {bins:?}",
            i * 2,
            i * 2 + 2
        );
    }
    for d in devices.iter_mut() {
        d.stop_daemon();
    }
}

/// A 10 % rollout selects about 100 of 1,000 devices, the same ones every
/// time; growing it only adds devices; another release picks others.
#[test]
fn a_ten_percent_rollout_selects_about_a_tenth_deterministically() {
    let ids: Vec<String> = (0..1000)
        .map(|i| format!("{:032x}", (i as u128) * 0x9e37_79b9_7f4a_7c15))
        .collect();
    let pick = |version: &str, p: f64| -> Vec<bool> {
        ids.iter()
            .map(|id| updraft::rollout::eligible(id, version, p))
            .collect()
    };
    let first = pick("2.0", 10.0);
    let n = first.iter().filter(|b| **b).count();
    eprintln!("10 % rollout selected {n} of 1000 devices");
    // Binomial(1000, 0.1): mean 100, sd 9.5; 70..130 is beyond 3 sd.
    assert!((70..=130).contains(&n), "{n} of 1000 selected at 10 %");
    assert_eq!(first, pick("2.0", 10.0), "the same devices every time");
    let twenty = pick("2.0", 20.0);
    assert!(
        first.iter().zip(&twenty).all(|(a, b)| !a || *b),
        "raising the share dropped a device"
    );
    let other = pick("2.1", 10.0);
    let overlap = first.iter().zip(&other).filter(|(a, b)| **a && **b).count();
    assert!(
        overlap < n / 2,
        "release 2.1 picked mostly the same devices ({overlap} of {n})"
    );
}

/// A device outside the rollout does not install; at 100 % it does.
#[test]
fn a_device_outside_the_rollout_waits() {
    updraft_tests::require!("nginx");
    let keys = TempDir::new("rollout-keys");
    let key = keygen(keys.path(), "release");
    let server = UpdateServer::start(&keys.join("site"), false);
    let img = keys.join("v1.img");
    image(&img, 1024 * 1024, 5);
    server
        .repo
        .release(&[&key], "1.0", &img, &["--rollout", "0"]);
    let mut spec = DeviceSpec::simple(&key);
    spec.server = server.server_toml("1h", "1s");
    let mut dev = Device::new("rollout", spec);
    dev.init();
    dev.start_daemon();
    server
        .nginx
        .wait_access_log(Duration::from_secs(30), |l| {
            l.iter().any(|e| e.uri == "/manifest.json")
        })
        .unwrap();
    let out = dev.ok(&["check"]);
    assert!(out.contains("this device is not selected"), "{out}");
    assert_eq!(dev.status()["state"], json!("idle"));
    server
        .repo
        .release(&[&key], "1.0", &img, &["--rollout", "100"]);
    let out = dev.ok(&["check"]);
    assert!(out.contains("installing release 1.0"), "{out}");
    dev.wait_reboot_requested(Duration::from_secs(60));
}

/// `ss -ltnup` shows no listening TCP or UDP socket of the daemon, while
/// idle and while downloading.
#[test]
fn the_daemon_never_listens_on_the_network() {
    updraft_tests::require!("nginx", "ss");
    let keys = TempDir::new("nolisten-keys");
    let key = keygen(keys.path(), "release");
    let server = UpdateServer::start(&keys.join("site"), true);
    let img = keys.join("v1.img");
    image(&img, 4 * 1024 * 1024, 5);
    let mut spec = DeviceSpec::simple(&key);
    spec.server = server.server_toml("2s", "1s");
    let mut dev = Device::new("nolisten", spec);
    dev.init();
    dev.start_daemon();
    let pid = dev.daemon_pid().expect("daemon pid");
    let listening = || -> Vec<String> {
        let out = Command::new("ss")
            .args(["-ltnup"])
            .output()
            .expect("running ss (iproute2)");
        assert!(
            out.status.success(),
            "ss failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains(&format!("pid={pid},")))
            .map(str::to_string)
            .collect()
    };
    // While idle and polling.
    server
        .nginx
        .wait_access_log(Duration::from_secs(30), |l| {
            l.iter().any(|e| e.uri == "/manifest.json")
        })
        .unwrap();
    assert_eq!(
        listening(),
        Vec::<String>::new(),
        "the daemon listens while idle"
    );
    // While installing.
    server.repo.release(&[&key], "1.0", &img, &[]);
    let mut seen_busy = false;
    let t = std::time::Instant::now();
    while !dev.reboot_marker.exists() && t.elapsed() < Duration::from_secs(60) {
        let st = dev.status();
        seen_busy |= st["state"] != json!("idle");
        assert_eq!(
            listening(),
            Vec::<String>::new(),
            "the daemon listens in state {}",
            st["state"]
        );
    }
    assert!(
        dev.reboot_marker.exists(),
        "the release was not installed:\n{}",
        dev.log_tail()
    );
    let _ = seen_busy;
    // Its only socket it accepts on is the local control socket.
    let out = Command::new("ss").args(["-lxp"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mine: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(&format!("pid={pid},")))
        .collect();
    assert_eq!(
        mine.len(),
        1,
        "expected exactly the control socket: {mine:?}"
    );
    assert!(mine[0].contains(dev.socket.to_str().unwrap()), "{mine:?}");
}
