//! Devices that keep the boot script of the updater they ran before
//! (`bootloader.flow`): updraft reads and writes Mender's or RAUC's U-Boot
//! variables with their owner's meaning, in a redundant environment read
//! and written by Debian's real `fw_printenv`/`fw_setenv` between boots.
//! The boot scripts are the test support's doubles of each updater's
//! documented contract (`bootenv::boot_uboot_mender`,
//! `bootenv::boot_uboot_rauc`); after every step the variables are checked
//! against that contract.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use updraft::slot::SlotName;
use updraft_tests::bootenv::{self, Layout, UbootEnv};
use updraft_tests::device::{BootSpec, Device};
use updraft_tests::proxied::ProxiedServer;

const WAIT: Duration = Duration::from_secs(90);
const IMAGE: usize = 1 << 20;
/// Mender's usual layout: root file systems on partitions 2 and 3.
const PARTS: [u32; 2] = [2, 3];

/// A device whose U-Boot environment holds `vars` and is read with
/// `flow_lines` (`flow = ...` and its keys), booted from slot A the way
/// the other updater's script passes it: `root=` only.
fn device(
    ps: &ProxiedServer,
    name: &str,
    vars: &[(&str, &str)],
    flow_lines: &str,
) -> (Device, PathBuf) {
    let mut dev = ps.device(name, "1s", "");
    std::fs::create_dir_all(dev.path("uboot")).expect("the environment's directory");
    let env = UbootEnv::create(
        &dev.path("uboot"),
        Layout::redundant_two_files(0x4000),
        vars,
    );
    let config = env.config.clone();
    dev.reconfigure(|s| {
        s.boot = BootSpec::Custom(format!(
            "kind = \"uboot\"\nfw_env_config = {config:?}\n{flow_lines}"
        ))
    });
    boot_into(&mut dev, SlotName::A);
    (dev, env.config)
}

/// Power on into `slot` with the command line another updater's script
/// writes: the root partition, no `updraft.slot=`.
fn boot_into(dev: &mut Device, slot: SlotName) {
    let root = match slot {
        SlotName::A => dev.slot_a.clone(),
        SlotName::B => dev.slot_b.clone(),
    };
    dev.power_on(&format!("console=ttyS0 root={} rootwait\n", root.display()));
}

fn vars(config: &std::path::Path, names: &[&str]) -> BTreeMap<String, String> {
    let all = bootenv::fw_printenv(config).unwrap_or_else(|e| panic!("{e}"));
    names
        .iter()
        .map(|n| (n.to_string(), all.get(*n).cloned().unwrap_or_default()))
        .collect()
}

fn expect(config: &std::path::Path, want: &[(&str, &str)]) {
    let names: Vec<&str> = want.iter().map(|(n, _)| *n).collect();
    let got = vars(config, &names);
    let want: BTreeMap<String, String> = want
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn a_mender_board_is_updated_and_committed_in_menders_variables() {
    updraft_tests::require!("nginx", "mkenvimage", "fw_printenv", "fw_setenv");
    let ps = ProxiedServer::start("flow-mender", false);
    let (mut dev, env) = device(
        &ps,
        "flow-mender",
        bootenv::MENDER_UBOOT_ENV,
        "flow = \"mender\"\n",
    );
    dev.init();
    assert_eq!(dev.status()["booted_slot"], "A");
    dev.start_daemon();
    ps.publish("1.1", 21, IMAGE, &[]);
    dev.wait_reboot_requested(WAIT);
    // As Mender's client arms a trial: the new partition, the flag, the
    // count reset; the board's own variables untouched.
    expect(
        &env,
        &[
            ("mender_boot_part", "3"),
            ("mender_boot_part_hex", "3"),
            ("upgrade_available", "1"),
            ("bootcount", "0"),
            ("bootcmd", "run mender_setup; run mender_boot"),
        ],
    );
    assert_eq!(bootenv::boot_uboot_mender(&env, PARTS), SlotName::B);
    boot_into(&mut dev, SlotName::B);
    expect(&env, &[("bootcount", "1")]);
    dev.start_daemon();
    dev.wait_committed("1.1", WAIT);
    dev.stop_daemon();
    // As Mender's client commits: the flag cleared, partition 3 kept.
    expect(
        &env,
        &[
            ("mender_boot_part", "3"),
            ("upgrade_available", "0"),
            ("bootcount", "0"),
        ],
    );
    // Boots after the commit stay on partition 3 and count nothing.
    assert_eq!(bootenv::boot_uboot_mender(&env, PARTS), SlotName::B);
    expect(&env, &[("bootcount", "0")]);
}

#[test]
fn a_mender_trial_that_hangs_is_undone_by_menders_altbootcmd_and_reported() {
    updraft_tests::require!("nginx", "mkenvimage", "fw_printenv", "fw_setenv");
    let ps = ProxiedServer::start("flow-mender-hang", false);
    let (mut dev, env) = device(
        &ps,
        "flow-mender-hang",
        bootenv::MENDER_UBOOT_ENV,
        "flow = \"mender\"\n",
    );
    dev.init();
    dev.start_daemon();
    ps.publish("1.1", 22, IMAGE, &[]);
    dev.wait_reboot_requested(WAIT);
    dev.stop_daemon();
    // The trial boot of partition 3 hangs before updraft starts; the
    // watchdog resets the board, and the count passes bootlimit.
    assert_eq!(bootenv::boot_uboot_mender(&env, PARTS), SlotName::B);
    assert_eq!(bootenv::boot_uboot_mender(&env, PARTS), SlotName::A);
    expect(
        &env,
        &[
            ("mender_boot_part", "2"),
            ("mender_boot_part_hex", "2"),
            ("upgrade_available", "0"),
        ],
    );
    boot_into(&mut dev, SlotName::A);
    dev.start_daemon();
    let st = dev.wait_rolled_back(WAIT);
    assert!(
        st["last_install"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("did not boot")),
        "{st:#}"
    );
    dev.stop_daemon();
    expect(
        &env,
        &[
            ("mender_boot_part", "2"),
            ("upgrade_available", "0"),
            ("bootcount", "0"),
        ],
    );
}

#[test]
fn a_failed_health_check_on_a_mender_board_switches_back_as_menders_rollback_does() {
    updraft_tests::require!("nginx", "mkenvimage", "fw_printenv", "fw_setenv");
    let ps = ProxiedServer::start("flow-mender-health", false);
    let (mut dev, env) = device(
        &ps,
        "flow-mender-health",
        bootenv::MENDER_UBOOT_ENV,
        "flow = \"mender\"\n",
    );
    dev.health_check("10-fails", "echo 'app did not start' >&2; exit 1");
    dev.init();
    dev.start_daemon();
    ps.publish("1.1", 23, IMAGE, &[]);
    dev.wait_reboot_requested(WAIT);
    assert_eq!(bootenv::boot_uboot_mender(&env, PARTS), SlotName::B);
    boot_into(&mut dev, SlotName::B);
    dev.start_daemon();
    dev.wait_reboot_requested(WAIT);
    expect(
        &env,
        &[
            ("mender_boot_part", "2"),
            ("mender_boot_part_hex", "2"),
            ("upgrade_available", "0"),
            ("bootcount", "0"),
        ],
    );
    assert_eq!(bootenv::boot_uboot_mender(&env, PARTS), SlotName::A);
    boot_into(&mut dev, SlotName::A);
    dev.start_daemon();
    dev.wait_rolled_back(WAIT);
}

#[test]
fn a_mender_grub_board_is_updated_in_menders_environment_files_and_a_hung_trial_rolls_back() {
    updraft_tests::require!("nginx", "grub-editenv");
    let ps = ProxiedServer::start("flow-mender-grub", false);
    let mut dev = ps.device("flow-mender-grub", "1s", "");
    let dir = dev.path("efi/grub-mender-grubenv");
    bootenv::mender_grubenv_create(
        &dir,
        &[
            ("mender_boot_part", "2"),
            ("upgrade_available", "0"),
            ("bootcount", "0"),
            ("mender_systemd_machine_id", "5b0c"),
        ],
    );
    dev.reconfigure(|s| {
        s.boot = BootSpec::Custom(format!(
            "kind = \"grub\"\nflow = \"mender\"\nmender_grubenv = {dir:?}\n"
        ))
    });
    boot_into(&mut dev, SlotName::A);
    dev.init();
    let env = |n: u32| {
        let all = bootenv::grub_editenv_list(&dir.join(format!("mender_grubenv{n}/env"))).unwrap();
        [
            "mender_boot_part",
            "upgrade_available",
            "bootcount",
            "mender_systemd_machine_id",
        ]
        .map(|k| all.get(k).cloned().unwrap_or_default())
    };
    dev.start_daemon();
    ps.publish("1.1", 27, IMAGE, &[]);
    dev.wait_reboot_requested(WAIT);
    dev.stop_daemon();
    // Both copies as Mender's client arms a trial; the locks pass the
    // checksum Mender's fw_setenv checks.
    for n in [1, 2] {
        assert_eq!(env(n), ["3", "1", "0", "5b0c"]);
    }
    assert!(bootenv::mender_grubenv_locks_whole(&dir));
    // The trial hangs: the second boot switches back.
    assert_eq!(bootenv::boot_grub_mender(&dir, PARTS), SlotName::B);
    assert_eq!(bootenv::boot_grub_mender(&dir, PARTS), SlotName::A);
    boot_into(&mut dev, SlotName::A);
    dev.start_daemon();
    dev.wait_rolled_back(WAIT);
    // Release 1.2 this time comes up and is committed.
    ps.publish("1.2", 28, IMAGE, &["--serial", "3"]);
    dev.wait_reboot_requested(WAIT);
    assert_eq!(bootenv::boot_grub_mender(&dir, PARTS), SlotName::B);
    boot_into(&mut dev, SlotName::B);
    dev.start_daemon();
    dev.wait_committed("1.2", WAIT);
    dev.stop_daemon();
    for n in [1, 2] {
        assert_eq!(env(n), ["3", "0", "0", "5b0c"]);
    }
    assert!(bootenv::mender_grubenv_locks_whole(&dir));
    assert_eq!(bootenv::boot_grub_mender(&dir, PARTS), SlotName::B);
}

#[test]
fn a_rauc_board_is_updated_in_raucs_bootnames() {
    updraft_tests::require!("nginx", "mkenvimage", "fw_printenv", "fw_setenv");
    let ps = ProxiedServer::start("flow-rauc", false);
    let names = ["system0", "system1"];
    let (mut dev, env) = device(
        &ps,
        "flow-rauc",
        &[
            ("bootcmd", "run rauc_boot"),
            ("BOOT_ORDER", "system0 system1"),
            ("BOOT_system0_LEFT", "3"),
            ("BOOT_system1_LEFT", "3"),
        ],
        "flow = \"rauc\"\nbootname_a = \"system0\"\nbootname_b = \"system1\"\n",
    );
    dev.init();
    dev.start_daemon();
    ps.publish("1.1", 24, IMAGE, &[]);
    dev.wait_reboot_requested(WAIT);
    expect(
        &env,
        &[
            ("BOOT_ORDER", "system1 system0"),
            ("BOOT_system1_LEFT", "3"),
            ("BOOT_A_LEFT", ""),
            ("BOOT_B_LEFT", ""),
        ],
    );
    assert_eq!(bootenv::boot_uboot_rauc(&env, names), Some(SlotName::B));
    expect(&env, &[("BOOT_system1_LEFT", "2")]);
    boot_into(&mut dev, SlotName::B);
    dev.start_daemon();
    dev.wait_committed("1.1", WAIT);
    dev.stop_daemon();
    expect(
        &env,
        &[
            ("BOOT_ORDER", "system1 system0"),
            ("BOOT_system1_LEFT", "3"),
        ],
    );
}

#[test]
fn a_rauc_grub_board_is_updated_in_raucs_bootnames() {
    updraft_tests::require!("nginx", "grub-editenv");
    let ps = ProxiedServer::start("flow-rauc-grub", false);
    let names = ["system0", "system1"];
    let mut dev = ps.device("flow-rauc-grub", "1s", "");
    let grubenv = dev.path("grub/grubenv");
    bootenv::grub_rauc_create(&grubenv, names);
    dev.reconfigure(|s| {
        s.boot = BootSpec::Custom(format!(
            "kind = \"grub\"\ngrubenv = {grubenv:?}\nflow = \"rauc\"\nbootname_a = \"system0\"\nbootname_b = \"system1\"\n"
        ))
    });
    boot_into(&mut dev, SlotName::A);
    dev.init();
    dev.start_daemon();
    ps.publish("1.1", 26, IMAGE, &[]);
    dev.wait_reboot_requested(WAIT);
    let grub = |names: &[&str]| -> Vec<String> {
        let all = bootenv::grub_editenv_list(&grubenv).unwrap();
        names
            .iter()
            .map(|n| all.get(*n).cloned().unwrap_or_default())
            .collect()
    };
    // As RAUC marks a slot primary: first in ORDER, OK, not tried.
    assert_eq!(
        grub(&["ORDER", "system1_OK", "system1_TRY", "B_OK"]),
        ["system1 system0", "1", "0", ""]
    );
    assert_eq!(bootenv::boot_grub_named(&grubenv, names), Some(SlotName::B));
    boot_into(&mut dev, SlotName::B);
    dev.start_daemon();
    dev.wait_committed("1.1", WAIT);
    dev.stop_daemon();
    assert_eq!(grub(&["ORDER", "system1_OK"]), ["system1 system0", "1"]);
    assert_eq!(bootenv::boot_grub_named(&grubenv, names), Some(SlotName::B));
}

#[test]
fn another_updaters_variables_that_do_not_parse_are_named_and_nothing_is_written() {
    updraft_tests::require!("nginx", "mkenvimage", "fw_printenv", "fw_setenv");
    let ps = ProxiedServer::start("flow-hostile", false);
    ps.publish("1.1", 25, IMAGE, &[]);
    for (n, (vars, flow, want)) in [
        (
            &[("mender_boot_part", "7"), ("upgrade_available", "0")][..],
            "flow = \"mender\"\n",
            "mender_boot_part=7 is neither slot A's partition (2) nor slot B's (3)",
        ),
        (
            &[("upgrade_available", "0")][..],
            "flow = \"mender\"\n",
            "mender_boot_part is not set",
        ),
        (
            &[("BOOT_ORDER", "system0 recovery")][..],
            "flow = \"rauc\"\nbootname_a = \"system0\"\nbootname_b = \"system1\"\n",
            "\"recovery\", which is neither",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let (dev, env) = device(&ps, &format!("flow-hostile-{n}"), vars, flow);
        let before = bootenv::fw_printenv(&env).unwrap();
        let st = dev.status();
        let e = st["bootloader_error"].as_str().unwrap_or_default();
        assert!(e.contains(want), "{st:#}");
        let out = dev.fails(&["install", &ps.manifest_url()]);
        assert!(out.contains(want), "{out}");
        assert_eq!(bootenv::fw_printenv(&env).unwrap(), before);
    }
}
