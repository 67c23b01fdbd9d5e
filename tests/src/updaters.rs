//! The updaters a fleet runs before it moves to updraft, real: RAUC 1.8
//! (Debian's `rauc`: its service on a private D-Bus, its client) and
//! Mender 3.4 (Debian's `mender-client`: its standalone `install`,
//! `commit` and `rollback`), each installing a release the way its fleets
//! do, on the loop devices and the bootloader environment of a test
//! device, so that `updraft adopt` meets the files they really leave.
//!
//! Neither was built for a machine that is not the device, and each is
//! given what it would find on one, no more:
//!
//! - **The U-Boot environment.** Both run `fw_printenv`/`fw_setenv` from
//!   `PATH` with the default configuration `/etc/fw_env.config` (RAUC 1.8
//!   has no key for another, Mender's U-Boot support none either). A
//!   directory first on their `PATH` holds two one-line scripts that run
//!   Debian's real tools with `-c` and the test's `fw_env.config`.
//! - **The booted slot.** RAUC takes it from `--override-boot-slot`, its
//!   own option for this. Mender 3.4 asks `mount` for the device of `/`
//!   and looks for a node in `/dev` with the root file system's device
//!   number, and only when neither names a root partition believes the
//!   environment's `mender_boot_part` (its `installer/partitions.go`). So
//!   it runs in a private mount namespace where `/dev` is a fresh tmpfs
//!   holding the nodes it needs and the loop devices, `mount` (first on
//!   its `PATH`) reports no device for `/`, and the test's `/etc/mender`
//!   (its path for `artifact_info` is fixed) is bind-mounted over the
//!   host's. The host's `/etc/mender` and `/dev` are never touched.
//!
//! Signing: RAUC bundles are signed with a throw-away certificate made
//! with `openssl`, its keyring; Mender artifacts are unsigned (Mender
//! installs them when no verification key is configured).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::bootenv::tool;
use crate::tmp::write_executable;

/// Run `cmd`, which must succeed; its stdout.
fn run(cmd: &mut Command) -> String {
    crate::bootenv::run(cmd).unwrap_or_else(|e| panic!("{e}"))
}

/// `dir/fw_printenv` and `dir/fw_setenv`: Debian's tools on `config`.
pub fn fw_tools(dir: &Path, config: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).expect("the tools' directory");
    for name in ["fw_printenv", "fw_setenv"] {
        write_executable(
            &dir.join(name),
            &format!(
                "#!/bin/sh\nexec {} -c '{}' \"$@\"\n",
                tool(name).display(),
                config.display()
            ),
        );
    }
    dir.to_path_buf()
}

fn path_with(first: &Path) -> String {
    format!(
        "{}:{}",
        first.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// A child killed and reaped on drop.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// ---- RAUC ---------------------------------------------------------------------

/// A signing certificate and key for RAUC bundles (its keyring is the
/// certificate).
pub struct RaucSigner {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl RaucSigner {
    pub fn new(dir: &Path) -> RaucSigner {
        std::fs::create_dir_all(dir).expect("the signer's directory");
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        run(Command::new(tool("openssl"))
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "365",
            ])
            .args(["-subj", "/CN=updraft test RAUC signer"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .stderr(Stdio::null()));
        RaucSigner { cert, key }
    }

    /// A `plain` bundle of `image` as the one image of slot class `rootfs`.
    pub fn bundle(&self, dir: &Path, compatible: &str, version: &str, image: &Path) -> PathBuf {
        let content = dir.join(format!("bundle-{version}"));
        let _ = std::fs::remove_dir_all(&content);
        std::fs::create_dir_all(&content).expect("the bundle's directory");
        std::fs::copy(image, content.join("rootfs.img")).expect("copying the image");
        std::fs::write(
            content.join("manifest.raucm"),
            format!(
                "[update]\ncompatible={compatible}\nversion={version}\n\n\
                 [bundle]\nformat=plain\n\n[image.rootfs]\nfilename=rootfs.img\n"
            ),
        )
        .expect("writing the RAUC manifest");
        let bundle = dir.join(format!("{version}.raucb"));
        let _ = std::fs::remove_file(&bundle);
        run(Command::new(tool("rauc"))
            .arg("bundle")
            .arg(format!("--cert={}", self.cert.display()))
            .arg(format!("--key={}", self.key.display()))
            .arg(&content)
            .arg(&bundle));
        bundle
    }
}

/// RAUC's service for one `system.conf`, on a private D-Bus.
pub struct Rauc {
    dir: PathBuf,
    conf: PathBuf,
    tools: Option<PathBuf>,
    bus: String,
    service: Option<Reaped>,
    _bus_daemon: Reaped,
}

impl Rauc {
    /// Start a private bus for `conf`; `fw_env_config` for
    /// `bootloader=uboot`. The service starts with [`Rauc::boot`].
    pub fn new(dir: &Path, conf: &Path, fw_env_config: Option<&Path>) -> Rauc {
        std::fs::create_dir_all(dir.join("mnt")).expect("RAUC's mount prefix");
        let socket = dir.join("bus.socket");
        let _ = std::fs::remove_file(&socket);
        let mut daemon = Command::new(tool("dbus-daemon"))
            .args(["--session", "--nofork", "--nopidfile", "--print-address=1"])
            .arg(format!("--address=unix:path={}", socket.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting dbus-daemon");
        let out = daemon.stdout.take().expect("dbus-daemon's stdout");
        let daemon = Reaped(daemon);
        let mut address = String::new();
        BufReader::new(out)
            .read_line(&mut address)
            .expect("reading the bus address");
        let bus = address.trim().to_string();
        assert!(bus.starts_with("unix:"), "dbus-daemon printed {bus:?}");
        Rauc {
            dir: dir.to_path_buf(),
            conf: conf.to_path_buf(),
            tools: fw_env_config.map(|c| fw_tools(&dir.join("bin"), c)),
            bus,
            service: None,
            _bus_daemon: daemon,
        }
    }

    /// (Re)start the service as on a device booted into the slot with
    /// `bootname`, and wait until it answers.
    pub fn boot(&mut self, bootname: &str) {
        self.stop();
        let log = std::fs::File::create(self.dir.join("service.log")).expect("the service log");
        let mut cmd = Command::new(tool("rauc"));
        cmd.arg(format!("--conf={}", self.conf.display()))
            .arg(format!("--mount={}", self.dir.join("mnt").display()))
            .arg("service")
            .arg(format!("--override-boot-slot={bootname}"))
            .env("DBUS_SYSTEM_BUS_ADDRESS", &self.bus)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the service log"))
            .stderr(log);
        if let Some(t) = &self.tools {
            cmd.env("PATH", path_with(t));
        }
        self.service = Some(Reaped(cmd.spawn().expect("starting rauc service")));
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.client(&["status"]).status.success() {
            assert!(
                Instant::now() < deadline,
                "rauc service did not answer within 20 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stop the service (a power-off).
    pub fn stop(&mut self) {
        self.service = None;
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("service.log")).unwrap_or_default()
    }

    /// `rauc ARGS` as a client of the service.
    pub fn client(&self, args: &[&str]) -> Output {
        Command::new(tool("rauc"))
            .args(args)
            .env("DBUS_SYSTEM_BUS_ADDRESS", &self.bus)
            .stdin(Stdio::null())
            .output()
            .expect("running rauc")
    }

    /// `rauc ARGS`, which must succeed; its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.client(args);
        assert!(
            out.status.success(),
            "rauc {args:?} failed ({}):\n{}{}\nservice log:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

// ---- Mender -------------------------------------------------------------------

/// Mender's standalone client on a device whose root file systems are
/// `parts` (slot A's and slot B's: links named with the partition number
/// Mender's scripts use, to block devices).
pub struct Mender {
    /// The device's `/etc/mender` (configuration, `artifact_info`).
    pub etc: PathBuf,
    /// Mender's data directory (`/var/lib/mender`: `device_type`, its store).
    pub data: PathBuf,
    bin: PathBuf,
    devices: Vec<PathBuf>,
}

impl Mender {
    /// Write Mender's files: `mender.conf` naming `parts`, `device_type`,
    /// `artifact_info` naming `artifact`; its U-Boot environment is
    /// `fw_env_config`.
    pub fn new(
        etc: &Path,
        data: &Path,
        bin: &Path,
        parts: [&Path; 2],
        device_type: &str,
        artifact: &str,
        fw_env_config: &Path,
    ) -> Mender {
        for d in [etc, data] {
            std::fs::create_dir_all(d).expect("Mender's directories");
        }
        std::fs::write(
            etc.join("mender.conf"),
            format!(
                "{{\n  \"RootfsPartA\": \"{}\",\n  \"RootfsPartB\": \"{}\",\n  \
                 \"ServerURL\": \"https://127.0.0.1:9\"\n}}\n",
                parts[0].display(),
                parts[1].display()
            ),
        )
        .expect("writing mender.conf");
        std::fs::write(
            data.join("device_type"),
            format!("device_type={device_type}\n"),
        )
        .expect("writing device_type");
        std::fs::write(
            etc.join("artifact_info"),
            format!("artifact_name={artifact}\n"),
        )
        .expect("writing artifact_info");
        fw_tools(bin, fw_env_config);
        write_executable(
            &bin.join("mount"),
            "#!/bin/sh\n[ $# -eq 0 ] && { echo 'none on / type tmpfs (rw)'; exit 0; }\n\
             exec /usr/bin/mount \"$@\"\n",
        );
        let devices = parts
            .iter()
            .map(|p| std::fs::canonicalize(p).expect("a root partition's device"))
            .collect();
        Mender {
            etc: etc.to_path_buf(),
            data: data.to_path_buf(),
            bin: bin.to_path_buf(),
            devices,
        }
    }

    /// An unsigned rootfs-image artifact of `image`.
    pub fn artifact(dir: &Path, device_type: &str, name: &str, image: &Path) -> PathBuf {
        std::fs::create_dir_all(dir).expect("the artifacts' directory");
        let out = dir.join(format!("{name}.mender"));
        let _ = std::fs::remove_file(&out);
        run(Command::new(tool("mender-artifact"))
            .args(["write", "rootfs-image", "-t", device_type, "-n", name, "-f"])
            .arg(image)
            .arg("-o")
            .arg(&out));
        out
    }

    /// `mender ARGS` in its namespace (see the module documentation).
    pub fn client(&self, args: &[&str]) -> Output {
        use std::os::unix::fs::MetadataExt;
        let mut nodes = String::new();
        for d in &self.devices {
            let rdev = std::fs::metadata(d).expect("a loop device").rdev();
            // SAFETY: major/minor only split a number.
            let (major, minor) = (libc::major(rdev), libc::minor(rdev));
            nodes.push_str(&format!(
                "mknod -m 660 '{}' b {major} {minor}\n",
                d.display()
            ));
        }
        let script = format!(
            "set -e\n\
             mount --bind '{etc}' /etc/mender\n\
             mount -t tmpfs -o mode=755 updraft-test-dev /dev\n\
             mknod -m 666 /dev/null c 1 3\nmknod -m 666 /dev/zero c 1 5\n\
             mknod -m 444 /dev/urandom c 1 9\n{nodes}\
             export PATH='{bin}':\"$PATH\"\n\
             exec '{mender}' --no-syslog -c /etc/mender/mender.conf -b /nonexistent -d '{data}' \"$@\"\n",
            etc = self.etc.display(),
            bin = self.bin.display(),
            mender = tool("mender").display(),
            data = self.data.display(),
        );
        Command::new(tool("unshare"))
            .args([
                "-m",
                "--propagation",
                "private",
                "sh",
                "-c",
                &script,
                "mender",
            ])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("running mender")
    }

    /// `mender ARGS`, which must succeed; stdout and stderr.
    pub fn ok(&self, args: &[&str]) -> String {
        crate::succeeded(&self.client(args), &format!("mender {args:?}"))
    }
}
