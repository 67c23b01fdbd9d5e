//! A neighbour that can write a directory the root daemon writes to: the
//! node-exporter textfile directory, shared with other collectors. Whatever
//! an unprivileged account plants there — a symbolic link where the metrics
//! file goes, links and FIFOs under every temporary name a PID could give —
//! no file outside the directory changes and the daemon keeps running.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

use updraft_tests::device::{Device, DeviceSpec};
use updraft_tests::publisher::keygen;
use updraft_tests::server::UpdateServer;
use updraft_tests::skip::is_root;
use updraft_tests::tmp::TempDir;

/// The account the plants are made as (Debian's `nobody`).
const NOBODY: u32 = 65534;

#[test]
fn plants_in_a_shared_metrics_directory_change_nothing_outside_it() {
    updraft_tests::require!("nginx", "python3");
    if !is_root() {
        updraft_tests::skip!("needs root to plant files as another account");
    }
    let keys = TempDir::new("neighbour-keys");
    let key = keygen(keys.path(), "release");
    let server = UpdateServer::start(&keys.join("site"), false);
    // Nobody must reach it: the scratch directory is root's, mode 0700.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(keys.path(), std::fs::Permissions::from_mode(0o755))
        .expect("opening the scratch directory");
    // The shared directory: nobody's, which root may write too.
    let shared = keys.join("textfile");
    std::fs::create_dir(&shared).expect("making the shared directory");
    std::os::unix::fs::chown(&shared, Some(NOBODY), Some(NOBODY)).expect("chown");
    let metrics = shared.join("updraft.prom");
    // What root owns outside it, and must not change.
    let victim = keys.join("victim.db");
    std::fs::write(&victim, b"precious").expect("writing the victim");
    let mut spec = DeviceSpec::simple(&key);
    spec.server = server.server_toml("1s", "200ms");
    spec.system = format!("metrics_file = {metrics:?}\n");
    let mut dev = Device::new("neighbour", spec);
    dev.init();

    // As nobody: the metrics file's name is a link to the victim, and the
    // temporary names of the next thousand PIDs (the naming of earlier
    // releases) are links to it or FIFOs.
    let last_pid: u32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1000);
    let plant = format!(
        "import os\n\
         d, v = {shared:?}, {victim:?}\n\
         os.symlink(v, os.path.join(d, 'updraft.prom'))\n\
         for p in range({first}, {last}):\n\
         \x20   n = os.path.join(d, '.updraft.prom.tmp.%d' % p)\n\
         \x20   os.mkfifo(n) if p % 2 else os.symlink(v, n)\n",
        first = last_pid,
        last = last_pid + 1000,
    );
    let status = Command::new("python3")
        .args(["-c", &plant])
        .uid(NOBODY)
        .gid(NOBODY)
        .status()
        .expect("running python3 as nobody");
    assert!(status.success(), "planting as nobody failed: {status}");

    dev.start_daemon();
    // Several polls, each writing the metrics file.
    let t = Instant::now();
    loop {
        let meta = std::fs::symlink_metadata(&metrics).expect("the metrics path");
        if meta.is_file() {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the metrics file was never written:\n{}",
            dev.log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(3));
    assert!(dev.daemon_running(), "{}", dev.log_tail());
    assert_eq!(std::fs::read(&victim).expect("the victim"), b"precious");
    let meta = std::fs::symlink_metadata(&metrics).expect("the metrics file");
    assert!(meta.is_file() && meta.uid() == 0, "{meta:?}");
    let text = std::fs::read_to_string(&metrics).expect("reading the metrics");
    assert!(text.contains("updraft_checks_total"), "{text}");
    // The plants are still there, untouched: nothing was opened through
    // them.
    let fifos = std::fs::read_dir(&shared)
        .expect("listing the shared directory")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_fifo()))
        .count();
    assert_eq!(fifos, 500);
    assert!(
        dev.log().contains("other accounts can write it"),
        "no warning about the shared directory:\n{}",
        dev.log_tail()
    );
    dev.stop_daemon();
}
