//! Scenario 9: a device RAUC has been updating, booted by RAUC's U-Boot
//! integration, taken over by `updraft adopt` and updated by updraft
//! through RAUC's own variables, on a disk of its own (the U-Boot
//! machine).
//!
//! The boot script is RAUC's documented U-Boot contract, written here from
//! RAUC's documentation ("Integration", U-Boot): `BOOT_ORDER` lists the
//! slots' bootnames, the first whose `BOOT_<bootname>_LEFT` is above 0
//! loses an attempt and boots with `rauc.slot=<bootname>` on the kernel
//! command line; with none left every counter is reset to 3 and the board
//! resets. Its environment is the same redundant pair of files on the FAT
//! partition as updraft's own script keeps, through the shipped hooks,
//! saving RAUC's variables instead of updraft's.
//!
//! The factory image (release 10.0) carries RAUC's `system.conf`, its data
//! partition RAUC's central status file naming 10.0 in `rootfs.0`, and
//! updraft installed beside it, unconfigured for the slots. Its first boot
//! runs `updraft adopt --from rauc` (the guest's init, as an integrator's
//! first-boot unit would), then updraft:
//!
//! 1. installs 10.1, whose health check fails: rolled back to RAUC's 10.0,
//!    which updraft reports as running;
//! 2. installs 10.2, committed in slot B;
//! 3. installs 10.3 with the power cut in the bootloader-environment write
//!    and switch (a seeded instant after the install is logged): the
//!    machine boots again, and 10.3 must commit in slot A.
//!
//! After each run the environment on the disk is checked against RAUC's
//! contract (bootnames only, the committed slot first with its attempts
//! reset), and the history holds `adopted`, `rolled-back` and `committed`.

use std::collections::BTreeMap;

use super::super::guest;
use super::*;

/// The factory environment: RAUC's, slot A (`system0`) booting, slot B
/// never installed.
pub(super) const RAUC_FACTORY_ENV: [(&str, &str); 3] = [
    ("BOOT_ORDER", "system0 system1"),
    ("BOOT_system0_LEFT", "3"),
    ("BOOT_system1_LEFT", "0"),
];

/// The variables the shipped hooks read and write, and RAUC's in their
/// place.
const UPDRAFT_LOADED: &str = "BOOT_ORDER BOOT_A_LEFT BOOT_B_LEFT";
const UPDRAFT_SAVED: &str = "BOOT_ORDER BOOT_A_LEFT BOOT_B_LEFT updraft_slot updraft_part";
const RAUC_VARIABLES: &str = "BOOT_ORDER BOOT_system0_LEFT BOOT_system1_LEFT";

/// `boot.scr`'s source for RAUC's contract (see the module documentation).
pub(super) fn rauc_uboot_script(machine: &Machine) -> Result<String> {
    let (load, save) = fat_env_hooks()?;
    let import = format!("env import -c ${{updraft_env_s}} ${{updraft_env_n}} {UPDRAFT_LOADED}\n");
    if load.matches(&import).count() != 1 || !save.contains(UPDRAFT_SAVED) {
        return Err(format!(
            "the shipped env-fat-load.cmd.in no longer imports {UPDRAFT_LOADED:?} once, or \
             env-fat-save.cmd.in no longer exports {UPDRAFT_SAVED:?}: RAUC's script cannot \
             name its variables in them"
        ));
    }
    let load = load.replace(&import, &import.replace(UPDRAFT_LOADED, RAUC_VARIABLES));
    let save = save.replace(UPDRAFT_SAVED, RAUC_VARIABLES);
    let [n0, n1] = guest::RAUC_BOOTNAMES;
    let (a, b) = (disk::SLOT_A.number, disk::SLOT_B.number);
    Ok(format!(
        r#"echo "{BOOTLOADER_MARK}"
# RAUC's U-Boot integration: bootnames {n0} (partition {a}) and {n1} ({b}).
{load}
test -n "${{BOOT_ORDER}}" || setenv BOOT_ORDER "{n0} {n1}"
test -n "${{BOOT_{n0}_LEFT}}" || setenv BOOT_{n0}_LEFT 3
test -n "${{BOOT_{n1}_LEFT}}" || setenv BOOT_{n1}_LEFT 3
setenv rauc_pick 'setenv rauc_slot; for BOOT_SLOT in ${{BOOT_ORDER}}; do if test -z "${{rauc_slot}}"; then if test "${{BOOT_SLOT}}" = "{n0}" && test ${{BOOT_{n0}_LEFT}} -gt 0; then setexpr BOOT_{n0}_LEFT ${{BOOT_{n0}_LEFT}} - 1; setenv rauc_slot {n0}; setenv rauc_part {a}; elif test "${{BOOT_SLOT}}" = "{n1}" && test ${{BOOT_{n1}_LEFT}} -gt 0; then setexpr BOOT_{n1}_LEFT ${{BOOT_{n1}_LEFT}} - 1; setenv rauc_slot {n1}; setenv rauc_part {b}; fi; fi; done'
run rauc_pick
setenv rauc_pick
if test -z "${{rauc_slot}}"; then
    echo "rauc: no valid slot found, resetting tries to 3"
    setenv BOOT_{n0}_LEFT 3
    setenv BOOT_{n1}_LEFT 3
{save}
    reset
fi
{save}
echo "rauc: booting slot ${{rauc_slot}} ({n0} left ${{BOOT_{n0}_LEFT}}, {n1} left ${{BOOT_{n1}_LEFT}})"
setenv bootargs "${{bootargs}} root=/dev/vda${{rauc_part}} rootfstype=ext4 rootwait ro rauc.slot=${{rauc_slot}} panic=5 {console} quiet"
load virtio 0:${{rauc_part}} ${{kernel_addr_r}} /boot/vmlinuz
{boot}
echo "rauc: slot ${{rauc_slot}} did not boot; resetting"
reset
"#,
        console = machine.console_arg(),
        boot = uboot_boot_cmd(),
    ))
}

/// RAUC's central status file on the data partition: the factory release
/// in `rootfs.0`, as RAUC records an installed bundle.
fn central_status(compatible: &str) -> String {
    format!(
        "[slot.rootfs.0]\nbundle.compatible={compatible}\nbundle.version=10.0\n\
         status=ok\ninstalled.timestamp=2026-01-05T09:00:00Z\ninstalled.count=1\n"
    )
}

impl Lab {
    /// Scenario 9 (see the module documentation); the power cut's instant
    /// comes from `seed`.
    pub fn adopt_rauc(&mut self, seed: u64) -> Result {
        let name = "9-adopt-rauc";
        if self.machine.loader != Loader::UBoot {
            return Err(format!(
                "scenario 9 boots RAUC's U-Boot script: a U-Boot machine, not {}",
                self.machine.name
            ));
        }
        let factory = self.work.join("rootfs-10.0-rauc.ext4");
        self.guest.rootfs_with(
            &healthy("10.0"),
            &self.settings,
            &self.work,
            &factory,
            Some(guest::Predecessor::RaucUboot),
        )?;
        self.images.insert("10.0".into(), factory.clone());
        self.build_disk_as(
            &factory,
            "10.0, RAUC's, booted by RAUC's script",
            Script::RaucUboot,
            &[(
                "rauc/central.raucs",
                central_status(&self.machine.compatible()),
            )],
        )?;

        let failing = Release {
            version: "10.1".into(),
            behaviour: Behaviour::FailsHealthCheck,
            app: false,
        };
        self.publish(&failing, &[])?;
        let mut vm = self.start(name)?;
        wait_userspace(&mut vm, "A", "10.0", 0)?;
        // RAUC's script read the factory environment: slot B has no tries.
        vm.wait_line("RAUC's script booting system0", 0, BOOT_WAIT, |l| {
            l.contains("rauc: booting slot system0 (system0 left 2, system1 left 0)")
        })?;
        let adopted = vm.wait_line("updraft adopt on the first boot", 0, BOOT_WAIT, |l| {
            l.contains(guest::ADOPT_MARK) && l.contains("found: release ")
        })?;
        if !adopted.contains("found: release 10.0 running in slot A (bundle.version of rootfs.0") {
            return Err(vm.failure(&format!("adopt found something else: {adopted}")));
        }
        println!("   console: {}", adopted.trim());
        wait_trial_boot(&mut vm, "B", "10.1")?;
        let m = vm.mark();
        wait_userspace(&mut vm, "A", "10.0", m)
            .map_err(|e| format!("no rollback reboot into RAUC's release: {e}"))?;
        let st = wait_status(&mut vm, "10.1 rolled back to RAUC's 10.0", |s| {
            rolled_back(s, "10.1") && s["booted_slot"] == "A" && s["running_version"] == "10.0"
        })?;
        println!(
            "   console: 10.1 failed its health check in B; back on RAUC's 10.0 in A: {}",
            st["last_install"]["reason"]
        );
        self.wait_report("10.1", "rolled_back")?;

        self.publish(&healthy("10.2"), &[])?;
        wait_trial_boot(&mut vm, "B", "10.2")?;
        wait_status(&mut vm, "10.2 committed in B", |s| {
            committed(s, "10.2") && s["booted_slot"] == "B"
        })?;
        self.wait_report("10.2", "committed")?;
        println!("   console: 10.2 committed in B through RAUC's variables");
        self.finish(vm, name)?;
        let env = self.boot_env()?;
        expect_rauc_env(&env, "after 10.2's commit", "B")?;
        let h = self.history()?;
        expect_event(&h, "adopted", "10.0", Some("A"))?;
        expect_event(&h, "rolled-back", "10.1", None)?;
        expect_event(&h, "committed", "10.2", Some("B"))?;
        println!(
            "   disk: {} {}; history: 10.0 adopted in A, 10.1 rolled back, 10.2 committed in B",
            self.env_name(),
            show_env(&env)
        );

        // A power cut in the write of RAUC's variables and the switch.
        let mut rng = updraft_tests::rng::Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let point = CUT_POINTS
            .iter()
            .find(|p| p.phase == "bootloader environment and switch")
            .ok_or("no cut point in the switch")?;
        self.publish(&healthy("10.3"), &[])?;
        let cut_name = "9-adopt-rauc-cut-switch";
        let mut vm = self.start(cut_name)?;
        let (marker, after_ms) =
            cut_after(&mut vm, point.marker, "10.3", point.jitter_ms, &mut rng)?;
        println!("   power cut {after_ms} ms after {marker:?}");
        self.record(vm, cut_name)?;
        let after = format!("{cut_name}-after");
        let mut vm = self.start(&after)?;
        wait_status_for(&mut vm, "10.3 committed after the cut", INSTALL_WAIT, |s| {
            committed(s, "10.3") && s["booted_slot"] == "A"
        })?;
        self.wait_report("10.3", "committed")?;
        println!("   after the cut: 10.3 committed in A");
        self.finish(vm, &after)?;
        let env = self.boot_env()?;
        expect_rauc_env(&env, "after 10.3's commit", "A")?;
        println!("   disk: {} {}", self.env_name(), show_env(&env));
        Ok(())
    }
}

/// RAUC's contract after a commit of `slot`: its bootname first in
/// `BOOT_ORDER` with its attempts reset to 3, nothing of updraft's own
/// variables.
fn expect_rauc_env(env: &BTreeMap<String, String>, what: &str, slot: &str) -> Result {
    let [n0, n1] = guest::RAUC_BOOTNAMES;
    let (first, second) = if slot == "A" { (n0, n1) } else { (n1, n0) };
    let order = format!("{first} {second}");
    let left = format!("BOOT_{first}_LEFT");
    expect_env(env, what, &[("BOOT_ORDER", &order), (&left, "3")])?;
    for own in ["BOOT_A_LEFT", "BOOT_B_LEFT", "updraft_slot"] {
        if env.contains_key(own) {
            return Err(format!(
                "{what}: the environment holds {own}, which RAUC's script does not know: {}",
                show_env(env)
            ));
        }
    }
    Ok(())
}
