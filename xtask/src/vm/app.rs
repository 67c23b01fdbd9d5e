//! The application component a guest runs: the app `web`'s tree, the
//! configuration tables and health check a slot image carries for it, the
//! guest's status line for it and the checks of what a disk holds.
//!
//! A slot image runs the app when its configuration names it: the
//! previous release of updraft (scenario 7) refuses tables it does not
//! know, so only the images of the app scenarios (6 and 8) carry them.
//!
//! This module owns the app's files and what they must hold. It must never
//! start QEMU, build slot images, or publish releases.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::util::{self, Result};

/// The app every release of these scenarios carries.
pub const APP: &str = "web";
/// Where the guests keep their apps: inside the state directory on the
/// data partition, which the shipped unit lets updraft write.
pub const APPS_DIR: &str = "/data/updraft/apps";
/// The app's health checks in the slot image.
pub const HEALTH_DIR: &str = "/etc/updraft/health.d/web";
/// Printed by the guest whenever an app's `current` changes: `NAME=TARGET:VERSION:SUMS`.
pub const APPS_MARK: &str = "updraft-vm: apps";

/// The `[apps]` and `[components.web]` tables of a slot image that runs
/// the app, its units (restarted after a switch) named.
pub fn config_tables(units: &[&str]) -> String {
    let units: Vec<String> = units.iter().map(|u| format!("{u:?}")).collect();
    format!(
        "\n[apps]\ndir = \"{APPS_DIR}\"\n\n\
         [components.{APP}]\nkind = \"app\"\nunits = [{}]\nhealth_dir = \"{HEALTH_DIR}\"\ntimeout = \"60s\"\n",
        units.join(", ")
    )
}

/// The app's health check: the generation being tried holds the version
/// released, every file as its `SUMS` lists it.
pub const HEALTH_CHECK: &str = "#!/bin/sh\n\
# The active generation holds the version being installed, every file intact.\n\
cd \"$UPDRAFT_APP_DIR/current\" || { echo \"$UPDRAFT_COMPONENT: no active generation\"; exit 1; }\n\
v=$(cat VERSION)\n\
[ \"$v\" = \"$UPDRAFT_VERSION\" ] || { echo \"$UPDRAFT_COMPONENT: current holds $v, not $UPDRAFT_VERSION\"; exit 1; }\n\
sha256sum -c SUMS >/dev/null 2>&1 || { echo \"$UPDRAFT_COMPONENT: a file differs from SUMS\"; exit 1; }\n";

/// The guest's shell lines (inside its status loop) that print
/// [`APPS_MARK`] whenever an app's `current` names another generation:
/// the generation, the version it holds and whether its files match SUMS.
pub const STATUS_LINES: &str = r#"    k=$(for c in /data/updraft/apps/*/current; do [ -e "$c" ] && printf '%s=%s ' "$(basename "$(dirname "$c")")" "$(readlink "$c")"; done)
    if [ "$k" != "$lastk" ]; then
        a=
        for c in /data/updraft/apps/*/current; do
            [ -e "$c" ] || continue
            s=bad
            (cd "$c" && sha256sum -c SUMS >/dev/null 2>&1) && s=ok
            a="$a $(basename "$(dirname "$c")")=$(readlink "$c"):$(cat "$c/VERSION" 2>/dev/null):$s"
        done
        echo "updraft-vm: apps$a"
        lastk=$k
    fi
"#;

/// The app's tree of `version` at `dir`: `bin/web` (prints its version
/// and stays up), `VERSION`, `files` data files of a few KiB (each release
/// changes a third of them) and `SUMS`, the sha256 of every other file.
pub fn tree(dir: &Path, version: &str, files: usize) -> Result {
    let _ = std::fs::remove_dir_all(dir);
    for d in ["bin", "share"] {
        std::fs::create_dir_all(dir.join(d))
            .map_err(|e| format!("creating {}: {e}", dir.join(d).display()))?;
    }
    let write = |rel: &str, bytes: &[u8], mode: u32| -> Result {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(rel);
        std::fs::write(&p, bytes).map_err(|e| format!("writing {}: {e}", p.display()))?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))
            .map_err(|e| format!("setting the mode of {}: {e}", p.display()))
    };
    write("VERSION", version.as_bytes(), 0o644)?;
    write(
        "bin/web",
        b"#!/bin/sh\n\
          # The app: says which generation runs, then stays up.\n\
          d=$(dirname \"$(dirname \"$(readlink -f \"$0\")\")\")\n\
          echo \"updraft-vm: app web $(cat \"$d/VERSION\") running from $d, pid $$\"\n\
          exec sleep 1000000\n",
        0o755,
    )?;
    let salt: u64 = version.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    for i in 0..files {
        // Two of every three files are the same in every release: what
        // the device links instead of downloading.
        let seed = if i % 3 == 0 {
            salt ^ i as u64
        } else {
            i as u64
        };
        let mut rng = updraft_tests::rng::Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let len = 2048 + rng.below(6144) as usize;
        let bytes: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
        write(&format!("share/{i:04}.bin"), &bytes, 0o644)?;
    }
    let sums = util::output(
        Command::new("sh")
            .arg("-c")
            .arg("find . -type f ! -name SUMS | LC_ALL=C sort | xargs sha256sum")
            .current_dir(dir),
    )?;
    write("SUMS", sums.as_bytes(), 0o644)
}

/// What a line of [`APPS_MARK`] says of app `name`: (generation target,
/// version, files intact).
pub fn app_line(line: &str, name: &str) -> Option<(String, String, bool)> {
    let rest = line.split(APPS_MARK).nth(1)?;
    let entry = rest
        .split_whitespace()
        .find_map(|e| e.strip_prefix(&format!("{name}=")))?;
    let mut f = entry.split(':');
    let target = f.next()?.to_string();
    let version = f.next()?.to_string();
    Some((target, version, f.next()? == "ok"))
}

/// The version of component `name` in a status JSON.
pub fn component_version(s: &Value, name: &str) -> Option<String> {
    s["components"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
        .and_then(|c| c["version"].as_str())
        .map(str::to_string)
}

/// Check a copy of the app's directory taken off the disk: `current`
/// names a generation holding `version`, every file as SUMS lists it.
pub fn check_on_disk(app_dir: &Path, version: &str) -> Result<String> {
    let current = app_dir.join("current");
    let target = std::fs::read_link(&current)
        .map_err(|e| format!("{} is not a symlink on the disk: {e}", current.display()))?;
    let held = std::fs::read_to_string(current.join("VERSION"))
        .map_err(|e| format!("reading VERSION through {}: {e}", current.display()))?;
    if held != version {
        return Err(format!(
            "on the disk, {} names {} holding {held}, not {version}",
            current.display(),
            target.display()
        ));
    }
    util::output(
        Command::new("sha256sum")
            .args(["-c", "--quiet", "SUMS"])
            .current_dir(&current),
    )
    .map_err(|e| format!("on the disk, {} is not intact: {e}", target.display()))?;
    Ok(target.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn app_lines_give_target_version_and_integrity() {
        let l = "updraft-vm: apps web=gen/3:9.2:ok api=gen/1:1.0:bad";
        assert_eq!(
            app_line(l, "web"),
            Some(("gen/3".into(), "9.2".into(), true))
        );
        assert_eq!(
            app_line(l, "api"),
            Some(("gen/1".into(), "1.0".into(), false))
        );
        assert_eq!(app_line(l, "db"), None);
        assert_eq!(app_line("updraft-vm: status {}", "web"), None);
    }

    #[test]
    fn the_status_lines_print_the_mark_the_harness_reads() {
        assert!(STATUS_LINES.contains(&format!("echo \"{APPS_MARK}$a\"")));
        assert!(STATUS_LINES.contains(APPS_DIR));
    }

    #[test]
    fn the_config_tables_name_the_app_and_its_units() {
        let t = config_tables(&["vm-web.service"]);
        assert!(t.contains("[components.web]\nkind = \"app\"\nunits = [\"vm-web.service\"]"));
        assert!(t.contains(&format!("dir = \"{APPS_DIR}\"")));
        assert!(config_tables(&[]).contains("units = []"));
    }

    #[test]
    fn a_tree_changes_a_third_of_its_files_between_releases() {
        let d = std::env::temp_dir().join(format!("updraft-app-tree-{}", std::process::id()));
        let (a, b) = (d.join("a"), d.join("b"));
        tree(&a, "1.0", 9).unwrap_or_else(|e| panic!("{e}"));
        tree(&b, "1.1", 9).unwrap_or_else(|e| panic!("{e}"));
        let same = (0..9)
            .filter(|i| {
                let f = format!("share/{i:04}.bin");
                std::fs::read(a.join(&f)).ok() == std::fs::read(b.join(&f)).ok()
            })
            .count();
        assert_eq!(same, 6);
        let sums = std::fs::read_to_string(a.join("SUMS")).unwrap_or_default();
        assert_eq!(sums.lines().count(), 11, "{sums}");
        check_on_disk_tree(&a);
        let _ = std::fs::remove_dir_all(&d);
    }

    fn check_on_disk_tree(dir: &Path) {
        let app = dir.with_file_name("app");
        std::fs::create_dir_all(&app).unwrap_or_else(|e| panic!("{e}"));
        let _ = std::fs::remove_file(app.join("current"));
        std::os::unix::fs::symlink(dir, app.join("current")).unwrap_or_else(|e| panic!("{e}"));
        assert!(check_on_disk(&app, "1.0").is_ok());
        assert!(check_on_disk(&app, "1.1").is_err());
        std::fs::write(dir.join("share/0001.bin"), b"changed").unwrap_or_else(|e| panic!("{e}"));
        assert!(check_on_disk(&app, "1.0").is_err());
    }
}
