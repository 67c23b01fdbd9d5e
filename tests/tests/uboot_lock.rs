//! libubootenv's lock against a local user: the lock lives in a directory
//! every user may write (`/run/lock`) and `flock` works on a read-only
//! descriptor, so whoever can create or open the file can hold it. The
//! daemon refuses a lock file that is not root's, takes the mode of its own
//! away from other users, and treats a busy bootloader at start as
//! something to retry, never as a reason to exit.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use updraft::slot::SlotName;
use updraft_tests::device::{BootSpec, Device, DeviceSpec};
use updraft_tests::hostile_client;
use updraft_tests::publisher::keygen;
use updraft_tests::tmp::TempDir;

/// A U-Boot device whose lock file is `lock/fw_printenv.lock` in a
/// sticky, world-writable directory (as `/run/lock` is), booted once more
/// into its committed slot so that the daemon's start must mark it good.
fn device(name: &str) -> (Device, PathBuf, TempDir) {
    let keys = TempDir::new(&format!("{name}-keys"));
    let key = keygen(keys.path(), "release");
    let mut spec = DeviceSpec::simple(&key);
    spec.boot = BootSpec::Uboot;
    let dev = Device::new(name, spec);
    let dir = dev.path("lock");
    std::fs::create_dir_all(&dir).expect("lock dir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let lock = dir.join("fw_printenv.lock");
    let mut dev = dev;
    let line = format!("lock_file = {lock:?}\n");
    dev.reconfigure(|s| s.bootloader = line);
    dev.init();
    let _ = std::fs::remove_file(&lock);
    dev.reboot_into(SlotName::A);
    (dev, lock, keys)
}

/// Hold `flock(LOCK_EX)` on `lock` as uid 65534, in one process (so
/// that killing it lets go): opened read-only when it exists, else
/// created (mode 0644 under the usual umask) as flock(1) would.
fn hold_as_nobody(lock: &Path) -> Child {
    let script = r#"
        use Fcntl qw(:flock);
        my $p = $ARGV[0];
        my $f;
        if (-e $p) { open($f, "<", $p) or die "open $p: $!" }
        else { open($f, ">>", $p) or die "create $p: $!" }
        flock($f, LOCK_EX) or die "flock $p: $!";
        print "held\n";
        STDOUT->flush();
        sleep 600;
    "#;
    let mut child = updraft_tests::hostile_client::perl_as_nobody(script)
        .arg(lock)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("setpriv perl");
    let mut line = String::new();
    let out = child.stdout.take().expect("stdout");
    std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line)
        .expect("reading the holder");
    assert_eq!(line, "held\n", "the holder did not take the lock");
    child
}

fn release(mut holder: Child) {
    let _ = holder.kill();
    let _ = holder.wait();
}

/// Wait for `needle` in the daemon's log.
fn wait_log(dev: &Device, needle: &str, timeout: Duration) {
    let t = Instant::now();
    while t.elapsed() < timeout {
        if dev.log().contains(needle) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "no {needle:?} in the log within {timeout:?}:\n{}",
        dev.log_tail()
    );
}

/// While the boot waits: the daemon runs and answers, the environment and
/// slots are as they were, and changing commands are refused as busy.
fn still_waiting(dev: &mut Device, before: &updraft_tests::device::Snapshot) {
    assert!(
        dev.daemon_running(),
        "the daemon exited:\n{}",
        dev.log_tail()
    );
    let t = Instant::now();
    let st = dev.status();
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "status took {:?}",
        t.elapsed()
    );
    assert_eq!(st["booted_slot"], serde_json::json!("A"), "{st:#}");
    // The slots' boot status reads "unknown" while the lock is held;
    // everything else is as it was.
    let now = dev.snapshot();
    assert_eq!(
        (
            &now.slot_a,
            &now.slot_b,
            &now.state,
            &now.serial,
            &now.boot_state
        ),
        (
            &before.slot_a,
            &before.slot_b,
            &before.state,
            &before.serial,
            &before.boot_state
        )
    );
    let err = dev.fails(&["mark-good"]);
    assert!(
        err.contains("the daemon is waiting for the bootloader"),
        "{err}"
    );
}

/// Another user created the lock file first (no tmpfiles.d entry ran) and
/// holds it. The daemon names the owner, refuses the file, keeps running,
/// and reconciles the boot once an operator removed it.
#[test]
fn a_lock_file_made_by_another_user_is_refused_and_the_daemon_keeps_running() {
    if let Some(why) = hostile_client::unavailable() {
        updraft_tests::skip!("{why}");
    }
    let (mut dev, lock, _keys) = device("lock-foreign");
    let before = dev.snapshot();
    // Reading the status made the lock; as if no tmpfiles.d entry ran, it
    // is not there for the attacker to find.
    let _ = std::fs::remove_file(&lock);
    let holder = hold_as_nobody(&lock);
    assert_eq!(std::fs::metadata(&lock).expect("lock").uid(), 65534);
    dev.start_daemon();
    let refusal = format!(
        "the U-Boot environment lock {} is owned by uid 65534, not root; refusing to use it",
        lock.display()
    );
    wait_log(&dev, &refusal, Duration::from_secs(20));
    // Past the 10 s lock timeout at which it used to exit.
    std::thread::sleep(Duration::from_secs(12));
    still_waiting(&mut dev, &before);
    assert_eq!(
        std::fs::metadata(&lock).expect("lock").uid(),
        65534,
        "left alone"
    );
    // The operator's fix.
    release(holder);
    std::fs::remove_file(&lock).expect("removing the foreign lock");
    wait_log(&dev, "reconciled this boot", Duration::from_secs(90));
    assert!(dev.daemon_running(), "{}", dev.log_tail());
    let meta = std::fs::metadata(&lock).expect("lock recreated");
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, 0o600));
    let after = dev.snapshot();
    assert_eq!((after.slot_a, after.slot_b), (before.slot_a, before.slot_b));
    assert_eq!(dev.boot_vars()["BOOT_ORDER"], "A B");
    dev.ok(&["status"]);
    dev.stop_daemon();
}

/// The lock file is root's but readable by everyone (mode 0644, as
/// libubootenv and earlier versions created it), and another user opened it
/// read-only and holds it. The daemon takes the file away from other users
/// (0600), retries with a backoff instead of exiting, and carries on once
/// the holder lets go; a new attempt to open it as that user fails.
#[test]
fn a_lock_held_through_a_readable_file_is_retried_and_then_closed_to_other_users() {
    if let Some(why) = hostile_client::unavailable() {
        updraft_tests::skip!("{why}");
    }
    if !updraft_tests::skip::on_path("flock") {
        updraft_tests::skip!("flock (util-linux) is not installed");
    }
    let (mut dev, lock, _keys) = device("lock-readable");
    let before = dev.snapshot();
    let _ = std::fs::remove_file(&lock);
    std::fs::write(&lock, b"").expect("lock");
    std::fs::set_permissions(&lock, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let holder = hold_as_nobody(&lock);
    dev.start_daemon();
    let busy = format!(
        "the U-Boot environment lock {} has been held by another process (fw_setenv?) for more than 10000 ms; trying again in",
        lock.display()
    );
    wait_log(&dev, &busy, Duration::from_secs(30));
    assert_eq!(
        std::fs::metadata(&lock).expect("lock").mode() & 0o7777,
        0o600,
        "made root only"
    );
    assert!(
        dev.log().contains("was mode 0644; made it 0600"),
        "{}",
        dev.log_tail()
    );
    std::thread::sleep(Duration::from_secs(2));
    still_waiting(&mut dev, &before);
    release(holder);
    wait_log(&dev, "reconciled this boot", Duration::from_secs(90));
    assert!(dev.daemon_running(), "{}", dev.log_tail());
    // The same user can no longer open it at all.
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "flock",
            "-n",
        ])
        .arg(&lock)
        .arg("true")
        .output()
        .expect("setpriv flock");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = dev.snapshot();
    assert_eq!((after.slot_a, after.slot_b), (before.slot_a, before.slot_b));
    dev.stop_daemon();
}
