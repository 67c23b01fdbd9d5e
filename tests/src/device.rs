//! A simulated device: two slot files, a kernel command line, a boot id, a
//! state directory and a configuration, driven through the real `updraft`
//! binary.
//!
//! A "reboot" is what DESIGN.md's contract says it is: the reboot command
//! writes a marker; the test gives the device a new boot id, runs the boot
//! script the bootloader would run (choosing a slot and counting the
//! attempt), writes that slot into the command line, and starts the daemon
//! again.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use updraft::hash::Sha256;
use updraft::slot::SlotName;

use crate::publisher::{KeyPair, image_bytes};
use crate::tmp::TempDir;
use crate::{bin, bootenv};

/// How the device trusts releases.
#[derive(Clone, Debug)]
pub enum TrustSpec {
    /// Simple mode: release keys in the configuration.
    Keys(Vec<PathBuf>, usize),
    /// Root mode: root keys, threshold, provisioned key document version.
    Root(Vec<PathBuf>, usize, u64),
}

/// Which bootloader backend the device uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BootSpec {
    /// The `file` backend.
    File,
    /// A redundant U-Boot environment in two files, made with `mkenvimage`,
    /// read by the real `fw_printenv`.
    Uboot,
    /// A `grubenv` block made with `grub-editenv`.
    Grub,
    /// Extra `[bootloader]` lines written verbatim (the test simulates
    /// reboots itself with `reboot_into`).
    Custom(String),
}

impl BootSpec {
    /// The `script` backend running the executable at `script` (the test
    /// simulates reboots itself with `reboot_into`).
    pub fn script(script: &Path) -> BootSpec {
        BootSpec::Custom(format!("kind = \"script\"\nscript = {script:?}\n"))
    }
}

/// How to build a device.
#[derive(Clone, Debug)]
pub struct DeviceSpec {
    pub slot_size: u64,
    pub trust: TrustSpec,
    pub boot: BootSpec,
    pub compatible: String,
    /// Extra `[device]` lines (releases before a key existed refuse it).
    pub device: String,
    /// `[server]` lines.
    pub server: String,
    /// `[health]` lines.
    pub health: String,
    /// Extra `[bootloader]` lines.
    pub bootloader: String,
    /// Extra `[system]` lines.
    pub system: String,
    /// `[policy]` lines; the section is left out when empty (releases
    /// before it existed refuse it).
    pub policy: String,
    /// Whole sections appended after the others (`[apps]`,
    /// `[components.NAME]`); releases before them refuse them.
    pub sections: String,
    /// `system.reboot_command` as a TOML array; `None`: touch the reboot
    /// marker (`Device::reboot_marker`).
    pub reboot_command: Option<String>,
    pub tries: u32,
    /// Link slot B to slot A's file (a misconfiguration).
    pub same_slot_twice: bool,
    /// Configure these paths as the slots (e.g. loop devices over the slot
    /// files) instead of the files themselves.
    pub slot_paths: Option<(PathBuf, PathBuf)>,
    /// Put the slots, the state directory and the bootloader environment
    /// under this directory (e.g. a power-cut filesystem).
    pub disk: Option<PathBuf>,
    /// Make the slot files sparse: `slot_size` bytes of which only the
    /// first MiB is written (with each slot's usual content), for slots
    /// larger than the test should write or hold in memory.
    pub sparse_slots: bool,
}

impl DeviceSpec {
    /// Require a build provenance attestation signed by `threshold` of
    /// `builders` (the `[provenance]` section).
    pub fn require_provenance(&mut self, builders: &[&KeyPair], threshold: usize) {
        let paths: Vec<PathBuf> = builders.iter().map(|b| b.public.clone()).collect();
        self.sections.push_str(&format!(
            "[provenance]\nbuilders = {}\nthreshold = {threshold}\n",
            toml_list(&paths)
        ));
    }

    pub fn simple(release: &KeyPair) -> DeviceSpec {
        DeviceSpec {
            slot_size: 16 * 1024 * 1024,
            trust: TrustSpec::Keys(vec![release.public.clone()], 1),
            boot: BootSpec::File,
            compatible: "testboard".into(),
            device: String::new(),
            server: String::new(),
            health: String::new(),
            bootloader: String::new(),
            system: String::new(),
            policy: String::new(),
            sections: String::new(),
            reboot_command: None,
            tries: 3,
            same_slot_twice: false,
            slot_paths: None,
            disk: None,
            sparse_slots: false,
        }
    }
}

/// What must not change when updraft refuses something.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub slot_a: Sha256,
    pub slot_b: Sha256,
    pub state: Value,
    pub serial: Value,
    pub keys_version: Value,
    pub slots: Value,
    pub boot_state: String,
}

impl Snapshot {
    /// Panic, naming what moved, unless `after` shows the device exactly as
    /// this snapshot: both slots' bytes, the state, the stored serial, the
    /// trusted key document, the slot records and the boot selection.
    pub fn assert_unchanged(&self, after: &Snapshot) {
        assert_eq!(self.slot_a, after.slot_a, "slot A bytes changed");
        assert_eq!(self.slot_b, after.slot_b, "slot B bytes changed");
        assert_eq!(self.state, after.state, "state changed");
        assert_eq!(self.serial, after.serial, "stored serial changed");
        assert_eq!(
            self.keys_version, after.keys_version,
            "trusted key version changed"
        );
        assert_eq!(
            self.slots, after.slots,
            "slot records or boot selection changed"
        );
        assert_eq!(
            self.boot_state, after.boot_state,
            "bootloader state changed"
        );
    }
}

pub struct Device {
    pub tmp: TempDir,
    pub spec: DeviceSpec,
    pub config: PathBuf,
    pub slot_a: PathBuf,
    pub slot_b: PathBuf,
    pub cmdline: PathBuf,
    pub boot_id: PathBuf,
    pub state_dir: PathBuf,
    pub socket: PathBuf,
    pub boot_state: PathBuf,
    pub reboot_marker: PathBuf,
    pub daemon_log: PathBuf,
    /// `fw_env.config` of the U-Boot environment (BootSpec::Uboot).
    pub fw_env_config: PathBuf,
    /// The GRUB environment block (BootSpec::Grub).
    pub grubenv: PathBuf,
    daemon: Option<Child>,
    boots: u32,
    /// An `updraft` binary to run instead of the workspace's (another
    /// release of it, see `previous.rs`).
    binary: Option<PathBuf>,
}

/// The factory image in slot A of every new device: a seed no test
/// publishes a release from. A device whose booted slot holds a
/// manifest's image records that release as running instead of
/// installing it (`provision`), so a factory image equal to a test's
/// release would end that test's update before it starts.
pub const FACTORY_SEED: u64 = 0xFAC7_0125;

impl Device {
    pub fn new(name: &str, spec: DeviceSpec) -> Device {
        let tmp = TempDir::new(name);
        let d = |p: &str| tmp.join(p);
        // What lives on the device's storage (slots, state, bootloader
        // environment) may be placed on another filesystem.
        let disk = |p: &str| {
            spec.disk
                .as_ref()
                .map(|r| r.join(p))
                .unwrap_or_else(|| tmp.join(p))
        };
        let dev = Device {
            config: d("updraft.toml"),
            slot_a: disk("slot-a.img"),
            slot_b: disk("slot-b.img"),
            cmdline: d("cmdline"),
            boot_id: d("boot_id"),
            state_dir: disk("data/updraft"),
            socket: d("run/updraft.sock"),
            boot_state: disk("data/updraft/boot.state"),
            reboot_marker: d("rebooted"),
            daemon_log: d("daemon.log"),
            fw_env_config: disk("boot/fw_env.config"),
            grubenv: disk("boot/grub/grubenv"),
            daemon: None,
            boots: 1,
            binary: None,
            spec,
            tmp,
        };
        if let Some(parent) = dev.slot_a.parent() {
            std::fs::create_dir_all(parent).expect("slot directory");
        }
        let make_slot = |path: &Path, seed: u64| {
            let size = dev.spec.slot_size;
            if dev.spec.sparse_slots {
                let head = image_bytes(size.min(1 << 20) as usize, seed);
                std::fs::write(path, &head).expect("writing a slot");
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(path)
                    .expect("opening a slot");
                f.set_len(size).expect("sizing a sparse slot");
            } else {
                std::fs::write(path, image_bytes(size as usize, seed)).expect("writing a slot");
            }
        };
        make_slot(&dev.slot_a, FACTORY_SEED);
        if dev.spec.same_slot_twice {
            std::os::unix::fs::symlink(&dev.slot_a, &dev.slot_b).expect("linking slot B to A");
        } else {
            make_slot(&dev.slot_b, 0xB);
        }
        std::fs::write(
            &dev.cmdline,
            "console=ttyS0 root=/dev/root updraft.slot=A\n",
        )
        .expect("cmdline");
        std::fs::write(&dev.boot_id, "boot-1\n").expect("boot id");
        match dev.spec.boot {
            BootSpec::Uboot => {
                let dir = dev.fw_env_config.parent().expect("boot dir").to_path_buf();
                std::fs::create_dir_all(&dir).expect("boot dir");
                let env = bootenv::UbootEnv::create(
                    &dir,
                    bootenv::Layout::redundant_two_files(0x4000),
                    &[
                        ("bootcmd", "run updraft_boot"),
                        ("bootdelay", "0"),
                        ("BOOT_ORDER", "A B"),
                        ("BOOT_A_LEFT", "3"),
                        ("BOOT_B_LEFT", "3"),
                    ],
                );
                assert_eq!(env.config, dev.fw_env_config);
            }
            BootSpec::Grub => {
                std::fs::create_dir_all(dev.grubenv.parent().expect("grub dir")).expect("grub dir");
                bootenv::grub_editenv_create(&dev.grubenv);
                bootenv::grub_editenv_set(
                    &dev.grubenv,
                    &[
                        ("ORDER", "A B"),
                        ("A_OK", "1"),
                        ("A_TRY", "0"),
                        ("B_OK", "1"),
                        ("B_TRY", "0"),
                    ],
                )
                .expect("grub-editenv set");
            }
            _ => {}
        }
        dev.write_config();
        dev
    }

    fn write_config(&self) {
        let s = &self.spec;
        let trust = match &s.trust {
            TrustSpec::Keys(keys, t) => format!("keys = {}\nthreshold = {t}\n", toml_list(keys)),
            TrustSpec::Root(keys, t, v) => {
                format!(
                    "root_keys = {}\nthreshold = {t}\nkeys_version = {v}\n",
                    toml_list(keys)
                )
            }
        };
        let boot = match &s.boot {
            BootSpec::File => format!("kind = \"file\"\npath = {:?}\n", self.boot_state),
            BootSpec::Uboot => format!(
                "kind = \"uboot\"\nfw_env_config = {:?}\n",
                self.fw_env_config
            ),
            BootSpec::Grub => format!("kind = \"grub\"\ngrubenv = {:?}\n", self.grubenv),
            BootSpec::Custom(lines) => lines.clone(),
        };
        let text = format!(
            "[server]\n{server}\n\
             [device]\ncompatible = {compat:?}\nid_file = {id:?}\n{device}\
             [trust]\n{trust}\n\
             [slots]\na = {a:?}\nb = {b:?}\ncmdline = {cmdline:?}\n\
             [bootloader]\n{boot}tries = {tries}\n{bootloader}\n\
             [health]\nchecks_dir = {checks:?}\n{health}\n\
             [system]\nstate_dir = {state:?}\nsocket = {sock:?}\nboot_id_file = {bootid:?}\n\
             reboot_command = {reboot}\n{system}\n{policy}{sections}",
            server = s.server,
            compat = s.compatible,
            device = if s.device.is_empty() {
                String::new()
            } else {
                format!("{}\n", s.device)
            },
            id = self.state_dir.join("device-id"),
            a = s.slot_paths.as_ref().map(|p| &p.0).unwrap_or(&self.slot_a),
            b = s.slot_paths.as_ref().map(|p| &p.1).unwrap_or(&self.slot_b),
            cmdline = self.cmdline,
            tries = s.tries,
            bootloader = s.bootloader,
            checks = self.tmp.join("health.d"),
            health = s.health,
            state = self.state_dir,
            sock = self.socket,
            bootid = self.boot_id,
            reboot = s
                .reboot_command
                .clone()
                .unwrap_or_else(|| format!("[\"touch\", {:?}]", self.reboot_marker)),
            system = s.system,
            policy = if s.policy.is_empty() {
                String::new()
            } else {
                format!("[policy]\n{}\n", s.policy)
            },
            sections = s.sections,
        );
        std::fs::write(&self.config, text).expect("writing the config");
    }

    /// Rewrite the configuration after changing the spec.
    pub fn reconfigure(&mut self, f: impl FnOnce(&mut DeviceSpec)) {
        f(&mut self.spec);
        self.write_config();
    }

    /// Run this `updraft` executable (natively) for every later command and
    /// daemon start, or the workspace's again with `None`. The state, the
    /// configuration and the slots stay as they are: this is how a test
    /// runs another release of updraft on the same device.
    pub fn use_binary(&mut self, exe: Option<PathBuf>) {
        assert!(
            self.daemon.is_none(),
            "stop the daemon before switching binaries"
        );
        self.binary = exe;
    }

    /// `updraft --config CONFIG ARGS…` (through the emulator when set).
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = match &self.binary {
            Some(exe) => Command::new(exe),
            None => bin::command("updraft"),
        };
        c.arg("--config").arg(&self.config).args(args);
        c
    }

    pub fn updraft(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("running updraft")
    }

    /// Run and insist on success; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.updraft(args);
        assert!(
            out.status.success(),
            "updraft {args:?} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Run and insist on exit status 1; returns stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let out = self.updraft(args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(
            out.status.code(),
            Some(1),
            "updraft {args:?} should fail with status 1, got {}:\n{}\n{err}",
            out.status,
            String::from_utf8_lossy(&out.stdout)
        );
        err
    }

    /// Run and insist on exit status `code`; returns stdout and stderr,
    /// in that order, as one text.
    pub fn exits(&self, code: i32, args: &[&str]) -> String {
        let out = self.updraft(args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            out.status.code(),
            Some(code),
            "updraft {args:?} should exit with status {code}, got {}:\n{text}\n{}",
            out.status,
            self.log_tail()
        );
        text
    }

    /// `updraft install MANIFEST`.
    pub fn install(&self, manifest: &str) -> Output {
        self.updraft(&["install", manifest])
    }

    /// `updraft status --json` as JSON.
    pub fn status(&self) -> Value {
        let text = self.ok(&["status", "--json"]);
        serde_json::from_str(&text).expect("status --json is JSON")
    }

    /// `status --json` once the daemon is back in `state` (a check that
    /// wrote its history is still `checking` until it returns); panics
    /// with the last status after `timeout`.
    pub fn wait_state(&self, state: &str, timeout: std::time::Duration) -> Value {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let st = self.status();
            if st["state"] == state {
                return st;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "still not {state} after {timeout:?}: {st:#}"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    pub fn slot_bytes(&self, s: SlotName) -> Vec<u8> {
        std::fs::read(match s {
            SlotName::A => &self.slot_a,
            SlotName::B => &self.slot_b,
        })
        .expect("reading a slot")
    }

    /// The sha256 of the first `len` bytes of slot `s`, read in pieces
    /// (for slots too large to read whole).
    pub fn slot_sha256(&self, s: SlotName, len: u64) -> Sha256 {
        use std::io::Read;
        let path = match s {
            SlotName::A => &self.slot_a,
            SlotName::B => &self.slot_b,
        };
        let f = std::fs::File::open(path).expect("opening a slot");
        let mut r = f.take(len);
        let mut h = updraft::hash::Hasher::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut n = 0u64;
        loop {
            let got = r.read(&mut buf).expect("reading a slot");
            if got == 0 {
                break;
            }
            h.update(&buf[..got]);
            n += got as u64;
        }
        assert_eq!(n, len, "slot {s} holds fewer than {len} bytes");
        h.finish()
    }

    /// The slot named on the command line.
    pub fn booted(&self) -> SlotName {
        let text = std::fs::read_to_string(&self.cmdline).expect("cmdline");
        updraft::slot::parse_cmdline(&text).expect("updraft.slot on the cmdline")
    }

    /// Everything a refused install must leave alone.
    pub fn snapshot(&self) -> Snapshot {
        let st = self.status();
        Snapshot {
            slot_a: Sha256::of(&self.slot_bytes(SlotName::A)),
            slot_b: Sha256::of(&self.slot_bytes(SlotName::B)),
            state: st["state"].clone(),
            serial: st["serial"].clone(),
            keys_version: st["keys_version"].clone(),
            slots: st["slots"].clone(),
            boot_state: self.boot_state_text(),
        }
    }

    /// The bootloader's variables as the real tools list them.
    pub fn boot_state_text(&self) -> String {
        match self.spec.boot {
            BootSpec::File | BootSpec::Custom(_) => {
                std::fs::read_to_string(&self.boot_state).unwrap_or_default()
            }
            BootSpec::Uboot => format!("{:?}", bootenv::fw_printenv(&self.fw_env_config)),
            BootSpec::Grub => format!("{:?}", bootenv::grub_editenv_list(&self.grubenv)),
        }
    }

    /// The boot selection variables as the real tools read them.
    pub fn boot_vars(&self) -> std::collections::BTreeMap<String, String> {
        match self.spec.boot {
            BootSpec::Uboot => {
                bootenv::fw_printenv(&self.fw_env_config).unwrap_or_else(|e| panic!("{e}"))
            }
            BootSpec::Grub => {
                bootenv::grub_editenv_list(&self.grubenv).unwrap_or_else(|e| panic!("{e}"))
            }
            _ => std::fs::read_to_string(&self.boot_state)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    /// Bring the device to a known first state: database created, booted
    /// slot marked good.
    pub fn init(&self) {
        self.ok(&["mark-good"]);
    }

    // ---- the daemon -----------------------------------------------------------

    pub fn start_daemon(&mut self) {
        assert!(self.daemon.is_none(), "daemon already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.daemon_log)
            .expect("daemon log");
        let child = self
            .cmd(&["daemon"])
            .env("UPDRAFT_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("starting the daemon");
        self.daemon = Some(child);
        // Ready when the socket answers.
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(30) {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            if let Some(c) = self.daemon.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    self.daemon = None;
                    panic!("daemon exited at start ({status}):\n{}", self.log_tail());
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "daemon did not open its socket within 30 s:\n{}",
            self.log_tail()
        );
    }

    pub fn daemon_running(&mut self) -> bool {
        match self.daemon.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    pub fn daemon_pid(&self) -> Option<u32> {
        self.daemon.as_ref().map(|c| c.id())
    }

    /// SIGTERM and wait.
    pub fn stop_daemon(&mut self) {
        if let Some(mut c) = self.daemon.take() {
            // SAFETY: signalling a child we started, by its pid.
            unsafe { libc_kill(c.id() as i32, 15) };
            let t = Instant::now();
            loop {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                if t.elapsed() > Duration::from_secs(30) {
                    let _ = c.kill();
                    let _ = c.wait();
                    panic!(
                        "daemon did not stop within 30 s of SIGTERM:\n{}",
                        self.log_tail()
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// SIGKILL: a crash.
    pub fn kill_daemon(&mut self) {
        if let Some(mut c) = self.daemon.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.daemon_log).unwrap_or_default()
    }

    /// The end of the daemon's own log, for failure messages: updraft's
    /// lines only (the libraries' debug lines are left out) and at most the
    /// last 80, so the events that matter survive a truncated CI log.
    pub fn log_tail(&self) -> String {
        const KEEP: usize = 80;
        let log = self.log();
        let own: Vec<&str> = log.lines().filter(|l| !l.contains(" DEBUG [")).collect();
        let skip = own.len().saturating_sub(KEEP);
        let mut out = String::new();
        if skip > 0 {
            out.push_str(&format!(
                "[… {skip} earlier line(s) of {} …]\n",
                self.daemon_log.display()
            ));
        }
        out.push_str(&own[skip..].join("\n"));
        out
    }

    /// Wait until the daemon's log holds `needle`; panics with the log
    /// after `timeout`.
    pub fn wait_log(&self, needle: &str, timeout: Duration) {
        let t = Instant::now();
        while t.elapsed() < timeout {
            if self.log().contains(needle) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "the daemon did not log {needle:?} within {timeout:?}:\n{}",
            self.log_tail()
        );
    }

    /// Wait until the boot selection variable `var` reads `want` (as the
    /// real tools list it); panics with the environment and the log after
    /// `timeout`.
    pub fn wait_boot_var(&self, var: &str, want: &str, timeout: Duration) {
        let t = Instant::now();
        while t.elapsed() < timeout {
            if self.boot_vars().get(var).map(String::as_str) == Some(want) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "{var} did not become {want} within {timeout:?}: {}\n{}",
            self.boot_state_text(),
            self.log_tail()
        );
    }

    /// Poll `status --json` until `pred` holds; panics with the log after
    /// `timeout`.
    pub fn wait_for(&self, what: &str, timeout: Duration, pred: impl Fn(&Value) -> bool) -> Value {
        let t = Instant::now();
        let mut last = Value::Null;
        while t.elapsed() < timeout {
            let out = self.updraft(&["status", "--json"]);
            if out.status.success() {
                if let Ok(v) = serde_json::from_slice::<Value>(&out.stdout) {
                    if pred(&v) {
                        return v;
                    }
                    last = v;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "timed out waiting for {what}; last status {last:#}\ndaemon log:\n{}",
            self.log_tail()
        );
    }

    /// Wait until the daemon committed `version` and runs it, idle; the
    /// status then.
    pub fn wait_committed(&self, version: &str, timeout: Duration) -> Value {
        self.wait_for(&format!("release {version} committed"), timeout, |s| {
            s["state"] == "idle" && s["running_version"] == version
        })
    }

    /// Wait until the daemon rolled its last install back and is idle; the
    /// status then.
    pub fn wait_rolled_back(&self, timeout: Duration) -> Value {
        self.wait_for("the install rolled back", timeout, |s| {
            s["last_install"]["result"] == "rolled_back" && s["state"] == "idle"
        })
    }

    /// Wait until the reboot command ran (the marker exists).
    pub fn wait_reboot_requested(&self, timeout: Duration) {
        let t = Instant::now();
        while t.elapsed() < timeout {
            if self.reboot_marker.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "no reboot was requested within {timeout:?}; log:\n{}",
            self.log_tail()
        );
    }

    // ---- reboots --------------------------------------------------------------

    /// Run the boot script once, as the bootloader would at power-on: it
    /// picks a slot and counts the attempt (real `fw_setenv` /
    /// `grub-editenv` for those backends). `None` when nothing is bootable.
    pub fn boot_script(&self) -> Option<SlotName> {
        match &self.spec.boot {
            BootSpec::File => bootenv::boot_file(&self.boot_state),
            BootSpec::Uboot => bootenv::boot_uboot(&self.fw_env_config),
            BootSpec::Grub => bootenv::boot_grub(&self.grubenv),
            BootSpec::Custom(_) => {
                panic!("custom bootloaders: the test simulates boots with reboot_into")
            }
        }
    }

    /// Simulate a reboot: stop the daemon, run the boot script, give the
    /// device a new boot id and write the chosen slot into the command line.
    /// Returns the booted slot.
    pub fn reboot(&mut self) -> SlotName {
        self.stop_daemon();
        let slot = self.boot_script().unwrap_or_else(|| {
            panic!(
                "the boot script found no bootable slot: {}",
                self.boot_state_text()
            )
        });
        self.reboot_into(slot);
        slot
    }

    /// The power-on part of a reboot: new boot id, command line naming
    /// `slot`, reboot marker cleared.
    pub fn reboot_into(&mut self, slot: SlotName) {
        self.power_on(&format!(
            "console=ttyS0 root=/dev/root updraft.slot={}\n",
            slot.as_str()
        ));
    }

    /// The power-on part of a reboot with the kernel command line a boot
    /// firmware chose: new boot id, reboot marker cleared.
    pub fn power_on(&mut self, cmdline: &str) {
        self.stop_daemon();
        self.boots += 1;
        std::fs::write(&self.boot_id, format!("boot-{}\n", self.boots)).expect("boot id");
        std::fs::write(&self.cmdline, cmdline).expect("cmdline");
        let _ = std::fs::remove_file(&self.reboot_marker);
    }

    /// A reboot command that records its arguments in the reboot marker
    /// (`reboot "0 tryboot"` leaves `0 tryboot`), as a TOML array.
    pub fn recording_reboot_command(&self) -> String {
        format!(
            "[\"/bin/sh\", \"-c\", \"printf '%s' \\\"$*\\\" > {}\", \"reboot\"]",
            self.reboot_marker.display()
        )
    }

    /// The arguments the last reboot command was given, once it ran
    /// ([`Device::recording_reboot_command`]).
    pub fn reboot_arguments(&self) -> Option<String> {
        std::fs::read_to_string(&self.reboot_marker).ok()
    }

    /// Add an executable health check.
    pub fn health_check(&self, name: &str, script: &str) {
        let dir = self.tmp.join("health.d");
        std::fs::create_dir_all(&dir).expect("health.d");
        crate::tmp::write_executable(&dir.join(name), &format!("#!/bin/sh\n{script}\n"));
    }

    /// Give the device its own inhibitors: an inhibit directory in its
    /// test directory, and an empty logind directory so the machine's own
    /// locks do not count; `policy` is added to the `[policy]` section.
    /// Returns the inhibit directory (not created: the daemon makes it).
    pub fn own_inhibitors(&mut self, policy: &str) -> PathBuf {
        let dir = self.path("inhibit.d");
        let logind = self.path("logind");
        std::fs::create_dir_all(&logind).expect("the logind directory");
        self.reconfigure(|s| {
            s.policy = format!(
                "inhibit_dir = {:?}\nlogind_dir = {:?}\n{policy}",
                dir.display().to_string(),
                logind.display().to_string()
            )
        });
        dir
    }

    pub fn path(&self, p: &str) -> PathBuf {
        self.tmp.join(p)
    }

    pub fn dir(&self) -> &Path {
        self.tmp.path()
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        if let Some(mut c) = self.daemon.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- daemon log (end) ---\n{}", self.log_tail());
        }
    }
}

fn toml_list(paths: &[PathBuf]) -> String {
    let items: Vec<String> = paths
        .iter()
        .map(|p| format!("{:?}", p.display().to_string()))
        .collect();
    format!("[{}]", items.join(", "))
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}
