//! Scenario 11 (x86_64): the hardware rollback floor on a real boot. QEMU's
//! TPM TIS device, backed by swtpm on the host, gives the guest's Debian
//! kernel (its TPM drivers are built in) `/dev/tpmrm0`; updraft in the
//! guest speaks TPM 2.0 to it directly (`rollback.access = "direct"`: the
//! busybox slots carry no tpm2-tools).
//!
//! The NV counter is defined from the host before the first boot, as
//! provisioning does (tpm2-tools against swtpm's TCP socket, on the state
//! the VM's TPM then uses). A release raising the security version is
//! installed and committed: the counter, read from the host afterwards,
//! moved to it. Then the data partition is rewritten empty (the database
//! gone, as an attacker who rewrites it leaves it) and the server offers
//! an older, validly signed manifest: the device refuses it by the
//! counter alone.
//!
//! This module owns the host's swtpm for the VM (started for each boot,
//! ended by its PID) and the scenario's assertions; it never changes the
//! TPM's state other than defining the index before the first boot.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use updraft_tests::swtpm::Swtpm;

use super::*;

/// The NV index, updraft's default.
const INDEX: u32 = 0x0150_0016;

/// The guest's `[rollback]` section.
const ROLLBACK: &str = "\n[rollback]\ncounter = \"tpm2\"\naccess = \"direct\"\nnv_index = \"0x1500016\"\ntcti = \"device:/dev/tpmrm0\"\n";

/// swtpm serving QEMU's TPM device on a control socket, on the state in
/// `state`; ended by its PID when dropped.
struct VmTpm {
    child: Child,
    socket: PathBuf,
}

impl VmTpm {
    fn start(state: &Path, log: &Path) -> Result<VmTpm> {
        // In the temporary directory: a socket's path must stay short.
        let socket = std::env::temp_dir().join(format!("updraft-vm-{}.swtpm", std::process::id()));
        let _ = std::fs::remove_file(&socket);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| format!("opening {}: {e}", log.display()))?;
        let err = log.try_clone().map_err(|e| format!("swtpm log: {e}"))?;
        let mut child = Command::new("swtpm")
            .args(["socket", "--tpm2", "--ctrl"])
            .arg(format!("type=unixio,path={}", socket.display()))
            .arg("--tpmstate")
            .arg(format!("dir={}", state.display()))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("starting swtpm: {e} (Debian package swtpm)"))?;
        let t = Instant::now();
        while !socket.exists() {
            if let Ok(Some(s)) = child.try_wait() {
                return Err(format!("swtpm exited at once ({s})"));
            }
            if t.elapsed() > Duration::from_secs(10) {
                let _ = child.kill();
                let _ = child.wait();
                return Err("swtpm made no control socket in 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(VmTpm { child, socket })
    }

    /// QEMU's arguments for a TPM TIS device backed by it.
    fn qemu_args(&self) -> Vec<OsString> {
        [
            "-chardev".to_string(),
            format!("socket,id=chrtpm,path={}", self.socket.display()),
            "-tpmdev".into(),
            "emulator,id=tpm0,chardev=chrtpm".into(),
            "-device".into(),
            "tpm-tis,tpmdev=tpm0".into(),
        ]
        .into_iter()
        .map(OsString::from)
        .collect()
    }
}

impl Drop for VmTpm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// The releases scenario 11 builds.
const RELEASES: &[&str] = &["11.0", "11.1", "11.2"];

impl Lab {
    /// Drop the cached root file systems of `versions`, so that the next
    /// [`Lab::image`] of each is built with the settings then in force.
    fn forget_images(&mut self, versions: &[&str]) {
        for v in versions {
            self.images.remove(*v);
        }
    }

    /// Scenario 11: the counter advances at the commit of a release raising
    /// the security version; a device whose database is gone refuses an
    /// older signed release by the counter.
    pub fn hardware_floor(&mut self) -> Result {
        let name = "11-hardware-floor";
        let state = self.work.join("swtpm-state");
        let _ = std::fs::remove_dir_all(&state);
        mkdir(&state)?;
        let tpm_log = self.work.join("swtpm.log");
        {
            let host = Swtpm::start_on("vm-provision", &state);
            host.define_counter(INDEX);
        }
        println!("   NV counter {INDEX:#x} defined on the VM's TPM (tpm2_nvdefine against swtpm)");
        // Its images carry the `[rollback]` section: none built earlier
        // (scenario 9 names releases 11.x too) may stand in for them, and
        // none of them for a later scenario's.
        self.forget_images(RELEASES);
        self.settings.extra = ROLLBACK.to_string();
        let result = self.hardware_floor_runs(name, &state, &tpm_log);
        self.settings.extra = String::new();
        self.forget_images(RELEASES);
        result
    }

    fn hardware_floor_runs(&mut self, name: &str, state: &Path, tpm_log: &Path) -> Result {
        let factory = self.image(&healthy("11.0"))?;
        self.build_disk(&factory, "11.0")?;
        // The older release, signed and kept aside; then the newer one.
        let old = healthy("11.1");
        self.publish_with(&old, &["--security-version", "1"])?;
        let old_manifest = self.work.join("manifest-11.1.json");
        std::fs::copy(self.site.join("manifest.json"), &old_manifest)
            .map_err(|e| format!("keeping 11.1's manifest: {e}"))?;
        // Until 11.2 is published nothing is offered: 11.1's manifest is
        // taken down now and served again after the wipe.
        let new = healthy("11.2");
        self.publish_with(&new, &["--security-version", "2"])?;

        let t = Instant::now();
        let tpm = VmTpm::start(state, tpm_log)?;
        let mut vm = self.start_tpm(&format!("{name}-commit"), &tpm)?;
        wait_userspace(&mut vm, "A", "11.0", 0)?;
        wait_trial_boot(&mut vm, "B", "11.2")?;
        let st = wait_status(&mut vm, "11.2 committed with the counter at 2", |s| {
            committed(s, "11.2") && s["hardware_floor"]["value"] == 2
        })?;
        println!(
            "   console: 11.2 (security version 2) committed in B; hw floor {}",
            st["hardware_floor"]
        );
        self.finish(vm, &format!("{name}-commit"))?;
        drop(tpm);
        let value = Swtpm::start_on("vm-read", state).value(INDEX);
        if value != Some(2) {
            return Err(format!(
                "the VM's TPM counter {INDEX:#x} reads {value:?} from the host after the commit, not 2"
            ));
        }
        println!("   host: the VM's TPM counter {INDEX:#x} reads 2");

        // The data partition rewritten empty: the database is gone.
        let empty = self.work.join("datafs-empty");
        let _ = std::fs::remove_dir_all(&empty);
        mkdir(&empty)?;
        let data_img = self.work.join("data-empty.ext4");
        disk::mkfs(&empty, &data_img, DATA.size_mib, "data")?;
        util::output(
            Command::new("dd")
                .arg(format!("if={}", data_img.display()))
                .arg(format!("of={}", self.disk.display()))
                .args(["bs=1M", "status=none", "conv=notrunc"])
                .arg(format!("seek={}", DATA.start_mib)),
        )?;
        std::fs::copy(&old_manifest, self.site.join("manifest.json"))
            .map_err(|e| format!("serving 11.1's manifest again: {e}"))?;
        println!(
            "   disk: data partition rewritten empty; the server offers 11.1 (security version 1)"
        );

        let tpm = VmTpm::start(state, tpm_log)?;
        let mut vm = self.start_tpm(&format!("{name}-wiped"), &tpm)?;
        wait_userspace(&mut vm, "B", "11.2", 0)?;
        let refusal = vm.wait_line("11.1 refused by the hardware floor", 0, BOOT_WAIT, |l| {
            l.contains("release 11.1 security version 1 is below the hardware floor 2")
        })?;
        println!("   console: {}", refusal.trim());
        let st = wait_status(&mut vm, "status with the floor", |s| {
            s["hardware_floor"]["value"] == 2
        })?;
        if st["running_version"] != "11.2" {
            return Err(format!("after the refusal: {st}"));
        }
        self.finish(vm, &format!("{name}-wiped"))?;
        drop(tpm);
        let h = self.history()?;
        let installed = |e: &&Value| {
            e["release"] == "11.1" && !e["event"].as_str().is_some_and(|ev| ev.contains("refus"))
        };
        if h.iter().any(|e| installed(&e)) {
            return Err(format!(
                "11.1 appears in the history:\n{}",
                show_history(&h)
            ));
        }
        println!(
            "   history: 11.1 never installed; scenario {:.1} s",
            t.elapsed().as_secs_f64()
        );
        Ok(())
    }

    fn start_tpm(&self, name: &str, tpm: &VmTpm) -> Result<Vm> {
        println!("\n== {name}");
        Vm::start_with(
            self.machine,
            name,
            &self.disk,
            &self.flash,
            &self.work.join(format!("{name}.console.log")),
            &tpm.qemu_args(),
        )
    }
}
