//! `updraft install FILE.updraft`: a release bundle (one cpio file made by
//! `updraft-publish bundle`) installs from a local file, as from a USB
//! stick, with the same verification as the directory form; a bundle
//! whose unsigned headers or signed contents were tampered with is refused
//! with an error naming the problem, and the active slot is untouched.

use std::path::{Path, PathBuf};

use serde_json::json;
use updraft::slot::SlotName;
use updraft_tests::device::{Device, DeviceSpec};
use updraft_tests::publisher::{Repo, image, keygen, publish_ok};
use updraft_tests::tmp::TempDir;

const IMAGE: usize = 3 * 1024 * 1024 + 4321;

struct Fixture {
    dev: Device,
    bundle: PathBuf,
    image: Vec<u8>,
    _keys: TempDir,
}

/// A device booted in A, and release 1.0 published and bundled.
fn fixture(name: &str) -> Fixture {
    let keys = TempDir::new(&format!("{name}-keys"));
    let release = keygen(keys.path(), "release");
    let dev = Device::new(name, DeviceSpec::simple(&release));
    dev.init();
    let repo = Repo::new(dev.path("repo"));
    let img = dev.path("v1.img");
    let image = image(&img, IMAGE, 41);
    repo.release(&[&release], "1.0", &img, &[]);
    let bundle = dev.path("release-1.0.updraft");
    let out = publish_ok(&[
        "bundle",
        "--dir",
        &dev.path("repo").display().to_string(),
        "--out",
        &bundle.display().to_string(),
    ]);
    assert!(out.contains("release 1.0"), "{out}");
    Fixture {
        dev,
        bundle,
        image,
        _keys: keys,
    }
}

fn arg(p: &Path) -> String {
    p.display().to_string()
}

/// Where `needle` first occurs in the bundle.
fn find(bytes: &[u8], needle: &[u8]) -> usize {
    bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("{:?} not in the bundle", String::from_utf8_lossy(needle)))
}

#[test]
fn a_bundle_installs_from_a_local_file() {
    let f = fixture("bundle-installs");
    let bytes = std::fs::read(&f.bundle).unwrap();
    assert_eq!(&bytes[..6], b"070701", "a cpio newc archive");
    assert_eq!(bytes.len() % 512, 0, "padded to a cpio block");
    // The first entry is the sw-description fleet servers index.
    let name_at = find(&bytes, b"sw-description\0");
    assert_eq!(name_at, 110, "sw-description is the first entry");
    assert!(find(&bytes, b"version = \"1.0\";") < find(&bytes, b"manifest.json\0"));

    let out = f.dev.ok(&["install", &arg(&f.bundle)]);
    assert!(out.contains("1.0"), "{out}");
    let b = f.dev.slot_bytes(SlotName::B);
    assert_eq!(&b[..f.image.len()], &f.image[..], "slot B holds the image");
    let st = f.dev.status();
    assert_eq!(st["next_boot"], json!("B"), "{st:#}");
}

#[test]
fn a_bundle_with_a_changed_artifact_byte_is_refused_and_a_is_untouched() {
    let f = fixture("bundle-tampered-artifact");
    let mut bytes = std::fs::read(&f.bundle).unwrap();
    // Past the artifact entry's name: its framed data.
    let at = find(&bytes, b".zst\0") + 4096;
    bytes[at] ^= 0x55;
    std::fs::write(&f.bundle, &bytes).unwrap();
    let a_before = f.dev.slot_bytes(SlotName::A);
    let err = f.dev.fails(&["install", &arg(&f.bundle)]);
    assert!(
        err.contains("frame") || err.contains("sha256"),
        "the error names the hash that failed:\n{err}"
    );
    assert_eq!(f.dev.slot_bytes(SlotName::A), a_before, "slot A changed");
    let st = f.dev.status();
    assert_eq!(st["next_boot"], json!("A"), "{st:#}");
    assert_eq!(st["state"], json!("idle"), "{st:#}");
}

#[test]
fn a_bundle_with_a_hostile_header_is_refused_before_a_byte_is_written() {
    let f = fixture("bundle-hostile-header");
    let good = std::fs::read(&f.bundle).unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("renamed entry", {
            let mut b = good.clone();
            let at = find(&b, b"manifest.json\0");
            b[at..at + 13].copy_from_slice(b"../etc/passwd");
            b
        }),
        ("truncated", good[..good.len() / 2].to_vec()),
        ("not a bundle", b"{\"signed\": true}".to_vec()),
    ];
    for (what, bytes) in cases {
        std::fs::write(&f.bundle, &bytes).unwrap();
        let before = f.dev.snapshot();
        let err = f.dev.fails(&["install", &arg(&f.bundle)]);
        assert!(
            err.contains("bundle"),
            "{what}: the error names the bundle:\n{err}"
        );
        before.assert_unchanged(&f.dev.snapshot());
    }
}
