//! meta-updraft under a real bitbake: bitbake 2.16 and openembedded-core
//! whinlatter, from the archive `../shared/yocto/` holds beside the
//! checkout (or `UPDRAFT_YOCTO_ARCHIVE`), unpacked afresh for each test.
//!
//! bitbake refuses to run as root and needs the `en_US.UTF-8` locale. As
//! root the tests run it as the unprivileged uid 65534 on a tree that uid
//! owns; the locale is compiled with `localedef` into the test's own
//! directory and found through `LOCPATH` (which bitbake's server is told to
//! keep, `BB_ENV_PASSTHROUGH_ADDITIONS`), so the machine's locales are
//! never changed. The host sanity checks a full build needs are left out
//! (`INHERIT:remove = "sanity"`): nothing is built, only parsed.
//!
//! What is checked: the layer parses for `qemuarm64` and `qemux86-64` with
//! systemd, with no error and no warning naming meta-updraft;
//! `bitbake -e updraft` shows the recipe's fetch list (every crate of
//! `updraft-crates.inc`), cargo's flags and the systemd unit; a broken
//! recipe line fails the parse with bitbake's own message. Each test is one
//! parse of 945 recipes, about 40 s on two idle cores. Without the archive
//! each says so and is listed with the skips; CI's strict mode allows that
//! skip (`skip_expected!`), as a machine without it cannot run bitbake.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use updraft_tests::repo_root;
use updraft_tests::tmp::TempDir;

const ARCHIVE: &str = "oe-core-whinlatter-bitbake-2.16.tar.xz";
/// Who runs bitbake when the tests run as root.
const UNPRIVILEGED: u32 = 65534;

fn archive() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("UPDRAFT_YOCTO_ARCHIVE") {
        return Some(PathBuf::from(p));
    }
    let p = repo_root().parent()?.join("shared/yocto").join(ARCHIVE);
    p.is_file().then_some(p)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// bitbake, oe-core and a copy of meta-updraft in a directory of their own,
/// with a build directory for `machine`.
struct Tree {
    tmp: TempDir,
}

impl Tree {
    fn new(name: &str, machine: &str, recipe_edit: impl FnOnce(&Path)) -> Option<Tree> {
        let archive = archive()?;
        let tmp = TempDir::new(name);
        let root = tmp.path();
        run(Command::new("tar")
            .arg("-xf")
            .arg(&archive)
            .arg("-C")
            .arg(root));
        run(Command::new("cp")
            .arg("-r")
            .arg(repo_root().join("yocto/meta-updraft"))
            .arg(root.join("meta-updraft")));
        recipe_edit(&root.join("meta-updraft"));
        let conf = root.join("build/conf");
        std::fs::create_dir_all(&conf).expect("build/conf");
        std::fs::write(
            conf.join("bblayers.conf"),
            format!(
                "BBPATH = \"${{TOPDIR}}\"\nBBFILES ?= \"\"\nBBLAYERS = \"{} {}\"\n",
                root.join("oe-core/meta").display(),
                root.join("meta-updraft").display()
            ),
        )
        .expect("bblayers.conf");
        std::fs::write(
            conf.join("local.conf"),
            format!(
                "MACHINE = \"{machine}\"\nINIT_MANAGER = \"systemd\"\nCONF_VERSION = \"2\"\n\
                 INHERIT:remove = \"sanity\"\n"
            ),
        )
        .expect("local.conf");
        let locale = root.join("locale");
        std::fs::create_dir_all(&locale).expect("locale dir");
        run(Command::new("localedef")
            .args(["-i", "en_US", "-f", "UTF-8"])
            .arg(locale.join("en_US.UTF-8")));
        if is_root() {
            run(Command::new("chown")
                .arg("-R")
                .arg(format!("{UNPRIVILEGED}:{UNPRIVILEGED}"))
                .arg(root));
        }
        Some(Tree { tmp })
    }

    /// `bitbake ARGS` in the build directory, as bitbake wants to be run.
    fn bitbake(&self, args: &[&str]) -> Output {
        let root = self.tmp.path();
        let mut cmd = if is_root() {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={UNPRIVILEGED}"))
                .arg(format!("--regid={UNPRIVILEGED}"))
                .arg("--clear-groups")
                .arg("env");
            c
        } else {
            Command::new("env")
        };
        cmd.arg("-i")
            .arg(format!("HOME={}", root.display()))
            .arg(format!(
                "PATH={}:/usr/bin:/bin",
                root.join("bitbake/bin").display()
            ))
            .arg(format!("LOCPATH={}", root.join("locale").display()))
            .args(["LANG=en_US.UTF-8", "LC_ALL=en_US.UTF-8"])
            .arg("BB_ENV_PASSTHROUGH_ADDITIONS=LOCPATH")
            .arg("bitbake")
            .args(args)
            .current_dir(root.join("build"));
        cmd.output().expect("running bitbake")
    }
}

fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

macro_rules! tree_or_skip {
    ($name:expr, $machine:expr, $edit:expr) => {
        match Tree::new($name, $machine, $edit) {
            Some(t) => t,
            // Loud (listed with the skips) but allowed: a machine without
            // the archive cannot run bitbake at all.
            None => updraft_tests::skip_expected!(
                "no bitbake archive: ../shared/yocto/{ARCHIVE} beside the checkout, or UPDRAFT_YOCTO_ARCHIVE"
            ),
        }
    };
}

/// The value of `NAME="…"` in `bitbake -e` output.
fn var<'a>(env: &'a str, name: &str) -> &'a str {
    let prefix = format!("{name}=\"");
    env.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or_else(|| panic!("bitbake -e shows no {name}"))
}

/// What meta-updraft makes bitbake say while parsing: warnings and errors
/// that name it.
fn ours(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| {
            (l.starts_with("WARNING") || l.starts_with("ERROR")) && l.contains("meta-updraft")
        })
        .collect()
}

#[test]
fn bitbake_e_shows_the_recipe_for_qemuarm64_with_systemd() {
    updraft_tests::require!("setpriv", "localedef", "chrpath", "diffstat", "gawk");
    let tree = tree_or_skip!("bitbake-qemuarm64", "qemuarm64", |_| {});
    // `-e` parses every recipe first, warning and failing as `-p` would.
    let out = tree.bitbake(&["-e", "updraft"]);
    let env = text(&out);
    assert!(out.status.success(), "bitbake -e updraft:\n{env}");
    assert!(
        ours(&env).is_empty(),
        "meta-updraft warns:\n{}",
        ours(&env).join("\n")
    );
    let inc = std::fs::read_to_string(
        repo_root().join("yocto/meta-updraft/recipes-support/updraft/updraft-crates.inc"),
    )
    .expect("updraft-crates.inc");
    let crates: Vec<&str> = inc
        .split_whitespace()
        .filter(|w| w.starts_with("crate://crates.io/"))
        .collect();
    let src_uri = var(&env, "SRC_URI");
    assert!(!crates.is_empty());
    for c in &crates {
        assert!(
            src_uri.split_whitespace().any(|w| w == *c),
            "{c} is not in SRC_URI"
        );
    }
    let flags = var(&env, "CARGO_BUILD_FLAGS");
    assert!(
        flags.contains("--frozen") && flags.contains("--release"),
        "{flags}"
    );
    assert!(
        flags.contains("aarch64"),
        "not built for the machine: {flags}"
    );
    assert_eq!(var(&env, "SYSTEMD_SERVICE:updraft"), "updraft.service");
}

#[test]
fn the_layer_parses_for_qemux86_64_with_no_error_and_no_warning_of_its_own() {
    updraft_tests::require!("setpriv", "localedef", "chrpath", "diffstat", "gawk");
    let tree = tree_or_skip!("bitbake-qemux86-64", "qemux86-64", |_| {});
    let out = tree.bitbake(&["-p"]);
    let log = text(&out);
    assert!(out.status.success(), "bitbake -p:\n{log}");
    assert!(log.contains(" 0 errors."), "bitbake -p:\n{log}");
    assert!(
        ours(&log).is_empty(),
        "meta-updraft warns:\n{}",
        ours(&log).join("\n")
    );
}

#[test]
fn a_broken_recipe_line_fails_the_parse_with_bitbakes_message() {
    updraft_tests::require!("setpriv", "localedef", "chrpath", "diffstat", "gawk");
    let tree = tree_or_skip!("bitbake-broken", "qemuarm64", |layer: &Path| {
        let recipe = layer.join("recipes-support/updraft/updraft_git.bb");
        let text = std::fs::read_to_string(&recipe).expect("the recipe");
        std::fs::write(&recipe, format!("{text}\nthis line is not bitbake\n"))
            .expect("the broken recipe");
    });
    let out = tree.bitbake(&["-p"]);
    let log = text(&out);
    assert!(!out.status.success(), "a broken recipe parsed:\n{log}");
    assert!(
        log.contains("updraft_git.bb") && log.contains("unparsed line: 'this line is not bitbake'"),
        "bitbake's message should name the recipe and the parse error:\n{log}"
    );
}
