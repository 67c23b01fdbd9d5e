//! Scenario 9: a device another updater has been updating, booted by that
//! updater's boot script, taken over by `updraft adopt` and updated by
//! updraft through that updater's own variables, on a disk of its own.
//! The U-Boot machine runs RAUC's U-Boot integration, the GRUB machine
//! Mender's GRUB integration; both scripts are written here from the
//! updaters' documentation, none copied:
//!
//! - **RAUC on U-Boot** ("Integration", U-Boot): `BOOT_ORDER` lists the
//!   slots' bootnames, the first whose `BOOT_<bootname>_LEFT` is above 0
//!   loses an attempt and boots with `rauc.slot=<bootname>`; with none
//!   left every counter is reset to 3 and the board resets. Its
//!   environment is the same redundant pair of files on the FAT partition
//!   as updraft's own script keeps, through the shipped hooks, reading and
//!   saving RAUC's variables instead of updraft's.
//! - **Mender on GRUB** (grub-mender-grubenv's documented layout): two
//!   copies `mender_grubenv{1,2}/env` with locks beside them holding
//!   `editing=0` when whole; a copy whose lock says otherwise is restored
//!   from the other (copy 2 checked first), copy 1 is read; while
//!   `upgrade_available=1` the first boot sets `bootcount=1` and the next
//!   switches `mender_boot_part` back and clears both, each copy written
//!   between `editing=1` and `editing=0`; partition `mender_boot_part`
//!   boots with `root=` naming it.
//!
//! The factory image carries the other updater's files (RAUC's
//! `system.conf`, its central status file on the data partition; Mender's
//! `mender.conf`, `device_type`, `artifact_info`) and updraft installed
//! beside it. Its first boot runs `updraft adopt` (the guest's init, as an
//! integrator's first-boot unit would), then updraft:
//!
//! 1. installs a release whose health check fails: rolled back to the
//!    other updater's release, which updraft reports as running;
//! 2. installs one that commits in slot B;
//! 3. installs one with the power cut in the bootloader-environment write
//!    and switch (a seeded instant after the install is logged): the
//!    machine boots again, and it must commit in slot A.
//!
//! After each run the environment on the disk is checked against the other
//! updater's contract, and the history holds `adopted`, `rolled-back` and
//! `committed`.

use std::collections::BTreeMap;
use std::path::Path;

use super::super::guest::{self, Predecessor};
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

/// Where Mender's GRUB environment is on the boot partition (mounted at
/// `/boot` in the guest, where adopt looks for `/boot/efi/...`).
pub(super) const MENDER_GRUBENV: &str = "efi/grub-mender-grubenv";

/// Mender's variables at the factory: partition 2 (slot A), no trial.
pub(super) const MENDER_FACTORY_ENV: [(&str, &str); 3] = [
    ("mender_boot_part", "2"),
    ("upgrade_available", "0"),
    ("bootcount", "0"),
];

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

/// `grub.cfg` for Mender's GRUB contract (see the module documentation).
pub(super) fn mender_grub_cfg(machine: &Machine) -> String {
    let (a, b) = (disk::SLOT_A.number, disk::SLOT_B.number);
    let boot = BOOT.number;
    let entry = |part: u8| {
        format!(
            "menuentry \"mender partition {part}\" {{\n    \
             linux16 (hd0,msdos{part})/boot/vmlinuz root=/dev/vda{part} rootwait ro panic=5 {console} quiet\n    \
             initrd16 (hd0,msdos{boot})/initrd.img\n}}\n",
            console = machine.console_arg()
        )
    };
    format!(
        r#"{GRUB_HEADER}echo "{BOOTLOADER_MARK}"
# Mender's GRUB integration: two environment copies with editing locks.
set timeout=0
set menv=(hd0,msdos{boot})/{MENDER_GRUBENV}
set editing=
load_env --file ${{menv}}/mender_grubenv2/lock editing
if [ "${{editing}}" != "0" ]; then
    echo "mender: copy 2 was being written; restoring it from copy 1"
    load_env --file ${{menv}}/mender_grubenv1/env bootcount mender_boot_part upgrade_available
    save_env --file ${{menv}}/mender_grubenv2/env bootcount mender_boot_part upgrade_available
    set editing=0
    save_env --file ${{menv}}/mender_grubenv2/lock editing
else
    set editing=
    load_env --file ${{menv}}/mender_grubenv1/lock editing
    if [ "${{editing}}" != "0" ]; then
        echo "mender: copy 1 was being written; restoring it from copy 2"
        load_env --file ${{menv}}/mender_grubenv2/env bootcount mender_boot_part upgrade_available
        save_env --file ${{menv}}/mender_grubenv1/env bootcount mender_boot_part upgrade_available
        set editing=0
        save_env --file ${{menv}}/mender_grubenv1/lock editing
    fi
fi
load_env --file ${{menv}}/mender_grubenv1/env bootcount mender_boot_part upgrade_available
if [ "${{upgrade_available}}" = "1" ]; then
    if [ "${{bootcount}}" != "0" ]; then
        echo "mender: the trial of partition ${{mender_boot_part}} did not commit; switching back"
        if [ "${{mender_boot_part}}" = "{a}" ]; then
            set mender_boot_part={b}
        else
            set mender_boot_part={a}
        fi
        set upgrade_available=0
        set bootcount=0
    else
        set bootcount=1
    fi
    for n in 2 1; do
        set editing=1
        save_env --file ${{menv}}/mender_grubenv${{n}}/lock editing
        save_env --file ${{menv}}/mender_grubenv${{n}}/env bootcount mender_boot_part upgrade_available
        set editing=0
        save_env --file ${{menv}}/mender_grubenv${{n}}/lock editing
    done
fi
echo "mender: booting partition ${{mender_boot_part}} (upgrade_available=${{upgrade_available}} bootcount=${{bootcount}})"
if [ "${{mender_boot_part}}" = "{b}" ]; then
    set default=1
else
    set default=0
fi
{entry_a}{entry_b}"#,
        entry_a = entry(a),
        entry_b = entry(b),
    )
}

/// Mender's GRUB environment copies and locks at the factory, in `dir`.
pub(super) fn mender_grubenv(dir: &Path) {
    updraft_tests::bootenv::mender_grubenv_create(dir, &MENDER_FACTORY_ENV);
}

/// RAUC's central status file on the data partition: the factory release
/// in `rootfs.0`, as RAUC records an installed bundle.
fn central_status(compatible: &str) -> String {
    format!(
        "[slot.rootfs.0]\nbundle.compatible={compatible}\nbundle.version=10.0\n\
         status=ok\ninstalled.timestamp=2026-01-05T09:00:00Z\ninstalled.count=1\n"
    )
}

/// What differs between the two takeovers.
struct Takeover {
    name: &'static str,
    /// "RAUC", "Mender".
    updater: &'static str,
    predecessor: Predecessor,
    script: Script,
    /// The releases: the other updater's, the failing one, the committed
    /// one, the one under the power cut.
    versions: [&'static str; 4],
    /// What names the factory release in adopt's output.
    named_by: &'static str,
    /// The script's line on the first boot, proving it read the factory
    /// environment.
    first_boot_line: &'static str,
}

impl Lab {
    /// Scenario 9 (see the module documentation) with the other updater of
    /// this machine's bootloader; the power cut's instant comes from `seed`.
    pub fn adopt(&mut self, seed: u64) -> Result {
        let t = match self.machine.loader {
            Loader::UBoot => Takeover {
                name: "9-adopt-rauc",
                updater: "RAUC",
                predecessor: Predecessor::RaucUboot,
                script: Script::RaucUboot,
                versions: ["10.0", "10.1", "10.2", "10.3"],
                named_by: "bundle.version of rootfs.0",
                first_boot_line: "rauc: booting slot system0 (system0 left 2, system1 left 0)",
            },
            Loader::Grub => Takeover {
                name: "9-adopt-mender",
                updater: "Mender",
                predecessor: Predecessor::MenderGrub,
                script: Script::MenderGrub,
                versions: ["11.0", "11.1", "11.2", "11.3"],
                named_by: "artifact_name in /etc/mender/artifact_info",
                first_boot_line: "mender: booting partition 2 (upgrade_available=0 bootcount=0)",
            },
        };
        let [factory_v, failing_v, good_v, cut_v] = t.versions;
        let factory = self
            .work
            .join(format!("rootfs-{factory_v}-{}.ext4", t.updater));
        self.guest.rootfs_with(
            &healthy(factory_v),
            &self.settings,
            &self.work,
            &factory,
            Some(t.predecessor),
        )?;
        self.images.insert(factory_v.into(), factory.clone());
        let data: Vec<(&str, String)> = match t.predecessor {
            Predecessor::RaucUboot => vec![(
                "rauc/central.raucs",
                central_status(&self.machine.compatible()),
            )],
            Predecessor::MenderGrub => Vec::new(),
        };
        let built = format!(
            "{factory_v}, {}'s, booted by {}'s script",
            t.updater, t.updater
        );
        self.build_disk_as(&factory, &built, t.script, &data)?;

        let failing = Release {
            version: failing_v.into(),
            behaviour: Behaviour::FailsHealthCheck,
            app: false,
        };
        self.publish(&failing, &[])?;
        let mut vm = self.start(t.name)?;
        wait_userspace(&mut vm, "A", factory_v, 0)?;
        vm.wait_line(
            &format!("{}'s script reading the factory environment", t.updater),
            0,
            BOOT_WAIT,
            |l| l.contains(t.first_boot_line),
        )?;
        let adopted = vm.wait_line("updraft adopt on the first boot", 0, BOOT_WAIT, |l| {
            l.contains(guest::ADOPT_MARK) && l.contains("found: release ")
        })?;
        let want = format!(
            "found: release {factory_v} running in slot A ({}",
            t.named_by
        );
        if !adopted.contains(&want) {
            return Err(vm.failure(&format!("adopt found something else: {adopted}")));
        }
        println!("   console: {}", adopted.trim());
        wait_trial_boot(&mut vm, "B", failing_v)?;
        let m = vm.mark();
        wait_userspace(&mut vm, "A", factory_v, m)
            .map_err(|e| format!("no rollback reboot into {}'s release: {e}", t.updater))?;
        let st = wait_status(
            &mut vm,
            &format!("{failing_v} rolled back to {}'s {factory_v}", t.updater),
            |s| {
                rolled_back(s, failing_v)
                    && s["booted_slot"] == "A"
                    && s["running_version"] == factory_v
            },
        )?;
        println!(
            "   console: {failing_v} failed its health check in B; back on {}'s {factory_v} in A: {}",
            t.updater, st["last_install"]["reason"]
        );
        self.wait_report(failing_v, "rolled_back")?;

        self.publish(&healthy(good_v), &[])?;
        wait_trial_boot(&mut vm, "B", good_v)?;
        wait_status(&mut vm, &format!("{good_v} committed in B"), |s| {
            committed(s, good_v) && s["booted_slot"] == "B"
        })?;
        self.wait_report(good_v, "committed")?;
        println!(
            "   console: {good_v} committed in B through {}'s variables",
            t.updater
        );
        self.finish(vm, t.name)?;
        let shown =
            self.expect_takeover_env(t.predecessor, &format!("after {good_v}'s commit"), "B")?;
        let h = self.history()?;
        expect_event(&h, "adopted", factory_v, Some("A"))?;
        expect_event(&h, "rolled-back", failing_v, None)?;
        expect_event(&h, "committed", good_v, Some("B"))?;
        println!(
            "   disk: {shown}; history: {factory_v} adopted in A, {failing_v} rolled back, \
             {good_v} committed in B"
        );

        // A power cut in the write of the other updater's variables and
        // the switch.
        let mut rng = updraft_tests::rng::Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let point = CUT_POINTS
            .iter()
            .find(|p| p.phase == "bootloader environment and switch")
            .ok_or("no cut point in the switch")?;
        self.publish(&healthy(cut_v), &[])?;
        let cut_name = format!("{}-cut-switch", t.name);
        let mut vm = self.start(&cut_name)?;
        let (marker, after_ms) =
            cut_after(&mut vm, point.marker, cut_v, point.jitter_ms, &mut rng)?;
        println!("   power cut {after_ms} ms after {marker:?}");
        self.record(vm, &cut_name)?;
        let after = format!("{cut_name}-after");
        let mut vm = self.start(&after)?;
        wait_status_for(
            &mut vm,
            &format!("{cut_v} committed after the cut"),
            INSTALL_WAIT,
            |s| committed(s, cut_v) && s["booted_slot"] == "A",
        )?;
        self.wait_report(cut_v, "committed")?;
        println!("   after the cut: {cut_v} committed in A");
        self.finish(vm, &after)?;
        let shown =
            self.expect_takeover_env(t.predecessor, &format!("after {cut_v}'s commit"), "A")?;
        println!("   disk: {shown}");
        Ok(())
    }

    /// The other updater's variables on the disk after a commit of `slot`,
    /// checked against its contract; what they are, for the log.
    fn expect_takeover_env(&self, p: Predecessor, what: &str, slot: &str) -> Result<String> {
        match p {
            Predecessor::RaucUboot => {
                let env = self.boot_env()?;
                expect_rauc_env(&env, what, slot)?;
                Ok(format!("{} {}", self.env_name(), show_env(&env)))
            }
            Predecessor::MenderGrub => {
                let dir = self.work.join("mender-grubenv.read");
                let _ = std::fs::remove_dir_all(&dir);
                mkdir(&dir)?;
                disk::dump_dir(
                    &self.disk,
                    BOOT,
                    &format!("/{MENDER_GRUBENV}"),
                    &dir,
                    &self.work,
                )?;
                let dir = dir.join("grub-mender-grubenv");
                let part = if slot == "A" {
                    disk::SLOT_A.number
                } else {
                    disk::SLOT_B.number
                }
                .to_string();
                let mut shown = Vec::new();
                for n in [1, 2] {
                    let env = updraft_tests::bootenv::grub_editenv_list(
                        &dir.join(format!("mender_grubenv{n}/env")),
                    )?;
                    expect_env(
                        &env,
                        &format!("{what}: Mender's copy {n}"),
                        &[
                            ("mender_boot_part", &part),
                            ("upgrade_available", "0"),
                            ("bootcount", "0"),
                        ],
                    )?;
                    shown.push(format!("copy {n}: {}", show_env(&env)));
                }
                if !updraft_tests::bootenv::mender_grubenv_locks_whole(&dir) {
                    return Err(format!(
                        "{what}: a lock of Mender's GRUB environment fails its checksum \
                         (sha256sum -c lock.sha256sum in {})",
                        dir.display()
                    ));
                }
                Ok(format!(
                    "Mender's GRUB environment {}; both locks pass their checksums",
                    shown.join("; ")
                ))
            }
        }
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

#[cfg(test)]
mod tests {
    use super::super::super::machine;
    use super::*;

    #[test]
    fn rauc_s_script_reads_and_saves_rauc_s_variables_only() {
        let text = rauc_uboot_script(&machine::AARCH64).unwrap();
        assert!(text.contains(&format!(
            "env import -c ${{updraft_env_s}} ${{updraft_env_n}} {RAUC_VARIABLES}\n"
        )));
        assert!(text.contains(&format!(
            "env export -c -s ${{updraft_env_n}} ${{updraft_env_s}} {RAUC_VARIABLES}\n"
        )));
        for own in [
            "BOOT_A_LEFT",
            "BOOT_B_LEFT",
            "updraft.slot=",
            "updraft_slot",
        ] {
            assert!(!text.contains(own), "{own} in RAUC's script:\n{text}");
        }
        assert!(text.contains("rauc.slot=${rauc_slot}"));
    }

    #[test]
    fn mender_s_grub_script_boots_the_partition_mender_boot_part_names() {
        let text = mender_grub_cfg(&machine::X86_64);
        for want in [
            "root=/dev/vda2 ",
            "root=/dev/vda3 ",
            "save_env --file ${menv}/mender_grubenv${n}/lock editing",
            "load_env --file ${menv}/mender_grubenv1/env bootcount mender_boot_part upgrade_available",
        ] {
            assert!(text.contains(want), "{want} missing:\n{text}");
        }
        assert!(!text.contains("updraft.slot="), "{text}");
    }
}
