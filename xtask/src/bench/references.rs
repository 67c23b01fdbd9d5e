//! The reference installers `bench install` times beside updraft: RAUC and
//! SWUpdate, each when it is installed. This module owns what they need and
//! nothing else: finding the tools, a signing key and self-signed
//! certificate made with `openssl`, RAUC's `system.conf`, bundle, private
//! D-Bus and service, SWUpdate's `.swu`, one timed install, and the check
//! that slot B holds the image afterwards.
//!
//! Both install the same image into the same slot B loop device as updraft.
//!
//! RAUC: `system.conf` with `bootloader=noop`, slot rootfs.0 = slot A
//! (booted, given by `--override-boot-slot`) and rootfs.1 = slot B, both
//! `type=raw`; the keyring is the certificate. The bundle is squashfs
//! (`rauc bundle --mksquashfs-args`: zstd at the release's level, 1 MiB
//! blocks) in the `plain` format: its whole content is checked against the
//! signature before anything is written. The `verity` format needs
//! device-mapper, which is used only when `/dev/mapper/control` exists.
//! Debian's rauc installs through its D-Bus service, so a private
//! `dbus-daemon` is started here and serves as the system bus
//! (`DBUS_SYSTEM_BUS_ADDRESS`) of a `rauc service` started for each run, so
//! the service's peak RSS (`VmHWM`) is that run's.
//!
//! SWUpdate: a `.swu` (cpio newc, written here) holding `sw-description`,
//! its CMS signature (Debian's swupdate is built to require signed images,
//! `-k`) and the release's own zstd artifact, installed by the `raw`
//! handler with `compressed = "zstd"` and the artifact's `sha256`.
//!
//! Each run zeroes slot B's first 4 MiB (so an image left by an earlier run
//! cannot pass the check), drops the page cache, runs the tool under GNU
//! time, fsyncs slot B (inside the timed span, as `dd conv=fsync` does),
//! and compares the sha256 of slot B's first image-size bytes with the
//! image's.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::common::{drop_caches, read_time_report, shell_line, shell_quote, under_gnu_time};
use crate::util::{self, Result};

/// The compatible string the release, bundle and `.swu` are made for.
const COMPATIBLE: &str = "benchboard";

/// A reference installer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tool {
    Rauc,
    Swupdate,
}

impl Tool {
    pub fn label(self) -> &'static str {
        match self {
            Tool::Rauc => "rauc install",
            Tool::Swupdate => "swupdate -i",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Tool::Rauc => "RAUC",
            Tool::Swupdate => "SWUpdate",
        }
    }
}

/// What the references are given: the same inputs as updraft.
pub struct Inputs<'a> {
    pub work: &'a Path,
    pub image: &'a Path,
    pub artifact: &'a Path,
    pub size: u64,
    pub level: u64,
    pub slot_a: &'a Path,
    pub slot_b: &'a Path,
}

/// One timed reference install.
pub struct Run {
    pub wall: Duration,
    pub user: Duration,
    pub sys: Duration,
    /// Peak RSS of the command run (the `rauc` client, or `swupdate`).
    pub rss_kib: u64,
    /// RAUC: peak RSS of the `rauc service` that did the install.
    pub service_rss_kib: Option<u64>,
}

/// The references set up for this run, and lines about those left out.
pub struct References {
    rauc: Option<Rauc>,
    swupdate: Option<Swupdate>,
    notes: Vec<String>,
    slot_b: PathBuf,
    size: u64,
    image_sha256: String,
}

/// Set up every reference that is installed; the others (and any whose
/// set-up fails) are left out with a line saying why.
pub fn prepare(inp: &Inputs) -> Result<References> {
    let mut notes = Vec::new();
    let missing = |tools: &[&str]| -> Vec<String> {
        tools
            .iter()
            .filter(|t| !util::have(t))
            .map(|t| t.to_string())
            .collect()
    };
    let rauc_missing = missing(&["rauc", "mksquashfs", "dbus-daemon", "openssl"]);
    let swu_missing = missing(&["swupdate", "openssl"]);
    let mut refs = References {
        rauc: None,
        swupdate: None,
        notes: Vec::new(),
        slot_b: inp.slot_b.to_path_buf(),
        size: inp.size,
        image_sha256: String::new(),
    };
    if !rauc_missing.is_empty() {
        notes.push(format!(
            "rauc: not installed (missing {}; apt-get install rauc squashfs-tools dbus openssl)",
            rauc_missing.join(", ")
        ));
    }
    if !swu_missing.is_empty() {
        notes.push(format!(
            "swupdate: not installed (missing {}; apt-get install swupdate openssl)",
            swu_missing.join(", ")
        ));
    }
    if rauc_missing.is_empty() || swu_missing.is_empty() {
        refs.image_sha256 = sha256_of(&format!("cat {}", q(inp.image)))?;
        let dir = inp.work.join("references");
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let signer = Signer::make(&dir)?;
        if rauc_missing.is_empty() {
            match Rauc::prepare(inp, &dir, &signer, &refs.image_sha256) {
                Ok(r) => refs.rauc = Some(r),
                Err(e) => notes.push(format!("rauc: left out, set-up failed: {e}")),
            }
        }
        if swu_missing.is_empty() {
            match Swupdate::prepare(inp, &dir, &signer) {
                Ok(s) => refs.swupdate = Some(s),
                Err(e) => notes.push(format!("swupdate: left out, set-up failed: {e}")),
            }
        }
    }
    refs.notes = notes;
    Ok(refs)
}

impl References {
    /// The references that will be measured, in run order.
    pub fn present(&self) -> Vec<Tool> {
        let mut v = Vec::new();
        if self.rauc.is_some() {
            v.push(Tool::Rauc);
        }
        if self.swupdate.is_some() {
            v.push(Tool::Swupdate);
        }
        v
    }

    /// Lines about references that are not installed or were left out.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// The command as a reader would run it by hand.
    pub fn command_line(&self, t: Tool) -> String {
        match t {
            Tool::Rauc => self.rauc.as_ref().map_or(String::new(), Rauc::command_line),
            Tool::Swupdate => self
                .swupdate
                .as_ref()
                .map_or(String::new(), Swupdate::command_line),
        }
    }

    /// What the tool checks while installing, as configured here.
    pub fn verification(&self, t: Tool) -> String {
        match t {
            Tool::Rauc => {
                let format = self.rauc.as_ref().map_or("plain", |r| r.format);
                format!(
                    "CMS signature of the bundle ({format} format: {}); no read-back of the slot",
                    if format == "verity" {
                        "dm-verity checks each block as it is read"
                    } else {
                        "the whole squashfs is hashed against the signature before writing"
                    }
                )
            }
            Tool::Swupdate => "CMS signature of sw-description, sha256 of the compressed \
                               image as it streams; no read-back of the slot"
                .into(),
        }
    }

    /// Install once, then check slot B holds the image.
    pub fn measure(&self, t: Tool) -> Result<Run> {
        clobber(&self.slot_b)?;
        drop_caches()?;
        let run = match t {
            Tool::Rauc => self
                .rauc
                .as_ref()
                .ok_or("rauc is not set up")?
                .install(&self.slot_b)?,
            Tool::Swupdate => self
                .swupdate
                .as_ref()
                .ok_or("swupdate is not set up")?
                .install(&self.slot_b)?,
        };
        let got = slot_sha256(&self.slot_b, self.size)?;
        if got != self.image_sha256 {
            return Err(format!(
                "{} reported success, but slot B {} does not hold the image \
                 (sha256 of its first {} bytes is {got}, the image's is {})",
                t.label(),
                self.slot_b.display(),
                self.size,
                self.image_sha256
            ));
        }
        Ok(run)
    }
}

fn q(p: &Path) -> String {
    shell_quote(&p.to_string_lossy())
}

/// sha256 (hex) of what a shell command writes to stdout.
fn sha256_of(script: &str) -> Result<String> {
    let out = util::output(
        Command::new("sh")
            .arg("-c")
            .arg(format!("{script} | sha256sum")),
    )?;
    out.split_whitespace()
        .next()
        .filter(|h| h.len() == 64)
        .map(str::to_string)
        .ok_or_else(|| format!("sha256sum printed {out:?} for {script}"))
}

fn slot_sha256(slot: &Path, size: u64) -> Result<String> {
    sha256_of(&format!(
        "dd if={} bs=4M count={size} iflag=direct,count_bytes status=none",
        q(slot)
    ))
}

/// Zero the slot's first 4 MiB and write it out.
fn clobber(slot: &Path) -> Result {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(slot)
        .map_err(|e| format!("opening {}: {e}", slot.display()))?;
    f.write_all(&vec![0u8; 4 << 20])
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("zeroing the start of {}: {e}", slot.display()))
}

/// Write the slot's dirty pages out, as part of the timed install.
fn fsync_slot(slot: &Path) -> Result {
    std::fs::OpenOptions::new()
        .write(true)
        .open(slot)
        .and_then(|f| f.sync_all())
        .map_err(|e| format!("fsync {}: {e}", slot.display()))
}

/// Run `cmd` under GNU time, then fsync the slot; wall time spans both.
fn timed(cmd: &mut Command, report: &Path, slot: &Path) -> Result<Run> {
    let mut timed = under_gnu_time(cmd, report);
    let t0 = Instant::now();
    let out = timed
        .output()
        .map_err(|e| format!("starting {}: {e}", shell_line(cmd)))?;
    fsync_slot(slot)?;
    let wall = t0.elapsed();
    let r = read_time_report(report)?;
    if !out.status.success() || r.exit != 0 {
        let tail = |b: &[u8]| {
            let s = String::from_utf8_lossy(b);
            let lines: Vec<&str> = s.lines().collect();
            lines[lines.len().saturating_sub(15)..].join("\n")
        };
        return Err(format!(
            "{} failed ({}):\n{}\n{}",
            shell_line(cmd),
            out.status,
            tail(&out.stdout),
            tail(&out.stderr)
        ));
    }
    Ok(Run {
        wall,
        user: r.user,
        sys: r.sys,
        rss_kib: r.max_rss_kib,
        service_rss_kib: None,
    })
}

// ---- signing ----------------------------------------------------------------

/// A key and self-signed certificate for the bundle and the `.swu`.
struct Signer {
    key: PathBuf,
    cert: PathBuf,
}

impl Signer {
    fn make(dir: &Path) -> Result<Signer> {
        let key = dir.join("signing.key");
        let cert = dir.join("signing.pem");
        if !key.is_file() || !cert.is_file() {
            util::output(
                Command::new("openssl")
                    .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout"])
                    .arg(&key)
                    .arg("-out")
                    .arg(&cert)
                    .args(["-days", "3650", "-subj", "/CN=updraft bench reference"]),
            )?;
        }
        Ok(Signer { key, cert })
    }
}

// ---- RAUC -------------------------------------------------------------------

/// mksquashfs arguments for RAUC's smallest bundle: zstd at `level` in
/// 1 MiB blocks.
pub(super) fn smallest(level: u64) -> String {
    format!("-comp zstd -Xcompression-level {level} -b 1M")
}

/// The `rauc bundle` command that packs `image` as the one raw image of a
/// bundle in `format`, signed by `signer`, its squashfs made with
/// `mksquashfs` arguments (`None`: RAUC's own, i.e. mksquashfs's defaults). Its input directory is `dir/content` (made afresh, holding the
/// RAUC manifest and a hard link to the image); the caller removes it.
fn rauc_bundle_command(
    dir: &Path,
    signer: &Signer,
    image: &Path,
    mksquashfs: Option<&str>,
    format: &str,
    bundle: &Path,
) -> Result<Command> {
    let content = dir.join("content");
    let _ = std::fs::remove_dir_all(&content);
    let _ = std::fs::remove_file(bundle);
    std::fs::create_dir_all(&content)
        .map_err(|e| format!("creating {}: {e}", content.display()))?;
    let manifest = format!(
        "[update]\ncompatible={COMPATIBLE}\nversion=1.0.0\n\n\
         [bundle]\nformat={format}\n\n[image.rootfs]\nfilename=rootfs.ext4\n"
    );
    std::fs::write(content.join("manifest.raucm"), manifest)
        .map_err(|e| format!("writing the RAUC manifest: {e}"))?;
    let img = content.join("rootfs.ext4");
    if std::fs::hard_link(image, &img).is_err() {
        std::fs::copy(image, &img)
            .map_err(|e| format!("copying the image into {}: {e}", content.display()))?;
    }
    let mut cmd = Command::new("rauc");
    cmd.arg("bundle")
        .arg(format!("--cert={}", signer.cert.display()))
        .arg(format!("--key={}", signer.key.display()))
        .arg(format!("--keyring={}", signer.cert.display()));
    if let Some(args) = mksquashfs {
        cmd.arg(format!("--mksquashfs-args={args}"));
    }
    cmd.arg(&content).arg(bundle);
    Ok(cmd)
}

/// `rauc bundle` for `bench publish`: a signing certificate under `dir`
/// and the command packing `image` into `bundle`, or why RAUC is absent.
pub(super) fn rauc_bundle(
    dir: &Path,
    image: &Path,
    mksquashfs: Option<&str>,
    bundle: &Path,
) -> Result<Command> {
    let missing: Vec<&str> = ["rauc", "mksquashfs", "openssl"]
        .into_iter()
        .filter(|t| !util::have(t))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "not installed (missing {}; apt-get install rauc squashfs-tools openssl)",
            missing.join(", ")
        ));
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let signer = Signer::make(dir)?;
    rauc_bundle_command(dir, &signer, image, mksquashfs, "plain", bundle)
}

struct Rauc {
    conf: PathBuf,
    bundle: PathBuf,
    mount: PathBuf,
    format: &'static str,
    log: PathBuf,
    report: PathBuf,
    bus: Bus,
}

impl Rauc {
    fn prepare(inp: &Inputs, dir: &Path, signer: &Signer, image_sha256: &str) -> Result<Rauc> {
        let rdir = dir.join("rauc");
        let data = rdir.join("data");
        let mount = rdir.join("mnt");
        for d in [&data, &mount] {
            std::fs::create_dir_all(d).map_err(|e| format!("creating {}: {e}", d.display()))?;
        }
        let format = if Path::new("/dev/mapper/control").exists() {
            "verity"
        } else {
            "plain"
        };
        let conf = rdir.join("system.conf");
        let text = format!(
            "[system]\ncompatible={COMPATIBLE}\nbootloader=noop\ndata-directory={data}\n\n\
             [keyring]\npath={cert}\n\n\
             [slot.rootfs.0]\ndevice={a}\ntype=raw\nbootname=A\n\n\
             [slot.rootfs.1]\ndevice={b}\ntype=raw\nbootname=B\n",
            data = data.display(),
            cert = signer.cert.display(),
            a = inp.slot_a.display(),
            b = inp.slot_b.display(),
        );
        std::fs::write(&conf, text).map_err(|e| format!("writing {}: {e}", conf.display()))?;

        let bundle = rdir.join("rootfs.raucb");
        let stamp = rdir.join("bundle.done");
        let want = format!("{image_sha256} level {} {format}\n", inp.level);
        if std::fs::read_to_string(&stamp).ok().as_deref() == Some(want.as_str())
            && bundle.is_file()
        {
            println!("  rauc: reusing {}", bundle.display());
        } else {
            let mut cmd = rauc_bundle_command(
                &rdir,
                signer,
                inp.image,
                Some(&smallest(inp.level)),
                format,
                &bundle,
            )?;
            println!("  rauc: {}", shell_line(&cmd));
            let t = Instant::now();
            util::output(&mut cmd)?;
            println!("  rauc: bundle made in {:.1} s", t.elapsed().as_secs_f64());
            let _ = std::fs::remove_dir_all(rdir.join("content"));
            std::fs::write(&stamp, want).map_err(|e| format!("{}: {e}", stamp.display()))?;
        }
        let len = std::fs::metadata(&bundle)
            .map(|m| m.len())
            .map_err(|e| format!("{}: {e}", bundle.display()))?;
        println!(
            "  rauc: {} ({:.1} MiB, {format} format), {}",
            bundle.display(),
            len as f64 / (1 << 20) as f64,
            conf.display()
        );
        let bus = Bus::start(&rdir)?;
        Ok(Rauc {
            conf,
            bundle,
            mount,
            format,
            log: rdir.join("service.log"),
            report: rdir.join("time.txt"),
            bus,
        })
    }

    fn service_command(&self) -> Command {
        let mut c = Command::new("rauc");
        c.arg(format!("--conf={}", self.conf.display()))
            .arg(format!("--mount={}", self.mount.display()))
            .arg("service")
            .arg("--override-boot-slot=A")
            .env("DBUS_SYSTEM_BUS_ADDRESS", &self.bus.address);
        c
    }

    fn install_command(&self) -> Command {
        let mut c = Command::new("rauc");
        c.arg("install")
            .arg(&self.bundle)
            .env("DBUS_SYSTEM_BUS_ADDRESS", &self.bus.address);
        c
    }

    fn command_line(&self) -> String {
        format!(
            "DBUS_SYSTEM_BUS_ADDRESS={} {}   (service: {})",
            self.bus.address,
            shell_line(&self.install_command()),
            shell_line(&self.service_command())
        )
    }

    fn install(&self, slot: &Path) -> Result<Run> {
        let log = std::fs::File::create(&self.log)
            .map_err(|e| format!("creating {}: {e}", self.log.display()))?;
        let err = log
            .try_clone()
            .map_err(|e| format!("{}: {e}", self.log.display()))?;
        let mut svc = self.service_command();
        svc.stdin(Stdio::null()).stdout(log).stderr(err);
        let mut svc = Reaped(
            svc.spawn()
                .map_err(|e| format!("starting {}: {e}", shell_line(&svc)))?,
        );
        self.wait_ready(&mut svc)?;
        let mut run = timed(&mut self.install_command(), &self.report, slot).map_err(|e| {
            format!(
                "{e}\nservice log ({}):\n{}",
                self.log.display(),
                std::fs::read_to_string(&self.log).unwrap_or_default()
            )
        })?;
        run.service_rss_kib = vm_hwm_kib(svc.0.id());
        Ok(run)
    }

    /// Wait until the service answers on the bus.
    fn wait_ready(&self, svc: &mut Reaped) -> Result {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = Command::new("rauc")
                .arg("status")
                .env("DBUS_SYSTEM_BUS_ADDRESS", &self.bus.address)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ok {
                return Ok(());
            }
            if let Ok(Some(status)) = svc.0.try_wait() {
                return Err(format!(
                    "rauc service exited ({status}); its log ({}):\n{}",
                    self.log.display(),
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "rauc service did not answer on {} within 20 s; its log ({}):\n{}",
                    self.bus.address,
                    self.log.display(),
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Peak RSS of a running process, from `/proc/PID/status`.
fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// A child process killed and reaped on drop.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A private `dbus-daemon` (session configuration: anyone on it may own
/// any name), stopped on drop.
struct Bus {
    address: String,
    _daemon: Reaped,
}

impl Bus {
    fn start(dir: &Path) -> Result<Bus> {
        let socket = dir.join("bus.socket");
        let _ = std::fs::remove_file(&socket);
        let mut cmd = Command::new("dbus-daemon");
        cmd.args(["--session", "--nofork", "--nopidfile", "--print-address=1"])
            .arg(format!("--address=unix:path={}", socket.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("starting {}: {e}", shell_line(&cmd)))?;
        let out = child.stdout.take();
        let daemon = Reaped(child);
        let mut line = String::new();
        if let Some(out) = out {
            let _ = BufReader::new(out).read_line(&mut line);
        }
        let address = line.trim().to_string();
        if !address.starts_with("unix:") {
            return Err(format!(
                "{} printed no bus address ({address:?})",
                shell_line(&cmd)
            ));
        }
        Ok(Bus {
            address,
            _daemon: daemon,
        })
    }
}

// ---- SWUpdate -----------------------------------------------------------------

struct Swupdate {
    swu: PathBuf,
    cert: PathBuf,
    tmp: PathBuf,
    report: PathBuf,
}

impl Swupdate {
    fn prepare(inp: &Inputs, dir: &Path, signer: &Signer) -> Result<Swupdate> {
        let sdir = dir.join("swupdate");
        let tmp = sdir.join("tmp");
        std::fs::create_dir_all(&tmp).map_err(|e| format!("creating {}: {e}", tmp.display()))?;
        let art_sha = sha256_of(&format!("cat {}", q(inp.artifact)))?;
        let name = "rootfs.ext4.zst";
        let desc = format!(
            "software = {{\n  version = \"1.0.0\";\n  hardware-compatibility: [ \"1.0\" ];\n  \
             images: ( {{\n    filename = \"{name}\";\n    device = \"{dev}\";\n    \
             type = \"raw\";\n    compressed = \"zstd\";\n    sha256 = \"{art_sha}\";\n  }} );\n}}\n",
            dev = inp.slot_b.display(),
        );
        let desc_path = sdir.join("sw-description");
        std::fs::write(&desc_path, &desc)
            .map_err(|e| format!("writing {}: {e}", desc_path.display()))?;
        let sig_path = sdir.join("sw-description.sig");
        util::output(
            Command::new("openssl")
                .args(["cms", "-sign", "-in"])
                .arg(&desc_path)
                .arg("-out")
                .arg(&sig_path)
                .arg("-signer")
                .arg(&signer.cert)
                .arg("-inkey")
                .arg(&signer.key)
                .args(["-outform", "DER", "-nosmimecap", "-binary"]),
        )?;
        let sig = std::fs::read(&sig_path).map_err(|e| format!("{}: {e}", sig_path.display()))?;
        let swu = sdir.join("rootfs.swu");
        write_newc(
            &swu,
            &[
                ("sw-description", Entry::Bytes(desc.as_bytes())),
                ("sw-description.sig", Entry::Bytes(&sig)),
                (name, Entry::File(inp.artifact)),
            ],
        )?;
        println!(
            "  swupdate: {} (sw-description, its CMS signature, the release's artifact)",
            swu.display()
        );
        Ok(Swupdate {
            swu,
            cert: signer.cert.clone(),
            tmp,
            report: sdir.join("time.txt"),
        })
    }

    fn command(&self) -> Command {
        let mut c = Command::new("swupdate");
        c.arg("-k")
            .arg(&self.cert)
            .args(["-H", &format!("{COMPATIBLE}:1.0"), "-i"])
            .arg(&self.swu)
            .env("TMPDIR", &self.tmp);
        c
    }

    fn command_line(&self) -> String {
        format!("TMPDIR={} {}", q(&self.tmp), shell_line(&self.command()))
    }

    fn install(&self, slot: &Path) -> Result<Run> {
        timed(&mut self.command(), &self.report, slot)
    }
}

enum Entry<'a> {
    Bytes(&'a [u8]),
    File(&'a Path),
}

/// Write a cpio archive in the "new ASCII" (newc) format.
fn write_newc(out: &Path, entries: &[(&str, Entry)]) -> Result {
    let err = |e: std::io::Error| format!("writing {}: {e}", out.display());
    let f = std::fs::File::create(out).map_err(err)?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
    let pad = |w: &mut std::io::BufWriter<std::fs::File>, n: u64| {
        w.write_all(&[0u8; 3][..((4 - n % 4) % 4) as usize])
    };
    let header = |w: &mut std::io::BufWriter<std::fs::File>,
                  ino: u64,
                  mode: u64,
                  name: &str,
                  len: u64|
     -> std::io::Result<()> {
        let fields = [
            ino,
            mode,
            0,
            0,
            1,
            0,
            len,
            0,
            0,
            0,
            0,
            name.len() as u64 + 1,
            0,
        ];
        let mut h = String::from("070701");
        for v in fields {
            h.push_str(&format!("{v:08X}"));
        }
        w.write_all(h.as_bytes())?;
        w.write_all(name.as_bytes())?;
        w.write_all(&[0])?;
        pad(w, 110 + name.len() as u64 + 1)
    };
    for (i, (name, entry)) in entries.iter().enumerate() {
        let ino = i as u64 + 1;
        match entry {
            Entry::Bytes(b) => {
                header(&mut w, ino, 0o100644, name, b.len() as u64).map_err(err)?;
                w.write_all(b).map_err(err)?;
                pad(&mut w, b.len() as u64).map_err(err)?;
            }
            Entry::File(p) => {
                let len = std::fs::metadata(p)
                    .map(|m| m.len())
                    .map_err(|e| format!("{}: {e}", p.display()))?;
                if len > u32::MAX as u64 {
                    return Err(format!("{} is too large for cpio newc", p.display()));
                }
                header(&mut w, ino, 0o100644, name, len).map_err(err)?;
                let mut src =
                    std::fs::File::open(p).map_err(|e| format!("{}: {e}", p.display()))?;
                let copied = std::io::copy(&mut src, &mut w).map_err(err)?;
                if copied != len {
                    return Err(format!("{} changed while being archived", p.display()));
                }
                pad(&mut w, len).map_err(err)?;
            }
        }
    }
    header(&mut w, 0, 0, "TRAILER!!!", 0).map_err(err)?;
    w.flush().map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newc_entries_are_aligned_and_end_with_the_trailer() {
        let dir = std::env::temp_dir().join(format!("xtask-newc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("a.cpio");
        write_newc(&p, &[("sw-description", Entry::Bytes(b"abcde"))]).unwrap();
        let b = std::fs::read(&p).unwrap();
        assert!(b.starts_with(b"070701"));
        // Header 110 + name 15 = 125, padded to 128; data 5, padded to 8.
        assert_eq!(&b[110..124], b"sw-description");
        assert_eq!(&b[128..133], b"abcde");
        assert_eq!(&b[136..142], b"070701");
        assert_eq!(b.len() % 4, 0);
        assert!(b.windows(10).any(|w| w == b"TRAILER!!!"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
