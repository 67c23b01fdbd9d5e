//! The Raspberry Pi's own A/B boot (`bootloader.kind = "rpi-tryboot"`),
//! against a simulated firmware that follows the documented contract
//! ([`updraft_tests::rpi`]): `autoboot.txt` on partition 1, slot A's boot
//! files on partition 2, slot B's on 3, all FAT images written through
//! `fusefat` and read by the firmware with mtools; `reboot "0 tryboot"`
//! arms the one-shot trial; the kernel learns the booted partition and
//! the trial from the device tree. No Raspberry Pi was used.

use std::path::Path;
use std::time::Duration;

use updraft::slot::SlotName;
use updraft_tests::device::{BootSpec, Device, DeviceSpec};
use updraft_tests::proxied::ProxiedServer;
use updraft_tests::rpi::{BOOT_A, BOOT_B, PiFirmware, read_autoboot};
use updraft_tests::tmp::TempDir;

const WAIT: Duration = Duration::from_secs(90);
const IMAGE: usize = 1 << 20;

/// The documentation's starting point: partition 2 boots, 3 is tried.
const AUTOBOOT_DOCUMENTED: &str =
    "[all]\ntryboot_a_b=1\nboot_partition=2\n[tryboot]\nboot_partition=3\n";

fn board(ps: &ProxiedServer, name: &str) -> (Device, PiFirmware) {
    let mut dev = ps.device(name, "1s", "");
    let fw = PiFirmware::install(&mut dev, AUTOBOOT_DOCUMENTED);
    dev.init();
    (dev, fw)
}

/// Slot B's boot files for release `version`: one `config.txt` for both
/// partitions, choosing each slot's command line with the firmware's
/// `[boot_partition=N]` filter, and a kernel naming the release.
fn boot_files(dir: &Path, dev: &Device, version: &str) {
    let cmdline = |slot: &Path, s: &str| {
        format!(
            "console=serial0,115200 root={} rootwait updraft.slot={s}\n",
            slot.display()
        )
    };
    updraft_tests::apps::write_tree(
        dir,
        &[
            (
                "config.txt",
                &format!(
                    "[all]\narm_64bit=1\nkernel=kernel_2712.img\n[boot_partition={BOOT_A}]\ncmdline=cmdline-a.txt\n[boot_partition={BOOT_B}]\ncmdline=cmdline-b.txt\n[all]\n"
                ),
            ),
            ("cmdline-a.txt", &cmdline(&dev.slot_a, "A")),
            ("cmdline-b.txt", &cmdline(&dev.slot_b, "B")),
            ("kernel_2712.img", &format!("kernel {version}")),
        ],
    );
}

#[test]
fn a_release_and_its_boot_files_are_tried_by_a_tryboot_reboot_and_committed_in_autoboot_txt() {
    updraft_tests::require!("nginx", "mkfs.vfat", "fsck.fat", "fusefat", "mtype");
    let ps = ProxiedServer::start("tryboot-cycle", false);
    let (mut dev, mut fw) = board(&ps, "tryboot-cycle");
    let (a, b) = (fw.boot_a.mount.clone(), fw.boot_b.mount.clone());
    dev.reconfigure(|s| {
        s.sections = format!("[components.firmware]\nkind = \"boot\"\na = {a:?}\nb = {b:?}\n");
    });
    let st = dev.status();
    assert_eq!(st["booted_slot"], "A", "{st:#}");
    dev.start_daemon();

    let tree = TempDir::new("tryboot-cycle-boot");
    boot_files(tree.path(), &dev, "1.1");
    ps.publish(
        "1.1",
        11,
        IMAGE,
        &["--boot", &format!("firmware={}", tree.path().display())],
    );
    dev.wait_reboot_requested(WAIT);
    // The trial is armed by the reboot's argument; autoboot.txt keeps
    // partition 2 as the default and names 3 for the trial.
    assert_eq!(dev.reboot_arguments().as_deref(), Some("0 tryboot"));
    assert_eq!(fw.selection(), (BOOT_A, BOOT_B));

    let boot = fw.power_on(&mut dev);
    assert_eq!(
        (boot.partition, boot.tryboot, boot.slot),
        (BOOT_B, true, SlotName::B)
    );
    // The kernel got slot B's command line from the release's own files.
    let cmdline = std::fs::read_to_string(dev.path("cmdline")).unwrap();
    assert!(
        cmdline.contains(&format!("root={}", dev.slot_b.display())),
        "{cmdline}"
    );
    assert_eq!(fw.boot_b.read_image("/kernel_2712.img"), b"kernel 1.1");
    dev.start_daemon();
    dev.wait_committed("1.1", WAIT);
    // Committed: both sections name partition 3, as the firmware reads it
    // from the image; the FAT file system is clean.
    assert_eq!(fw.selection(), (BOOT_B, BOOT_B));
    fw.autoboot.check();
    let st = dev.status();
    assert_eq!(st["booted_slot"], "B", "{st:#}");
    assert_eq!(st["next_boot"], "B", "{st:#}");

    // An ordinary reboot stays on B, no trial.
    dev.stop_daemon();
    let boot = fw.power_on(&mut dev);
    assert_eq!((boot.partition, boot.tryboot), (BOOT_B, false));
    dev.start_daemon();
    let st = dev.wait_for("idle on B", WAIT, |s| s["state"] == "idle");
    assert_eq!(st["running_version"], "1.1", "{st:#}");
}

#[test]
fn a_trial_whose_kernel_never_comes_up_falls_back_to_partition_2_and_is_rolled_back() {
    updraft_tests::require!("nginx", "mkfs.vfat", "fsck.fat", "fusefat", "mtype");
    let ps = ProxiedServer::start("tryboot-fallback", false);
    let (mut dev, mut fw) = board(&ps, "tryboot-fallback");
    let slot_a = dev.slot_bytes(SlotName::A);
    dev.start_daemon();
    ps.publish("1.1", 12, IMAGE, &[]);
    dev.wait_reboot_requested(WAIT);
    fw.fail_kernel(BOOT_B);
    let boot = fw.power_on(&mut dev);
    // Partition 3 hung; the watchdog's reset cleared the flag and the
    // firmware booted the default.
    assert_eq!(boot.failed, vec![BOOT_B]);
    assert_eq!(
        (boot.partition, boot.tryboot, boot.slot),
        (BOOT_A, false, SlotName::A)
    );
    dev.start_daemon();
    let st = dev.wait_rolled_back(WAIT);
    let reason = st["last_install"]["reason"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(reason.contains("did not boot"), "{st:#}");
    // The failed slot is named by neither section any more.
    assert_eq!(fw.selection(), (BOOT_A, BOOT_A));
    assert_eq!(dev.slot_bytes(SlotName::A), slot_a);
    assert_eq!(st["booted_slot"], "A");
}

#[test]
fn a_failed_health_check_rolls_back_with_an_ordinary_reboot() {
    updraft_tests::require!("nginx", "mkfs.vfat", "fsck.fat", "fusefat", "mtype");
    let ps = ProxiedServer::start("tryboot-health", false);
    let (mut dev, mut fw) = board(&ps, "tryboot-health");
    dev.health_check("10-fails", "echo 'service did not come up' >&2; exit 1");
    dev.start_daemon();
    ps.publish("1.1", 13, IMAGE, &[]);
    dev.wait_reboot_requested(WAIT);
    let boot = fw.power_on(&mut dev);
    assert_eq!((boot.partition, boot.tryboot), (BOOT_B, true));
    dev.start_daemon();
    // The rollback's reboot carries no trial argument, and autoboot.txt
    // names only partition 2.
    dev.wait_reboot_requested(WAIT);
    assert_eq!(dev.reboot_arguments().as_deref(), Some(""));
    assert_eq!(fw.selection(), (BOOT_A, BOOT_A));
    let boot = fw.power_on(&mut dev);
    assert_eq!((boot.partition, boot.tryboot), (BOOT_A, false));
    dev.start_daemon();
    let st = dev.wait_rolled_back(WAIT);
    assert!(
        st["last_install"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("service did not come up")),
        "{st:#}"
    );
}

/// Put `text` in `path` as a new file (`fusefat` keeps the old length of
/// a file opened with `O_TRUNC`).
fn replace(path: &Path, text: &str) {
    let _ = std::fs::remove_file(path);
    std::fs::write(path, text).unwrap();
}

#[test]
fn hostile_autoboot_txt_or_device_tree_values_are_named_and_the_running_slot_kept() {
    updraft_tests::require!("nginx", "mkfs.vfat", "fsck.fat", "fusefat", "mtype");
    let ps = ProxiedServer::start("tryboot-hostile", false);
    let (mut dev, fw) = board(&ps, "tryboot-hostile");
    let autoboot = fw.autoboot.mount.join("autoboot.txt");
    let original = std::fs::read_to_string(&autoboot).unwrap();
    let before = dev.snapshot();

    // A partition outside the slots, garbage, and a file past the
    // firmware's 512 bytes: each named, nothing written.
    for (text, want) in [
        (
            "[all]\nboot_partition=7\n".to_string(),
            "[all] boot_partition=7 is neither slot A's boot partition (2) nor slot B's (3)",
        ),
        (
            "\u{1}\u{2}garbage\n".to_string(),
            "line 1: expected key=value",
        ),
        (
            format!("[all]\nboot_partition=2\n#{}\n", "x".repeat(600)),
            "the firmware reads only its first 512",
        ),
    ] {
        replace(&autoboot, &text);
        let st = dev.status();
        let e = st["bootloader_error"].as_str().unwrap_or_default();
        assert!(e.contains(want) && e.contains("autoboot.txt"), "{st:#}");
        let out = dev.fails(&["install", &ps.manifest_url()]);
        assert!(out.contains("autoboot.txt"), "{out}");
        assert_eq!(std::fs::read_to_string(&autoboot).unwrap(), text);
    }
    replace(&autoboot, &original);
    before.assert_unchanged(&dev.snapshot());

    // Device-tree values: missing, garbage, a partition that is no slot's.
    let dt = fw.device_tree().to_path_buf();
    let partition = dt.join("partition");
    for (bytes, want) in [
        (None, "without U-Boot"),
        (
            Some(vec![0, 3]),
            "holds 2 bytes where the firmware writes one 4-byte cell",
        ),
        (Some(7u32.to_be_bytes().to_vec()), "booted partition 7"),
    ] {
        match &bytes {
            Some(b) => std::fs::write(&partition, b).unwrap(),
            None => std::fs::remove_file(&partition).unwrap(),
        }
        let out = dev.fails(&["status"]);
        assert!(out.contains(want), "{out}");
    }
    // The daemon does not stop over it: it reports, degraded, and keeps
    // asking.
    dev.start_daemon();
    dev.wait_log("booted partition 7", WAIT);
    assert!(dev.daemon_running(), "{}", dev.log_tail());
    std::fs::write(&partition, BOOT_A.to_be_bytes()).unwrap();
    dev.stop_daemon();
    assert_eq!(dev.status()["booted_slot"], "A");
    before.assert_unchanged(&dev.snapshot());
}

/// `autoboot.txt` rewritten under a power cut after every single write:
/// the partition holding it keeps only what was made durable, and at
/// every instant the firmware finds a file naming the old selection or
/// the new one, never none.
#[test]
fn a_power_cut_at_any_instant_of_the_autoboot_txt_rewrite_leaves_the_old_or_the_new_file() {
    use updraft_tests::powerfs::{self, PowerFs};
    if let Some(why) = powerfs::unavailable() {
        updraft_tests::skip!("{why}");
    }
    const OLD: &str = "[all]\ntryboot_a_b=1\nboot_partition=2\n[tryboot]\nboot_partition=3\n";
    let keys = TempDir::new("tryboot-cut-keys");
    let key = updraft_tests::publisher::keygen(keys.path(), "release");
    let part = keys.join("mmcblk0p1");
    std::fs::create_dir_all(&part).unwrap();
    let mut fs = PowerFs::mount(&part).expect("mounting the power-cut filesystem");
    let autoboot = part.join("autoboot.txt");
    let mut dev = Device::new("tryboot-cut", DeviceSpec::simple(&key));
    let dt = dev.path("device-tree");
    std::fs::create_dir_all(&dt).unwrap();
    // Booted B by a trial: marking it good commits B in autoboot.txt.
    std::fs::write(dt.join("partition"), BOOT_B.to_be_bytes()).unwrap();
    std::fs::write(dt.join("tryboot"), 1u32.to_be_bytes()).unwrap();
    std::fs::write(dev.path("cmdline"), "root=/dev/mmcblk0p6\n").unwrap();
    let lines = format!("kind = \"rpi-tryboot\"\nautoboot = {autoboot:?}\ndevice_tree = {dt:?}\n");
    dev.reconfigure(|s| s.boot = BootSpec::Custom(lines));
    // What the firmware reads: an ordinary boot's and a trial's choice.
    let firmware = || {
        let bytes = std::fs::read(&autoboot).unwrap_or_default();
        (read_autoboot(&bytes, false), read_autoboot(&bytes, true))
    };
    let old = (Some((BOOT_A, true)), Some((BOOT_B, true)));
    let new = (Some((BOOT_B, true)), Some((BOOT_B, true)));
    let (mut saw_old, mut saw_new) = (0, 0);
    let mut n = 1;
    loop {
        std::fs::write(&autoboot, OLD).unwrap();
        fs.sync_all();
        fs.arm_cut_after(n);
        let out = dev.updraft(&["mark-good"]);
        let cut = fs.is_dead();
        fs.disarm();
        fs.restore_power().expect("power-on");
        let found = firmware();
        assert!(
            found == old || found == new,
            "cut after write {n}: the firmware finds {found:?} in {:?}",
            std::fs::read(&autoboot)
                .ok()
                .map(|b| String::from_utf8_lossy(&b).into_owned())
        );
        if found == old {
            saw_old += 1;
        } else {
            saw_new += 1;
        }
        if !cut {
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(found, new, "a rewrite that completed is durable");
            break;
        }
        n += 1;
        assert!(n < 50, "the rewrite never completed");
    }
    assert!(saw_old > 0 && saw_new > 0, "old {saw_old}, new {saw_new}");
    // Temporary files the cuts left are removed by the next rewrite.
    std::fs::write(&autoboot, OLD).unwrap();
    dev.ok(&["mark-good"]);
    let left: Vec<_> = std::fs::read_dir(&part)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, vec!["autoboot.txt".to_string()]);
}
