//! updraft's GRUB environment block against `grub-editenv` (grub-common):
//! blocks it creates and edits are read, blocks updraft writes are listed
//! and edited by it, other variables and comments survive byte for byte,
//! malformed blocks are refused and left alone; and the one-try
//! trial/fallback cycle through the GRUB script fragment.

use std::path::{Path, PathBuf};

use updraft::bootloader::Bootloader;
use updraft::bootloader::grub::{GRUBENV_SIZE, GrubBootloader, parse_grubenv};
use updraft::error::Kind;
use updraft::slot::SlotName;
use updraft_tests::bootenv::{
    Scratch, boot_grub, grub_editenv_create, grub_editenv_list, grub_editenv_set,
    grub_editenv_unset,
};

/// A block made by `grub-editenv create`, with a provisioned A/B state and
/// some variables updraft does not own.
fn provisioned(dir: &Scratch) -> PathBuf {
    let p = dir.path().join("grubenv");
    grub_editenv_create(&p);
    grub_editenv_set(
        &p,
        &[
            ("saved_entry", "gnulinux-advanced-1234"),
            ("ORDER", "A B"),
            ("A_OK", "1"),
            ("A_TRY", "0"),
            ("B_OK", "1"),
            ("B_TRY", "0"),
            ("kernel_opts", "quiet splash"),
            ("path", "C:\\efi\\boot"),
        ],
    )
    .unwrap();
    p
}

fn listed(p: &Path, name: &str) -> Option<String> {
    grub_editenv_list(p)
        .unwrap_or_else(|e| panic!("{e}"))
        .remove(name)
}

#[test]
fn grub_editenv_lists_what_updraft_writes() {
    updraft_tests::require!("grub-editenv");
    let dir = Scratch::new("grub-lists");
    let p = provisioned(&dir);
    let mut bl = GrubBootloader::new(p.clone()).unwrap();
    let check = |order: &str, a: (&str, &str), b: (&str, &str)| {
        let vars = grub_editenv_list(&p).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            vars.get("ORDER").map(String::as_str),
            Some(order),
            "{vars:?}"
        );
        assert_eq!(
            (vars["A_OK"].as_str(), vars["A_TRY"].as_str()),
            a,
            "{vars:?}"
        );
        assert_eq!(
            (vars["B_OK"].as_str(), vars["B_TRY"].as_str()),
            b,
            "{vars:?}"
        );
        assert_eq!(
            vars.get("kernel_opts").map(String::as_str),
            Some("quiet splash")
        );
        assert_eq!(vars.get("path").map(String::as_str), Some("C:\\efi\\boot"));
        assert_eq!(std::fs::metadata(&p).unwrap().len(), GRUBENV_SIZE as u64);
    };
    bl.disable(SlotName::B).unwrap();
    check("A", ("1", "0"), ("0", "0"));
    bl.trial(SlotName::B, 3).unwrap();
    check("B A", ("1", "0"), ("1", "0"));
    bl.mark_bad(SlotName::B).unwrap();
    check("A", ("1", "0"), ("0", "0"));
    bl.mark_good(SlotName::B, 3).unwrap();
    check("B A", ("1", "0"), ("1", "0"));
    // grub-editenv can go on editing what updraft wrote.
    grub_editenv_set(&p, &[("extra", "1")]).unwrap();
    grub_editenv_unset(&p, &["saved_entry"]).unwrap();
    assert_eq!(listed(&p, "extra").as_deref(), Some("1"));
    assert_eq!(bl.read().unwrap().next_boot(), Some(SlotName::B));
}

#[test]
fn updraft_reads_what_grub_editenv_writes() {
    updraft_tests::require!("grub-editenv");
    let dir = Scratch::new("grub-reads");
    let p = dir.path().join("grubenv");
    grub_editenv_create(&p);
    let mut bl = GrubBootloader::new(p.clone()).unwrap();
    // A fresh block: the shipped grub.cfg's defaults, slot A only.
    let s = bl.read().unwrap();
    assert_eq!(s.order, vec![SlotName::A, SlotName::B]);
    assert_eq!(s.next_boot(), Some(SlotName::A));
    assert!(!s.b.bootable);
    grub_editenv_set(
        &p,
        &[
            ("ORDER", "B A"),
            ("B_OK", "1"),
            ("B_TRY", "0"),
            ("A_OK", "1"),
            ("A_TRY", "1"),
        ],
    )
    .unwrap();
    let s = bl.read().unwrap();
    assert_eq!(s.order, vec![SlotName::B, SlotName::A]);
    assert!(s.b.bootable && s.b.tries_left == 1);
    assert!(!s.a.bootable && s.a.tries_left == 0, "A was tried");
    grub_editenv_set(&p, &[("B_TRY", "1")]).unwrap();
    assert_eq!(bl.read().unwrap().next_boot(), None);
    grub_editenv_unset(&p, &["ORDER", "A_TRY"]).unwrap();
    let s = bl.read().unwrap();
    assert_eq!(s.order, vec![SlotName::A, SlotName::B]);
    assert_eq!(s.next_boot(), Some(SlotName::A));
    grub_editenv_set(&p, &[("A_OK", "maybe")]).unwrap();
    let e = bl.read().unwrap_err().to_string();
    assert!(
        e.contains("A_OK=\"maybe\"") && e.contains(&p.display().to_string()),
        "{e}"
    );
}

#[test]
fn other_lines_survive_byte_for_byte() {
    updraft_tests::require!("grub-editenv");
    let dir = Scratch::new("grub-bytes");
    let p = provisioned(&dir);
    let ours = |l: &&[u8]| {
        ["ORDER=", "A_OK=", "A_TRY=", "B_OK=", "B_TRY="]
            .iter()
            .any(|v| l.starts_with(v.as_bytes()))
    };
    let others = |block: &[u8]| -> Vec<Vec<u8>> {
        let end = block.iter().rposition(|&b| b == b'\n').unwrap();
        block[..end]
            .split(|&b| b == b'\n')
            .filter(|l| !ours(l))
            .map(<[u8]>::to_vec)
            .collect()
    };
    let before = std::fs::read(&p).unwrap();
    let mut bl = GrubBootloader::new(p.clone()).unwrap();
    bl.disable(SlotName::B).unwrap();
    bl.trial(SlotName::B, 1).unwrap();
    bl.mark_bad(SlotName::B).unwrap();
    let after = std::fs::read(&p).unwrap();
    assert_ne!(after, before);
    assert_eq!(
        others(&after),
        others(&before),
        "header, warning comment and other variables unchanged"
    );
    assert!(
        others(&after)
            .iter()
            .any(|l| l == b"path=C:\\\\efi\\\\boot"),
        "escapes kept as written"
    );
    assert!(
        after[after.iter().rposition(|&b| b == b'\n').unwrap() + 1..]
            .iter()
            .all(|&b| b == b'#')
    );
}

#[test]
fn malformed_blocks_are_refused_and_left_untouched() {
    updraft_tests::require!("grub-editenv");
    let dir = Scratch::new("grub-malformed");
    let good = std::fs::read(provisioned(&dir)).unwrap();
    let header = b"# GRUB Environment Block\n".len();
    let mut wrong_header = good.clone();
    wrong_header[2] = b'X';
    let mut bad_padding = good.clone();
    bad_padding[GRUBENV_SIZE - 10] = b'x';
    let mut bad_line = good.clone();
    bad_line.splice(header..header, b"no equals sign\n".iter().copied());
    bad_line.truncate(GRUBENV_SIZE);
    let mut nul = good.clone();
    nul[GRUBENV_SIZE - 1] = 0;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated", good[..1000].to_vec(), "1000 bytes"),
        (
            "grown",
            [good.clone(), vec![b'#'; 24]].concat(),
            "longer than 1024",
        ),
        ("empty", Vec::new(), "0 bytes"),
        ("wrong header", wrong_header, "not the header"),
        ("padding", bad_padding, "not '#' padding"),
        ("bad line", bad_line, "neither name=value nor a comment"),
        ("nul", nul, "NUL byte at offset 0x3ff"),
    ];
    for (what, bytes, want) in cases {
        let p = dir
            .path()
            .join(format!("grubenv-{}", what.replace(' ', "-")));
        std::fs::write(&p, &bytes).unwrap();
        let mut bl = GrubBootloader::new(p.clone()).unwrap();
        let e = bl.read().unwrap_err();
        assert_eq!(e.kind(), Kind::Bootloader, "{what}");
        let msg = e.to_string();
        assert!(
            msg.contains(want) && msg.contains(&p.display().to_string()),
            "{what}: {msg}"
        );
        assert!(bl.disable(SlotName::B).is_err(), "{what}");
        assert!(bl.trial(SlotName::B, 1).is_err(), "{what}");
        assert!(bl.mark_good(SlotName::A, 1).is_err(), "{what}");
        assert!(bl.mark_bad(SlotName::B).is_err(), "{what}");
        assert_eq!(std::fs::read(&p).unwrap(), bytes, "{what}: left untouched");
    }
    // The parser agrees with the file-level checks on the good block.
    assert!(parse_grubenv(&good).is_ok());
}

#[test]
fn a_write_that_would_overflow_the_block_is_refused() {
    updraft_tests::require!("grub-editenv");
    let dir = Scratch::new("grub-full");
    let p = dir.path().join("grubenv");
    grub_editenv_create(&p);
    // grub-editenv fills the block to within a few bytes.
    let filler = "x".repeat(GRUBENV_SIZE - 120);
    grub_editenv_set(&p, &[("filler", &filler)]).unwrap();
    let before = std::fs::read(&p).unwrap();
    let mut bl = GrubBootloader::new(p.clone()).unwrap();
    let e = bl.trial(SlotName::B, 1).unwrap_err().to_string();
    assert!(e.contains("more than the 1024"), "{e}");
    assert_eq!(std::fs::read(&p).unwrap(), before);
    assert_eq!(listed(&p, "filler").as_deref(), Some(filler.as_str()));
}

#[test]
fn trial_without_mark_good_falls_back_after_one_try() {
    updraft_tests::require!("grub-editenv");
    let dir = Scratch::new("grub-fallback");
    let p = provisioned(&dir);
    let mut bl = GrubBootloader::new(p.clone()).unwrap();
    assert_eq!(boot_grub(&p), Some(SlotName::A));
    bl.mark_good(SlotName::A, 3).unwrap();
    bl.disable(SlotName::B).unwrap();
    assert_eq!(
        boot_grub(&p),
        Some(SlotName::A),
        "a half-written B is never booted"
    );
    bl.mark_good(SlotName::A, 3).unwrap();
    bl.trial(SlotName::B, 3).unwrap();
    assert_eq!(boot_grub(&p), Some(SlotName::B), "the one try");
    assert_eq!(listed(&p, "B_TRY").as_deref(), Some("1"));
    let s = bl.read().unwrap();
    assert!(!s.b.bootable && s.b.tries_left == 0, "B used its try");
    assert_eq!(
        boot_grub(&p),
        Some(SlotName::A),
        "B never marked good: GRUB falls back"
    );
}

#[test]
fn mark_good_after_the_trial_boot_keeps_the_new_slot() {
    updraft_tests::require!("grub-editenv");
    let dir = Scratch::new("grub-keep");
    let p = provisioned(&dir);
    let mut bl = GrubBootloader::new(p.clone()).unwrap();
    bl.disable(SlotName::B).unwrap();
    bl.trial(SlotName::B, 3).unwrap();
    for _ in 0..5 {
        assert_eq!(boot_grub(&p), Some(SlotName::B));
        bl.mark_good(SlotName::B, 3).unwrap();
        assert_eq!(listed(&p, "B_TRY").as_deref(), Some("0"));
    }
    bl.mark_bad(SlotName::B).unwrap();
    assert_eq!(boot_grub(&p), Some(SlotName::A));
}
