//! A daemon that waits sleeps: in every waiting state it wakes only for
//! real deadlines and events, and it answers `updraft status` meanwhile.
//!
//! Each test brings a real daemon into one waiting state and watches it for
//! 10 s through `/proc` (context switches of all its threads, and CPU
//! time). A fleet gateway runs the daemon for years; a spin in one state
//! (for instance a poll timeout of zero while a reboot is pending) costs a
//! core on a hundred devices' worth of hosts and drains battery-backed
//! ones.

use std::time::{Duration, Instant};

use serde_json::json;
use updraft::slot::SlotName;
use updraft_tests::activity::{self, Activity};
use updraft_tests::device::{BootSpec, Device, DeviceSpec};
use updraft_tests::publisher::{KeyPair, image, keygen};
use updraft_tests::server::UpdateServer;
use updraft_tests::tmp::TempDir;

const WAIT: Duration = Duration::from_secs(90);
const WATCH: Duration = Duration::from_secs(10);
const IMAGE: usize = 2 * 1024 * 1024 + 17;

/// Wake-ups per second a waiting daemon may average (watchdog pings and a
/// once-a-second status refresh fit well under this).
const MAX_WAKEUPS_PER_SEC: f64 = 5.0;
const MAX_CPU_PERCENT: f64 = 1.0;

fn assert_asleep(dev: &Device, what: &str) -> Activity {
    let pid = dev.daemon_pid().expect("daemon running");
    let a = activity::measure(pid, WATCH);
    eprintln!(
        "{what}: {} context switches in {:.1} s ({:.2}/s), CPU {:.2} %",
        a.switches,
        a.over.as_secs_f64(),
        a.wakeups_per_sec(),
        a.cpu_percent()
    );
    assert!(
        a.wakeups_per_sec() < MAX_WAKEUPS_PER_SEC,
        "{what}: the daemon woke {:.1} times per second ({} switches in {:?})\nlog:\n{}",
        a.wakeups_per_sec(),
        a.switches,
        a.over,
        dev.log_tail()
    );
    assert!(
        a.cpu_percent() < MAX_CPU_PERCENT,
        "{what}: the daemon used {:.2} % CPU over {:?}\nlog:\n{}",
        a.cpu_percent(),
        a.over,
        dev.log_tail()
    );
    a
}

/// `updraft status` answers, and within a second.
fn assert_status_answers(dev: &Device, state: &str) {
    let t = Instant::now();
    let st = dev.status();
    let took = t.elapsed();
    assert_eq!(st["state"], json!(state), "{st:#}");
    assert!(
        took < Duration::from_secs(1),
        "updraft status took {took:?} in state {state}\nlog:\n{}",
        dev.log_tail()
    );
}

/// A device polling a TLS server every 2 s, with release 1.0 published.
struct Rig {
    dev: Device,
    _server: UpdateServer,
    _keys: TempDir,
}

fn rig(name: &str) -> Rig {
    let keys = TempDir::new(&format!("{name}-keys"));
    let key: KeyPair = keygen(keys.path(), "release");
    let mut dev = Device::new(name, DeviceSpec::simple(&key));
    let server = UpdateServer::start(&dev.path("site"), false);
    let server_toml = server.server_toml("2s", "1s");
    dev.reconfigure(|s| s.server = server_toml);
    dev.init();
    let path = dev.path("1.0.img");
    image(&path, IMAGE, 21);
    server.repo.release(&[&key], "1.0", &path, &[]);
    Rig {
        dev,
        _server: server,
        _keys: keys,
    }
}

#[test]
fn an_idle_daemon_sleeps() {
    let keys = TempDir::new("idle-keys");
    let key = keygen(keys.path(), "release");
    let mut dev = Device::new("idle-sleeps", DeviceSpec::simple(&key));
    dev.init();
    dev.start_daemon();
    assert_status_answers(&dev, "idle");
    assert_asleep(&dev, "idle");
    dev.stop_daemon();
}

#[test]
fn a_daemon_whose_reboot_does_not_come_sleeps_and_answers() {
    updraft_tests::require!("nginx");
    let mut r = rig("reboot-sleeps");
    r.dev.start_daemon();
    r.dev.wait_reboot_requested(WAIT);
    r.dev.wait_for("the rebooting state", WAIT, |s| {
        s["state"] == json!("rebooting")
    });
    // Let the next poll's time pass while the reboot is pending: polls
    // wait for the update to end, and their deadline must not end every
    // wait of the loop.
    std::thread::sleep(Duration::from_secs(3));
    assert_status_answers(&r.dev, "rebooting");
    assert_asleep(&r.dev, "rebooting, reboot command exited");
    assert_status_answers(&r.dev, "rebooting");
    r.dev.stop_daemon();
}

#[test]
fn a_daemon_whose_reboot_command_hangs_sleeps_and_answers() {
    updraft_tests::require!("nginx");
    let mut r = rig("reboot-hangs");
    let pid_file = r.dev.path("reboot.pid");
    let script = format!(
        "touch {:?}; echo $$ > {:?}; exec sleep 50",
        r.dev.reboot_marker, pid_file
    );
    r.dev
        .reconfigure(|s| s.reboot_command = Some(format!("[\"sh\", \"-c\", {script:?}]")));
    r.dev.start_daemon();
    r.dev.wait_reboot_requested(WAIT);
    assert_status_answers(&r.dev, "rebooting");
    assert_asleep(&r.dev, "rebooting, reboot command running");
    assert_status_answers(&r.dev, "rebooting");
    r.dev.stop_daemon();
    // The reboot command is ours to end.
    if let Some(pid) = std::fs::read_to_string(&pid_file)
        .ok()
        .and_then(|p| p.trim().parse::<i32>().ok())
    {
        // SAFETY: signalling the process the test's reboot command started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

#[test]
fn a_daemon_running_a_slow_health_check_sleeps_and_answers() {
    updraft_tests::require!("nginx");
    let mut r = rig("health-sleeps");
    r.dev.start_daemon();
    r.dev.wait_reboot_requested(WAIT);
    r.dev.health_check("10-slow", "sleep 40");
    let booted = r.dev.reboot();
    assert_eq!(booted, SlotName::B);
    r.dev.start_daemon();
    r.dev
        .wait_for("health checks", WAIT, |s| s["state"] == json!("testing"));
    assert_status_answers(&r.dev, "testing");
    assert_asleep(&r.dev, "testing, health check running");
    assert_status_answers(&r.dev, "testing");
    // Stopping ends the check with the daemon (the run kills its child).
    r.dev.stop_daemon();
}

/// A `script` bootloader whose `verb` (from the file `hang`, when it
/// exists) first touches `started-VERB` and then takes `secs` seconds, as a
/// script waiting on slow flash or a wedged tool would.
fn slow_boot_script(dev: &Device, secs: u32) -> String {
    let hang = dev.path("hang");
    let started = dev.path("started");
    let before = format!(
        r#"if [ "$(cat {hang:?} 2>/dev/null)" = "$1" ]; then
    touch {started:?}-"$1"
    sleep {secs}
fi"#
    );
    updraft_tests::bootenv::shell_script_bootloader(&dev.path("boot-select.state"), &before, "")
}

/// Switch the rig's device to [`slow_boot_script`], hanging in `verb`.
fn use_slow_boot_script(r: &mut Rig, verb: &str, secs: u32) {
    let script = r.dev.path("boot-select");
    updraft_tests::tmp::write_executable(&script, &slow_boot_script(&r.dev, secs));
    std::fs::write(r.dev.path("hang"), verb).expect("writing the hang marker");
    r.dev.reconfigure(|s| s.boot = BootSpec::script(&script));
}

fn wait_for_file(dev: &Device, path: &std::path::Path) {
    let t = Instant::now();
    while !path.exists() {
        assert!(
            t.elapsed() < WAIT,
            "{} did not appear within {WAIT:?}\nlog:\n{}",
            path.display(),
            dev.log_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_daemon_whose_bootloader_script_hangs_in_a_write_sleeps_answers_and_finishes_it() {
    updraft_tests::require!("nginx");
    let mut r = rig("script-trial-hangs");
    use_slow_boot_script(&mut r, "trial", 20);
    r.dev.start_daemon();
    wait_for_file(&r.dev, &r.dev.path("started-trial"));
    assert_status_answers(&r.dev, "installed");
    assert_asleep(&r.dev, "installed, bootloader script hanging in trial");
    assert_status_answers(&r.dev, "installed");
    // A stop request does not cut the write short: the daemon waits for
    // the script, and the trial boot it was setting up is in place.
    r.dev.stop_daemon();
    let state = std::fs::read_to_string(r.dev.path("boot-select.state"))
        .expect("the script's state after the trial");
    assert!(
        state.contains("O=\"B A\"") && state.contains("B=3"),
        "the trial write was not completed:\n{state}\nlog:\n{}",
        r.dev.log_tail()
    );
}

#[test]
fn a_daemon_whose_bootloader_script_hangs_in_a_read_answers_status() {
    updraft_tests::require!("nginx");
    let mut r = rig("script-read-hangs");
    // Nothing to install: the daemon stays idle and a status request is
    // what makes it read the bootloader.
    r.dev.reconfigure(|s| s.server = String::new());
    use_slow_boot_script(&mut r, "none yet", 15);
    r.dev.start_daemon();
    assert_status_answers(&r.dev, "idle");
    std::fs::write(r.dev.path("hang"), "read").expect("writing the hang marker");
    // The next status request that finds the daemon idle reads the
    // bootloader (one that arrives while the read of an earlier request is
    // still under way, as on a loaded machine, is answered from the last
    // snapshot and reads nothing): ask until a read hangs.
    let started = r.dev.path("started-read");
    let t = Instant::now();
    while !started.exists() {
        assert!(
            t.elapsed() < WAIT,
            "no bootloader read started within {WAIT:?}\nlog:\n{}",
            r.dev.log_tail()
        );
        assert_status_answers(&r.dev, "idle");
        std::thread::sleep(Duration::from_millis(200));
    }
    // While that read goes on, later requests are answered too.
    assert_status_answers(&r.dev, "idle");
    r.dev.stop_daemon();
}
