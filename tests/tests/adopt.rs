//! `updraft adopt`: a device another updater has been updating is taken
//! over where it stands, with the boot scripts it has.
//!
//! The real updaters install first (Debian's RAUC 1.8 and Mender 3.4,
//! `updraft_tests::updaters`): RAUC through its service into a GRUB
//! environment with its own bootnames, Mender through `fw_setenv` into a
//! redundant U-Boot environment. Their boot scripts are the test
//! support's doubles of each updater's documented contract
//! (`bootenv::boot_grub_named`, `bootenv::boot_uboot_mender`). Then
//! `adopt` reads what they left, which must be unchanged by it, and
//! updraft performs the next update, a rollback and a commit, the
//! variables checked against the other updater's contract after each step.
//!
//! The slots are loop devices: adopt refuses a slot that is not a block
//! device. Hostile state files (missing, garbage, naming a slot that does
//! not exist or a file that is not a block device, a switch pending) are
//! refused with their name, and nothing is written.

use std::path::{Path, PathBuf};
use std::time::Duration;

use updraft::slot::SlotName;
use updraft_tests::bootenv::{self, Layout, LoopDevice, UbootEnv};
use updraft_tests::device::{Device, DeviceSpec};
use updraft_tests::proxied::ProxiedServer;
use updraft_tests::publisher::{image, keygen};
use updraft_tests::skip::is_root;
use updraft_tests::tmp::TempDir;
use updraft_tests::updaters::{Mender, Rauc, RaucSigner};

const WAIT: Duration = Duration::from_secs(90);
const IMAGE: usize = 1 << 20;
const NAMES: [&str; 2] = ["system0", "system1"];

macro_rules! needs_root {
    () => {
        if !is_root() {
            updraft_tests::skip!("needs root to attach loop devices");
        }
    };
}

/// A device that has never run updraft: its configuration holds the
/// fleet's settings (server, trust, health) and a release marker path of
/// its own; slots are loop devices. `root` is where the other updater's
/// files go (`/` on a real device): the device's own directory, so that
/// `root/data/updraft` is its state directory.
struct Fixture {
    dev: Device,
    a: LoopDevice,
    b: LoopDevice,
    _keys: Option<TempDir>,
}

impl Fixture {
    fn new(dev: Device, keys: Option<TempDir>) -> Fixture {
        let mut dev = dev;
        let marker = dev.path("etc/updraft/release");
        dev.reconfigure(|s| s.device = format!("release_file = {marker:?}"));
        let a = LoopDevice::attach(&dev.slot_a);
        let b = LoopDevice::attach(&dev.slot_b);
        std::fs::create_dir_all(dev.path("proc")).expect("root/proc");
        std::os::unix::fs::symlink(&dev.cmdline, dev.path("proc/cmdline"))
            .expect("root/proc/cmdline");
        std::fs::create_dir_all(dev.path("data")).expect("root/data");
        Fixture {
            dev,
            a,
            b,
            _keys: keys,
        }
    }

    fn root(&self) -> String {
        self.dev.dir().display().to_string()
    }

    fn marker(&self) -> PathBuf {
        self.dev.path("etc/updraft/release")
    }

    fn db(&self) -> PathBuf {
        self.dev.path("data/updraft/updraft.db")
    }

    /// The kernel command line of a boot into `slot`: its root device and
    /// what the other updater's script adds.
    fn boot(&mut self, root: &Path, extra: &str) {
        self.dev.power_on(&format!(
            "console=ttyS0 root={} rootwait {extra}\n",
            root.display()
        ));
    }

    fn adopt(&self, from: &str, extra: &[&str]) -> std::process::Output {
        let mut args = vec!["adopt", "--from", from, "--root"];
        let root = self.root();
        args.push(&root);
        args.extend_from_slice(extra);
        self.dev.updraft(&args)
    }

    fn adopt_ok(&self, from: &str, extra: &[&str]) -> String {
        updraft_tests::succeeded(&self.adopt(from, extra), &format!("adopt --from {from}"))
    }

    /// `adopt` fails with exit status 1 naming `want`, and writes nothing.
    fn adopt_refused(&self, from: &str, want: &str, row: &str) {
        let config = std::fs::read(&self.dev.config).expect("the configuration");
        let out = self.adopt(from, &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{row}: adopt should fail:\n{err}"
        );
        assert!(
            err.contains(want),
            "{row}: the error should name {want:?}:\n{err}"
        );
        assert_eq!(
            std::fs::read(&self.dev.config).expect("the configuration"),
            config,
            "{row}: the configuration was written"
        );
        assert!(
            !self.marker().exists(),
            "{row}: a release marker was written"
        );
        assert!(!self.db().exists(), "{row}: the store was written");
    }
}

/// RAUC's GRUB variables for bootnames system0 and system1, one line.
fn rauc_grub(grubenv: &Path) -> String {
    let all = bootenv::grub_editenv_list(grubenv).unwrap_or_else(|e| panic!("{e}"));
    bootenv::show(
        &all,
        &[
            "ORDER",
            "system0_OK",
            "system0_TRY",
            "system1_OK",
            "system1_TRY",
        ],
    )
}

/// Mender's U-Boot variables, one line.
fn mender_uboot(config: &Path) -> String {
    let all = bootenv::fw_printenv(config).unwrap_or_else(|e| panic!("{e}"));
    bootenv::show(
        &all,
        &[
            "mender_boot_part",
            "mender_boot_part_hex",
            "upgrade_available",
            "bootcount",
        ],
    )
}

/// Set Mender's selection: partition `part` booted next, `trial` armed.
fn mender_set(config: &Path, part: &str, trial: &str) {
    bootenv::fw_setenv(
        config,
        &[
            ("mender_boot_part", Some(part)),
            ("mender_boot_part_hex", Some(part)),
            ("upgrade_available", Some(trial)),
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

fn rauc_system_conf(f: &Fixture, compatible: &str, boot: &str, keyring: &Path) -> String {
    format!(
        "[system]\ncompatible={compatible}\n{boot}\ndata-directory={data}\n\n\
         [keyring]\npath={keyring}\n\n\
         [slot.rootfs.0]\ndevice={a}\ntype=raw\nbootname=system0\n\n\
         [slot.rootfs.1]\ndevice={b}\ntype=raw\nbootname=system1\n",
        data = f.dev.path("data/rauc").display(),
        keyring = keyring.display(),
        a = f.a.path.display(),
        b = f.b.path.display(),
    )
}

#[test]
fn a_device_rauc_updated_on_grub_is_adopted_then_updated_rolled_back_and_committed_by_updraft() {
    updraft_tests::require!("nginx", "grub-editenv", "losetup");
    updraft_tests::require!("rauc", "mksquashfs", "dbus-daemon", "openssl");
    needs_root!();
    let ps = ProxiedServer::start("adopt-rauc", false);
    let dev = Device::new("adopt-rauc", ps.device_spec("1s", ""));
    let compatible = dev.spec.compatible.clone();
    let mut f = Fixture::new(dev, None);
    let grubenv = f.dev.path("boot/grub/grubenv");
    bootenv::grub_rauc_create(&grubenv, NAMES);
    let signer = RaucSigner::new(&f.dev.path("rauc-signer"));
    let conf = f.dev.path("etc/rauc/system.conf");
    std::fs::create_dir_all(conf.parent().expect("etc/rauc")).expect("etc/rauc");
    let boot = format!("bootloader=grub\ngrubenv={}", grubenv.display());
    std::fs::write(
        &conf,
        rauc_system_conf(&f, &compatible, &boot, &signer.cert),
    )
    .expect("system.conf");

    // RAUC installs 1.0 into rootfs.1 (slot B) and switches to it.
    let img = f.dev.path("rauc-1.0.img");
    let bytes = image(&img, IMAGE, 71);
    let bundle = signer.bundle(&f.dev.path("rauc-bundles"), &compatible, "1.0", &img);
    let mut rauc = Rauc::new(&f.dev.path("rauc"), &conf, None);
    let (a_dev, b_dev) = (f.a.path.clone(), f.b.path.clone());
    f.boot(&a_dev, "rauc.slot=system0");
    rauc.boot("system0");
    rauc.ok(&["install", &bundle.display().to_string()]);
    assert_eq!(
        &f.dev.slot_bytes(SlotName::B)[..IMAGE],
        &bytes[..],
        "RAUC wrote slot B"
    );
    assert_eq!(
        rauc_grub(&grubenv),
        "ORDER=system1 system0 system0_OK=1 system0_TRY=0 system1_OK=1 system1_TRY=0"
    );
    // GRUB boots system1 (RAUC's script marks the try), RAUC commits it.
    assert_eq!(bootenv::boot_grub_named(&grubenv, NAMES), Some(SlotName::B));
    f.boot(&b_dev, "rauc.slot=system1");
    rauc.boot("system1");
    rauc.ok(&["status", "mark-good"]);
    assert_eq!(
        rauc_grub(&grubenv),
        "ORDER=system1 system0 system0_OK=1 system0_TRY=0 system1_OK=1 system1_TRY=0"
    );
    rauc.stop();

    // adopt reads what RAUC left, and leaves it as it was.
    let env_before = std::fs::read(&grubenv).expect("grubenv");
    let dry = f.adopt_ok("rauc", &["--dry-run"]);
    assert!(dry.contains("nothing written (--dry-run)"), "{dry}");
    assert!(
        !f.marker().exists() && !f.db().exists(),
        "--dry-run wrote something:\n{dry}"
    );
    let out = f.adopt_ok("rauc", &[]);
    assert!(
        out.contains("found: release 1.0 running in slot B (bundle.version of rootfs.1 in"),
        "{out}"
    );
    assert_eq!(
        std::fs::read(&grubenv).expect("grubenv"),
        env_before,
        "adopt wrote grubenv"
    );
    assert_eq!(
        std::fs::read_to_string(f.marker()).expect("the release marker"),
        "# adopted from RAUC\nUPDRAFT_RELEASE=1.0\n"
    );
    let config = std::fs::read_to_string(&f.dev.config).expect("the configuration");
    for line in [
        "kind = \"grub\"",
        "flow = \"rauc\"",
        "bootname_a = \"system0\"",
        "bootname_b = \"system1\"",
        &format!("a = {:?}", a_dev.display().to_string()),
        &format!("compatible = {compatible:?}"),
    ] {
        assert!(config.contains(line), "{line} missing from:\n{config}");
    }
    let st = f.dev.status();
    assert_eq!(st["booted_slot"], "B", "{st:#}");
    assert_eq!(st["running_version"], "1.0", "{st:#}");
    let history = f.dev.ok(&["history"]);
    assert!(
        history.contains("adopted") && history.contains("from RAUC"),
        "{history}"
    );
    // Adopting again changes nothing; once updraft has state of its own,
    // adopt refuses.
    let again = f.adopt_ok("rauc", &[]);
    assert!(again.contains("unchanged:"), "{again}");

    // updraft's first release fails its health check: rolled back to
    // RAUC's 1.0 through RAUC's variables.
    f.dev.health_check(
        "10-app",
        "test \"$UPDRAFT_VERSION\" != 2.0 || { echo 'app did not start' >&2; exit 1; }",
    );
    f.dev.start_daemon();
    ps.publish("2.0", 72, IMAGE, &[]);
    f.dev.wait_reboot_requested(WAIT);
    f.dev.stop_daemon();
    assert_eq!(
        rauc_grub(&grubenv),
        "ORDER=system0 system1 system0_OK=1 system0_TRY=0 system1_OK=1 system1_TRY=0"
    );
    assert_eq!(bootenv::boot_grub_named(&grubenv, NAMES), Some(SlotName::A));
    f.boot(&a_dev, "rauc.slot=system0");
    f.dev.start_daemon();
    f.dev.wait_reboot_requested(WAIT);
    f.dev.stop_daemon();
    // system0 out of the order and not OK: bad, whatever the try flag its
    // boot set says.
    assert_eq!(
        rauc_grub(&grubenv),
        "ORDER=system1 system0_OK=0 system0_TRY=1 system1_OK=1 system1_TRY=0"
    );
    assert_eq!(bootenv::boot_grub_named(&grubenv, NAMES), Some(SlotName::B));
    f.boot(&b_dev, "rauc.slot=system1");
    f.dev.start_daemon();
    let st = f.dev.wait_rolled_back(WAIT);
    assert_eq!(st["booted_slot"], "B", "{st:#}");
    assert_eq!(st["running_version"], "1.0", "{st:#}");

    // The next release commits, in RAUC's variables.
    ps.publish("2.1", 73, IMAGE, &["--serial", "10"]);
    f.dev.wait_reboot_requested(WAIT);
    f.dev.stop_daemon();
    assert_eq!(bootenv::boot_grub_named(&grubenv, NAMES), Some(SlotName::A));
    f.boot(&a_dev, "rauc.slot=system0");
    f.dev.start_daemon();
    f.dev.wait_committed("2.1", WAIT);
    f.dev.stop_daemon();
    assert_eq!(
        rauc_grub(&grubenv),
        "ORDER=system0 system1 system0_OK=1 system0_TRY=0 system1_OK=1 system1_TRY=0"
    );
    let refused = f.adopt("rauc", &[]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("already holds updraft's own state"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    // RAUC, started again (the way back), reads the same boot state.
    rauc.boot("system0");
    let status = rauc.ok(&["status", "--output-format=json"]);
    assert!(status.contains("\"boot_primary\":\"rootfs.0\""), "{status}");
}

/// Mender's files on `f`: root partitions named as Mender's scripts count
/// them (`dev/rootfs-p2`, `dev/rootfs-p3` to the loop devices), its U-Boot
/// environment in `etc/`.
fn mender_files(
    f: &Fixture,
    env: &[(&str, &str)],
    artifact: &str,
) -> (Mender, PathBuf, [PathBuf; 2]) {
    let parts = [f.dev.path("dev/rootfs-p2"), f.dev.path("dev/rootfs-p3")];
    std::fs::create_dir_all(f.dev.path("dev")).expect("root/dev");
    for (link, dev) in parts.iter().zip([&f.a.path, &f.b.path]) {
        let _ = std::fs::remove_file(link);
        std::os::unix::fs::symlink(dev, link).expect("a partition link");
    }
    std::fs::create_dir_all(f.dev.path("etc")).expect("root/etc");
    let uenv = UbootEnv::create(&f.dev.path("etc"), Layout::redundant_two_files(0x4000), env);
    let mender = Mender::new(
        &f.dev.path("etc/mender"),
        &f.dev.path("var/lib/mender"),
        &f.dev.path("mender-bin"),
        [&parts[0], &parts[1]],
        &f.dev.spec.compatible,
        artifact,
        &uenv.config,
    );
    (mender, uenv.config, parts)
}

#[test]
fn a_device_mender_updated_on_uboot_is_adopted_then_updated_rolled_back_and_committed_by_updraft() {
    updraft_tests::require!("nginx", "mkenvimage", "fw_printenv", "fw_setenv", "losetup");
    updraft_tests::require!("mender", "mender-artifact", "unshare");
    needs_root!();
    let ps = ProxiedServer::start("adopt-mender", false);
    let mut f = Fixture::new(Device::new("adopt-mender", ps.device_spec("1s", "")), None);
    let (mender, env, parts) = mender_files(&f, bootenv::MENDER_UBOOT_ENV, "release-1");
    f.boot(&parts[0], "");

    // Mender installs release-2 into partition 3 (slot B) and commits it
    // after the boot into it.
    let img = f.dev.path("mender-release-2.img");
    let bytes = image(&img, IMAGE, 81);
    let artifact = Mender::artifact(
        &f.dev.path("mender-artifacts"),
        &f.dev.spec.compatible,
        "release-2",
        &img,
    );
    mender.ok(&["install", &artifact.display().to_string()]);
    assert_eq!(
        &f.dev.slot_bytes(SlotName::B)[..IMAGE],
        &bytes[..],
        "Mender wrote slot B"
    );
    assert_eq!(
        mender_uboot(&env),
        "mender_boot_part=3 mender_boot_part_hex=3 upgrade_available=1 bootcount=0"
    );
    assert_eq!(bootenv::boot_uboot_mender(&env, [2, 3]), SlotName::B);
    f.boot(&parts[1], "");
    let committed = mender.ok(&["commit"]);
    assert!(committed.contains("Committing"), "{committed}");
    assert_eq!(
        mender_uboot(&env),
        "mender_boot_part=3 mender_boot_part_hex=3 upgrade_available=0 bootcount=1"
    );
    // Slot B's root file system is release-2's: its artifact_info says so
    // (the image build writes it; here the test, as the image is bytes).
    std::fs::write(
        mender.etc.join("artifact_info"),
        "artifact_name=release-2\n",
    )
    .expect("artifact_info");

    // adopt reads what Mender left, and leaves it as it was.
    let env_files: Vec<Vec<u8>> = ["env.img", "env.img.redund"]
        .iter()
        .filter_map(|n| std::fs::read(f.dev.path("etc").join(n)).ok())
        .collect();
    let out = f.adopt_ok("mender", &[]);
    assert!(
        out.contains("found: release release-2 running in slot B (artifact_name in"),
        "{out}"
    );
    let env_after: Vec<Vec<u8>> = ["env.img", "env.img.redund"]
        .iter()
        .filter_map(|n| std::fs::read(f.dev.path("etc").join(n)).ok())
        .collect();
    assert!(!env_files.is_empty());
    assert_eq!(env_after, env_files, "adopt wrote the U-Boot environment");
    let config = std::fs::read_to_string(&f.dev.config).expect("the configuration");
    for line in [
        "kind = \"uboot\"",
        "flow = \"mender\"",
        "boot_partition_a = 2",
        "boot_partition_b = 3",
        &format!(
            "state_dir = {:?}",
            f.dev.path("data/updraft").display().to_string()
        ),
    ] {
        assert!(config.contains(line), "{line} missing from:\n{config}");
    }

    // updraft's first release fails its health check: Mender's variables
    // switch back as Mender's rollback does.
    f.dev.health_check(
        "10-app",
        "test \"$UPDRAFT_VERSION\" != 3.0 || { echo 'app did not start' >&2; exit 1; }",
    );
    f.dev.start_daemon();
    ps.publish("3.0", 82, IMAGE, &[]);
    f.dev.wait_reboot_requested(WAIT);
    f.dev.stop_daemon();
    assert_eq!(
        mender_uboot(&env),
        "mender_boot_part=2 mender_boot_part_hex=2 upgrade_available=1 bootcount=0"
    );
    assert_eq!(bootenv::boot_uboot_mender(&env, [2, 3]), SlotName::A);
    f.boot(&parts[0], "");
    f.dev.start_daemon();
    f.dev.wait_reboot_requested(WAIT);
    f.dev.stop_daemon();
    assert_eq!(
        mender_uboot(&env),
        "mender_boot_part=3 mender_boot_part_hex=3 upgrade_available=0 bootcount=0"
    );
    assert_eq!(bootenv::boot_uboot_mender(&env, [2, 3]), SlotName::B);
    f.boot(&parts[1], "");
    f.dev.start_daemon();
    let st = f.dev.wait_rolled_back(WAIT);
    assert_eq!(st["running_version"], "release-2", "{st:#}");

    // The next release commits.
    ps.publish("3.1", 83, IMAGE, &["--serial", "10"]);
    f.dev.wait_reboot_requested(WAIT);
    f.dev.stop_daemon();
    assert_eq!(bootenv::boot_uboot_mender(&env, [2, 3]), SlotName::A);
    f.boot(&parts[0], "");
    f.dev.start_daemon();
    f.dev.wait_committed("3.1", WAIT);
    f.dev.stop_daemon();
    assert_eq!(
        mender_uboot(&env),
        "mender_boot_part=2 mender_boot_part_hex=2 upgrade_available=0 bootcount=0"
    );
}

/// A device with RAUC's files for U-Boot, booted from system0, RAUC's
/// status naming 1.0 there.
fn rauc_uboot_fixture(name: &str) -> Fixture {
    let keys = TempDir::new(&format!("{name}-keys"));
    let key = keygen(keys.path(), "release");
    let mut f = Fixture::new(Device::new(name, DeviceSpec::simple(&key)), Some(keys));
    std::fs::create_dir_all(f.dev.path("etc/rauc")).expect("etc/rauc");
    let conf = rauc_system_conf(
        &f,
        &f.dev.spec.compatible,
        "bootloader=uboot",
        Path::new("/nonexistent.pem"),
    );
    std::fs::write(f.dev.path("etc/rauc/system.conf"), conf).expect("system.conf");
    UbootEnv::create(
        &f.dev.path("etc"),
        Layout::redundant_two_files(0x4000),
        &[
            ("BOOT_ORDER", "system0 system1"),
            ("BOOT_system0_LEFT", "3"),
            ("BOOT_system1_LEFT", "3"),
        ],
    );
    std::fs::create_dir_all(f.dev.path("data/rauc")).expect("data/rauc");
    std::fs::write(
        f.dev.path("data/rauc/central.raucs"),
        "[slot.rootfs.0]\nbundle.compatible=testboard\nbundle.version=1.0\nstatus=ok\n",
    )
    .expect("central.raucs");
    let a = f.a.path.clone();
    f.boot(&a, "rauc.slot=system0");
    f
}

#[test]
fn adopt_refuses_hostile_rauc_state_files_by_name_and_writes_nothing() {
    updraft_tests::require!("mkenvimage", "fw_printenv", "losetup");
    needs_root!();
    let mut f = rauc_uboot_fixture("adopt-hostile-rauc");
    let conf = f.dev.path("etc/rauc/system.conf");
    let good = std::fs::read_to_string(&conf).expect("system.conf");
    let b = f.b.path.display().to_string();
    let a = f.a.path.clone();
    let plain_file = f.dev.slot_a.display().to_string();
    let rows: Vec<(&str, String, &str)> = vec![
        (
            "system.conf missing",
            String::new(),
            "not found (RAUC's system configuration)",
        ),
        ("garbage", "\u{7f}ELF\u{1}\u{1}".into(), "line 1"),
        (
            "a slot that does not exist",
            good.replace(&b, "/dev/updraft-no-such-disk"),
            "slot rootfs.1 is /dev/updraft-no-such-disk",
        ),
        (
            "a slot that is not a block device",
            good.replace(&b, &plain_file),
            "which is not a block device",
        ),
        (
            "three bootable slots",
            format!("{good}\n[slot.rootfs.2]\ndevice={b}\nbootname=x\n"),
            "has 3 (rootfs.0, rootfs.1, rootfs.2)",
        ),
        (
            "an unsupported bootloader",
            good.replace("bootloader=uboot", "bootloader=efi"),
            "bootloader=efi",
        ),
    ];
    for (row, text, want) in &rows {
        if text.is_empty() {
            std::fs::remove_file(&conf).expect("removing system.conf");
        } else {
            std::fs::write(&conf, text).expect("system.conf");
        }
        f.adopt_refused("rauc", want, row);
    }
    std::fs::write(&conf, &good).expect("system.conf");

    f.boot(&a, "rauc.slot=recovery");
    f.adopt_refused(
        "rauc",
        "rauc.slot=recovery is neither slot A's bootname system0",
        "an unknown bootname",
    );
    f.boot(&a, "rauc.slot=system0");

    let env = f.dev.path("etc/fw_env.config");
    bootenv::fw_setenv(&env, &[("BOOT_ORDER", Some("system1 system0"))]).expect("fw_setenv");
    f.adopt_refused(
        "rauc",
        "switch or a trial boot pending",
        "RAUC's switch pending",
    );
    bootenv::fw_setenv(&env, &[("BOOT_ORDER", Some("system0 system1"))]).expect("fw_setenv");

    let status = f.dev.path("data/rauc/central.raucs");
    let good_status = std::fs::read_to_string(&status).expect("central.raucs");
    std::fs::write(&status, "slot.rootfs.0\nbundle.version 1.0\n").expect("central.raucs");
    f.adopt_refused("rauc", "central.raucs: line 1", "a garbage status file");
    std::fs::write(&status, "[slot.rootfs.1]\nbundle.version=0.9\n").expect("central.raucs");
    f.adopt_refused(
        "rauc",
        "give it with --release VERSION",
        "no release for the booted slot",
    );
    std::fs::write(&status, good_status).expect("central.raucs");

    let config = std::fs::read(&f.dev.config).expect("the configuration");
    std::fs::write(&f.dev.config, "[device]\ncompatible = \"x\"\n").expect("config");
    f.adopt_refused(
        "rauc",
        "does not load",
        "a configuration without the fleet's trust",
    );
    std::fs::write(&f.dev.config, &config).expect("config");

    // A dry run says what it would write and writes nothing; the real run
    // writes it.
    let dry = f.adopt_ok("rauc", &["--dry-run"]);
    assert!(
        dry.contains("would write:") && dry.contains("nothing written"),
        "{dry}"
    );
    assert_eq!(std::fs::read(&f.dev.config).expect("config"), config);
    assert!(!f.marker().exists() && !f.db().exists());
    let out = f.adopt_ok("rauc", &[]);
    assert!(
        out.contains("found: release 1.0 running in slot A"),
        "{out}"
    );
    assert!(f.marker().exists() && f.db().exists(), "{out}");
    assert!(
        f.dev.path("updraft.toml.before-adopt").exists(),
        "the configuration before was not kept"
    );
}

#[test]
fn adopt_refuses_hostile_mender_state_files_by_name_and_writes_nothing() {
    updraft_tests::require!("mkenvimage", "fw_printenv", "losetup");
    needs_root!();
    let keys = TempDir::new("adopt-hostile-mender-keys");
    let key = keygen(keys.path(), "release");
    let mut f = Fixture::new(
        Device::new("adopt-hostile-mender", DeviceSpec::simple(&key)),
        Some(keys),
    );
    let (mender, env, parts) = mender_files(&f, bootenv::MENDER_UBOOT_ENV, "release-1");
    f.boot(&parts[0], "");
    let conf = mender.etc.join("mender.conf");
    let good = std::fs::read_to_string(&conf).expect("mender.conf");
    let b = parts[1].display().to_string();
    let plain_file = f.dev.slot_b.display().to_string();
    let rows: Vec<(&str, String, &str)> = vec![
        (
            "mender.conf missing",
            String::new(),
            "no Mender configuration to adopt",
        ),
        ("garbage", "{\"RootfsPartA\": ".into(), "not JSON"),
        (
            "a partition that does not exist",
            good.replace(&b, "/dev/updraft-no-such-disk3"),
            "RootfsPartB is /dev/updraft-no-such-disk3",
        ),
        (
            "a partition that is not a block device",
            good.replace(&b, &plain_file),
            "which is not a block device",
        ),
    ];
    for (row, text, want) in &rows {
        if text.is_empty() {
            std::fs::remove_file(&conf).expect("removing mender.conf");
        } else {
            std::fs::write(&conf, text).expect("mender.conf");
        }
        f.adopt_refused("mender", want, row);
    }
    std::fs::write(&conf, &good).expect("mender.conf");

    let info = mender.etc.join("artifact_info");
    std::fs::write(&info, "artifact_name release 1\n").expect("artifact_info");
    f.adopt_refused(
        "mender",
        "expected artifact_name=VALUE",
        "a garbage artifact_info",
    );
    std::fs::write(&info, "artifact_name=release-1\n").expect("artifact_info");

    let device_type = mender.data.join("device_type");
    std::fs::remove_file(&device_type).expect("removing device_type");
    f.adopt_refused("mender", "device_type: not found", "device_type missing");
    std::fs::write(
        &device_type,
        format!("device_type={}\n", f.dev.spec.compatible),
    )
    .expect("device_type");

    mender_set(&env, "3", "1");
    f.adopt_refused(
        "mender",
        "switch or a trial boot pending",
        "Mender's trial pending",
    );
    mender_set(&env, "7", "0");
    f.adopt_refused(
        "mender",
        "mender_boot_part=7 is neither slot A's partition (2)",
        "mender_boot_part naming neither slot",
    );
    mender_set(&env, "2", "0");

    let saved = f.dev.path("fw_env.config.saved");
    std::fs::rename(&env, &saved).expect("moving fw_env.config");
    f.adopt_refused(
        "mender",
        "neither Mender's GRUB environment",
        "no bootloader environment",
    );
    std::fs::rename(&saved, &env).expect("restoring fw_env.config");

    let out = f.adopt_ok("mender", &[]);
    assert!(
        out.contains("found: release release-1 running in slot A"),
        "{out}"
    );
    assert_eq!(
        std::fs::read_to_string(f.marker()).expect("the marker"),
        "# adopted from Mender\nUPDRAFT_RELEASE=release-1\n"
    );
}
