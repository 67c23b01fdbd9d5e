//! The Yocto layer stays in step with the workspace:
//!
//! * the recipe's crate list (`updraft-crates.inc`) names exactly the
//!   crates.io packages of `Cargo.lock`, each with the lock file's checksum,
//!   no more and no fewer (regenerate with `cargo xtask yocto-crates`);
//! * the recipe's licence checksum still covers the licence line of the
//!   workspace manifest;
//! * `oelint-adv` (PyPI) finds no error in the layer (skipped loudly when it
//!   is not installed).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use updraft_tests::repo_root;
use updraft_tests::skip;

const CRATES_IO: &str = "registry+https://github.com/rust-lang/crates.io-index";
const REGENERATE: &str = "run `cargo xtask yocto-crates` after changing Cargo.lock";

fn layer() -> PathBuf {
    repo_root().join("yocto/meta-updraft")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// `name-version` → checksum for every package cargo fetches from crates.io.
fn lock_packages() -> BTreeMap<String, String> {
    let lock: toml::Table =
        toml::from_str(&read(&repo_root().join("Cargo.lock"))).expect("Cargo.lock is TOML");
    let packages = lock["package"].as_array().expect("[[package]] entries");
    let mut out = BTreeMap::new();
    for p in packages {
        let field = |k: &str| p.get(k).and_then(|v| v.as_str());
        let (Some(name), Some(version)) = (field("name"), field("version")) else {
            panic!("Cargo.lock package without name or version: {p:?}");
        };
        match field("source") {
            None => {}
            Some(CRATES_IO) => {
                let sum =
                    field("checksum").unwrap_or_else(|| panic!("{name} {version} has no checksum"));
                out.insert(format!("{name}-{version}"), sum.to_string());
            }
            Some(other) => panic!(
                "{name} {version} comes from {other}, which the recipe cannot fetch as crate://"
            ),
        }
    }
    out
}

/// The `crate://` entries and `SRC_URI[…sha256sum]` flags of the crate list.
fn recipe_crates() -> (Vec<String>, BTreeMap<String, String>) {
    let text = read(&layer().join("recipes-support/updraft/updraft-crates.inc"));
    let mut uris = Vec::new();
    let mut sums = BTreeMap::new();
    for line in text.lines() {
        for word in line.split(|c: char| c.is_whitespace() || c == '"') {
            if let Some(rest) = word.strip_prefix("crate://crates.io/") {
                let (name, version) = rest
                    .split_once('/')
                    .unwrap_or_else(|| panic!("bad crate URI {word}"));
                uris.push(format!("{name}-{version}"));
            }
        }
        if let Some(rest) = line.trim().strip_prefix("SRC_URI[") {
            let (key, value) = rest
                .split_once("] = ")
                .unwrap_or_else(|| panic!("bad line {line:?}"));
            let key = key
                .strip_suffix(".sha256sum")
                .unwrap_or_else(|| panic!("not a sha256sum flag: {line:?}"));
            let value = value.trim().trim_matches('"').to_string();
            assert!(
                sums.insert(key.to_string(), value).is_none(),
                "{key} has two checksums"
            );
        }
    }
    (uris, sums)
}

#[test]
fn crate_list_matches_cargo_lock_exactly() {
    let lock = lock_packages();
    let (uris, sums) = recipe_crates();
    assert!(!lock.is_empty(), "Cargo.lock lists no crates.io package");

    let mut unique = uris.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), uris.len(), "a crate:// entry appears twice");

    let missing: Vec<&String> = lock.keys().filter(|k| !unique.contains(k)).collect();
    let extra: Vec<&String> = unique.iter().filter(|k| !lock.contains_key(*k)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "crate:// entries differ from Cargo.lock ({REGENERATE}): missing {missing:?}, extra {extra:?}"
    );

    let wrong: Vec<String> = lock
        .iter()
        .filter(|(k, v)| sums.get(*k) != Some(*v))
        .map(|(k, v)| format!("{k}: lock {v}, recipe {:?}", sums.get(k)))
        .collect();
    assert!(
        wrong.is_empty(),
        "checksums differ from Cargo.lock ({REGENERATE}): {wrong:#?}"
    );
    let stray: Vec<&String> = sums.keys().filter(|k| !lock.contains_key(*k)).collect();
    assert!(
        stray.is_empty(),
        "checksums for crates not in Cargo.lock ({REGENERATE}): {stray:?}"
    );
}

#[test]
fn recipe_uses_the_crate_list_and_the_shipped_systemd_files() {
    let recipe = read(&layer().join("recipes-support/updraft/updraft_git.bb"));
    assert!(
        recipe
            .lines()
            .any(|l| l.trim() == "require updraft-crates.inc")
    );
    assert!(
        recipe
            .lines()
            .any(|l| l.trim() == "inherit cargo systemd useradd")
    );
    for shipped in [
        "systemd/updraft.service",
        "systemd/updraft.tmpfiles",
        "systemd/updraft.sysusers",
        "systemd/updraft.catalog",
        "systemd/updraft.service.d/50-health-checks.conf.example",
    ] {
        assert!(
            recipe.contains(&format!("${{S}}/{shipped}")),
            "recipe does not install {shipped}"
        );
        assert!(
            repo_root().join(shipped).is_file(),
            "{shipped} is missing from the repository"
        );
    }
}

#[test]
fn licence_checksum_covers_the_manifest_licence_line() {
    let recipe = read(&layer().join("recipes-support/updraft/updraft_git.bb"));
    let spec = recipe
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("LIC_FILES_CHKSUM = \"file://Cargo.toml;")
        })
        .expect("LIC_FILES_CHKSUM on Cargo.toml");
    let param = |k: &str| {
        spec.trim_end_matches('"')
            .split(';')
            .find_map(|p| p.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("no {k} in {spec}"))
            .to_string()
    };
    let begin: usize = param("beginline").parse().expect("beginline");
    let end: usize = param("endline").parse().expect("endline");
    let manifest = read(&repo_root().join("Cargo.toml"));
    let lines: Vec<&str> = manifest.lines().collect();
    let covered: String = lines[begin - 1..end]
        .iter()
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(
        covered.contains("license = \"Apache-2.0 OR MIT\""),
        "lines {begin}-{end} of Cargo.toml are {covered:?}"
    );
    let out = Command::new("md5sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn();
    let mut child = out.expect("md5sum (coreutils)");
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(covered.as_bytes())
            .expect("feed md5sum");
    }
    let out = child.wait_with_output().expect("md5sum output");
    let md5 = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string();
    assert_eq!(
        param("md5"),
        md5,
        "update LIC_FILES_CHKSUM in updraft_git.bb"
    );
    // The publisher's recipe builds the same workspace under the same licence.
    let publisher = read(&layer().join("recipes-support/updraft/updraft-publish_git.bb"));
    let line = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("LIC_FILES_CHKSUM = "))
            .map(str::to_string)
    };
    assert_eq!(
        line(&publisher),
        line(&recipe),
        "keep LIC_FILES_CHKSUM equal in updraft-publish_git.bb and updraft_git.bb"
    );
}

#[test]
fn the_layer_passes_oelint_adv() {
    let available = Command::new("oelint-adv")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !available {
        skip!("oelint-adv is not installed (pip install oelint-adv)");
    }
    let mut files = Vec::new();
    let mut dirs = vec![layer()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("layer dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p
                .extension()
                .is_some_and(|x| x == "bb" || x == "bbappend" || x == "inc" || x == "conf")
            {
                files.push(p);
            }
        }
    }
    files.sort();
    assert!(files.len() >= 4, "layer files: {files:?}");
    // The HOMEPAGE reachability rule needs the network; everything else runs.
    let out = Command::new("oelint-adv")
        .args([
            "--quiet",
            "--release",
            "whinlatter",
            "--suppress",
            "oelint.vars.homepageping",
        ])
        .args(&files)
        .output()
        .expect("run oelint-adv");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("oelint-adv findings:\n{report}");
    let errors: Vec<&str> = report.lines().filter(|l| l.contains(":error:")).collect();
    assert!(
        errors.is_empty(),
        "oelint-adv errors:\n{}",
        errors.join("\n")
    );
    let crashed = report.contains("Traceback");
    assert!(!crashed, "oelint-adv failed:\n{report}");
}

/// `NAME ??= "value"` defaults of a recipe.
fn recipe_defaults(recipe: &str) -> BTreeMap<String, String> {
    recipe
        .lines()
        .filter_map(|l| l.split_once(" ??= "))
        .map(|(k, v)| (k.trim().to_string(), v.trim().trim_matches('"').to_string()))
        .collect()
}

/// `@@NAME@@` placeholders in a template.
fn placeholders(text: &str) -> Vec<String> {
    let mut out: Vec<String> = text
        .split("@@")
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The boot templates as the recipe renders them with its defaults.
fn render_boot_files() -> Vec<(String, String)> {
    let dir = layer().join("recipes-bsp/updraft-bootfiles");
    let recipe = read(&dir.join("updraft-bootfiles_1.0.bb"));
    let defaults = recipe_defaults(&recipe);
    let mut rendered = Vec::new();
    for name in ["boot.cmd", "grub.cfg"] {
        let template = read(&dir.join("files").join(format!("{name}.in")));
        let mut text = template.clone();
        for p in placeholders(&template) {
            assert!(
                recipe.contains(&format!("-e 's#@@{p}@@#${{{p}}}#g'")),
                "updraft-bootfiles does not substitute @@{p}@@ in {name}.in"
            );
            let value = defaults
                .get(&p)
                .unwrap_or_else(|| panic!("no default ({p} ??= …) for @@{p}@@"));
            // What bitbake would expand inside the default.
            let value = value.replace("${KERNEL_IMAGETYPE}", "Image");
            text = text.replace(&format!("@@{p}@@"), &value);
        }
        assert!(!text.contains("@@"), "{name}: placeholders left");
        rendered.push((name.to_string(), text));
    }
    rendered
}

#[test]
fn boot_templates_render_completely_and_grub_accepts_its_script() {
    updraft_tests::require!("grub-script-check");
    let rendered = render_boot_files();
    let boot_cmd = &rendered[0].1;
    // The slot is chosen from BOOT_ORDER and passed to Linux.
    assert!(boot_cmd.contains("for s in ${BOOT_ORDER}"));
    assert!(boot_cmd.contains("updraft.slot=${updraft_slot}"));
    assert!(boot_cmd.contains("panic=10"));
    assert!(
        !boot_cmd.contains("setenv BOOT_ORDER \"A B\""),
        "the script must never put a slot back into BOOT_ORDER"
    );
    let grub = &rendered[1].1;
    assert!(grub.contains("updraft.slot=A") && grub.contains("updraft.slot=B"));
    assert!(grub.contains("save_env A_TRY B_TRY"));

    let dir = std::env::temp_dir().join(format!("updraft-bootfiles-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let cfg = dir.join("grub.cfg");
    std::fs::write(&cfg, grub).expect("write grub.cfg");
    let out = Command::new("grub-script-check")
        .arg(&cfg)
        .output()
        .unwrap_or_else(|e| {
            panic!("grub-script-check (Debian package grub-common) is needed: {e}")
        });
    assert!(
        out.status.success(),
        "grub-script-check rejects the GRUB configuration: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let cmd = dir.join("boot.cmd");
    std::fs::write(&cmd, boot_cmd).expect("write boot.cmd");
    let out = Command::new("mkimage")
        .args([
            "-A", "arm64", "-T", "script", "-C", "none", "-n", "updraft", "-d",
        ])
        .arg(&cmd)
        .arg(dir.join("boot.scr"))
        .output()
        .unwrap_or_else(|e| panic!("mkimage (Debian package u-boot-tools) is needed: {e}"));
    assert!(
        out.status.success(),
        "mkimage: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn recipe_builds_sqlite_with_the_workspace_flags() {
    let value_of = |text: &str, prefix: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .map(|v| v.trim().trim_matches('"').to_string())
    };
    let config = read(&repo_root().join(".cargo/config.toml"));
    let workspace =
        value_of(&config, "LIBSQLITE3_FLAGS = ").expect("LIBSQLITE3_FLAGS in .cargo/config.toml");
    for name in ["updraft_git.bb", "updraft-publish_git.bb"] {
        let recipe = read(&layer().join("recipes-support/updraft").join(name));
        let yocto = value_of(&recipe, "export LIBSQLITE3_FLAGS = ")
            .unwrap_or_else(|| panic!("export LIBSQLITE3_FLAGS in {name}"));
        assert_eq!(
            yocto, workspace,
            "keep {name}'s LIBSQLITE3_FLAGS equal to .cargo/config.toml's"
        );
    }
}

#[test]
fn the_default_configuration_parses_for_both_bootloaders() {
    let recipe = read(&layer().join("recipes-support/updraft/updraft_git.bb"));
    let template = read(&layer().join("recipes-support/updraft/files/updraft.toml"));
    for (bootloader, slot_a, slot_b) in [
        ("uboot", "/dev/mmcblk0p2", "/dev/mmcblk0p3"),
        (
            "grub",
            "/dev/disk/by-partlabel/rootA",
            "/dev/disk/by-partlabel/rootB",
        ),
    ] {
        let mut text = template.clone();
        for (placeholder, value) in [
            ("@COMPATIBLE@", "rpi4"),
            ("@SLOT_A@", slot_a),
            ("@SLOT_B@", slot_b),
            ("@BOOTLOADER@", bootloader),
            (
                "@MANIFEST_URL@",
                "https://updates.example.com/rpi4/manifest.json",
            ),
        ] {
            assert!(
                recipe.contains(&format!("-e 's#{placeholder}#")),
                "the recipe does not substitute {placeholder}"
            );
            text = text.replace(placeholder, value);
        }
        assert!(
            !text.contains('@'),
            "unsubstituted placeholder in updraft.toml"
        );
        let cfg = updraft::config::Config::parse(&text)
            .unwrap_or_else(|e| panic!("default updraft.toml with {bootloader}: {e}"));
        assert_eq!(cfg.system.state_dir, PathBuf::from("/data/updraft"));
        assert_eq!(cfg.system.socket_group.as_deref(), Some("updraft"));
    }
    // An empty manifest URL (local installs only) is valid too.
    let local = template
        .replace("@COMPATIBLE@", "rpi4")
        .replace("@SLOT_A@", "/dev/mmcblk0p2")
        .replace("@SLOT_B@", "/dev/mmcblk0p3")
        .replace("@BOOTLOADER@", "uboot")
        .replace("@MANIFEST_URL@", "");
    updraft::config::Config::parse(&local)
        .unwrap_or_else(|e| panic!("default updraft.toml without a server: {e}"));
}
