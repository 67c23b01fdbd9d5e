//! updraft's U-Boot environment against libubootenv's `fw_printenv` and
//! `fw_setenv` and u-boot-tools' `mkenvimage`: what one writes, the other
//! reads, in single and redundant layouts, across the wrap of the flags
//! counter, with corrupted copies and a held lock; and the trial/fallback
//! cycle through the RAUC-style boot script.

use std::time::Duration;

use updraft::bootloader::Bootloader;
use updraft::bootloader::uboot::{DEFAULT_LOCK_FILE, UbootBootloader, parse_fw_env_config};
use updraft::error::Kind;
use updraft::slot::SlotName;
use updraft_tests::bootenv::{HeldLock, Layout, LoopDevice, Scratch, UbootEnv, boot_uboot};

const SIZE: usize = 0x4000;

const BASE_VARS: &[(&str, &str)] = &[
    ("bootcmd", "run distro_bootcmd"),
    ("bootdelay", "2"),
    ("foo", "bar baz"),
    ("BOOT_ORDER", "A B"),
    ("BOOT_A_LEFT", "3"),
    ("BOOT_B_LEFT", "3"),
    ("zz_last", "x=y=z"),
];

fn env(name: &str, layout: Layout) -> (Scratch, UbootEnv) {
    let dir = Scratch::new(name);
    let env = UbootEnv::create(dir.path(), layout, BASE_VARS);
    (dir, env)
}

fn expect_printenv(env: &UbootEnv, order: &str, a: &str, b: &str) {
    let vars = env.printenv().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        vars.get("BOOT_ORDER").map(String::as_str),
        Some(order),
        "{vars:?}"
    );
    assert_eq!(
        vars.get("BOOT_A_LEFT").map(String::as_str),
        Some(a),
        "{vars:?}"
    );
    assert_eq!(
        vars.get("BOOT_B_LEFT").map(String::as_str),
        Some(b),
        "{vars:?}"
    );
    assert_eq!(vars.get("foo").map(String::as_str), Some("bar baz"));
    assert_eq!(
        vars.get("bootcmd").map(String::as_str),
        Some("run distro_bootcmd")
    );
    assert_eq!(vars.get("zz_last").map(String::as_str), Some("x=y=z"));
}

/// Alternate trials of B and A, checking after every write that
/// fw_printenv sees exactly updraft's latest values.
fn fw_printenv_follows_updraft(env: &UbootEnv, writes: u32) {
    let mut bl = env.bootloader();
    let mut left = [3u32, 3u32];
    for i in 0..writes {
        let tries = 1 + i % 9;
        let slot = if i % 2 == 0 { SlotName::B } else { SlotName::A };
        bl.trial(slot, tries)
            .unwrap_or_else(|e| panic!("write {i}: {e}"));
        left[usize::from(slot == SlotName::B)] = tries;
        let order = if slot == SlotName::B { "B A" } else { "A B" };
        expect_printenv(env, order, &left[0].to_string(), &left[1].to_string());
    }
}

#[test]
fn fw_printenv_reads_every_write_to_a_single_copy() {
    updraft_tests::require!("mkenvimage", "fw_printenv", "fw_setenv");
    let (_d, env) = env("single-writes", Layout::single(SIZE));
    fw_printenv_follows_updraft(&env, 300);
}

#[test]
fn fw_printenv_reads_every_write_to_redundant_copies_across_the_flags_wrap() {
    updraft_tests::require!("mkenvimage", "fw_printenv", "fw_setenv");
    let (_d, env) = env("redundant-writes", Layout::redundant(SIZE));
    assert_eq!(
        (env.flags(0), env.flags(1)),
        (1, 1),
        "mkenvimage -r writes flags 1"
    );
    let mut bl = env.bootloader();
    let mut flags_seen = Vec::new();
    for i in 0..300u32 {
        let before = [env.copy_bytes(0), env.copy_bytes(1)];
        let slot = if i % 2 == 0 { SlotName::B } else { SlotName::A };
        bl.trial(slot, 1 + i % 9)
            .unwrap_or_else(|e| panic!("write {i}: {e}"));
        // Exactly one copy changed, and it is not the one read before.
        let written = usize::from(i % 2 == 0);
        assert_eq!(
            env.copy_bytes(1 - written),
            before[1 - written],
            "write {i} touched the current copy"
        );
        assert_ne!(env.copy_bytes(written), before[written]);
        let f = env.flags(written);
        assert_eq!(
            f,
            env.flags(1 - written).wrapping_add(1),
            "write {i}: flags follow the current copy"
        );
        flags_seen.push(f);
        let order = if slot == SlotName::B { "B A" } else { "A B" };
        let vars = env.printenv().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            vars.get("BOOT_ORDER").map(String::as_str),
            Some(order),
            "write {i} (flags {f})"
        );
        assert_eq!(
            vars.get(if slot == SlotName::B {
                "BOOT_B_LEFT"
            } else {
                "BOOT_A_LEFT"
            })
            .map(String::as_str),
            Some((1 + i % 9).to_string().as_str()),
            "write {i} (flags {f})"
        );
        assert_eq!(vars.get("foo").map(String::as_str), Some("bar baz"));
    }
    let wrap = flags_seen.windows(2).position(|w| w == [255, 0]);
    assert!(
        wrap.is_some(),
        "the flags counter wrapped 255→0: {flags_seen:?}"
    );
}

#[test]
fn fw_printenv_reads_redundant_copies_in_two_files() {
    updraft_tests::require!("mkenvimage", "fw_printenv", "fw_setenv");
    let (_d, env) = env("two-files", Layout::redundant_two_files(0x2000));
    fw_printenv_follows_updraft(&env, 260);
}

#[test]
fn updraft_reads_what_fw_setenv_writes() {
    updraft_tests::require!("mkenvimage", "fw_printenv", "fw_setenv");
    for layout in [Layout::single(SIZE), Layout::redundant(SIZE)] {
        let (_d, env) = env("fw-setenv", layout);
        let mut bl = env.bootloader();
        // Interleave both writers so each has to pick up the other's copy
        // and flags, many times over the wrap.
        for i in 0..270u32 {
            let left = (i % 9 + 1).to_string();
            env.setenv(&[("BOOT_ORDER", Some("B A")), ("BOOT_B_LEFT", Some(&left))])
                .unwrap_or_else(|e| panic!("{e}"));
            let s = bl
                .read()
                .unwrap_or_else(|e| panic!("after fw_setenv {i}: {e}"));
            assert_eq!(s.order, vec![SlotName::B, SlotName::A]);
            assert_eq!(s.b.tries_left, i % 9 + 1);
            bl.mark_bad(SlotName::B).unwrap();
            assert_eq!(
                env.printenv()
                    .unwrap()
                    .get("BOOT_ORDER")
                    .map(String::as_str),
                Some("A")
            );
        }
        // Variables fw_setenv deletes read as the boot script's defaults.
        env.setenv(&[
            ("BOOT_ORDER", None),
            ("BOOT_A_LEFT", None),
            ("BOOT_B_LEFT", None),
        ])
        .unwrap();
        let s = bl.read().unwrap();
        assert_eq!(s.order, vec![SlotName::A]);
        assert_eq!((s.a.tries_left, s.b.tries_left), (3, 0));
    }
}

#[test]
fn wrapped_flags_select_the_copy_fw_printenv_selects() {
    updraft_tests::require!("mkenvimage", "fw_printenv", "fw_setenv");
    // (flags of copy 1, flags of copy 2, the copy both must read)
    for (f0, f1, want) in [
        (255u8, 0u8, 1usize),
        (0, 255, 0),
        (254, 0, 0),
        (255, 1, 0),
        (7, 7, 0),
        (3, 4, 1),
    ] {
        let (_d, env) = env("wrap", Layout::redundant(SIZE));
        // Copy 2 gets different content by one fw_setenv write.
        env.setenv(&[("marker", Some("copy2"))]).unwrap();
        env.set_flags(0, f0);
        env.set_flags(1, f1);
        let theirs = env.printenv().unwrap().get("marker").cloned();
        let loaded = env.bootloader().load().unwrap();
        let ours = loaded
            .env
            .get("marker")
            .map(|v| String::from_utf8_lossy(v).into_owned());
        assert_eq!(loaded.current, want, "flags ({f0}, {f1})");
        assert_eq!(
            ours, theirs,
            "flags ({f0}, {f1}): updraft and fw_printenv disagree"
        );
        assert_eq!(ours.is_some(), want == 1);
    }
}

#[test]
fn a_corrupted_copy_is_survived() {
    updraft_tests::require!("mkenvimage", "fw_printenv", "fw_setenv");
    let (_d, env) = env("one-corrupt", Layout::redundant(SIZE));
    let mut bl = env.bootloader();
    bl.trial(SlotName::B, 3).unwrap(); // copy 2 current (flags 2)
    bl.mark_good(SlotName::B, 2).unwrap(); // copy 1 current (flags 3)
    env.corrupt(0);
    // Both fall back to copy 2, the state before mark_good.
    expect_printenv(&env, "B A", "3", "3");
    let s = bl.read().unwrap();
    assert_eq!((s.order[0], s.b.tries_left), (SlotName::B, 3));
    // The next write replaces the corrupt copy and leaves the good one.
    let good = env.copy_bytes(1);
    bl.mark_good(SlotName::B, 2).unwrap();
    assert_eq!(env.copy_bytes(1), good);
    expect_printenv(&env, "B A", "3", "2");
    assert_eq!(env.flags(0), env.flags(1).wrapping_add(1));
}

#[test]
fn no_valid_copy_is_refused_and_left_untouched() {
    updraft_tests::require!("mkenvimage", "fw_printenv", "fw_setenv");
    for layout in [
        Layout::single(SIZE),
        Layout::redundant(SIZE),
        Layout::redundant_two_files(SIZE),
    ] {
        let (_d, env) = env("all-corrupt", layout.clone());
        for i in 0..layout.copies.len() {
            env.corrupt(i);
        }
        assert!(
            env.printenv().is_err(),
            "fw_printenv also finds no valid copy"
        );
        let before = env.snapshot();
        let mut bl = env.bootloader();
        let read = bl.read().unwrap_err();
        assert_eq!(read.kind(), Kind::Bootloader);
        let msg = read.to_string();
        assert!(
            msg.contains("CRC mismatch") && msg.contains("no valid environment copy"),
            "{msg}"
        );
        assert!(
            msg.contains(&env.copies[0].0.display().to_string()),
            "names the device: {msg}"
        );
        for op in 0..4 {
            let r = match op {
                0 => bl.disable(SlotName::B),
                1 => bl.trial(SlotName::B, 3),
                2 => bl.mark_good(SlotName::A, 3),
                _ => bl.mark_bad(SlotName::B),
            };
            assert!(r.is_err());
        }
        assert_eq!(env.snapshot(), before, "nothing was written");
    }
}

#[test]
fn unknown_variables_survive_byte_for_byte() {
    updraft_tests::require!("mkenvimage", "fw_printenv", "fw_setenv");
    for layout in [Layout::single(SIZE), Layout::redundant(SIZE)] {
        let dir = Scratch::new("unknown");
        let vars = [
            ("zeta", "first, out of order"),
            (
                "bootcmd",
                "if test -e mmc 0:1 boot.scr; then load mmc 0:1 ${scriptaddr} boot.scr; source ${scriptaddr}; fi",
            ),
            ("foo", "bar baz"),
            ("BOOT_ORDER", "A B"),
            ("empty", ""),
            ("ethaddr", "02:00:00:00:00:01"),
            ("tab", "a\tb"),
            ("BOOT_A_LEFT", "3"),
            ("alpha", "last"),
        ];
        let env = UbootEnv::create(dir.path(), layout, &vars);
        let others = |entries: Vec<String>| -> Vec<String> {
            entries
                .into_iter()
                .filter(|e| !e.starts_with("BOOT_"))
                .collect()
        };
        let original = others(env.entries(0));
        assert_eq!(original.len(), 7);
        let mut bl = env.bootloader();
        bl.disable(SlotName::B).unwrap();
        bl.trial(SlotName::B, 3).unwrap();
        bl.mark_bad(SlotName::B).unwrap();
        bl.mark_good(SlotName::A, 3).unwrap();
        let current = bl.load().unwrap().current;
        let entries = env.entries(current);
        assert_eq!(others(entries.clone()), original, "same bytes, same order");
        // updraft's own variables stay where they were; a new one is appended.
        assert_eq!(entries[3], "BOOT_ORDER=A");
        assert_eq!(entries[7], "BOOT_A_LEFT=3");
        assert_eq!(entries.last().map(String::as_str), Some("BOOT_B_LEFT=0"));
        let seen = env.printenv().unwrap();
        assert_eq!(seen.get("bootcmd").map(String::as_str), Some(vars[1].1));
        assert_eq!(seen.get("tab").map(String::as_str), Some("a\tb"));
    }
}

#[test]
fn the_lock_file_is_honoured() {
    updraft_tests::require!("mkenvimage", "fw_printenv", "fw_setenv", "flock");
    let (_d, env) = env("lock", Layout::redundant(SIZE));
    let mut bl = env.bootloader();
    bl.set_lock_timeout(Duration::from_millis(300));
    let before = env.snapshot();
    {
        let _held = HeldLock::take(std::path::Path::new(DEFAULT_LOCK_FILE));
        let e = bl.trial(SlotName::B, 3).unwrap_err();
        assert_eq!(e.kind(), Kind::Busy);
        assert!(e.to_string().contains(DEFAULT_LOCK_FILE), "{e}");
        assert!(
            bl.read().is_err(),
            "reading takes the lock too, as fw_printenv does"
        );
        assert_eq!(env.snapshot(), before);
    }
    bl.trial(SlotName::B, 3).unwrap();
    expect_printenv(&env, "B A", "3", "3");
}

#[test]
fn block_devices_with_offsets_from_the_end() {
    updraft_tests::require!("mkenvimage", "fw_printenv", "fw_setenv", "losetup");
    if !updraft_tests::skip::is_root() {
        updraft_tests::skip!("needs root for a loop device");
    }
    let dir = Scratch::new("loop");
    let disk = dir.path().join("disk.img");
    std::fs::write(&disk, vec![0u8; 1 << 20]).unwrap();
    // Build the copies in a file, then place them at the end of the disk.
    let staging = UbootEnv::create(dir.path(), Layout::redundant(SIZE), BASE_VARS);
    let image = staging.copy_bytes(0);
    let lo = LoopDevice::attach(&disk);
    let config = dir.path().join("loop.config");
    std::fs::write(
        &config,
        format!(
            "{dev} -0x8000 0x4000\n{dev} -0x4000 0x4000\n",
            dev = lo.path.display()
        ),
    )
    .unwrap();
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&lo.path)
            .unwrap();
        f.write_all_at(&image, (1 << 20) - 0x8000).unwrap();
        f.write_all_at(&image, (1 << 20) - 0x4000).unwrap();
        f.sync_all().unwrap();
    }
    let mut bl = UbootBootloader::from_config_file(&config).unwrap();
    for i in 0..5 {
        bl.trial(if i % 2 == 0 { SlotName::B } else { SlotName::A }, 2)
            .unwrap();
        let vars = updraft_tests::bootenv::fw_printenv(&config).unwrap();
        assert_eq!(
            vars.get("BOOT_ORDER").map(String::as_str),
            Some(if i % 2 == 0 { "B A" } else { "A B" })
        );
        assert_eq!(vars.get("foo").map(String::as_str), Some("bar baz"));
    }
    assert_eq!(
        parse_fw_env_config(&std::fs::read_to_string(&config).unwrap())
            .unwrap()
            .copies[0]
            .offset,
        -0x8000
    );
}

#[test]
fn trial_without_mark_good_falls_back_after_the_tries() {
    updraft_tests::require!("mkenvimage", "fw_printenv", "fw_setenv");
    let (_d, env) = env("fallback", Layout::redundant(SIZE));
    let mut bl = env.bootloader();
    assert_eq!(boot_uboot(&env.config), Some(SlotName::A));
    bl.mark_good(SlotName::A, 3).unwrap(); // the daemon on the committed slot
    bl.disable(SlotName::B).unwrap(); // installing into B
    assert_eq!(
        boot_uboot(&env.config),
        Some(SlotName::A),
        "a half-written B is never booted"
    );
    bl.mark_good(SlotName::A, 3).unwrap();
    bl.trial(SlotName::B, 3).unwrap();
    // B never comes up far enough to be marked good: three tries.
    for n in 1..=3 {
        assert_eq!(boot_uboot(&env.config), Some(SlotName::B), "boot {n}");
    }
    assert_eq!(
        boot_uboot(&env.config),
        Some(SlotName::A),
        "the fourth boot falls back"
    );
    let s = bl.read().unwrap();
    assert_eq!(s.b.tries_left, 0);
    assert!(!s.b.bootable);
    assert_eq!(s.next_boot(), Some(SlotName::A));
}

#[test]
fn mark_good_after_the_trial_boot_keeps_the_new_slot() {
    updraft_tests::require!("mkenvimage", "fw_printenv", "fw_setenv");
    let (_d, env) = env("keep", Layout::single(SIZE));
    let mut bl = env.bootloader();
    bl.disable(SlotName::B).unwrap();
    bl.trial(SlotName::B, 3).unwrap();
    for _ in 0..6 {
        assert_eq!(boot_uboot(&env.config), Some(SlotName::B));
        bl.mark_good(SlotName::B, 3).unwrap(); // health checks passed / later boots
        assert_eq!(bl.read().unwrap().b.tries_left, 3);
    }
    // A health-check failure: mark B bad, the next boot is A.
    bl.mark_bad(SlotName::B).unwrap();
    assert_eq!(boot_uboot(&env.config), Some(SlotName::A));
}

#[test]
fn the_boot_script_resets_counters_when_nothing_is_bootable() {
    updraft_tests::require!("mkenvimage", "fw_printenv", "fw_setenv");
    let (_d, env) = env("reset", Layout::single(SIZE));
    env.setenv(&[
        ("BOOT_A_LEFT", Some("0")),
        ("BOOT_B_LEFT", Some("0")),
        ("BOOT_ORDER", Some("A")),
    ])
    .unwrap();
    let mut bl = env.bootloader();
    assert_eq!(bl.read().unwrap().next_boot(), None);
    assert_eq!(boot_uboot(&env.config), None);
    // Counters are reset, the order is not: B stays out.
    let s = bl.read().unwrap();
    assert_eq!(s.order, vec![SlotName::A]);
    assert_eq!((s.a.tries_left, s.b.tries_left), (3, 3));
    assert_eq!(boot_uboot(&env.config), Some(SlotName::A));
}
