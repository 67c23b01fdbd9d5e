//! Scenario 10: updraft's Debian package on the systemd guest, installed,
//! configured, upgraded, removed and purged with dpkg by the guest itself.
//!
//! The slot holds scenario 6's Debian tree (which has dpkg) without
//! updraft, mounted read-write (`/var` on the slot: dpkg's database), and
//! two packages made by [`crate::deb`] with this tree's packaging:
//!
//! * the *previous build*: the previous landed release's `updraft` (the
//!   commit `updraft_tests::previous` pins, scenario 7's binary), at
//!   version `VERSION~prev.COMMIT-1`, lower than
//! * the *new build*: the guest's `updraft` of every x86_64 scenario (the
//!   workspace's build), at this tree's version `VERSION-1`.
//!
//! A unit of the VM's own runs the steps in order and prints, after each,
//! what dpkg, systemd and the file system show (`updraft-vm: deb STEP`
//! lines of `key=value` fields); the harness asserts them:
//!
//! 1. `install-old`: `dpkg -i` of the previous build: the unit enabled but
//!    inactive, the group and the state directory made;
//! 2. `start-unconfigured`: the unit started on the shipped configuration:
//!    active and degraded (systemd's status names `device.compatible`),
//!    never restarted;
//! 3. `configure`: the VM's configuration written over the conffile, the
//!    unit restarted: `updraft status` says idle, the database exists;
//! 4. `upgrade`: `dpkg -i` of the new build: the edited conffile kept, the
//!    daemon restarted (a new main PID) on the new binary, idle, the
//!    state directory as it was;
//! 5. `remove`: `dpkg -r`: the binary gone, the unit stopped, the
//!    conffile, the wants link and the state directory kept;
//! 6. `purge`: `dpkg -P`: the conffile and the wants link gone, the state
//!    directory still there (docs/debian.md).
//!
//! This module owns the scenario's guest files and assertions; the Debian
//! tree, the VM's marker and console units and the partition layout are
//! scenario 6's (its parent), the packages `deb`'s.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::super::super::console::Vm;
use super::super::super::disk::{self, BOOT};
use super::super::super::machine;
use super::super::{Lab, mkdir, wait_userspace};
use super::{
    SD_DATA, SD_SLOT_A, SD_SLOT_B, SLOT_MIB, VM_FILES, base_tarball, install, mark_script, put,
};
use crate::util::{self, Result};

/// The release marker of the slot (the console's userspace line).
const VERSION_MARK: &str = "deb";
/// Printed by the guest's step script after each step.
const STEP_MARK: &str = "updraft-vm: deb ";
/// The steps, in the order the guest runs them.
const STEPS: &[&str] = &[
    "install-old",
    "start-unconfigured",
    "configure",
    "upgrade",
    "remove",
    "purge",
];
/// How long one step may take under TCG (dpkg and a daemon start).
const STEP_WAIT: Duration = Duration::from_secs(240);
/// Where the packages and the configuration wait in the guest.
const GUEST_DIR: &str = "root/updraft-deb";

impl Lab {
    /// Scenario 10: the Debian package's life on the systemd guest.
    pub fn deb_package(&mut self) -> Result {
        let name = "10-deb";
        if !util::is_root() {
            let msg = "scenario 10 (the Debian package) needs root: mmdebstrap, and the slot \
                       image keeps the owners of the Debian tree";
            if super::super::super::ci() {
                return Err(msg.into());
            }
            println!("\n== {name}\nvm-test: skipped: {msg}");
            return Ok(());
        }
        println!("\n== {name}: packaging the previous and this build of updraft");
        let base = base_tarball()?;
        let out = self.work.join("deb-packages");
        let _ = std::fs::remove_dir_all(&out);
        mkdir(&out)?;
        let t = Instant::now();
        let commit = updraft_tests::previous::short(updraft_tests::previous::PINNED).to_string();
        let previous = out.join("updraft-previous");
        std::fs::copy(updraft_tests::previous::binary()?, &previous)
            .map_err(|e| format!("copying the previous release's updraft: {e}"))?;
        util::run(Command::new(disk::tool("strip")).arg(&previous))?;
        let old_version = format!("{}~prev.{commit}-1", env!("CARGO_PKG_VERSION"));
        let new_version = crate::deb::version();
        let old_changes = format!("The previous landed release, commit {commit}.");
        let old_deb = crate::deb::agent(&crate::deb::Input {
            arch: "amd64",
            version: &old_version,
            binary: &previous,
            out_dir: &out,
            changes: &old_changes,
        })?;
        let new_deb = crate::deb::agent(&crate::deb::Input {
            arch: "amd64",
            version: &new_version,
            binary: self.guest.updraft(),
            out_dir: &out,
            changes: "This build.",
        })?;
        println!(
            "   {} ({old_version}) and {} ({new_version}) made in {:.1} s",
            file_name(&old_deb),
            file_name(&new_deb),
            t.elapsed().as_secs_f64()
        );
        let configured = config();
        let slot = self.deb_image(&base, &old_deb, &new_deb, &configured)?;

        let disk_image = self.systemd_disk("deb", &slot)?;

        println!("\n== {name}");
        let mut vm = Vm::start(
            self.machine,
            name,
            &disk_image,
            &self.flash,
            &self.work.join(format!("{name}.console.log")),
        )?;
        wait_userspace(&mut vm, "A", VERSION_MARK, 0)?;
        let expect = Expect {
            old_version,
            new_version,
            old_binary: sha256_16(&previous)?,
            new_binary: sha256_16(self.guest.updraft())?,
            shipped_conf: sha256_16(&util::root().join("contrib/debian/updraft.toml"))?,
            configured_conf: sha256_16_of(configured.as_bytes()),
        };
        let mut seen: BTreeMap<&str, Step> = BTreeMap::new();
        for step in STEPS {
            let t = Instant::now();
            let from = vm.mark();
            let want = format!("{STEP_MARK}{step}\t");
            let line = vm.wait_line(
                &format!("step {step} of the package's life"),
                from,
                STEP_WAIT,
                |l| l.contains(&want),
            )?;
            let s = Step::parse(&line);
            expect.check(step, &s, &seen).map_err(|e| {
                vm.failure(&format!("after {step}: {e}\n(the step's line: {line})"))
            })?;
            println!(
                "   console: {step} ({:.1} s): {}",
                t.elapsed().as_secs_f64(),
                s.describe()
            );
            seen.insert(step, s);
        }
        self.finish(vm, name)?;
        Ok(())
    }

    /// The slot image: the Debian tree, the two packages and the VM's
    /// configuration in `/root/updraft-deb`, the VM's units; no updraft.
    fn deb_image(
        &self,
        base: &Path,
        old_deb: &Path,
        new_deb: &Path,
        configured: &str,
    ) -> Result<PathBuf> {
        let t = Instant::now();
        let root = self.work.join("deb-rootfs");
        let _ = std::fs::remove_dir_all(&root);
        mkdir(&root)?;
        util::run(
            Command::new("tar")
                .args(["-xpf"])
                .arg(base)
                .args(["--numeric-owner", "-C"])
                .arg(&root),
        )
        .map_err(|e| format!("unpacking {}: {e}", base.display()))?;
        install(&self.guest.kernel.image, &root, "boot/vmlinuz", 0o644)?;
        install(old_deb, &root, &format!("{GUEST_DIR}/old.deb"), 0o644)?;
        install(new_deb, &root, &format!("{GUEST_DIR}/new.deb"), 0o644)?;
        install(
            &self.settings.release_key,
            &root,
            &format!("{GUEST_DIR}/release.pub"),
            0o644,
        )?;
        put(
            &root,
            &format!("{GUEST_DIR}/updraft.toml"),
            configured,
            0o644,
        )?;
        put(&root, "etc/updraft-vm-version", VERSION_MARK, 0o644)?;
        put(&root, "etc/fstab", &fstab(), 0o644)?;
        mkdir(&root.join("data"))?;
        put(&root, "etc/hostname", "updraft-vm\n", 0o644)?;
        put(
            &root,
            "etc/machine-id",
            "7570646673797374656d64766d000010\n",
            0o444,
        )?;
        for (file, text, mode) in VM_FILES {
            put(&root, file, text, *mode)?;
        }
        put(&root, "usr/lib/updraft-vm/mark", &mark_script(), 0o755)?;
        put(&root, "usr/lib/updraft-vm/deb-steps", STEPS_SCRIPT, 0o755)?;
        put(
            &root,
            "etc/systemd/system/updraft-vm-deb.service",
            STEPS_UNIT,
            0o644,
        )?;
        util::run(
            Command::new("systemctl")
                .arg(format!("--root={}", root.display()))
                .args([
                    "enable",
                    "--quiet",
                    "updraft-vm-mark.service",
                    "updraft-vm-console.service",
                    "updraft-vm-deb.service",
                ]),
        )?;
        util::run(
            Command::new("systemctl")
                .arg(format!("--root={}", root.display()))
                .args([
                    "mask",
                    "--quiet",
                    "serial-getty@ttyS0.service",
                    "getty@tty1.service",
                    "e2scrub_all.timer",
                    "e2scrub_reap.service",
                    "fstrim.timer",
                    "apt-daily.timer",
                    "apt-daily-upgrade.timer",
                ]),
        )?;
        let out = self.work.join("deb-rootfs.ext4");
        disk::mkfs(&root, &out, SLOT_MIB, "rootfs")?;
        println!(
            "   slot image with the Debian tree and both packages built in {:.1} s ({SLOT_MIB} MiB ext4)",
            t.elapsed().as_secs_f64()
        );
        let _ = std::fs::remove_dir_all(&root);
        Ok(out)
    }
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The first 16 hex digits of a file's sha256, as the guest prints them.
fn sha256_16(p: &Path) -> Result<String> {
    let bytes = std::fs::read(p).map_err(|e| format!("reading {}: {e}", p.display()))?;
    Ok(sha256_16_of(&bytes))
}

fn sha256_16_of(bytes: &[u8]) -> String {
    let mut hex = updraft::hash::Sha256::of(bytes).to_hex();
    hex.truncate(16);
    hex
}

/// What one step line says.
struct Step {
    fields: BTreeMap<String, String>,
}

impl Step {
    fn parse(line: &str) -> Step {
        let rest = line.split(STEP_MARK).nth(1).unwrap_or("");
        Step {
            fields: rest
                .split('\t')
                .skip(1)
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .collect(),
        }
    }

    fn get(&self, key: &str) -> &str {
        self.fields.get(key).map(String::as_str).unwrap_or("")
    }

    /// `updraft status --json` of the step, when it printed JSON.
    fn status(&self) -> Option<Value> {
        serde_json::from_str(self.get("status")).ok()
    }

    fn describe(&self) -> String {
        let mut parts = vec![
            format!("dpkg {} {}", self.get("dpkg"), self.get("version")),
            format!("unit {} {}", self.get("enabled"), self.get("active")),
        ];
        match self.status() {
            Some(s) => parts.push(format!("status {}", s["state"].as_str().unwrap_or("?"))),
            None if !self.get("sdstatus").is_empty() => {
                parts.push(format!("systemd: {}", self.get("sdstatus")))
            }
            None => {}
        }
        parts.push(format!(
            "conffile {}, state dir [{}]",
            self.get("conf"),
            self.get("state")
        ));
        parts.join("; ")
    }
}

/// What each step must show.
struct Expect {
    old_version: String,
    new_version: String,
    old_binary: String,
    new_binary: String,
    shipped_conf: String,
    configured_conf: String,
}

impl Expect {
    fn check(&self, step: &str, s: &Step, seen: &BTreeMap<&str, Step>) -> Result {
        let is = |key: &str, want: &str, why: &str| -> Result {
            if s.get(key) == want {
                Ok(())
            } else {
                Err(format!("{key} is {:?}, not {want:?}: {why}", s.get(key)))
            }
        };
        let state_kept = |why: &str| -> Result {
            let db = s.get("state").split(',').any(|f| f == "updraft.db");
            if db && s.get("state_mode") == "700" {
                Ok(())
            } else {
                Err(format!(
                    "the state directory holds [{}] with mode {}: {why}",
                    s.get("state"),
                    s.get("state_mode")
                ))
            }
        };
        let idle = |why: &str| -> Result {
            match s.status() {
                Some(st) if st["state"] == "idle" => Ok(()),
                _ => Err(format!("updraft status is {:?}: {why}", s.get("status"))),
            }
        };
        is("rc", "0", "the step's command must succeed")?;
        match step {
            "install-old" => {
                is("dpkg", "ii", "the package installs")?;
                is(
                    "version",
                    &self.old_version,
                    "the previous build is installed",
                )?;
                is(
                    "binary",
                    &self.old_binary,
                    "/usr/bin/updraft is the previous build's",
                )?;
                is(
                    "conf",
                    &self.shipped_conf,
                    "the conffile is the shipped one",
                )?;
                is("enabled", "enabled", "the package enables the unit")?;
                is(
                    "active",
                    "inactive",
                    "the package must not start the daemon before it is configured",
                )?;
                is("group", "updraft", "sysusers.d makes the group")?;
                is(
                    "state_mode",
                    "700",
                    "tmpfiles.d makes the state directory, root only",
                )?;
            }
            "start-unconfigured" => {
                is(
                    "active",
                    "active",
                    "the daemon stays up on the shipped configuration",
                )?;
                is(
                    "restarts",
                    "0",
                    "a daemon without configuration must not restart in a loop",
                )?;
                let sd = s.get("sdstatus");
                if !(sd.starts_with("degraded") && sd.contains("device.compatible")) {
                    return Err(format!(
                        "systemd's status of the unit is {sd:?}: the daemon must run degraded, naming the missing device.compatible"
                    ));
                }
            }
            "configure" => {
                is("active", "active", "the configured daemon runs")?;
                is(
                    "conf",
                    &self.configured_conf,
                    "the configuration is the VM's",
                )?;
                idle("the configured daemon reports idle")?;
                state_kept("the daemon made its database")?;
            }
            "upgrade" => {
                is("dpkg", "ii", "the new build installs over the previous one")?;
                is("version", &self.new_version, "the new build is installed")?;
                is(
                    "binary",
                    &self.new_binary,
                    "/usr/bin/updraft is the new build's",
                )?;
                is(
                    "conf",
                    &self.configured_conf,
                    "an upgrade keeps the edited conffile",
                )?;
                is("active", "active", "the daemon runs after the upgrade")?;
                is("enabled", "enabled", "the unit stays enabled")?;
                let before = seen.get("configure").map(|c| c.get("pid")).unwrap_or("");
                if s.get("pid") == before || s.get("pid") == "0" {
                    return Err(format!(
                        "the daemon's main PID is {} as before the upgrade ({before}): the postinst must restart it",
                        s.get("pid")
                    ));
                }
                idle("the upgraded daemon reads the state the previous build wrote")?;
                let id = |st: Option<Value>| {
                    st.and_then(|v| v["device_id"].as_str().map(str::to_string))
                };
                let was = id(seen.get("configure").and_then(Step::status));
                if was.is_none() || id(s.status()) != was {
                    return Err(format!(
                        "the device id is {:?} after the upgrade, {was:?} before: the state must carry over",
                        id(s.status())
                    ));
                }
                state_kept("an upgrade leaves the state directory alone")?;
            }
            "remove" => {
                is("dpkg", "rc", "dpkg -r leaves the package's configuration")?;
                is("binary", "absent", "dpkg -r removes the binary")?;
                is("active", "inactive", "the prerm stops the daemon")?;
                is("conf", &self.configured_conf, "dpkg -r keeps the conffile")?;
                is(
                    "wants",
                    "yes",
                    "dpkg -r keeps the administrator's enablement",
                )?;
                state_kept("dpkg -r leaves the state directory alone")?;
            }
            "purge" => {
                is("dpkg", "absent", "dpkg -P forgets the package")?;
                is("conf", "absent", "dpkg -P removes the conffile")?;
                is("wants", "no", "the postrm removes the wants link on purge")?;
                state_kept("purge keeps the state directory (docs/debian.md)")?;
            }
            other => return Err(format!("no expectation for step {other}")),
        }
        Ok(())
    }
}

/// The VM's configuration of the daemon: no server (it never polls, and
/// idles), the GRUB environment and the slots of the disk.
fn config() -> String {
    format!(
        r#"# updraft on the Debian package's guest: configured by the operator.
[server]
manifest_url = ""

[device]
compatible = "{compatible}"
id_file = "/data/updraft/device-id"

[trust]
keys = ["/etc/updraft/release.pub"]

[slots]
a = "/dev/vda{a}"
b = "/dev/vda{b}"

[bootloader]
kind = "grub"
grubenv = "/boot/grub/grubenv"

[health]
checks_dir = "/etc/updraft/health.d"
timeout = "60s"

[system]
reboot = "auto"
state_dir = "/data/updraft"
socket = "/run/updraft/updraft.sock"
socket_group = "updraft"
"#,
        compatible = machine::X86_64.compatible(),
        a = SD_SLOT_A.number,
        b = SD_SLOT_B.number,
    )
}

/// The root file system read-write (`systemd-remount-fs` applies the
/// root's line), `/var` on it: dpkg's database.
fn fstab() -> String {
    format!(
        "/dev/vda{root} / ext4 rw 0 0\n\
         /dev/vda{boot} /boot ext4 defaults 0 2\n\
         /dev/vda{data} /data ext4 defaults 0 2\n\
         tmpfs /tmp tmpfs mode=1777,size=32m 0 0\n",
        root = SD_SLOT_A.number,
        boot = BOOT.number,
        data = SD_DATA.number,
    )
}

const STEPS_UNIT: &str = "[Unit]\n\
     Description=updraft VM: the Debian package's install, upgrade and removal\n\
     After=updraft-vm-mark.service local-fs.target\n\n\
     [Service]\n\
     Type=simple\n\
     ExecStart=/usr/lib/updraft-vm/deb-steps\n\n\
     [Install]\n\
     WantedBy=multi-user.target\n";

/// The steps, each followed by one line of what it left.
const STEPS_SCRIPT: &str = r#"#!/bin/sh
# The Debian package's life, step by step; after each, one line of facts.
exec >/dev/console 2>&1
dir=/root/updraft-deb
unit=updraft.service
systemctl is-system-running --wait >/dev/null 2>&1
first16() { cut -c1-16; }
facts() {
    version=$(dpkg-query -W -f='${Version}' updraft 2>/dev/null)
    dpkg=$(dpkg-query -W -f='${db:Status-Abbrev}' updraft 2>/dev/null | tr -d ' ')
    [ -n "$dpkg" ] || dpkg=absent
    enabled=$(systemctl is-enabled $unit 2>/dev/null | head -n 1)
    active=$(systemctl is-active $unit 2>/dev/null | head -n 1)
    pid=$(systemctl show -p MainPID --value $unit 2>/dev/null)
    restarts=$(systemctl show -p NRestarts --value $unit 2>/dev/null)
    sdstatus=$(systemctl show -p StatusText --value $unit 2>/dev/null | tr -d '\t')
    if [ -x /usr/bin/updraft ]; then
        binary=$(sha256sum /usr/bin/updraft | first16)
        status=$(updraft status --json 2>&1 | tr -d '\n\t')
    else
        binary=absent
        status=
    fi
    if [ -f /etc/updraft/updraft.toml ]; then
        conf=$(sha256sum /etc/updraft/updraft.toml | first16)
    else
        conf=absent
    fi
    if [ -L /etc/systemd/system/multi-user.target.wants/$unit ]; then wants=yes; else wants=no; fi
    group=$(getent group updraft | cut -d: -f1)
    state=$(ls -A /data/updraft 2>/dev/null | tr '\n' ',')
    state_mode=$(stat -c %a /data/updraft 2>/dev/null)
    printf 'updraft-vm: deb %s\trc=%s\tdpkg=%s\tversion=%s\tenabled=%s\tactive=%s\tpid=%s\trestarts=%s\tbinary=%s\tconf=%s\twants=%s\tgroup=%s\tstate_mode=%s\tstate=%s\tsdstatus=%s\tstatus=%s\n' \
        "$1" "$2" "$dpkg" "$version" "$enabled" "$active" "$pid" "$restarts" "$binary" "$conf" "$wants" "$group" "$state_mode" "$state" "$sdstatus" "$status"
}
# Until `updraft status` shows the state wanted (60 s at most).
wait_state() {
    i=0
    while [ $i -lt 60 ]; do
        updraft status --json 2>/dev/null | grep -Eq "\"state\": *\"$1\"" && return 0
        sleep 1
        i=$((i + 1))
    done
    return 1
}
rc=0; dpkg -i $dir/old.deb </dev/null || rc=$?
facts install-old $rc
rc=0; systemctl start $unit || rc=$?
sleep 3
facts start-unconfigured $rc
rc=0
{ cp $dir/updraft.toml /etc/updraft/updraft.toml && cp $dir/release.pub /etc/updraft/release.pub \
    && systemctl restart $unit && wait_state idle; } || rc=$?
facts configure $rc
rc=0; dpkg -i $dir/new.deb </dev/null || rc=$?
wait_state idle || true
facts upgrade $rc
rc=0; dpkg -r updraft </dev/null || rc=$?
facts remove $rc
rc=0; dpkg -P updraft </dev/null || rc=$?
facts purge $rc
echo "updraft-vm: deb done"
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_line_gives_its_fields() {
        let s = Step::parse(
            "[  9.1] updraft-vm: deb remove\trc=0\tdpkg=rc\tbinary=absent\tstatus=\tstate=updraft.db,",
        );
        assert_eq!(s.get("dpkg"), "rc");
        assert_eq!(s.get("binary"), "absent");
        assert_eq!(s.get("state"), "updraft.db,");
        assert!(s.status().is_none());
    }

    #[test]
    fn every_step_the_script_prints_is_checked() {
        for step in STEPS {
            assert!(
                STEPS_SCRIPT.contains(&format!("facts {step} ")),
                "the guest script never reports {step}"
            );
        }
    }
}
