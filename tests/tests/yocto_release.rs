//! meta-updraft's release class, tested through the commands it runs.
//!
//! `classes/updraft-release.bbclass` does its work through one script,
//! `yocto/meta-updraft/scripts/updraft-release-image`: `marker` writes the
//! release marker into the root filesystem (a `ROOTFS_POSTPROCESS_COMMAND`)
//! and `publish` signs the finished image into a release directory and a
//! bundle (`do_updraft_release`). These tests run that same script outside
//! bitbake, with the workspace's `updraft-publish`, on root filesystems
//! made into ext4 images the way `IMAGE_CMD:ext4` does (`mkfs.ext4 -d`),
//! and install what it produced on a test device: the full image, then a
//! delta from the previous image; the marker inside the image parses as
//! the agent parses it; key documents made offline go into the release
//! and a device trusting only the root key installs it; the signing key
//! is read in place and nothing secret lands in the output; a missing key
//! or a bad version stops the script before anything is written. `yocto_bitbake` checks that the
//! class parses and expands under a real bitbake.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::json;
use updraft::slot::SlotName;
use updraft_tests::device::{Device, DeviceSpec, TrustSpec};
use updraft_tests::publisher::{KeyPair, Repo, image_bytes, keygen};
use updraft_tests::repo_root;
use updraft_tests::tmp::TempDir;

/// The hardware id the class signs in (`UPDRAFT_COMPATIBLE`, by default
/// `${MACHINE}`).
const MACHINE: &str = "qemuarm64";
/// The ext4 images' size: room for the payload and the file system.
const IMAGE_SIZE: &str = "8M";
/// The payload file's size in each root filesystem.
const PAYLOAD: usize = 3 * 1024 * 1024;

fn script() -> PathBuf {
    repo_root().join("yocto/meta-updraft/scripts/updraft-release-image")
}

/// `updraft-release-image ARGS`, with the workspace's publisher.
fn release_image(args: &[&str]) -> Output {
    Command::new(script())
        .args(args)
        .env(
            "UPDRAFT_PUBLISH",
            updraft_tests::bin::path("updraft-publish"),
        )
        .output()
        .expect("running updraft-release-image")
}

fn ok(args: &[&str]) -> String {
    updraft_tests::succeeded(
        &release_image(args),
        &format!("updraft-release-image {args:?}"),
    )
}

fn arg(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// A root filesystem as `do_rootfs` leaves it, with a payload of `seed`
/// (changed at a few places when `changed`), marked by the script as
/// `version` and made into an ext4 image: the image's path.
fn build_image(dir: &Path, version: &str, seed: u64, changed: bool) -> PathBuf {
    let rootfs = dir.join(format!("rootfs-{version}"));
    std::fs::create_dir_all(rootfs.join("usr/lib/app")).expect("rootfs");
    let mut payload = image_bytes(PAYLOAD, seed);
    if changed {
        for i in (0..PAYLOAD).step_by(65_537) {
            payload[i] = payload[i].wrapping_add(1);
        }
    }
    std::fs::write(rootfs.join("usr/lib/app/payload.bin"), &payload).expect("payload");
    std::fs::write(rootfs.join("etc-version"), format!("{version}\n")).expect("version file");
    let out = ok(&["marker", arg(&rootfs), version]);
    assert!(out.contains(&format!("as release {version}")), "{out}");
    let img = dir.join(format!("image-{version}.rootfs.ext4"));
    let status = Command::new("truncate")
        .args(["-s", IMAGE_SIZE])
        .arg(&img)
        .status()
        .expect("truncate");
    assert!(status.success());
    // A fixed UUID and time, as reproducible builds set them, so that two
    // releases differ where their files do.
    let out = Command::new("mkfs.ext4")
        .args([
            "-q",
            "-F",
            "-b",
            "4096",
            "-U",
            "6d1f3c7a-0e52-4b8e-9a31-5c2d7e8f9a10",
        ])
        .arg("-d")
        .arg(&rootfs)
        .arg(&img)
        .env("E2FSPROGS_FAKE_TIME", "1767225600")
        .output()
        .expect("mkfs.ext4");
    assert!(
        out.status.success(),
        "mkfs.ext4: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    img
}

/// The file `path` inside the ext4 image `img`, read with debugfs.
fn file_in_image(img: &Path, path: &str) -> String {
    let out = Command::new("debugfs")
        .arg("-R")
        .arg(format!("cat {path}"))
        .arg(img)
        .output()
        .expect("debugfs");
    assert!(out.status.success(), "debugfs: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `publish` of `image` as `version` into `site`, the bundle beside it.
fn publish(
    key: &KeyPair,
    image: &Path,
    version: &str,
    site: &Path,
    previous: Option<&Path>,
    key_documents: Option<&Path>,
) -> (PathBuf, String) {
    let bundle = site
        .parent()
        .expect("site's parent")
        .join(format!("image-{version}.updraft"));
    let mut args = vec![
        "publish",
        "--image",
        arg(image),
        "--version",
        version,
        "--compatible",
        MACHINE,
        "--key",
        arg(&key.key),
        "--out",
        arg(site),
        "--bundle",
        arg(&bundle),
    ];
    if let Some(p) = previous {
        args.extend(["--from", arg(p)]);
    }
    if let Some(d) = key_documents {
        args.extend(["--key-documents", arg(d)]);
    }
    // What a class user passes through UPDRAFT_PUBLISH_ARGS.
    args.extend(["--", "--level", "3", "--frame-size", "1048576"]);
    let out = ok(&args);
    assert!(bundle.is_file(), "no bundle:\n{out}");
    (bundle, out)
}

/// No file below `dir` holds the private key, nor any private key.
fn assert_no_secret(dir: &Path, key: &KeyPair) {
    let secret = std::fs::read(&key.key).expect("the key");
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let bytes = std::fs::read(&p).expect("a file");
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret.as_slice())
                    && !bytes.windows(11).any(|w| w == b"PRIVATE KEY"),
                "{} holds private key material",
                p.display()
            );
        }
    }
}

/// A device of `MACHINE` that trusts `key`.
fn device(name: &str, key: &KeyPair) -> Device {
    device_with(name, DeviceSpec::simple(key))
}

fn device_with(name: &str, mut spec: DeviceSpec) -> Device {
    spec.compatible = MACHINE.into();
    let dev = Device::new(name, spec);
    dev.init();
    dev
}

#[test]
fn an_image_published_by_the_class_script_installs_from_its_bundle() {
    updraft_tests::require!("mkfs.ext4", "debugfs");
    // The key lives outside the build directory, as the class demands.
    let keys = TempDir::new("yocto-release-keys");
    let key = keygen(keys.path(), "release");
    let build = TempDir::new("yocto-release-build");
    let img = build_image(build.path(), "1.0", 7, false);

    // The marker inside the image is one the agent reads.
    let marker = file_in_image(&img, "/etc/updraft/release");
    let parsed = updraft::provision::parse_marker(&marker).expect("the marker parses");
    assert_eq!(parsed.version, "1.0", "{marker}");
    assert_eq!(file_in_image(&img, "/etc-version"), "1.0\n");

    let site = build.join("deploy/updraft-image");
    let (bundle, out) = publish(&key, &img, "1.0", &site, None, None);
    assert!(out.contains("release 1.0"), "{out}");
    assert!(site.join("manifest.json").is_file(), "{out}");
    assert_no_secret(build.path(), &key);

    let dev = device("yocto-release-full", &key);
    let out = dev.ok(&["install", arg(&bundle)]);
    assert!(out.contains("1.0"), "{out}");
    let image = std::fs::read(&img).expect("the image");
    assert_eq!(
        &dev.slot_bytes(SlotName::B)[..image.len()],
        &image[..],
        "slot B holds the image the class built"
    );
    let st = dev.status();
    assert_eq!(st["next_boot"], json!("B"), "{st:#}");
}

#[test]
fn a_delta_from_the_previous_image_is_published_and_installed() {
    updraft_tests::require!("mkfs.ext4", "debugfs");
    let keys = TempDir::new("yocto-release-delta-keys");
    let key = keygen(keys.path(), "release");
    let build = TempDir::new("yocto-release-delta-build");
    let v1 = build_image(build.path(), "1.0", 11, false);
    let v2 = build_image(build.path(), "2.0", 11, true);
    let site = build.join("deploy/updraft-image");
    let (b1, _) = publish(&key, &v1, "1.0", &site, None, None);
    // UPDRAFT_PREVIOUS_IMAGE: the delta from the image devices run.
    let (b2, out) = publish(&key, &v2, "2.0", &site, Some(&v1), None);
    assert!(out.contains("delta from"), "no delta published:\n{out}");

    let mut dev = device("yocto-release-delta", &key);
    dev.ok(&["install", arg(&b1)]);
    dev.reboot_into(SlotName::B);
    let out = dev.ok(&["mark-good"]);
    assert!(out.contains("marked good"), "{out}");
    let out = dev.ok(&["install", arg(&b2)]);
    assert!(out.contains("installed release 2.0 into slot A"), "{out}");
    let image = std::fs::read(&v2).expect("image 2.0");
    assert_eq!(
        &dev.slot_bytes(SlotName::A)[..image.len()],
        &image[..],
        "slot A is not image 2.0"
    );
    let history = dev.ok(&["history"]);
    assert!(
        history.contains("verified on the slot (delta)"),
        "{history}"
    );
}

#[test]
fn key_documents_made_offline_go_into_the_release_a_root_mode_device_installs() {
    updraft_tests::require!("mkfs.ext4", "debugfs");
    // Offline: the root key signs the key document naming the release key.
    let offline = TempDir::new("yocto-release-offline");
    let root = keygen(offline.path(), "root");
    let key = keygen(offline.path(), "release");
    let document = Repo::new(offline.join("site")).key_document(&[&root], &[&key], 1, &[]);
    let documents = document.parent().expect("keys/").to_path_buf();

    let build = TempDir::new("yocto-release-root-build");
    let img = build_image(build.path(), "1.0", 5, false);
    let site = build.join("deploy/updraft-image");
    let (bundle, _) = publish(&key, &img, "1.0", &site, None, Some(&documents));
    assert_eq!(
        std::fs::read(site.join("keys/1.json")).expect("the key document in the release"),
        std::fs::read(&document).expect("the key document"),
    );
    assert_no_secret(build.path(), &key);
    assert_no_secret(build.path(), &root);

    let mut spec = DeviceSpec::simple(&key);
    spec.trust = TrustSpec::Root(vec![root.public.clone()], 1, 0);
    let dev = device_with("yocto-release-root", spec);
    let out = dev.ok(&["install", arg(&bundle)]);
    assert!(out.contains("1.0"), "{out}");
    let image = std::fs::read(&img).expect("the image");
    assert_eq!(&dev.slot_bytes(SlotName::B)[..image.len()], &image[..]);
}

#[test]
fn the_script_stops_before_writing_without_a_readable_key_or_with_a_bad_version() {
    updraft_tests::require!("mkfs.ext4", "debugfs");
    let build = TempDir::new("yocto-release-refusals");
    let img = build_image(build.path(), "1.0", 3, false);
    let site = build.join("deploy/site");
    let bundle = build.join("deploy/image.updraft");
    let missing = build.join("no-such.key");
    let out = release_image(&[
        "publish",
        "--image",
        arg(&img),
        "--version",
        "1.0",
        "--compatible",
        MACHINE,
        "--key",
        arg(&missing),
        "--out",
        arg(&site),
        "--bundle",
        arg(&bundle),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "published without a key");
    assert!(
        err.contains("signing key") && err.contains("no-such.key"),
        "{err}"
    );
    assert!(!site.exists() && !bundle.exists(), "wrote output: {err}");

    let rootfs = build.join("rootfs-1.0");
    let out = release_image(&["marker", arg(&rootfs), "1.0\"; rm -rf /"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a quoted version was written");
    assert!(err.contains("release version"), "{err}");
    let marker = std::fs::read_to_string(rootfs.join("etc/updraft/release")).expect("marker");
    assert!(marker.contains("UPDRAFT_RELEASE=\"1.0\""), "{marker}");
}
