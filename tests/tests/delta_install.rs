//! Delta updates on a device: the delta path when the active slot holds
//! exactly the delta's source, the full image otherwise, and the full image
//! again when a delta cannot produce the signed image.

use serde_json::json;
use updraft::hash::Sha256;
use updraft::slot::SlotName;
use updraft_tests::device::{Device, DeviceSpec};
use updraft_tests::publisher::{KeyPair, Repo, image_bytes, keygen};
use updraft_tests::tmp::TempDir;

const IMAGE: usize = 6 * 1024 * 1024;

struct Fx {
    dev: Device,
    repo: Repo,
    key: KeyPair,
    _keys: TempDir,
    v1: std::path::PathBuf,
    v2: std::path::PathBuf,
    v2_bytes: Vec<u8>,
}

/// A device running release 1.0 from slot B (installed, booted, committed).
fn running_v1(name: &str) -> Fx {
    let keys = TempDir::new(&format!("{name}-keys"));
    let key = keygen(keys.path(), "release");
    let mut dev = Device::new(name, DeviceSpec::simple(&key));
    dev.init();
    let repo = Repo::new(keys.join("site"));
    let v1 = keys.join("v1.img");
    let v1_bytes = image_bytes(IMAGE, 10);
    std::fs::write(&v1, &v1_bytes).unwrap();
    // Release 2.0: release 1.0 with some blocks changed, like a package
    // upgrade.
    let mut v2_bytes = v1_bytes.clone();
    for i in (0..IMAGE).step_by(97_003) {
        v2_bytes[i] = v2_bytes[i].wrapping_add(1);
    }
    v2_bytes[IMAGE / 2..IMAGE / 2 + 200_000].copy_from_slice(&image_bytes(200_000, 77));
    let v2 = keys.join("v2.img");
    std::fs::write(&v2, &v2_bytes).unwrap();
    repo.release(&[&key], "1.0", &v1, &[]);
    dev.ok(&["install", &repo.manifest_str()]);
    dev.reboot_into(SlotName::B);
    let out = dev.ok(&["mark-good"]);
    assert!(out.contains("marked good"), "{out}");
    assert_eq!(dev.status()["running_version"], json!("1.0"));
    Fx {
        dev,
        repo,
        key,
        _keys: keys,
        v1,
        v2,
        v2_bytes,
    }
}

#[test]
fn a_delta_from_the_running_release_is_used() {
    let f = running_v1("delta-path");
    let out = f
        .repo
        .release(&[&f.key], "2.0", &f.v2, &["--from", f.v1.to_str().unwrap()]);
    assert!(out.contains("delta from"), "no delta published: {out}");
    let p = f.repo.payload();
    let delta_size = p["deltas"][0]["size"].as_u64().unwrap();
    assert!(
        delta_size < p["artifact"]["size"].as_u64().unwrap() / 4,
        "{p:#}"
    );
    let out = f.dev.ok(&["install", &f.repo.manifest_str()]);
    assert!(out.contains("installed release 2.0 into slot A"), "{out}");
    assert_eq!(
        &f.dev.slot_bytes(SlotName::A)[..IMAGE],
        &f.v2_bytes[..],
        "slot A is not release 2.0"
    );
    let history = f.dev.ok(&["history"]);
    assert!(
        history.contains(&format!("delta, {delta_size} bytes")),
        "{history}"
    );
    assert!(
        history.contains("verified on the slot (delta)"),
        "{history}"
    );
    assert!(!history.contains("delta-fallback"), "{history}");
    // The delta was spooled in state_dir and removed after use.
    let leftovers: Vec<_> = std::fs::read_dir(&f.dev.state_dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("delta-"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "delta spool left behind: {leftovers:?}"
    );
}

#[test]
fn a_modified_active_slot_gets_the_full_image() {
    let f = running_v1("delta-modified");
    f.repo
        .release(&[&f.key], "2.0", &f.v2, &["--from", f.v1.to_str().unwrap()]);
    // What a read-write mounted root does to its slot.
    let mut b = f.dev.slot_bytes(SlotName::B);
    b[4096] ^= 0xff;
    std::fs::write(&f.dev.slot_b, &b).unwrap();
    f.dev.ok(&["install", &f.repo.manifest_str()]);
    assert_eq!(&f.dev.slot_bytes(SlotName::A)[..IMAGE], &f.v2_bytes[..]);
    let history = f.dev.ok(&["history"]);
    assert!(history.contains("2.0        A  full image"), "{history}");
}

#[test]
fn a_delta_that_cannot_produce_the_image_falls_back_to_the_full_image() {
    let f = running_v1("delta-wrong-source");
    // A delta made from another image, listed (and signed) as if it were
    // made from release 1.0: the device picks it, its output does not hash
    // to the signed image, and the full image takes over.
    let other = f._keys.join("other.img");
    let mut other_bytes = std::fs::read(&f.v1).unwrap();
    for i in (0..IMAGE).step_by(65_537) {
        other_bytes[i] ^= 0x5a;
    }
    std::fs::write(&other, other_bytes).unwrap();
    f.repo.release(
        &[&f.key],
        "2.0",
        &f.v2,
        &["--from", other.to_str().unwrap()],
    );
    let v1 = std::fs::read(&f.v1).unwrap();
    f.repo.resign(&[&f.key], |p| {
        p["deltas"][0]["from_sha256"] = json!(Sha256::of(&v1).to_hex());
        p["deltas"][0]["from_size"] = json!(v1.len());
    });
    let out = f.dev.ok(&["install", &f.repo.manifest_str()]);
    assert!(out.contains("installed release 2.0 into slot A"), "{out}");
    assert_eq!(&f.dev.slot_bytes(SlotName::A)[..IMAGE], &f.v2_bytes[..]);
    let history = f.dev.ok(&["history"]);
    assert!(history.contains("delta-fallback"), "{history}");
    assert!(history.contains("delta output has sha256"), "{history}");
}
