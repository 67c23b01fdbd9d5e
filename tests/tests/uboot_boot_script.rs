//! The U-Boot boot script of `meta-updraft` (`boot.cmd.in`), run by a real
//! U-Boot: Debian's `qemu_arm64` build in `qemu-system-aarch64`, booting a
//! disk laid out like the layer's wks (FAT boot partition with `boot.scr`,
//! two ext4 root slots with `/boot/Image`). Each case starts from a given
//! boot environment and reads U-Boot's console: which slot the script
//! picked, the counters it left, and the kernel command line.
//!
//! The "kernel" is not a kernel, so `booti` fails and the script resets;
//! `-no-reboot` turns that reset into the end of the run.
//!
//! The FAT-file environment hooks (`env-fat-load.cmd.in`,
//! `env-fat-save.cmd.in`) are run the same way, with a redundant pair of
//! environment files on the FAT partition: the copy the script picks must
//! be the one updraft's backend and libubootenv pick, and the copy it
//! writes must read back with Debian's `fw_printenv`.
//!
//! Needs qemu-system-aarch64 (Debian `qemu-system-arm`), U-Boot for qemu
//! (`u-boot-qemu`), mkimage (`u-boot-tools`), mkfs.vfat (`dosfstools`),
//! mcopy (`mtools`) and mkfs.ext4 (`e2fsprogs`); without them the cases
//! skip loudly.

use std::path::Path;
use std::process::{Command, Stdio};

use updraft_tests::bootenv::{Layout, UbootEnv};
use updraft_tests::repo_root;
use updraft_tests::skip;

const UBOOT: &str = "/usr/lib/u-boot/qemu_arm64/u-boot.bin";
const TOOLS: [&str; 5] = [
    "qemu-system-aarch64",
    "mkimage",
    "mkfs.vfat",
    "mcopy",
    "mkfs.ext4",
];

// Partition layout in 512-byte sectors: boot (FAT), rootA, rootB.
const PARTS: [(u8, u8, u32, u32); 3] = [
    (0x80, 0x0c, 2048, 32768),
    (0, 0x83, 34816, 16384),
    (0, 0x83, 51200, 16384),
];
const DISK_SECTORS: u64 = 67584;

fn missing_tool() -> Option<String> {
    if !Path::new(UBOOT).is_file() {
        return Some(format!("{UBOOT} (Debian package u-boot-qemu)"));
    }
    for tool in TOOLS {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
            .unwrap_or(false);
        let found = found
            || Path::new("/sbin").join(tool).is_file()
            || Path::new("/usr/sbin").join(tool).is_file();
        if !found {
            return Some(tool.to_string());
        }
    }
    None
}

fn tool(name: &str) -> Command {
    for dir in ["/usr/sbin", "/sbin"] {
        let p = Path::new(dir).join(name);
        if p.is_file() {
            return Command::new(p);
        }
    }
    Command::new(name)
}

fn run(cmd: &mut Command) {
    let shown = format!("{cmd:?}");
    let out = cmd.output().unwrap_or_else(|e| panic!("{shown}: {e}"));
    assert!(
        out.status.success(),
        "{shown}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

const FILES: &str = "yocto/meta-updraft/recipes-bsp/updraft-bootfiles/files";

/// Size of each copy of the FAT-file environment pair.
const FAT_ENV_SIZE: usize = 0x4000;

fn read_shipped(name: &str) -> String {
    std::fs::read_to_string(repo_root().join(FILES).join(name))
        .unwrap_or_else(|e| panic!("read {name}: {e}"))
}

/// boot.cmd.in with the values a qemu virt board needs and the default
/// environment hooks (nothing to load, `saveenv`).
fn render_script() -> String {
    render("", "saveenv")
}

/// boot.cmd.in with the FAT-file environment hooks for a pair
/// `uboot.env` / `uboot-redund.env` on the boot partition.
fn render_fat_env_script() -> String {
    let hook = |name: &str| {
        read_shipped(name)
            .replace("@@UPDRAFT_ENV_DEV@@", "virtio 0:1")
            // Above the load addresses, below U-Boot at the top of 256 MiB.
            .replace("@@UPDRAFT_ENV_ADDR@@", "0x48000000")
            .replace("@@UPDRAFT_ENV_SIZE@@", &format!("{FAT_ENV_SIZE:#x}"))
            .replace("@@UPDRAFT_ENV_FILE@@", "uboot.env")
            .replace("@@UPDRAFT_ENV_REDUND_FILE@@", "uboot-redund.env")
    };
    render(&hook("env-fat-load.cmd.in"), &hook("env-fat-save.cmd.in"))
}

fn render(env_load: &str, env_save: &str) -> String {
    let template = read_shipped("boot.cmd.in");
    let values = [
        ("UPDRAFT_ENV_LOAD", env_load),
        ("UPDRAFT_ENV_SAVE", env_save),
        ("UPDRAFT_PART_A", "2"),
        ("UPDRAFT_PART_B", "3"),
        ("UPDRAFT_TRIES", "3"),
        ("UPDRAFT_PANIC_SECONDS", "10"),
        ("UPDRAFT_EXTRA_BOOTARGS", "console=ttyAMA0"),
        ("UPDRAFT_KERNEL_PATH", "/boot/Image"),
        ("UPDRAFT_BOOT_DEV", "virtio 0"),
        ("UPDRAFT_ROOT_PREFIX", "/dev/vda"),
        ("UPDRAFT_BOOT_CMD", "booti ${kernel_addr_r} - ${fdt_addr}"),
    ];
    let mut text = template;
    for (k, v) in values {
        text = text.replace(&format!("@@{k}@@"), v);
    }
    assert!(
        !text.contains("@@"),
        "unrendered placeholder in boot.cmd.in"
    );
    text
}

fn mbr() -> [u8; 512] {
    let mut mbr = [0u8; 512];
    for (i, (status, kind, start, len)) in PARTS.iter().enumerate() {
        let e = &mut mbr[0x1be + 16 * i..0x1be + 16 * (i + 1)];
        e[0] = *status;
        e[1..4].copy_from_slice(&[0xfe, 0xff, 0xff]);
        e[4] = *kind;
        e[5..8].copy_from_slice(&[0xfe, 0xff, 0xff]);
        e[8..12].copy_from_slice(&start.to_le_bytes());
        e[12..16].copy_from_slice(&len.to_le_bytes());
    }
    mbr[510] = 0x55;
    mbr[511] = 0xaa;
    mbr
}

/// Boot U-Boot once with `env` (U-Boot commands run before the script, as
/// if the environment held those values) and return its console output.
fn boot(tag: &str, env: &[&str]) -> String {
    let dir = scratch(tag);
    let mut script = env.iter().map(|l| format!("{l}\n")).collect::<String>();
    script.push_str(&render_script());
    let console = boot_disk(&dir, &script, &[]);
    let _ = std::fs::remove_dir_all(&dir);
    console
}

fn scratch(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("updraft-uboot-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("root/boot")).expect("scratch dir");
    dir
}

/// Boot U-Boot once from a disk in `dir` whose FAT partition holds
/// `boot.scr` made from `script` and the `fat_files` (name, host path);
/// afterwards the FAT partition is left in `dir/boot.img`. The console.
fn boot_disk(dir: &Path, script: &str, fat_files: &[(&str, &Path)]) -> String {
    use std::io::{Seek, SeekFrom, Write};
    std::fs::write(dir.join("boot.cmd"), script).expect("boot.cmd");
    run(tool("mkimage")
        .args([
            "-A", "arm64", "-T", "script", "-C", "none", "-n", "updraft", "-d",
        ])
        .arg(dir.join("boot.cmd"))
        .arg(dir.join("boot.scr")));
    run(tool("mkfs.vfat")
        .arg("-C")
        .arg(dir.join("boot.img"))
        .arg("16384"));
    run(tool("mcopy")
        .arg("-i")
        .arg(dir.join("boot.img"))
        .arg(dir.join("boot.scr"))
        .arg("::/boot.scr"));
    for (name, path) in fat_files {
        run(tool("mcopy")
            .arg("-i")
            .arg(dir.join("boot.img"))
            .arg(path)
            .arg(format!("::/{name}")));
    }
    std::fs::write(dir.join("root/boot/Image"), b"not a kernel").expect("fake kernel");
    run(tool("mkfs.ext4")
        .args(["-q", "-F", "-d"])
        .arg(dir.join("root"))
        .arg(dir.join("root.img"))
        .arg("8M"));

    let disk = dir.join("disk.img");
    let mut f = std::fs::File::create(&disk).expect("disk image");
    f.set_len(DISK_SECTORS * 512).expect("size disk image");
    f.write_all(&mbr()).expect("write MBR");
    for (i, (_, _, start, _)) in PARTS.iter().enumerate() {
        let content = std::fs::read(dir.join(if i == 0 { "boot.img" } else { "root.img" }))
            .expect("partition image");
        f.seek(SeekFrom::Start(u64::from(*start) * 512))
            .expect("seek");
        f.write_all(&content).expect("write partition");
    }
    drop(f);

    let out = Command::new("timeout")
        .arg("120")
        .arg("qemu-system-aarch64")
        .args([
            "-M",
            "virt",
            "-cpu",
            "cortex-a57",
            "-m",
            "256",
            "-nographic",
            "-no-reboot",
        ])
        .args([
            "-nic", "none", "-monitor", "none", "-serial", "stdio", "-bios", UBOOT,
        ])
        .arg("-drive")
        .arg(format!("if=none,file={},format=raw,id=d0", disk.display()))
        .args(["-device", "virtio-blk-device,drive=d0"])
        .stdin(Stdio::null())
        .output()
        .expect("run qemu-system-aarch64");
    let console = String::from_utf8_lossy(&out.stdout).replace('\r', "");
    // The FAT partition as U-Boot left it.
    let disk_bytes = std::fs::read(&disk).expect("read disk image");
    let (_, _, start, len) = PARTS[0];
    let (start, len) = (start as usize * 512, len as usize * 512);
    std::fs::write(dir.join("boot.img"), &disk_bytes[start..start + len]).expect("boot.img");
    assert!(
        console.contains("did not boot; resetting"),
        "the script did not run to its end ({}):\n{console}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    console
}

/// The "updraft: booting slot …" line.
fn choice(console: &str) -> &str {
    console
        .lines()
        .find(|l| l.starts_with("updraft: booting slot "))
        .unwrap_or_else(|| panic!("no slot was booted:\n{console}"))
}

fn cmdline(console: &str) -> &str {
    console
        .lines()
        .find_map(|l| l.strip_prefix("updraft: kernel command line: "))
        .unwrap_or_else(|| panic!("no kernel command line:\n{console}"))
}

macro_rules! needs_tools {
    () => {
        if let Some(t) = missing_tool() {
            skip!("{t} is not installed");
        }
    };
}

#[test]
fn a_fresh_environment_boots_a_and_counts_the_attempt() {
    needs_tools!();
    let console = boot("fresh", &[]);
    assert_eq!(
        choice(&console),
        "updraft: booting slot A (A left 2, B left 0)"
    );
    let cmdline = cmdline(&console);
    for word in [
        "root=/dev/vda2",
        "ro",
        "rootwait",
        "updraft.slot=A",
        "panic=10",
        "console=ttyAMA0",
    ] {
        assert!(
            cmdline.split_whitespace().any(|w| w == word),
            "{word} missing from {cmdline:?}"
        );
    }
}

#[test]
fn the_first_slot_in_boot_order_with_attempts_left_is_booted() {
    needs_tools!();
    let console = boot(
        "trial",
        &[
            "setenv BOOT_ORDER \"B A\"",
            "setenv BOOT_A_LEFT 3",
            "setenv BOOT_B_LEFT 3",
        ],
    );
    assert_eq!(
        choice(&console),
        "updraft: booting slot B (A left 3, B left 2)"
    );
    let cmdline = cmdline(&console);
    assert!(
        cmdline.contains("root=/dev/vda3") && cmdline.contains("updraft.slot=B"),
        "{cmdline}"
    );
}

#[test]
fn an_exhausted_slot_falls_back_to_the_next_in_order() {
    needs_tools!();
    let console = boot(
        "fallback",
        &[
            "setenv BOOT_ORDER \"B A\"",
            "setenv BOOT_A_LEFT 2",
            "setenv BOOT_B_LEFT 0",
        ],
    );
    assert_eq!(
        choice(&console),
        "updraft: booting slot A (A left 1, B left 0)"
    );
    assert!(cmdline(&console).contains("updraft.slot=A"));
}

#[test]
fn when_every_slot_is_exhausted_counters_reset_but_the_order_stays() {
    needs_tools!();
    let console = boot(
        "reset",
        &[
            "setenv BOOT_ORDER \"B A\"",
            "setenv BOOT_A_LEFT 0",
            "setenv BOOT_B_LEFT 0",
        ],
    );
    assert!(console.contains("resetting the counters"), "{console}");
    assert_eq!(
        choice(&console),
        "updraft: booting slot B (A left 3, B left 2)"
    );
}

#[test]
fn a_slot_taken_out_of_boot_order_is_never_booted_even_after_a_reset() {
    needs_tools!();
    // B is being written: updraft removed it from BOOT_ORDER first.
    let console = boot(
        "writing",
        &[
            "setenv BOOT_ORDER A",
            "setenv BOOT_A_LEFT 0",
            "setenv BOOT_B_LEFT 3",
        ],
    );
    assert_eq!(
        choice(&console),
        "updraft: booting slot A (A left 2, B left 3)"
    );
    assert!(!cmdline(&console).contains("updraft.slot=B"));
}

#[test]
fn a_boot_order_naming_no_slot_boots_a() {
    needs_tools!();
    let console = boot(
        "garbage",
        &[
            "setenv BOOT_ORDER X",
            "setenv BOOT_A_LEFT 3",
            "setenv BOOT_B_LEFT 3",
        ],
    );
    assert!(console.contains("names no slot, booting A"), "{console}");
    assert!(choice(&console).starts_with("updraft: booting slot A "));
    assert!(cmdline(&console).contains("root=/dev/vda2"));
}

/// A redundant pair of environment files in `dir`: copy 0 holding `vars0`
/// with flags `flags[0]`, copy 1 holding `vars1` with `flags[1]`; copy 1's
/// CRC broken when `break1`.
fn fat_pair(
    dir: &Path,
    vars0: &[(&str, &str)],
    vars1: &[(&str, &str)],
    flags: [u8; 2],
    break1: bool,
) -> UbootEnv {
    let other = dir.join("other");
    std::fs::create_dir_all(&other).expect("scratch dir");
    let pair = UbootEnv::create(dir, Layout::redundant_two_files(FAT_ENV_SIZE), vars0);
    let second = UbootEnv::create(&other, Layout::redundant_two_files(FAT_ENV_SIZE), vars1);
    pair.write_copy_bytes(1, &second.copy_bytes(1));
    pair.set_flags(0, flags[0]);
    pair.set_flags(1, flags[1]);
    if break1 {
        pair.corrupt(1);
    }
    pair
}

/// The copy updraft's backend reads from `pair`, with a lock file of the
/// scratch directory's.
fn updraft_pick(pair: &UbootEnv, dir: &Path) -> usize {
    let lock = dir.join("fw_printenv.lock");
    std::fs::write(&lock, b"").expect("lock file");
    let mut b = pair.bootloader();
    b.set_lock_file(lock);
    b.load()
        .unwrap_or_else(|e| panic!("updraft reading the pair: {e}"))
        .current
}

/// Run the script with `pair` on the FAT partition; then copy the two files
/// back out over `pair`'s, so that `pair` reads what U-Boot left.
fn boot_fat_pair(dir: &Path, pair: &UbootEnv) -> String {
    let files = [
        ("uboot.env", pair.copies[0].0.as_path()),
        ("uboot-redund.env", pair.copies[1].0.as_path()),
    ];
    let console = boot_disk(dir, &render_fat_env_script(), &files);
    for (name, path) in files {
        run(tool("mcopy")
            .args(["-o", "-i"])
            .arg(dir.join("boot.img"))
            .arg(format!("::/{name}"))
            .arg(path));
    }
    console
}

const FACTORY: [(&str, &str); 3] = [
    ("BOOT_ORDER", "A B"),
    ("BOOT_A_LEFT", "3"),
    ("BOOT_B_LEFT", "0"),
];
const TRIAL_B: [(&str, &str); 3] = [
    ("BOOT_ORDER", "B A"),
    ("BOOT_A_LEFT", "3"),
    ("BOOT_B_LEFT", "3"),
];

#[test]
fn the_fat_pair_is_read_from_the_newer_copy_and_written_to_the_other() {
    needs_tools!();
    let dir = scratch("fat-newer");
    let pair = fat_pair(&dir, &FACTORY, &TRIAL_B, [1, 2], false);
    assert_eq!(updraft_pick(&pair, &dir), 1);
    let console = boot_fat_pair(&dir, &pair);
    assert!(
        console.contains("updraft: environment copy 1 (flags 2)"),
        "{console}"
    );
    assert_eq!(
        choice(&console),
        "updraft: booting slot B (A left 3, B left 2)"
    );
    // U-Boot wrote copy 0 with flags 3; copy 1 is as it was.
    assert_eq!(pair.flags(0), 3);
    assert_eq!(pair.flags(1), 2);
    assert_eq!(updraft_pick(&pair, &dir), 0);
    let env = pair.printenv().unwrap_or_else(|e| panic!("{e}"));
    for (k, v) in [
        ("BOOT_ORDER", "B A"),
        ("BOOT_A_LEFT", "3"),
        ("BOOT_B_LEFT", "2"),
        ("updraft_slot", "B"),
        ("updraft_part", "3"),
    ] {
        assert_eq!(env.get(k).map(String::as_str), Some(v), "{k} in {env:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_fat_copy_with_a_broken_crc_is_ignored_however_new() {
    needs_tools!();
    let dir = scratch("fat-crc");
    let pair = fat_pair(&dir, &FACTORY, &TRIAL_B, [1, 2], true);
    assert_eq!(updraft_pick(&pair, &dir), 0);
    let console = boot_fat_pair(&dir, &pair);
    assert!(console.contains("bad CRC"), "{console}");
    assert_eq!(
        choice(&console),
        "updraft: booting slot A (A left 2, B left 0)"
    );
    // The broken copy was the one written, now newer than copy 0.
    assert_eq!(pair.flags(1), 2);
    assert_eq!(updraft_pick(&pair, &dir), 1);
    let env = pair.printenv().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(env.get("BOOT_ORDER").map(String::as_str), Some("A B"));
    assert_eq!(env.get("BOOT_A_LEFT").map(String::as_str), Some("2"));
    assert_eq!(env.get("updraft_slot").map(String::as_str), Some("A"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_fat_pair_flags_wrap_from_255_to_0_as_updraft_counts_them() {
    needs_tools!();
    for (flags, current, slot) in [
        ([255, 0], 1, "updraft: booting slot B (A left 3, B left 2)"),
        ([0, 255], 0, "updraft: booting slot A (A left 2, B left 0)"),
    ] {
        let dir = scratch(&format!("fat-wrap-{}", flags[0]));
        let pair = fat_pair(&dir, &FACTORY, &TRIAL_B, flags, false);
        assert_eq!(updraft_pick(&pair, &dir), current);
        let console = boot_fat_pair(&dir, &pair);
        assert_eq!(choice(&console), slot);
        let written = 1 - current;
        assert_eq!(pair.flags(written), flags[current].wrapping_add(1));
        assert_eq!(updraft_pick(&pair, &dir), written);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
