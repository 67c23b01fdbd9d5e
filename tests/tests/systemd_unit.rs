//! The shipped systemd files are valid and the unit's sandbox stays tight:
//!
//! * `systemd-analyze verify` accepts `systemd/updraft.service` (staged with
//!   `ExecStart=` pointing at the built `updraft`, since verify checks that
//!   the binary exists) without a single complaint about the unit, alone and
//!   with the health-check drop-in example applied;
//! * `systemd-analyze security --offline=yes` rates its exposure 3.0 or
//!   lower (the figure is printed);
//! * `systemd-sysusers` and `systemd-tmpfiles`, run against a scratch root,
//!   create the `updraft` group and `/run/updraft` (setgid, group updraft)
//!   and `/data/updraft` (root only) from the shipped snippets.
//!
//! Needs the systemd tools (Debian package `systemd`); without
//! `systemd-analyze` the tests skip loudly.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use updraft_tests::repo_root;
use updraft_tests::{bin, skip};

const MAX_EXPOSURE: f64 = 3.0;

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("updraft-systemd-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// The shipped unit with `ExecStart=` pointing at the built binary, in
/// `dir/updraft.service`.
fn stage_unit(dir: &Path) -> PathBuf {
    let unit = std::fs::read_to_string(repo_root().join("systemd/updraft.service"))
        .expect("read updraft.service");
    let exe = bin::path("updraft");
    let exe = exe.canonicalize().unwrap_or(exe);
    let exec_lines = unit
        .lines()
        .filter(|l| l.starts_with("ExecStart=/usr/bin/updraft "))
        .count();
    assert_eq!(
        exec_lines, 1,
        "updraft.service must have exactly one ExecStart=/usr/bin/updraft line"
    );
    let staged = unit.replace(
        "ExecStart=/usr/bin/updraft ",
        &format!("ExecStart={} ", exe.display()),
    );
    let path = dir.join("updraft.service");
    std::fs::write(&path, staged).expect("write staged unit");
    path
}

fn run(cmd: &mut Command) -> Output {
    let shown = format!("{cmd:?}");
    cmd.output()
        .unwrap_or_else(|e| panic!("running {shown}: {e}"))
}

/// verify must succeed and say nothing about our unit (unknown keys and
/// bad values are only warnings, with exit status 0).
fn assert_verifies(unit: &Path) {
    let out = run(Command::new("systemd-analyze").arg("verify").arg(unit));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let dir = unit
        .parent()
        .expect("unit dir")
        .to_string_lossy()
        .into_owned();
    let about_us: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("updraft") || l.contains(dir.as_str()))
        .collect();
    assert!(
        out.status.success() && about_us.is_empty(),
        "systemd-analyze verify {} ({}):\n{stderr}",
        unit.display(),
        out.status
    );
    if !stderr.trim().is_empty() {
        eprintln!("systemd-analyze verify: messages about other units:\n{stderr}");
    }
}

fn exposure(unit: &Path) -> f64 {
    let out = run(Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(unit));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| {
            panic!(
                "no overall exposure in systemd-analyze security output ({}):\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let figure = line
        .split(':')
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("cannot read the exposure figure in {line:?}"));
    let failed: Vec<&str> = stdout.lines().filter(|l| l.starts_with('✗')).collect();
    eprintln!(
        "{}: {line}\n  open items:\n    {}",
        unit.display(),
        failed.join("\n    ")
    );
    figure
}

#[test]
fn the_unit_verifies_and_its_exposure_is_at_most_3() {
    if !have("systemd-analyze") {
        skip!("systemd-analyze is not installed (Debian package systemd)");
    }
    let dir = scratch("unit");
    let unit = stage_unit(&dir);
    assert_verifies(&unit);
    let figure = exposure(&unit);
    println!("systemd-analyze security --offline=yes updraft.service: exposure {figure:.1}");
    assert!(
        figure <= MAX_EXPOSURE,
        "exposure {figure} is above {MAX_EXPOSURE}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_health_check_drop_in_example_applies_cleanly() {
    if !have("systemd-analyze") {
        skip!("systemd-analyze is not installed (Debian package systemd)");
    }
    let dir = scratch("dropin");
    let unit = stage_unit(&dir);
    let base = exposure(&unit);
    let dropins = dir.join("updraft.service.d");
    std::fs::create_dir_all(&dropins).expect("drop-in dir");
    std::fs::copy(
        repo_root().join("systemd/updraft.service.d/50-health-checks.conf.example"),
        dropins.join("50-health-checks.conf"),
    )
    .expect("copy drop-in example");
    assert_verifies(&unit);
    let loosened = exposure(&unit);
    println!(
        "with the health-check drop-in example: exposure {loosened:.1} (unit alone {base:.1})"
    );
    // The drop-in was applied: it loosens the sandbox a little, no more.
    assert!(loosened > base, "drop-in not applied: {loosened} vs {base}");
    assert!(
        loosened <= MAX_EXPOSURE,
        "exposure with the drop-in {loosened} is above {MAX_EXPOSURE}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sysusers_and_tmpfiles_create_the_group_and_directories() {
    if !have("systemd-sysusers") || !have("systemd-tmpfiles") {
        skip!("systemd-sysusers/systemd-tmpfiles are not installed (Debian package systemd)");
    }
    if !updraft_tests::skip::is_root() {
        skip!("systemd-tmpfiles needs root to set owners in a scratch root");
    }
    let root = scratch("root");
    std::fs::create_dir_all(root.join("etc")).expect("etc");
    let sysusers = repo_root().join("systemd/updraft.sysusers");
    let tmpfiles = repo_root().join("systemd/updraft.tmpfiles");

    let out = run(Command::new("systemd-sysusers")
        .arg(format!("--root={}", root.display()))
        .arg(&sysusers));
    assert!(
        out.status.success(),
        "systemd-sysusers: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let group = std::fs::read_to_string(root.join("etc/group")).expect("etc/group written");
    let gid: u32 = group
        .lines()
        .find_map(|l| l.strip_prefix("updraft:x:"))
        .and_then(|rest| rest.split(':').next())
        .and_then(|g| g.parse().ok())
        .unwrap_or_else(|| panic!("no updraft group in {group:?}"));

    let out = run(Command::new("systemd-tmpfiles")
        .arg("--create")
        .arg(format!("--root={}", root.display()))
        .arg(&tmpfiles));
    assert!(
        out.status.success(),
        "systemd-tmpfiles: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let run_dir = std::fs::metadata(root.join("run/updraft")).expect("/run/updraft created");
    assert!(run_dir.is_dir());
    assert_eq!(
        run_dir.mode() & 0o7777,
        0o2750,
        "/run/updraft: setgid, group may enter"
    );
    assert_eq!(
        (run_dir.uid(), run_dir.gid()),
        (0, gid),
        "/run/updraft is root:updraft"
    );
    let state = std::fs::metadata(root.join("data/updraft")).expect("/data/updraft created");
    assert_eq!(state.mode() & 0o7777, 0o700, "state_dir is root only");
    assert_eq!((state.uid(), state.gid()), (0, 0));
    let _ = std::fs::remove_dir_all(&root);
}

/// The tmpfiles.d entry creates libubootenv's lock at boot, root-owned and
/// mode 0600, so no other user can create it first or open it to hold the
/// lock.
#[test]
fn tmpfiles_creates_the_uboot_lock_root_only() {
    if !have("systemd-sysusers") || !have("systemd-tmpfiles") {
        skip!("systemd-sysusers/systemd-tmpfiles are not installed (Debian package systemd)");
    }
    if !updraft_tests::skip::is_root() {
        skip!("systemd-tmpfiles needs root to set owners in a scratch root");
    }
    let root = scratch("lock-root");
    std::fs::create_dir_all(root.join("etc")).expect("etc");
    let out = run(Command::new("systemd-sysusers")
        .arg(format!("--root={}", root.display()))
        .arg(repo_root().join("systemd/updraft.sysusers")));
    assert!(
        out.status.success(),
        "systemd-sysusers: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(Command::new("systemd-tmpfiles")
        .arg("--create")
        .arg(format!("--root={}", root.display()))
        .arg(repo_root().join("systemd/updraft.tmpfiles")));
    assert!(
        out.status.success(),
        "systemd-tmpfiles: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lock = std::fs::symlink_metadata(root.join("run/lock/fw_printenv.lock"))
        .expect("/run/lock/fw_printenv.lock created");
    assert!(lock.file_type().is_file());
    assert_eq!(lock.mode() & 0o7777, 0o600, "the U-Boot lock is root only");
    assert_eq!((lock.uid(), lock.gid()), (0, 0));
    let _ = std::fs::remove_dir_all(&root);
}

/// The journal catalog packages install compiles with journalctl's own
/// `--update-catalog` and lists every event kind with its subject, so
/// `journalctl -x` can show it beside updraft's entries.
#[test]
fn the_journal_catalog_compiles_and_lists_every_event_kind() {
    if !have("journalctl") {
        skip!("journalctl is not installed (Debian package systemd)");
    }
    let root = scratch("catalog");
    let dir = root.join("usr/lib/systemd/catalog");
    std::fs::create_dir_all(&dir).expect("catalog dir");
    std::fs::copy(
        repo_root().join("systemd/updraft.catalog"),
        dir.join("updraft.catalog"),
    )
    .expect("staging the catalog");
    let root_arg = format!("--root={}", root.display());
    let update = Command::new("journalctl")
        .args([root_arg.as_str(), "--update-catalog"])
        .output()
        .expect("running journalctl --update-catalog");
    assert!(
        update.status.success() && update.stderr.is_empty(),
        "journalctl --update-catalog: {}",
        String::from_utf8_lossy(&update.stderr)
    );
    let list = Command::new("journalctl")
        .args([root_arg.as_str(), "--list-catalog"])
        .output()
        .expect("running journalctl --list-catalog");
    assert!(list.status.success());
    let listed = String::from_utf8_lossy(&list.stdout);
    for kind in updraft::events::KINDS {
        let line = listed
            .lines()
            .find(|l| l.starts_with(kind.message_id))
            .unwrap_or_else(|| panic!("{} ({}) not listed:\n{listed}", kind.name, kind.message_id));
        assert!(
            line.ends_with(&format!("updraft: {}", kind.subject)),
            "{line}"
        );
    }
    assert_eq!(
        listed.lines().count(),
        updraft::events::KINDS.len(),
        "{listed}"
    );
}
