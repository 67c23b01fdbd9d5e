//! The GRUB configuration of `meta-updraft` (`grub.cfg.in`), run by a real
//! GRUB: `grub-emu`, the GRUB emulator, with the environment block written
//! by `grub-editenv`. Each case sources the rendered configuration, then
//! prints which slot it chose, the menu entry it made the default and the
//! TRY flags it set.
//!
//! GRUB cannot write its environment block on the emulator's host
//! filesystem ("sparse file not allowed"), so what `save_env` would store
//! is read from the variables instead.
//!
//! Needs `grub-emu` (Debian package `grub-emu`) and `grub-editenv`
//! (`grub-common`); without them the cases skip loudly.

use std::process::{Command, Stdio};

use updraft_tests::repo_root;
use updraft_tests::skip;

fn render() -> String {
    let template = std::fs::read_to_string(
        repo_root().join("yocto/meta-updraft/recipes-bsp/updraft-bootfiles/files/grub.cfg.in"),
    )
    .expect("read grub.cfg.in");
    let values = [
        ("UPDRAFT_GRUB_TIMEOUT", "0"),
        ("UPDRAFT_GRUB_DISK", "hd0"),
        ("UPDRAFT_PART_A", "2"),
        ("UPDRAFT_PART_B", "3"),
        ("UPDRAFT_KERNEL_PATH", "/boot/bzImage"),
        ("UPDRAFT_PARTUUID_A", "3b2a9c7e-4f1d-4d52-9a67-1c0e8f3d2a01"),
        ("UPDRAFT_PARTUUID_B", "3b2a9c7e-4f1d-4d52-9a67-1c0e8f3d2a02"),
        ("UPDRAFT_PANIC_SECONDS", "10"),
        ("UPDRAFT_EXTRA_BOOTARGS", ""),
        ("UPDRAFT_GRUB_PARTMAP", "gpt"),
        ("UPDRAFT_GRUB_LINUX", "linux"),
        ("UPDRAFT_GRUB_INITRD", ""),
    ];
    let mut text = template;
    for (k, v) in values {
        text = text.replace(&format!("@@{k}@@"), v);
    }
    assert!(
        !text.contains("@@"),
        "unrendered placeholder in grub.cfg.in"
    );
    text
}

/// What the configuration decided.
#[derive(Debug, PartialEq)]
struct Decision {
    slot: String,
    default: String,
    a_try: String,
    b_try: String,
    order: String,
}

/// Run GRUB with a grubenv holding `env` (None: no grubenv at all).
fn decide(tag: &str, env: Option<&[&str]>) -> (Decision, String) {
    let dir = std::env::temp_dir().join(format!("updraft-grub-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    std::fs::write(dir.join("updraft.cfg"), render()).expect("updraft.cfg");
    std::fs::write(
        dir.join("grub.cfg"),
        "source ${prefix}/updraft.cfg\n\
         echo \"decision: slot=${slot} default=${default} A_TRY=${A_TRY} B_TRY=${B_TRY} ORDER=${ORDER}\"\n\
         halt\n",
    )
    .expect("grub.cfg");
    if let Some(vars) = env {
        let envfile = dir.join("grubenv");
        let status = Command::new("grub-editenv")
            .arg(&envfile)
            .arg("create")
            .status()
            .expect("grub-editenv");
        assert!(status.success());
        let status = Command::new("grub-editenv")
            .arg(&envfile)
            .arg("set")
            .args(vars)
            .status()
            .expect("grub-editenv");
        assert!(status.success());
    }
    let out = Command::new("timeout")
        .args(["60", "grub-emu", "-r", "host", "-d"])
        .arg(&dir)
        .stdin(Stdio::null())
        .output()
        .expect("run grub-emu");
    let console = String::from_utf8_lossy(&out.stdout).replace('\r', "\n");
    let _ = std::fs::remove_dir_all(&dir);
    let line = console
        .lines()
        .find_map(|l| l.split("decision: ").nth(1))
        .unwrap_or_else(|| {
            panic!(
                "GRUB did not reach the end of the configuration ({}):\n{console}",
                out.status
            )
        });
    let field = |k: &str| {
        let start = line
            .find(&format!("{k}="))
            .map(|i| i + k.len() + 1)
            .unwrap_or_else(|| panic!("{k} in {line}"));
        let rest = &line[start..];
        if k == "ORDER" {
            rest.trim_end().to_string()
        } else {
            rest.split_whitespace().next().unwrap_or("").to_string()
        }
    };
    let d = Decision {
        slot: field("slot"),
        default: field("default"),
        a_try: field("A_TRY"),
        b_try: field("B_TRY"),
        order: field("ORDER"),
    };
    (d, console)
}

fn decision(slot: &str, a_try: &str, b_try: &str, order: &str) -> Decision {
    Decision {
        slot: slot.into(),
        default: if slot == "A" { "0".into() } else { "1".into() },
        a_try: a_try.into(),
        b_try: b_try.into(),
        order: order.into(),
    }
}

macro_rules! needs_grub {
    () => {
        if !skip::on_path("grub-emu") || !skip::on_path("grub-editenv") {
            skip!(
                "grub-emu or grub-editenv is not installed (Debian packages grub-emu, grub-common)"
            );
        }
    };
}

#[test]
fn without_a_grubenv_slot_a_is_booted() {
    needs_grub!();
    let (d, _) = decide("none", None);
    assert_eq!(d, decision("A", "1", "0", "A B"));
}

#[test]
fn the_first_good_untried_slot_in_order_gets_its_try() {
    needs_grub!();
    let (d, _) = decide(
        "trial",
        Some(&["ORDER=B A", "A_OK=1", "A_TRY=0", "B_OK=1", "B_TRY=0"]),
    );
    assert_eq!(d, decision("B", "0", "1", "B A"));
}

#[test]
fn a_tried_slot_that_never_confirmed_falls_back_to_the_other() {
    needs_grub!();
    let (d, _) = decide(
        "fallback",
        Some(&["ORDER=B A", "A_OK=1", "A_TRY=0", "B_OK=1", "B_TRY=1"]),
    );
    assert_eq!(d, decision("A", "1", "1", "B A"));
}

#[test]
fn when_every_slot_was_tried_the_flags_clear_and_the_order_stays() {
    needs_grub!();
    let (d, console) = decide(
        "cleared",
        Some(&["ORDER=B A", "A_OK=1", "A_TRY=1", "B_OK=1", "B_TRY=1"]),
    );
    assert!(console.contains("clearing the TRY flags"), "{console}");
    assert_eq!(d, decision("B", "0", "1", "B A"));
}

#[test]
fn a_slot_not_marked_ok_is_never_booted() {
    needs_grub!();
    // B is being written: updraft set B_OK=0 first.
    let (d, _) = decide(
        "writing",
        Some(&["ORDER=B A", "A_OK=1", "A_TRY=1", "B_OK=0", "B_TRY=0"]),
    );
    assert_eq!(d, decision("A", "1", "0", "B A"));
}

#[test]
fn with_no_good_slot_at_all_a_is_booted() {
    needs_grub!();
    let (d, console) = decide(
        "nogood",
        Some(&["ORDER=A B", "A_OK=0", "A_TRY=0", "B_OK=0", "B_TRY=0"]),
    );
    assert!(console.contains("no slot is marked OK"), "{console}");
    assert_eq!(d.slot, "A");
    assert_eq!(d.default, "0");
}
