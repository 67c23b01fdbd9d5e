//! meta-updraft under a real bitbake: bitbake 2.16 and openembedded-core
//! whinlatter, from the archive `../shared/yocto/` holds beside the
//! checkout (or `UPDRAFT_YOCTO_ARCHIVE`).
//!
//! One test, its steps in sequence on one unpacked tree and one bitbake
//! server, because a parse of oe-core's 945 recipes is what costs: the
//! first step parses everything and the steps after it use the recipes the
//! server holds, reparsing only what a step changed; the other machine
//! parses everything again. Each step prints its time
//! (docs/testing.md, "The bitbake test", has the figures). In order:
//!
//! 1. `bitbake -p`, then `bitbake -e updraft`, for `qemuarm64` with
//!    systemd: no error and no warning naming meta-updraft; every crate of
//!    `updraft-crates.inc` in `SRC_URI`; `--frozen --release` and the
//!    machine's target in `CARGO_BUILD_FLAGS`; `updraft.service` in
//!    `SYSTEMD_SERVICE`; the board settings of `local.conf` in the
//!    commands that write `updraft.toml`, `root.pub` and `fw_env.config`;
//! 2. `bitbake -p` for `qemux86-64`: the layer parses with no error and
//!    no warning of its own (a second whole parse: the machine is part of
//!    every recipe); the steps after it run for this machine;
//! 3. `bitbake -e` of `updraft-publish-native` and of a test image that
//!    inherits `updraft-release`: the class's variables expand (the image
//!    type, the marker command, the script found in the layer, the
//!    publishing command with its key, deltas and outputs);
//! 4. `bitbake updraft -c fetch` with `BB_NO_NETWORK = "1"`: every crate
//!    and the git source come from a mirror on this machine (`PREMIRRORS`:
//!    the `.crate` files of cargo's own download cache, the same bytes
//!    crates.io serves, and a bare repository holding the checkout's
//!    `HEAD`), and every crate lands in `DL_DIR` with its sha256 checked;
//! 5. `bitbake updraft -c unpack`: the checkout and every crate unpacked
//!    where cargo's offline build reads them;
//! 6. a corrupted `.crate` in the mirror fails the fetch, naming the
//!    checksum mismatch;
//! 7. a signing key inside the build directory fails the image's parse;
//! 8. a line that is not bitbake fails the parse with bitbake's message
//!    naming the recipe.
//!
//! Nothing leaves the machine: bitbake cannot use the network, and the
//! mirror is made from files already here. bitbake refuses to run as root
//! and needs the `en_US.UTF-8` locale. As root the test runs it as the
//! unprivileged uid 65534 on a tree that uid owns; the locale is compiled
//! with `localedef` into the test's own directory and found through
//! `LOCPATH` (which bitbake's server is told to keep,
//! `BB_ENV_PASSTHROUGH_ADDITIONS`), so the machine's locales are never
//! changed. The host sanity checks a full build needs are left out
//! (`INHERIT:remove = "sanity"`). Without the archive the test says so and
//! is listed with the skips; CI's strict mode allows that skip
//! (`skip_expected!`), as a machine without it cannot run bitbake.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use updraft_tests::repo_root;
use updraft_tests::skip::is_root;
use updraft_tests::tmp::TempDir;

const ARCHIVE: &str = "oe-core-whinlatter-bitbake-2.16.tar.xz";
/// Who runs bitbake when the tests run as root.
const UNPRIVILEGED: u32 = 65534;
/// How long bitbake's server waits for the next command before it ends.
const IDLE_SECONDS: u32 = 60;
/// The test image recipe, written into the tree's copy of the layer.
const IMAGE: &str = "updraft-release-test-image";
/// Board settings the tree's local.conf gives, checked in the recipe.
const MANIFEST_URL: &str = "https://updates.example.com/stable/manifest.json";
const SLOT_A: &str = "/dev/vda2";
const SLOT_B: &str = "/dev/vda3";
const COMPATIBLE: &str = "updraft-test-board";
const FW_ENV: &str = "/dev/mmcblk0 0x3fe000 0x2000";

fn archive() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("UPDRAFT_YOCTO_ARCHIVE") {
        return Some(PathBuf::from(p));
    }
    let p = repo_root().parent()?.join("shared/yocto").join(ARCHIVE);
    p.is_file().then_some(p)
}

/// `crate://crates.io/NAME/VERSION` of every crate in updraft-crates.inc.
fn recipe_crates() -> Vec<(String, String)> {
    let inc = std::fs::read_to_string(
        repo_root().join("yocto/meta-updraft/recipes-support/updraft/updraft-crates.inc"),
    )
    .expect("updraft-crates.inc");
    let crates: Vec<(String, String)> = inc
        .split_whitespace()
        .filter_map(|w| w.trim_matches('"').strip_prefix("crate://crates.io/"))
        .map(|c| {
            let (name, version) = c.rsplit_once('/').expect("crate://crates.io/NAME/VERSION");
            (name.to_string(), version.to_string())
        })
        .collect();
    assert_eq!(
        crates.len(),
        inc.matches(".sha256sum]").count(),
        "a crate of updraft-crates.inc without its checksum, or the reverse"
    );
    crates
}

/// cargo's download cache: `$CARGO_HOME/registry/cache/<registry>/`.
fn cargo_crate_cache() -> Vec<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .expect("CARGO_HOME or HOME");
    let dir = home.join("registry/cache");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect()
}

/// bitbake, oe-core, a copy of meta-updraft (with a test image recipe),
/// the source mirror and a build directory, in a directory of their own.
struct Tree {
    tmp: TempDir,
    /// The commit the mirror holds and the recipe builds.
    rev: String,
}

impl Tree {
    fn new() -> Option<Tree> {
        let archive = archive()?;
        let tmp = TempDir::new("yocto-bitbake");
        let root = tmp.path().to_path_buf();
        let root = root.as_path();
        run(Command::new("tar")
            .arg("-xf")
            .arg(&archive)
            .arg("-C")
            .arg(root));
        let layer = root.join("meta-updraft");
        run(Command::new("cp")
            .arg("-r")
            .arg(repo_root().join("yocto/meta-updraft"))
            .arg(&layer));
        let images = layer.join("recipes-test/images");
        std::fs::create_dir_all(&images).expect("the test image's directory");
        std::fs::write(
            images.join(format!("{IMAGE}.bb")),
            "SUMMARY = \"core-image-minimal with updraft, as a signed updraft release\"\n\
             require recipes-core/images/core-image-minimal.bb\n\
             IMAGE_INSTALL:append = \" updraft\"\n\
             inherit updraft-release\n",
        )
        .expect("the test image recipe");

        let rev = mirror(root);
        // Keys outside the build directory, as the class wants them: the
        // root public key the recipe installs and the release key the
        // class signs with (only its path is used; nothing is built).
        let keys = root.join("keys");
        std::fs::create_dir_all(&keys).expect("keys");
        std::fs::write(keys.join("root.pub"), "-----BEGIN PUBLIC KEY-----\n").expect("root.pub");
        std::fs::write(keys.join("release.key"), "").expect("release.key");

        let conf = root.join("build/conf");
        std::fs::create_dir_all(&conf).expect("build/conf");
        std::fs::write(
            conf.join("bblayers.conf"),
            format!(
                "BBPATH = \"${{TOPDIR}}\"\nBBFILES ?= \"\"\nBBLAYERS = \"{} {}\"\n",
                root.join("oe-core/meta").display(),
                layer.display()
            ),
        )
        .expect("bblayers.conf");
        let tree = Tree { tmp, rev };
        tree.local_conf("qemuarm64");
        let locale = root.join("locale");
        std::fs::create_dir_all(&locale).expect("locale dir");
        run(Command::new("localedef")
            .args(["-i", "en_US", "-f", "UTF-8"])
            .arg(locale.join("en_US.UTF-8")));
        tree.own();
        Some(tree)
    }

    fn root(&self) -> &Path {
        self.tmp.path()
    }

    fn layer(&self) -> PathBuf {
        self.root().join("meta-updraft")
    }

    fn downloads(&self) -> PathBuf {
        self.root().join("build/downloads")
    }

    /// local.conf for `machine`: systemd, no network, every source from
    /// the mirror, and board and release settings the checks look for.
    fn local_conf(&self, machine: &str) {
        let root = self.root();
        let mirror = root.join("mirror");
        let keys = root.join("keys");
        std::fs::write(
            root.join("build/conf/local.conf"),
            format!(
                "MACHINE = \"{machine}\"\nINIT_MANAGER = \"systemd\"\nCONF_VERSION = \"2\"\n\
                 INHERIT:remove = \"sanity\"\n\
                 BB_NO_NETWORK = \"1\"\n\
                 PREMIRRORS:prepend = \"https://crates.io/.* file://{mirror}/ \\\n\
                 git://github.com/.* git://{mirror}/git/BASENAME;protocol=file \"\n\
                 UPDRAFT_SRCREV = \"{rev}\"\n\
                 UPDRAFT_MANIFEST_URL = \"{MANIFEST_URL}\"\n\
                 UPDRAFT_SLOT_A = \"{SLOT_A}\"\nUPDRAFT_SLOT_B = \"{SLOT_B}\"\n\
                 UPDRAFT_COMPATIBLE = \"{COMPATIBLE}\"\n\
                 UPDRAFT_FW_ENV = \"{FW_ENV}\"\n\
                 UPDRAFT_ROOT_KEY = \"{keys}/root.pub\"\n\
                 UPDRAFT_SIGNING_KEY = \"{keys}/release.key\"\n\
                 UPDRAFT_RELEASE_VERSION = \"2.0\"\n\
                 UPDRAFT_PREVIOUS_IMAGE = \"{root}/releases/1.0.ext4\"\n",
                mirror = mirror.display(),
                keys = keys.display(),
                root = root.display(),
                rev = self.rev,
            ),
        )
        .expect("local.conf");
    }

    /// Give the tree to the user bitbake runs as.
    fn own(&self) {
        if is_root() {
            run(Command::new("chown")
                .arg("-R")
                .arg(format!("{UNPRIVILEGED}:{UNPRIVILEGED}"))
                .arg(self.root()));
        }
    }

    /// `bitbake ARGS` in the build directory, as bitbake wants to be run.
    fn bitbake(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("running bitbake")
    }

    fn command(&self, args: &[&str]) -> Command {
        let root = self.root();
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
            // One bitbake server for all the steps, which keeps the parsed
            // recipes in memory between commands and reparses only what a
            // step changed. (A new server per command reads the parse
            // cache, but the first server's cache is not the one the
            // second looks for: the second parses everything again.) It
            // ends IDLE_SECONDS after the last command, or when the tree
            // is dropped.
            .arg(format!("BB_SERVER_TIMEOUT={IDLE_SECONDS}"))
            .arg("bitbake")
            .args(args)
            .current_dir(root.join("build"));
        cmd
    }
}

impl Drop for Tree {
    /// End the bitbake server the steps shared (`bitbake -m`), so that
    /// nothing outlives the test, even one that failed.
    fn drop(&mut self) {
        let _ = self.command(&["-m"]).output();
    }
}

/// The mirror under `root/mirror`: every crate of updraft-crates.inc from
/// cargo's download cache, and `git/updraft.git`, a bare repository
/// holding the checkout's `HEAD` as branch `main`. Returns `HEAD`'s commit.
fn mirror(root: &Path) -> String {
    let mirror = root.join("mirror");
    std::fs::create_dir_all(&mirror).expect("mirror");
    let caches = cargo_crate_cache();
    let mut missing = Vec::new();
    for (name, version) in recipe_crates() {
        let file = format!("{name}-{version}.crate");
        match caches.iter().map(|c| c.join(&file)).find(|p| p.is_file()) {
            Some(p) => {
                std::fs::copy(&p, mirror.join(&file)).expect("copying a crate");
            }
            None => missing.push(file),
        }
    }
    assert!(
        missing.is_empty(),
        "not in cargo's download cache (`cargo fetch --locked` gets every crate of Cargo.lock): {}",
        missing.join(" ")
    );
    let bare = mirror.join("git/updraft.git");
    run(Command::new("git")
        .args(["init", "--quiet", "--bare"])
        .arg(&bare));
    run(Command::new("git")
        .arg("-C")
        .arg(repo_root())
        .args(["push", "--quiet"])
        .arg(&bare)
        .arg("HEAD:refs/heads/main"));
    let out = Command::new("git")
        .arg("-C")
        .arg(repo_root())
        .args(["rev-parse", "HEAD"])
        .output()
        .expect("git rev-parse");
    assert!(out.status.success(), "git rev-parse HEAD: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    updraft_tests::succeeded(&out, &format!("{cmd:?}"));
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Run one step, printing its time, and return what it returned.
fn step<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let r = f();
    eprintln!(
        "yocto_bitbake: {what}: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    r
}

/// The value of `NAME="…"` in `bitbake -e` output.
fn var<'a>(env: &'a str, name: &str) -> &'a str {
    let prefix = format!("{name}=\"");
    env.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or_else(|| panic!("bitbake -e shows no {name}"))
}

/// The body of shell function `name` in `bitbake -e` output.
fn function<'a>(env: &'a str, name: &str) -> &'a str {
    let head = format!("\n{name}() {{\n");
    let start = env
        .find(&head)
        .unwrap_or_else(|| panic!("bitbake -e shows no {name}()"))
        + head.len();
    let len = env[start..]
        .find("\n}\n")
        .unwrap_or_else(|| panic!("{name}() does not end"));
    &env[start..start + len]
}

/// What meta-updraft makes bitbake say: warnings and errors that name it.
fn ours(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| {
            (l.starts_with("WARNING") || l.starts_with("ERROR")) && l.contains("meta-updraft")
        })
        .collect()
}

/// bitbake's parse summary line, for the step's report.
fn parse_summary(log: &str) -> &str {
    log.lines()
        .find(|l| l.starts_with("Parsing of "))
        .unwrap_or("(no parse summary)")
}

/// `bitbake ARGS`, which must succeed without a word about meta-updraft.
fn bitbake_ok(tree: &Tree, args: &[&str]) -> String {
    let out = tree.bitbake(args);
    let log = text(&out);
    assert!(out.status.success(), "bitbake {args:?}:\n{log}");
    assert!(
        ours(&log).is_empty(),
        "meta-updraft warns:\n{}",
        ours(&log).join("\n")
    );
    eprintln!(
        "yocto_bitbake: bitbake {}: {}",
        args.join(" "),
        parse_summary(&log)
    );
    log
}

#[test]
fn meta_updraft_parses_expands_fetches_and_unpacks_under_bitbake() {
    updraft_tests::require!("setpriv", "localedef", "chrpath", "diffstat", "gawk", "git");
    let total = Instant::now();
    let tree = match step("the archive, the layer, the mirror", Tree::new) {
        Some(t) => t,
        // Loud (listed with the skips) but allowed: a machine without the
        // archive cannot run bitbake at all.
        None => updraft_tests::skip_expected!(
            "no bitbake archive: ../shared/yocto/{ARCHIVE} beside the checkout, or UPDRAFT_YOCTO_ARCHIVE"
        ),
    };
    let root = tree.root().to_path_buf();
    let crates = recipe_crates();
    assert!(!crates.is_empty());

    // 1. The whole parse, for qemuarm64; the recipe's variables.
    let log = step("qemuarm64: parse, bitbake -p", || {
        bitbake_ok(&tree, &["-p"])
    });
    assert!(log.contains(" 0 errors."), "bitbake -p:\n{log}");
    let env = step("bitbake -e updraft", || {
        bitbake_ok(&tree, &["-e", "updraft"])
    });
    let src_uri = var(&env, "SRC_URI");
    for (name, version) in &crates {
        let uri = format!("crate://crates.io/{name}/{version}");
        assert!(
            src_uri.split_whitespace().any(|w| w == uri),
            "{uri} is not in SRC_URI"
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
    assert!(flags.contains("--package updraft --bin updraft"), "{flags}");
    assert_eq!(var(&env, "SYSTEMD_SERVICE:updraft"), "updraft.service");
    let install = function(&env, "do_install");
    for (placeholder, value) in [
        ("@MANIFEST_URL@", MANIFEST_URL),
        ("@SLOT_A@", SLOT_A),
        ("@SLOT_B@", SLOT_B),
        ("@COMPATIBLE@", COMPATIBLE),
        ("@BOOTLOADER@", "uboot"),
    ] {
        assert!(
            install.contains(&format!("-e 's#{placeholder}#{value}#'")),
            "updraft.toml's {placeholder} is not set to {value}:\n{install}"
        );
    }
    assert!(
        install.contains(&format!("{}/keys/root.pub", root.display())) && install.contains(FW_ENV),
        "the root key and fw_env.config are not installed:\n{install}"
    );
    let recommends = var(&env, "RRECOMMENDS:updraft");
    assert!(
        recommends.contains("libubootenv-bin") && recommends.contains("updraft-fw-env"),
        "{recommends}"
    );

    // 2. The other machine: a whole parse again. It comes here because in
    // a new build directory the configuration's hash, which names the
    // parse cache, changes once after the first command that runs a
    // target (`-e updraft` above), so the command after that parses every
    // recipe whatever it is: here, where a whole parse is due anyway. The
    // steps after it run for this machine, whose parse the server holds.
    tree.local_conf("qemux86-64");
    tree.own();
    let log = step("qemux86-64: parse, bitbake -p", || {
        bitbake_ok(&tree, &["-p"])
    });
    assert!(log.contains(" 0 errors."), "bitbake -p:\n{log}");

    // 3. The publisher and the release class.
    let env = step("bitbake -e updraft-publish-native", || {
        bitbake_ok(&tree, &["-e", "updraft-publish-native"])
    });
    let flags = var(&env, "CARGO_BUILD_FLAGS");
    assert!(
        flags.contains("--package updraft-publish --bin updraft-publish")
            && flags.contains("x86_64"),
        "not the build host's publisher: {flags}"
    );
    assert!(
        var(&env, "SRC_URI").contains(&format!(
            "crate://crates.io/{}/{}",
            crates[0].0, crates[0].1
        )),
        "the publisher does not use the crate list"
    );
    let env = step(&format!("bitbake -e {IMAGE}"), || {
        bitbake_ok(&tree, &["-e", IMAGE])
    });
    let script = tree.layer().join("scripts/updraft-release-image");
    assert_eq!(
        var(&env, "UPDRAFT_RELEASE_SCRIPT"),
        script.display().to_string()
    );
    assert!(
        var(&env, "IMAGE_FSTYPES")
            .split_whitespace()
            .any(|t| t == "ext4"),
        "{}",
        var(&env, "IMAGE_FSTYPES")
    );
    assert!(
        var(&env, "ROOTFS_POSTPROCESS_COMMAND").contains("updraft_release_marker"),
        "{}",
        var(&env, "ROOTFS_POSTPROCESS_COMMAND")
    );
    let marker = function(&env, "updraft_release_marker");
    assert!(
        marker.contains(&format!("{} marker ", script.display())) && marker.contains("'2.0'"),
        "{marker}"
    );
    let deploy = var(&env, "DEPLOY_DIR_IMAGE").to_string();
    let link = var(&env, "IMAGE_LINK_NAME").to_string();
    let release = function(&env, "do_updraft_release");
    for expected in [
        format!("{} publish", script.display()),
        format!("--image \"{deploy}/{link}.ext4\""),
        format!("--key \"{}/keys/release.key\"", root.display()),
        format!("for previous in {}/releases/1.0.ext4", root.display()),
        format!("--out \"{deploy}/updraft-{link}\""),
        format!("--compatible '{COMPATIBLE}'"),
        "--version '2.0'".to_string(),
    ] {
        assert!(
            release.contains(&expected),
            "do_updraft_release lacks {expected}:\n{release}"
        );
    }
    let bundle = var(&env, "UPDRAFT_BUNDLE");
    assert!(
        bundle.starts_with(&format!("{deploy}/{link}")) && bundle.ends_with(".updraft"),
        "{bundle}"
    );

    // 4. The sources, from the mirror only.
    step("bitbake updraft -c fetch", || {
        bitbake_ok(&tree, &["updraft", "-c", "fetch"])
    });
    let dl = tree.downloads();
    for (name, version) in &crates {
        let file = dl.join(format!("{name}-{version}.crate"));
        let fetched = std::fs::read(&file)
            .unwrap_or_else(|e| panic!("{} was not fetched: {e}", file.display()));
        let mirrored = std::fs::read(root.join("mirror").join(format!("{name}-{version}.crate")))
            .expect("the mirror's crate");
        assert!(
            fetched == mirrored,
            "{} differs from the mirror",
            file.display()
        );
        assert!(
            dl.join(format!("{name}-{version}.crate.done")).is_file(),
            "{name} {version}: no done stamp (checksum not verified)"
        );
    }
    eprintln!(
        "yocto_bitbake: {} crates and commit {} fetched from the mirror",
        crates.len(),
        tree.rev
    );
    let clone = dl.join("git2/github.com.updraft-ota.updraft.git");
    run(Command::new("git")
        .args(["-c", "safe.directory=*", "--git-dir"])
        .arg(&clone)
        .args(["cat-file", "-e"])
        .arg(format!("{}^{{commit}}", tree.rev)));

    // 5. Unpacked where cargo's offline build reads them.
    step("bitbake updraft -c unpack", || {
        bitbake_ok(&tree, &["updraft", "-c", "unpack"])
    });
    let work = std::fs::read_dir(root.join("build/tmp/work"))
        .expect("tmp/work")
        .filter_map(|e| e.ok().map(|e| e.path().join("updraft/0.1.0+git/sources")))
        .find(|p| p.is_dir())
        .expect("updraft's sources in tmp/work");
    assert!(
        work.join("updraft-0.1.0+git/Cargo.lock").is_file(),
        "the checkout is not unpacked in {}",
        work.display()
    );
    for (name, version) in &crates {
        let dir = work.join(format!("cargo_home/bitbake/{name}-{version}"));
        assert!(
            dir.join("Cargo.toml").is_file() || dir.join("Cargo.toml.orig").is_file(),
            "{} is not unpacked",
            dir.display()
        );
    }

    // 6. A crate whose bytes differ from the recipe's checksum.
    let (name, version) = &crates[crates.len() / 2];
    let file = format!("{name}-{version}.crate");
    let mirrored = root.join("mirror").join(&file);
    let mut bytes = std::fs::read(&mirrored).expect("the mirror's crate");
    let at = bytes.len() / 2;
    bytes[at] ^= 0x20;
    std::fs::remove_file(&mirrored).expect("the mirror's crate");
    std::fs::write(&mirrored, &bytes).expect("the corrupted crate");
    for stale in [file.clone(), format!("{file}.done")] {
        std::fs::remove_file(dl.join(stale)).expect("the fetched crate");
    }
    tree.own();
    let out = step("bitbake updraft -c fetch -f, a corrupted crate", || {
        tree.bitbake(&["updraft", "-c", "fetch", "-f"])
    });
    let log = text(&out);
    assert!(
        !out.status.success(),
        "a corrupted crate was fetched:\n{log}"
    );
    assert!(
        log.contains("Checksum mismatch") && log.contains(&file),
        "bitbake should name the checksum mismatch of {file}:\n{log}"
    );
    // With the mirror's copy refused, the next place is crates.io itself,
    // which BB_NO_NETWORK forbids: the fetch ends there.
    assert!(log.contains("NetworkAccess"), "{log}");
    assert!(!dl.join(format!("{file}.done")).exists(), "{file} accepted");

    // 7. A signing key inside the build tree.
    let images = tree.layer().join("recipes-test/images");
    let leaky = images.join("updraft-leaky-key-image.bb");
    std::fs::write(
        &leaky,
        format!(
            "SUMMARY = \"an image whose release key lies in the build tree\"\n\
             require {IMAGE}.bb\n\
             UPDRAFT_SIGNING_KEY = \"${{TOPDIR}}/release.key\"\n"
        ),
    )
    .expect("the leaky image recipe");
    tree.own();
    let out = step("bitbake -p, a signing key in the build tree", || {
        tree.bitbake(&["-p"])
    });
    let log = text(&out);
    assert!(
        !out.status.success(),
        "a key in the build tree parsed:\n{log}"
    );
    assert!(
        log.contains("UPDRAFT_SIGNING_KEY") && log.contains("inside TOPDIR"),
        "the class should name the key's place:\n{log}"
    );
    std::fs::remove_file(&leaky).expect("removing the leaky recipe");

    // 8. A line that is not bitbake.
    let recipe = tree.layer().join("recipes-support/updraft/updraft_git.bb");
    let good = std::fs::read_to_string(&recipe).expect("the recipe");
    std::fs::write(&recipe, format!("{good}\nthis line is not bitbake\n"))
        .expect("the broken recipe");
    let out = step("bitbake -p, a broken recipe line", || tree.bitbake(&["-p"]));
    let log = text(&out);
    assert!(!out.status.success(), "a broken recipe parsed:\n{log}");
    assert!(
        log.contains("updraft_git.bb") && log.contains("unparsed line: 'this line is not bitbake'"),
        "bitbake's message should name the recipe and the parse error:\n{log}"
    );
    std::fs::write(&recipe, good).expect("the recipe again");

    eprintln!(
        "yocto_bitbake: all steps: {:.1} s",
        total.elapsed().as_secs_f64()
    );
}
