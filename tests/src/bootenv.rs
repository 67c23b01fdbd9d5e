//! Bootloader environments for tests, made and read with the real tools.
//!
//! U-Boot environments are built by `mkenvimage` (u-boot-tools) and read and
//! written by `fw_printenv`/`fw_setenv` (libubootenv-tool); GRUB blocks by
//! `grub-editenv` (grub-common). The simulated boot scripts
//! ([`boot_uboot`], [`boot_grub`], [`boot_file`]) do what the boot scripts
//! in `docs/bootloaders.md` do at power-on, through those same tools, so a
//! test can "reboot" a device and see which slot the bootloader picks.
//!
//! A test using them first checks `require!` (see [`crate::prereq`]), so
//! that it skips, naming the Debian package, when a tool is missing; a
//! tool that is missing anyway panics with the same name, never a silent
//! pass.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use updraft::bootloader::uboot::UbootBootloader;
use updraft::slot::SlotName;

/// The path of a tool (on `PATH`, then in `/usr/sbin` and `/sbin`);
/// panics naming its package from `tests/prerequisites.txt` when it is
/// missing.
pub fn tool(name: &str) -> PathBuf {
    if let Some(p) = crate::prereq::command(name) {
        return p;
    }
    let why =
        crate::prereq::unavailable(&[name]).unwrap_or_else(|| format!("{name} is not installed"));
    panic!("{why}: cargo xtask test as root installs it");
}

pub(crate) fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("running {cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn parse_listing(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A directory removed when dropped.
pub struct Scratch {
    path: PathBuf,
}

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        static N: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "updraft-bootenv-{}-{}-{name}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("creating a scratch directory");
        Scratch { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

// ---------------------------------------------------------------------------
// U-Boot

/// `fw_printenv -c CONFIG`: all variables, or the tool's error.
pub fn fw_printenv(config: &Path) -> Result<BTreeMap<String, String>, String> {
    run(Command::new(tool("fw_printenv")).arg("-c").arg(config)).map(|t| parse_listing(&t))
}

/// One variable as `fw_printenv` sees it (`None` when unset).
pub fn fw_printenv_var(config: &Path, name: &str) -> Option<String> {
    fw_printenv(config)
        .unwrap_or_else(|e| panic!("{e}"))
        .remove(name)
}

/// `fw_setenv -c CONFIG -s SCRIPT`: set (`Some`) or delete (`None`) several
/// variables in one write.
pub fn fw_setenv(config: &Path, vars: &[(&str, Option<&str>)]) -> Result<(), String> {
    let script = config.with_file_name(format!(
        ".fw_setenv-{}-{}",
        std::process::id(),
        config
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    ));
    let text: String = vars
        .iter()
        .map(|(k, v)| format!("{k}={}\n", v.unwrap_or("")))
        .collect();
    std::fs::write(&script, text).map_err(|e| format!("writing {}: {e}", script.display()))?;
    let r = run(Command::new(tool("fw_setenv"))
        .arg("-c")
        .arg(config)
        .arg("-s")
        .arg(&script))
    .map(|_| ());
    let _ = std::fs::remove_file(&script);
    r
}

/// Where the copies of a test environment go.
#[derive(Clone, Debug)]
pub struct Layout {
    /// Size of each copy.
    pub size: usize,
    /// (file name in the directory, offset) per copy; two copies = redundant.
    pub copies: Vec<(String, u64)>,
    /// Length of each device file (at least what the copies need).
    pub file_size: Option<u64>,
}

impl Layout {
    /// One copy at offset 0 of `uboot.env`, the file exactly one copy long.
    pub fn single(size: usize) -> Layout {
        Layout {
            size,
            copies: vec![("uboot.env".into(), 0)],
            file_size: None,
        }
    }

    /// Two copies back to back in one file.
    pub fn redundant(size: usize) -> Layout {
        Layout {
            size,
            copies: vec![("uboot.env".into(), 0), ("uboot.env".into(), size as u64)],
            file_size: None,
        }
    }

    /// Two copies, each in its own file.
    pub fn redundant_two_files(size: usize) -> Layout {
        Layout {
            size,
            copies: vec![("uboot.env".into(), 0), ("uboot-redund.env".into(), 0)],
            file_size: None,
        }
    }

    pub fn is_redundant(&self) -> bool {
        self.copies.len() == 2
    }
}

/// A U-Boot environment in files, with its `fw_env.config`.
pub struct UbootEnv {
    pub layout: Layout,
    /// Device path and offset of each copy.
    pub copies: Vec<(PathBuf, u64)>,
    pub config: PathBuf,
}

impl UbootEnv {
    /// Build the environment holding `vars` (in this order) with
    /// `mkenvimage` (`-r` when redundant; both copies get flags 1) and
    /// describe it in `dir/fw_env.config`.
    pub fn create(dir: &Path, layout: Layout, vars: &[(&str, &str)]) -> UbootEnv {
        let text: String = vars.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
        let txt = dir.join("env.txt");
        let img = dir.join("env.img");
        std::fs::write(&txt, text).expect("writing env.txt");
        let mut cmd = Command::new(tool("mkenvimage"));
        if layout.is_redundant() {
            cmd.arg("-r");
        }
        cmd.arg("-s")
            .arg(layout.size.to_string())
            .arg("-o")
            .arg(&img)
            .arg(&txt);
        run(&mut cmd).unwrap_or_else(|e| panic!("{e}"));
        let image = std::fs::read(&img).expect("reading mkenvimage output");
        assert_eq!(image.len(), layout.size);
        let mut copies = Vec::new();
        let mut config = String::new();
        for (name, offset) in &layout.copies {
            let dev = dir.join(name);
            let needed = offset + layout.size as u64;
            let len = layout.file_size.unwrap_or(needed).max(needed);
            let f = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&dev)
                .expect("creating the environment file");
            if f.metadata().expect("metadata").len() < len {
                f.set_len(len).expect("sizing the environment file");
            }
            std::os::unix::fs::FileExt::write_all_at(&f, &image, *offset).expect("writing a copy");
            config.push_str(&format!(
                "{} {:#x} {:#x}\n",
                dev.display(),
                offset,
                layout.size
            ));
            copies.push((dev, *offset));
        }
        let config_path = dir.join("fw_env.config");
        std::fs::write(&config_path, config).expect("writing fw_env.config");
        UbootEnv {
            layout,
            copies,
            config: config_path,
        }
    }

    /// updraft's backend for this environment.
    pub fn bootloader(&self) -> UbootBootloader {
        UbootBootloader::from_config_file(&self.config).unwrap_or_else(|e| panic!("{e}"))
    }

    fn header(&self) -> usize {
        if self.layout.is_redundant() { 5 } else { 4 }
    }

    /// The bytes of copy `i`.
    pub fn copy_bytes(&self, i: usize) -> Vec<u8> {
        let (dev, off) = &self.copies[i];
        let f = std::fs::File::open(dev).expect("opening a copy");
        let mut buf = vec![0u8; self.layout.size];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf, *off).expect("reading a copy");
        buf
    }

    pub fn write_copy_bytes(&self, i: usize, bytes: &[u8]) {
        assert_eq!(bytes.len(), self.layout.size);
        let (dev, off) = &self.copies[i];
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(dev)
            .expect("opening a copy");
        std::os::unix::fs::FileExt::write_all_at(&f, bytes, *off).expect("writing a copy");
    }

    /// The data area of copy `i` (after CRC and flags).
    pub fn data(&self, i: usize) -> Vec<u8> {
        self.copy_bytes(i)[self.header()..].to_vec()
    }

    /// The entries of copy `i` (`name=value`, in order).
    pub fn entries(&self, i: usize) -> Vec<String> {
        let data = self.data(i);
        let mut out = Vec::new();
        for e in data.split(|&b| b == 0) {
            if e.is_empty() {
                break;
            }
            out.push(String::from_utf8_lossy(e).into_owned());
        }
        out
    }

    /// The flags byte of copy `i` (redundant only).
    pub fn flags(&self, i: usize) -> u8 {
        assert!(self.layout.is_redundant());
        self.copy_bytes(i)[4]
    }

    /// Set the flags byte of copy `i`; the CRC does not cover it.
    pub fn set_flags(&self, i: usize, flags: u8) {
        let mut b = self.copy_bytes(i);
        b[4] = flags;
        self.write_copy_bytes(i, &b);
    }

    /// Flip bytes in the data area of copy `i`, so its CRC no longer holds.
    pub fn corrupt(&self, i: usize) {
        let mut b = self.copy_bytes(i);
        let h = self.header();
        for k in [h + 1, h + 7, self.layout.size / 2] {
            b[k] ^= 0x5a;
        }
        self.write_copy_bytes(i, &b);
    }

    /// All bytes of all device files, to check that nothing was written.
    pub fn snapshot(&self) -> Vec<Vec<u8>> {
        self.copies
            .iter()
            .map(|(dev, _)| std::fs::read(dev).expect("reading a device file"))
            .collect()
    }

    pub fn printenv(&self) -> Result<BTreeMap<String, String>, String> {
        fw_printenv(&self.config)
    }

    pub fn setenv(&self, vars: &[(&str, Option<&str>)]) -> Result<(), String> {
        fw_setenv(&self.config, vars)
    }
}

/// `test A -gt B` in U-Boot reads numbers in decimal (`simple_strtol(…, 10)`,
/// leading digits only).
fn uboot_decimal(s: &str) -> i64 {
    let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().unwrap_or(0)
}

/// `setexpr X ${X} - 1` in U-Boot reads hexadecimal and writes `%lx`.
fn uboot_setexpr_minus_one(s: &str) -> String {
    let s = s.strip_prefix("0x").unwrap_or(s);
    let digits: String = s.chars().take_while(char::is_ascii_hexdigit).collect();
    let v = u64::from_str_radix(&digits, 16).unwrap_or(0);
    format!("{:x}", v.wrapping_sub(1))
}

fn nonempty(v: Option<&String>, default: &str) -> String {
    match v {
        Some(s) if !s.is_empty() => s.clone(),
        _ => default.to_string(),
    }
}

/// Power on a U-Boot device whose boot script is the RAUC-style one in
/// `docs/bootloaders.md`: defaults for missing variables (`A B`, 3, 3); the
/// first slot in `BOOT_ORDER` with `BOOT_x_LEFT > 0` has its counter
/// decremented and is booted; with none, both counters are reset to 3 (not
/// `BOOT_ORDER`) and the board resets (`None`). One `saveenv`, done here
/// with one `fw_setenv` write.
pub fn boot_uboot(fw_env_config: &Path) -> Option<SlotName> {
    let vars = fw_printenv(fw_env_config)
        .unwrap_or_else(|e| panic!("the boot script cannot read the environment: {e}"));
    let order = nonempty(vars.get("BOOT_ORDER"), "A");
    let mut left_a = nonempty(vars.get("BOOT_A_LEFT"), "3");
    let mut left_b = nonempty(vars.get("BOOT_B_LEFT"), "0");
    let mut booted = None;
    for s in order.split_whitespace() {
        match s {
            "A" if uboot_decimal(&left_a) > 0 => {
                left_a = uboot_setexpr_minus_one(&left_a);
                booted = Some(SlotName::A);
            }
            "B" if uboot_decimal(&left_b) > 0 => {
                left_b = uboot_setexpr_minus_one(&left_b);
                booted = Some(SlotName::B);
            }
            _ => continue,
        }
        break;
    }
    if booted.is_none() {
        left_a = "3".into();
        left_b = "3".into();
    }
    fw_setenv(
        fw_env_config,
        &[
            ("BOOT_ORDER", Some(&order)),
            ("BOOT_A_LEFT", Some(&left_a)),
            ("BOOT_B_LEFT", Some(&left_b)),
        ],
    )
    .unwrap_or_else(|e| panic!("the boot script's saveenv failed: {e}"));
    booted
}

/// Power on a board booted by RAUC's documented U-Boot script with
/// bootnames `names` (slot A's, slot B's): the first bootname in
/// `BOOT_ORDER` whose `BOOT_<name>_LEFT` is above 0 loses an attempt and
/// boots; with none, every counter is reset to 3 and the board resets
/// (`None`). One `saveenv` (one `fw_setenv`).
pub fn boot_uboot_rauc(fw_env_config: &Path, names: [&str; 2]) -> Option<SlotName> {
    let vars = fw_printenv(fw_env_config)
        .unwrap_or_else(|e| panic!("the boot script cannot read the environment: {e}"));
    let order = nonempty(vars.get("BOOT_ORDER"), &names.join(" "));
    let left_var = |i: usize| format!("BOOT_{}_LEFT", names[i]);
    let mut left = [0, 1].map(|i| nonempty(vars.get(&left_var(i)), "3"));
    let mut booted = None;
    for word in order.split_whitespace() {
        let Some(i) = names.iter().position(|n| *n == word) else {
            continue;
        };
        if uboot_decimal(&left[i]) > 0 {
            left[i] = uboot_setexpr_minus_one(&left[i]);
            booted = Some([SlotName::A, SlotName::B][i]);
            break;
        }
    }
    if booted.is_none() {
        left = ["3".to_string(), "3".to_string()];
    }
    let (va, vb) = (left_var(0), left_var(1));
    fw_setenv(
        fw_env_config,
        &[
            ("BOOT_ORDER", Some(&order)),
            (&va, Some(&left[0])),
            (&vb, Some(&left[1])),
        ],
    )
    .unwrap_or_else(|e| panic!("the boot script's saveenv failed: {e}"));
    booted
}

/// What Mender's U-Boot integration and client leave on a device running
/// partition 2: its boot commands, U-Boot's boot count limit of 1, no
/// trial.
pub const MENDER_UBOOT_ENV: &[(&str, &str)] = &[
    ("bootcmd", "run mender_setup; run mender_boot"),
    ("altbootcmd", "run mender_altbootcmd; run bootcmd"),
    ("bootlimit", "1"),
    ("bootcount", "0"),
    ("upgrade_available", "0"),
    ("mender_boot_part", "2"),
    ("mender_boot_part_hex", "2"),
];

/// Power on a board with Mender's U-Boot integration, as its
/// documentation and U-Boot's boot count limit describe it: while
/// `upgrade_available=1` every boot counts `bootcount` up (saved in the
/// environment); past `bootlimit` U-Boot runs `altbootcmd`, which switches
/// `mender_boot_part` (and `_hex`) to the other root partition and clears
/// `upgrade_available`; then the partition `mender_boot_part` names boots.
/// `partitions` are slot A's and slot B's partition numbers.
pub fn boot_uboot_mender(fw_env_config: &Path, partitions: [u32; 2]) -> SlotName {
    let vars = fw_printenv(fw_env_config)
        .unwrap_or_else(|e| panic!("the boot script cannot read the environment: {e}"));
    let get = |n: &str| vars.get(n).cloned().unwrap_or_default();
    let mut part: u32 = get("mender_boot_part")
        .parse()
        .unwrap_or_else(|_| panic!("mender_boot_part is not a number: {vars:?}"));
    if get("upgrade_available") == "1" {
        let bootcount = uboot_decimal(&nonempty(vars.get("bootcount"), "0")) + 1;
        let bootlimit = uboot_decimal(&nonempty(vars.get("bootlimit"), "1"));
        let count = bootcount.to_string();
        let mut set: Vec<(&str, Option<&str>)> = vec![("bootcount", Some(&count))];
        let (other, hex);
        if bootcount > bootlimit {
            // altbootcmd: the other root partition, the trial over.
            part = if part == partitions[0] {
                partitions[1]
            } else {
                partitions[0]
            };
            other = part.to_string();
            hex = format!("{part:X}");
            set.extend([
                ("mender_boot_part", Some(other.as_str())),
                ("mender_boot_part_hex", Some(hex.as_str())),
                ("upgrade_available", Some("0")),
            ]);
        }
        fw_setenv(fw_env_config, &set)
            .unwrap_or_else(|e| panic!("the boot script's saveenv failed: {e}"));
    }
    match part {
        p if p == partitions[0] => SlotName::A,
        p if p == partitions[1] => SlotName::B,
        p => panic!("mender_boot_part={p} is no slot's partition"),
    }
}

/// Power on a device whose boot script reads the `file` backend's state file
/// the way the U-Boot script reads its environment (missing file or
/// variables: `A B`, 3, 3; decimal counts).
pub fn boot_file(path: &Path) -> Option<SlotName> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => panic!("reading {}: {e}", path.display()),
    };
    let vars = parse_listing(&text);
    let order = nonempty(vars.get("BOOT_ORDER"), "A");
    let mut left = [
        uboot_decimal(&nonempty(vars.get("BOOT_A_LEFT"), "3")),
        uboot_decimal(&nonempty(vars.get("BOOT_B_LEFT"), "0")),
    ];
    let mut booted = None;
    for s in order.split_whitespace() {
        let (slot, i) = match s {
            "A" => (SlotName::A, 0),
            "B" => (SlotName::B, 1),
            _ => continue,
        };
        if left[i] > 0 {
            left[i] -= 1;
            booted = Some(slot);
            break;
        }
    }
    if booted.is_none() {
        left = [3, 3];
    }
    let mut out = String::new();
    let mut seen = [false; 3];
    for line in text.lines() {
        let replaced = match line.split_once('=').map(|(k, _)| k.trim()) {
            Some("BOOT_ORDER") => Some((0, format!("BOOT_ORDER={order}"))),
            Some("BOOT_A_LEFT") => Some((1, format!("BOOT_A_LEFT={}", left[0]))),
            Some("BOOT_B_LEFT") => Some((2, format!("BOOT_B_LEFT={}", left[1]))),
            _ => None,
        };
        match replaced {
            Some((i, l)) => {
                seen[i] = true;
                out.push_str(&l);
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    for (i, l) in [
        format!("BOOT_ORDER={order}"),
        format!("BOOT_A_LEFT={}", left[0]),
        format!("BOOT_B_LEFT={}", left[1]),
    ]
    .into_iter()
    .enumerate()
    {
        if !seen[i] {
            out.push_str(&l);
            out.push('\n');
        }
    }
    std::fs::write(path, out).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    booted
}

/// Holds libubootenv's lock (`flock` from util-linux on the same file) until
/// dropped.
pub struct HeldLock {
    child: Child,
}

impl HeldLock {
    /// Returns once the lock is held.
    pub fn take(lock_file: &Path) -> HeldLock {
        let mut child = Command::new(tool("flock"))
            .arg(lock_file)
            .args(["sh", "-c", "echo locked; read _"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting flock");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().expect("flock stdout"))
            .read_line(&mut line)
            .expect("reading from flock");
        assert_eq!(
            line.trim(),
            "locked",
            "flock did not take {}",
            lock_file.display()
        );
        HeldLock { child }
    }
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        if let Some(mut stdin) = self.child.stdin.take() {
            let _ = stdin.write_all(b"\n");
        }
        let _ = self.child.wait();
    }
}

/// A loop device over a file, detached when dropped.
pub struct LoopDevice {
    pub path: PathBuf,
}

impl LoopDevice {
    pub fn attach(file: &Path) -> LoopDevice {
        let out = run(Command::new(tool("losetup"))
            .args(["-f", "--show"])
            .arg(file))
        .unwrap_or_else(|e| panic!("{e}"));
        LoopDevice {
            path: PathBuf::from(out.trim()),
        }
    }

    /// 512-byte sectors the kernel has read from the device since it was
    /// attached (`/sys/block/loopN/stat`, third field): reads served from
    /// the page cache do not count.
    pub fn sectors_read(&self) -> u64 {
        let name = self
            .path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_else(|| panic!("{} has no device name", self.path.display()));
        let stat = std::fs::read_to_string(format!("/sys/block/{name}/stat"))
            .unwrap_or_else(|e| panic!("reading /sys/block/{name}/stat: {e}"));
        stat.split_whitespace()
            .nth(2)
            .and_then(|f| f.parse().ok())
            .unwrap_or_else(|| panic!("/sys/block/{name}/stat has no sector count: {stat:?}"))
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new(tool("losetup"))
            .arg("-d")
            .arg(&self.path)
            .status();
    }
}

// ---------------------------------------------------------------------------
// GRUB

/// `grub-editenv FILE create`.
pub fn grub_editenv_create(grubenv: &Path) {
    run(Command::new(tool("grub-editenv"))
        .arg(grubenv)
        .arg("create"))
    .unwrap_or_else(|e| panic!("{e}"));
}

/// A GRUB environment at `grubenv` (its directory made) as RAUC's GRUB
/// script expects it with bootnames `names`: `ORDER` lists both, each
/// `<name>_OK=1`, `<name>_TRY=0`.
pub fn grub_rauc_create(grubenv: &Path, names: [&str; 2]) {
    if let Some(dir) = grubenv.parent() {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    }
    grub_editenv_create(grubenv);
    let order = names.join(" ");
    let (ok, tr) = (
        names.map(|n| format!("{n}_OK")),
        names.map(|n| format!("{n}_TRY")),
    );
    grub_editenv_set(
        grubenv,
        &[
            ("ORDER", order.as_str()),
            (&ok[0], "1"),
            (&tr[0], "0"),
            (&ok[1], "1"),
            (&tr[1], "0"),
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

/// `NAME=VALUE` of each of `names` (empty when unset), space-separated:
/// one line to compare with what a contract says.
pub fn show(vars: &BTreeMap<String, String>, names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("{n}={}", vars.get(*n).map_or("", |v| v.as_str())))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `grub-editenv FILE list`.
pub fn grub_editenv_list(grubenv: &Path) -> Result<BTreeMap<String, String>, String> {
    run(Command::new(tool("grub-editenv")).arg(grubenv).arg("list")).map(|t| parse_listing(&t))
}

/// `grub-editenv FILE set NAME=VALUE…`.
pub fn grub_editenv_set(grubenv: &Path, vars: &[(&str, &str)]) -> Result<(), String> {
    let mut cmd = Command::new(tool("grub-editenv"));
    cmd.arg(grubenv).arg("set");
    for (k, v) in vars {
        cmd.arg(format!("{k}={v}"));
    }
    run(&mut cmd).map(|_| ())
}

/// `grub-editenv FILE unset NAME…`.
pub fn grub_editenv_unset(grubenv: &Path, names: &[&str]) -> Result<(), String> {
    run(Command::new(tool("grub-editenv"))
        .arg(grubenv)
        .arg("unset")
        .args(names))
    .map(|_| ())
}

/// Power on a GRUB device whose `grub.cfg` holds the fragment in
/// `docs/bootloaders.md`: defaults `ORDER="A B"`, `x_OK=0`, `x_TRY=0`; the
/// first slot in `ORDER` with `x_OK=1` and `x_TRY=0` gets `x_TRY=1`
/// (`save_env`, here `grub-editenv set`) and is booted; with none, `None`.
pub fn boot_grub(grubenv: &Path) -> Option<SlotName> {
    boot_grub_named(grubenv, ["A", "B"])
}

/// [`boot_grub`] with the slots named `names` (slot A's, slot B's): RAUC's
/// GRUB script with its bootnames (`ORDER`, `<bootname>_OK`,
/// `<bootname>_TRY`).
pub fn boot_grub_named(grubenv: &Path, names: [&str; 2]) -> Option<SlotName> {
    let vars = grub_editenv_list(grubenv)
        .unwrap_or_else(|e| panic!("GRUB cannot load its environment: {e}"));
    let get = |k: &str, d: &str| vars.get(k).cloned().unwrap_or_else(|| d.to_string());
    let number = |s: String| uboot_decimal(&s);
    let order = get("ORDER", &names.join(" "));
    for s in order.split_whitespace() {
        let slot = match names.iter().position(|n| *n == s) {
            Some(0) => SlotName::A,
            Some(_) => SlotName::B,
            None => continue,
        };
        // As the shipped grub.cfg initialises them: A's OK 1, B's 0.
        let ok = number(get(
            &format!("{s}_OK"),
            if slot == SlotName::A { "1" } else { "0" },
        ));
        let tried = number(get(&format!("{s}_TRY"), "0"));
        if ok == 1 && tried == 0 {
            grub_editenv_set(grubenv, &[(&format!("{s}_TRY"), "1")])
                .unwrap_or_else(|e| panic!("GRUB's save_env failed: {e}"));
            return Some(slot);
        }
    }
    None
}

/// Make Mender's GRUB environment under `dir` as its integration ships
/// it, with `grub-editenv`: `mender_grubenvN/env` holding `vars`,
/// `mender_grubenvN/lock` holding `editing=0`, and `lock.sha256sum`, the
/// checksum Mender's `fw_setenv` checks the lock against.
pub fn mender_grubenv_create(dir: &Path, vars: &[(&str, &str)]) {
    for n in [1, 2] {
        let d = dir.join(format!("mender_grubenv{n}"));
        std::fs::create_dir_all(&d).expect("mender_grubenv directory");
        for (file, v) in [("env", vars), ("lock", &[("editing", "0")][..])] {
            grub_editenv_create(&d.join(file));
            grub_editenv_set(&d.join(file), v).unwrap_or_else(|e| panic!("{e}"));
        }
        let sum = run(Command::new("sha256sum").arg("lock").current_dir(&d))
            .unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(d.join("lock.sha256sum"), sum).expect("lock.sha256sum");
    }
}

/// Whether both of Mender's GRUB environment locks under `dir` pass the
/// checksum Mender's `fw_setenv` checks (`sha256sum -c lock.sha256sum`).
pub fn mender_grubenv_locks_whole(dir: &Path) -> bool {
    [1, 2].iter().all(|n| {
        Command::new("sha256sum")
            .args(["-c", "--quiet", "lock.sha256sum"])
            .current_dir(dir.join(format!("mender_grubenv{n}")))
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// Power on a board with Mender's GRUB integration, as its scripts
/// describe it: a copy whose lock does not say `editing=0` is restored from
/// the other (copy 2 checked first); copy 1 is read; while
/// `upgrade_available=1`, the first boot sets `bootcount=1` and a later one
/// switches `mender_boot_part` to the other root partition and clears both;
/// the copies are saved (copy 2, then copy 1, each between `editing=1` and
/// `editing=0`); the partition `mender_boot_part` names boots.
pub fn boot_grub_mender(dir: &Path, partitions: [u32; 2]) -> SlotName {
    let copy = |n: u32, f: &str| dir.join(format!("mender_grubenv{n}/{f}"));
    let list = |p: &Path| grub_editenv_list(p).unwrap_or_else(|e| panic!("GRUB: {e}"));
    let names = ["bootcount", "mender_boot_part", "upgrade_available"];
    let copy_over = |from: u32, to: u32| {
        let vars = list(&copy(from, "env"));
        let set: Vec<(&str, &str)> = names
            .iter()
            .filter_map(|n| vars.get(*n).map(|v| (*n, v.as_str())))
            .collect();
        grub_editenv_set(&copy(to, "env"), &set).unwrap_or_else(|e| panic!("{e}"));
        grub_editenv_set(&copy(to, "lock"), &[("editing", "0")]).unwrap_or_else(|e| panic!("{e}"));
    };
    let editing = |n: u32| list(&copy(n, "lock")).get("editing").cloned();
    if editing(2).as_deref() != Some("0") {
        copy_over(1, 2);
    } else if editing(1).as_deref() != Some("0") {
        copy_over(2, 1);
    }
    let vars = list(&copy(1, "env"));
    let get = |k: &str| vars.get(k).cloned().unwrap_or_default();
    let mut part: u32 = get("mender_boot_part")
        .parse()
        .unwrap_or_else(|_| panic!("mender_boot_part is not a number: {vars:?}"));
    if get("upgrade_available") == "1" {
        let (upgrade, count) = if get("bootcount") != "0" {
            part = if part == partitions[0] {
                partitions[1]
            } else {
                partitions[0]
            };
            ("0", "0")
        } else {
            ("1", "1")
        };
        let p = part.to_string();
        for n in [2, 1] {
            grub_editenv_set(&copy(n, "lock"), &[("editing", "1")])
                .unwrap_or_else(|e| panic!("{e}"));
            grub_editenv_set(
                &copy(n, "env"),
                &[
                    ("bootcount", count),
                    ("mender_boot_part", &p),
                    ("upgrade_available", upgrade),
                ],
            )
            .unwrap_or_else(|e| panic!("{e}"));
            grub_editenv_set(&copy(n, "lock"), &[("editing", "0")])
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }
    match part {
        p if p == partitions[0] => SlotName::A,
        p if p == partitions[1] => SlotName::B,
        p => panic!("mender_boot_part={p} is no slot's partition"),
    }
}

/// A `script` bootloader (see `agent/src/bootloader/script.rs`) written in
/// shell, keeping the selection in the file `state` with the `file`
/// backend's rules (order, tries left per slot). `before` runs first and
/// `after` once a write verb has saved its state, both with the verb and
/// its arguments in `$1`..: a test puts its faults there (a hang, the
/// daemon killed half-way through a write).
pub fn shell_script_bootloader(state: &Path, before: &str, after: &str) -> String {
    format!(
        r#"#!/bin/sh
set -e
O="A"; A=3; B=0
[ -f {state:?} ] && . {state:?}
{before}
without() {{ r=""; for s in $O; do [ "$s" = "$1" ] || r="$r $s"; done; echo $r; }}
other() {{ [ "$1" = A ] && echo B || echo A; }}
save() {{ printf 'O="%s"\nA=%s\nB=%s\n' "$O" "$A" "$B" > {state:?}.new; mv {state:?}.new {state:?}; }}
case "$1" in
read) printf 'BOOT_ORDER=%s\nBOOT_A_LEFT=%s\nBOOT_B_LEFT=%s\n' "$O" "$A" "$B"; exit 0 ;;
disable) O=$(without "$2"); eval "$2=0"; save ;;
trial|good) O="$2 $(without "$2")"; eval "$2=$3"; save ;;
bad) O=$(other "$2"); eval "$2=0"; save ;;
*) echo "unknown verb $1" >&2; exit 2 ;;
esac
{after}
"#
    )
}
