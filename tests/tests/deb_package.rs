//! The Debian package `cargo xtask dist --deb` makes (docs/debian.md),
//! built from the workspace's `updraft` (`--agent`, no release build) and
//! inspected as dpkg and lintian see it:
//!
//! * `dpkg-deb -I`: the control fields (architecture, version, a glibc
//!   dependency with a version, systemd), `/etc/updraft/updraft.toml` the
//!   only conffile, the three maintainer scripts executable and accepted
//!   by `sh -n`;
//! * `dpkg-deb -c`: every file root's, the binary 0755, the unit, the
//!   tmpfiles and sysusers snippets, the bash completion, the copyright
//!   file, the changelog and the lintian overrides where Debian puts them,
//!   and nothing under the state directory;
//! * the shipped configuration parses up to the one key an operator must
//!   fill in (`device.compatible`): what the daemon, started unconfigured,
//!   runs degraded on;
//! * `lintian` reports no error and no warning that the package does not
//!   override.
//!
//! Needs dpkg-deb (Debian package dpkg), strip (binutils) and lintian;
//! skips loudly without.
//! Installing the package is scenario 10 of `cargo xtask vm-test`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use updraft_tests::{bin, cargo_command, repo_root, require};

/// The package, built once for the file's tests.
fn package() -> PathBuf {
    static DEB: OnceLock<PathBuf> = OnceLock::new();
    DEB.get_or_init(|| {
        let out = std::env::temp_dir().join(format!("updraft-deb-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out).expect("scratch dir");
        // Stripped, as a release build is (lintian flags debug symbols).
        let agent = out.join("updraft");
        std::fs::copy(bin::path("updraft"), &agent).expect("copying updraft");
        run(Command::new("strip").arg(&agent));
        let built = cargo_command()
            .current_dir(repo_root())
            .args(["xtask", "dist", "--deb", "--agent"])
            .arg(&agent)
            .arg("--out")
            .arg(&out)
            .output()
            .expect("running cargo xtask dist --deb");
        assert!(
            built.status.success(),
            "cargo xtask dist --deb failed:\n{}{}",
            String::from_utf8_lossy(&built.stdout),
            String::from_utf8_lossy(&built.stderr)
        );
        std::fs::read_dir(&out)
            .expect("reading the output directory")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.extension().is_some_and(|x| x == "deb")
                    && p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("updraft_"))
            })
            .expect("no updraft_*.deb made")
    })
    .clone()
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("starting a command");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn field<'a>(control: &'a str, name: &str) -> Option<&'a str> {
    control
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
}

/// The package's control members (`dpkg-deb --control`), in a scratch dir.
fn control_dir(deb: &Path) -> PathBuf {
    let dir = deb.with_extension("control");
    let _ = std::fs::remove_dir_all(&dir);
    run(Command::new("dpkg-deb").arg("--control").arg(deb).arg(&dir));
    dir
}

#[test]
fn control_data_conffiles_and_maintainer_scripts() {
    require!("dpkg-deb", "strip");
    let deb = package();
    let control = run(Command::new("dpkg-deb").args(["-f"]).arg(&deb));
    assert_eq!(field(&control, "Package"), Some("updraft"));
    assert_eq!(field(&control, "Architecture"), Some("amd64"));
    let version = field(&control, "Version").expect("Version");
    assert!(
        version.starts_with(env!("CARGO_PKG_VERSION")) && version.contains('-'),
        "Version {version:?} is not the crate's version with a Debian revision"
    );
    let depends = field(&control, "Depends").expect("Depends");
    assert!(
        depends.starts_with("libc6 (>= 2.") && depends.contains("systemd"),
        "Depends {depends:?} must name glibc with a version and systemd"
    );
    let dir = control_dir(&deb);
    let conffiles = std::fs::read_to_string(dir.join("conffiles")).expect("conffiles");
    assert_eq!(
        conffiles.lines().collect::<Vec<_>>(),
        ["/etc/updraft/updraft.toml"]
    );
    for script in ["postinst", "prerm", "postrm"] {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(script);
        let mode = std::fs::metadata(&p)
            .unwrap_or_else(|e| panic!("{script}: {e}"))
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755, "{script} must be 0755");
        run(Command::new("sh").arg("-n").arg(&p));
    }
    let postinst = std::fs::read_to_string(dir.join("postinst")).expect("postinst");
    assert!(
        !postinst.contains("systemctl start") && !postinst.contains("systemctl restart"),
        "the postinst must not start the daemon (only try-restart it on an upgrade)"
    );
    for script in ["prerm", "postrm"] {
        let text = std::fs::read_to_string(dir.join(script)).expect(script);
        let removes_state = text.lines().any(|l| {
            let l = l.trim_start();
            !l.starts_with('#') && l.contains("/data") && (l.contains("rm ") || l.contains("rmdir"))
        });
        assert!(
            !removes_state,
            "{script} must never remove the state directory"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn files_owners_and_modes() {
    require!("dpkg-deb", "strip");
    let deb = package();
    let listing = run(Command::new("dpkg-deb").arg("-c").arg(&deb));
    let entries: Vec<(&str, &str, &str)> = listing
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            Some((*w.first()?, *w.get(1)?, *w.last()?))
        })
        .collect();
    for (mode, owner, path) in &entries {
        assert_eq!(*owner, "root/root", "{path} is not root's: {mode} {owner}");
        assert!(
            !path.starts_with("./data"),
            "the package must not ship the state directory: {path}"
        );
    }
    let mode_of = |want: &str| {
        entries
            .iter()
            .find(|(_, _, p)| p.trim_start_matches('.') == want)
            .map(|(m, _, _)| *m)
            .unwrap_or_else(|| panic!("{want} is not in the package:\n{listing}"))
    };
    assert_eq!(mode_of("/usr/bin/updraft"), "-rwxr-xr-x");
    for file in [
        "/lib/systemd/system/updraft.service",
        "/usr/lib/tmpfiles.d/updraft.conf",
        "/usr/lib/sysusers.d/updraft.conf",
        "/usr/lib/systemd/catalog/updraft.catalog",
        "/etc/updraft/updraft.toml",
        "/usr/share/bash-completion/completions/updraft",
        "/usr/share/doc/updraft/copyright",
        "/usr/share/doc/updraft/changelog.Debian.gz",
        "/usr/share/lintian/overrides/updraft",
    ] {
        assert_eq!(mode_of(file), "-rw-r--r--", "{file}");
    }
    assert_eq!(mode_of("/etc/updraft/health.d/"), "drwxr-xr-x");
}

#[test]
fn the_shipped_configuration_waits_for_the_device_id() {
    // The daemon started on the conffile as shipped runs degraded with
    // this reason (scenario 10 watches it do so).
    let conf = repo_root().join("contrib/debian/updraft.toml");
    let out = bin::command("updraft")
        .arg("--config")
        .arg(&conf)
        .arg("status")
        .output()
        .expect("running updraft status");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success(),
        "the shipped file must not be complete"
    );
    assert!(
        text.contains("device.compatible: must not be empty"),
        "the shipped configuration must parse up to device.compatible: {text}"
    );
}

#[test]
fn lintian_is_clean_or_overridden() {
    require!("dpkg-deb", "strip", "lintian");
    let deb = package();
    let out = Command::new("lintian")
        .args(["--display-info", "--pedantic", "--show-overrides"])
        .arg(&deb)
        .output()
        .expect("running lintian");
    let text = String::from_utf8_lossy(&out.stdout);
    println!("lintian {}:\n{text}", deb.display());
    let bad: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("E: ") || l.starts_with("W: "))
        .collect();
    assert!(
        bad.is_empty(),
        "lintian tags neither fixed nor overridden (with a reason, in contrib/debian/updraft.lintian-overrides):\n{}",
        bad.join("\n")
    );
    assert!(
        out.status.success(),
        "lintian failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
