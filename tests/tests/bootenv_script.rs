//! The `script` backend driving a real bootloader environment: the example
//! script from `docs/bootloaders.md` (libubootenv's `fw_printenv`/`fw_setenv`
//! over a U-Boot environment), run by updraft, read by the RAUC-style boot
//! script and cross-checked with updraft's native U-Boot backend.

use std::path::{Path, PathBuf};

use updraft::bootloader::Bootloader;
use updraft::bootloader::script::ScriptBootloader;
use updraft::error::Kind;
use updraft::slot::SlotName;
use updraft_tests::bootenv::{Layout, Scratch, UbootEnv, boot_uboot, tool};

/// The example script as published, with its `CONFIG=` line pointed at
/// `config`.
fn documented_script(dir: &Path, config: &Path) -> PathBuf {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/bootloaders.md"
    ))
    .expect("reading docs/bootloaders.md");
    let marker = "<!-- example: script-backend -->\n```sh\n";
    let start = doc
        .find(marker)
        .expect("the script-backend example marker in docs/bootloaders.md")
        + marker.len();
    let len = doc[start..].find("```\n").expect("the end of the example");
    let script = doc[start..start + len].replace(
        "CONFIG=/etc/fw_env.config\n",
        &format!("CONFIG={}\n", config.display()),
    );
    assert!(
        script.contains(&config.display().to_string()),
        "the example sets CONFIG=/etc/fw_env.config"
    );
    let path = dir.join("boot-select");
    updraft_tests::tmp::write_executable(&path, &script);
    path
}

fn setup(name: &str) -> (Scratch, UbootEnv, ScriptBootloader) {
    // The script calls the tools by name: fail here, naming the package,
    // rather than inside the script.
    tool("fw_printenv");
    tool("fw_setenv");
    let dir = Scratch::new(name);
    let env = UbootEnv::create(
        dir.path(),
        Layout::redundant(0x4000),
        &[
            ("bootcmd", "run distro_bootcmd"),
            ("BOOT_ORDER", "A B"),
            ("BOOT_A_LEFT", "3"),
            ("BOOT_B_LEFT", "3"),
        ],
    );
    let script = documented_script(dir.path(), &env.config);
    let bl = ScriptBootloader::new(script).unwrap();
    (dir, env, bl)
}

#[test]
fn the_documented_script_runs_the_update_cycle() {
    updraft_tests::require!("mkenvimage", "fw_printenv", "fw_setenv");
    let (_d, env, mut bl) = setup("script-cycle");
    let mut native = env.bootloader();
    assert_eq!(bl.read().unwrap(), native.read().unwrap());
    bl.disable(SlotName::B).unwrap();
    assert_eq!(native.read().unwrap().order, vec![SlotName::A]);
    assert_eq!(boot_uboot(&env.config), Some(SlotName::A));
    bl.trial(SlotName::B, 3).unwrap();
    let s = bl.read().unwrap();
    assert_eq!(
        s,
        native.read().unwrap(),
        "the script and the native backend agree"
    );
    assert_eq!((s.order[0], s.b.tries_left), (SlotName::B, 3));
    for n in 1..=3 {
        assert_eq!(boot_uboot(&env.config), Some(SlotName::B), "boot {n}");
    }
    assert_eq!(
        boot_uboot(&env.config),
        Some(SlotName::A),
        "fallback after three tries"
    );
    bl.trial(SlotName::B, 2).unwrap();
    assert_eq!(boot_uboot(&env.config), Some(SlotName::B));
    bl.mark_good(SlotName::B, 2).unwrap();
    assert_eq!(bl.read().unwrap().b.tries_left, 2);
    bl.mark_bad(SlotName::B).unwrap();
    let s = native.read().unwrap();
    assert_eq!(s.order, vec![SlotName::A]);
    assert!(!s.b.bootable);
    assert_eq!(boot_uboot(&env.config), Some(SlotName::A));
    assert_eq!(
        env.printenv().unwrap().get("bootcmd").map(String::as_str),
        Some("run distro_bootcmd")
    );
}

#[test]
fn script_failures_reach_the_operator_with_stderr() {
    updraft_tests::require!("mkenvimage", "fw_printenv", "fw_setenv");
    let (_d, env, mut bl) = setup("script-fail");
    env.corrupt(0);
    env.corrupt(1);
    let e = bl.trial(SlotName::B, 3).unwrap_err();
    assert_eq!(e.kind(), Kind::Bootloader);
    let msg = e.to_string();
    assert!(msg.contains("trial B 3` exited with status 1"), "{msg}");
    assert!(msg.contains("cannot read the U-Boot environment"), "{msg}");
}
