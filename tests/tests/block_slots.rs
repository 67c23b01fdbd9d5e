//! Block-device slots: loop devices standing in for partitions.
//!
//! A 256 MiB image installed into a loop device holds exactly the image's
//! bytes, and the install read all of them back from the device (its
//! sector counter, not the page cache); a slot that is mounted is refused
//! (the kernel refuses `O_EXCL` on a mounted block device) with nothing
//! written. These need root for `losetup` and `mount`, and say so when they
//! cannot run.

use std::io::Read;
use std::process::Command;

use updraft::hash::Sha256;
use updraft_tests::bootenv::LoopDevice;
use updraft_tests::device::{Device, DeviceSpec};
use updraft_tests::publisher::{Repo, image, image_bytes, keygen};
use updraft_tests::skip::is_root;
use updraft_tests::tmp::TempDir;

const MIB: usize = 1024 * 1024;

fn read_device(path: &std::path::Path, len: usize) -> Vec<u8> {
    let mut f = std::fs::File::open(path).expect("opening the loop device");
    let mut buf = vec![0u8; len];
    f.read_exact(&mut buf).expect("reading the loop device");
    buf
}

#[test]
fn a_256_mib_image_installs_into_a_loop_device() {
    updraft_tests::require!("losetup");
    if !is_root() {
        updraft_tests::skip!("needs root to attach loop devices");
    }
    let keys = TempDir::new("loop256-keys");
    let key = keygen(keys.path(), "release");
    let mut spec = DeviceSpec::simple(&key);
    spec.slot_size = 272 * MIB as u64;
    let mut dev = Device::new("loop256", spec);
    let a = LoopDevice::attach(&dev.slot_a);
    let b = LoopDevice::attach(&dev.slot_b);
    let paths = (a.path.clone(), b.path.clone());
    dev.reconfigure(|s| s.slot_paths = Some(paths));
    dev.init();
    let img = keys.join("v1.img");
    let bytes = image(&img, 256 * MIB, 99);
    let repo = Repo::new(keys.join("site"));
    repo.release(&[&key], "1.0", &img, &["--frame-size", "4194304"]);
    let before_a = Sha256::of(&read_device(&a.path, 272 * MIB));
    let read_before = b.sectors_read();
    let out = dev.ok(&["install", &repo.manifest_str()]);
    assert!(out.contains("installed release 1.0 into slot B"), "{out}");
    // The read-back read the whole image from the device, not from the
    // page cache the write went through.
    let read_back = b.sectors_read() - read_before;
    assert!(
        read_back >= (256 * MIB / 512) as u64,
        "the install read {read_back} sectors from slot B; the image has {}",
        256 * MIB / 512
    );
    let on_b = read_device(&b.path, 256 * MIB);
    assert!(on_b == bytes, "loop device B does not hold the image");
    assert_eq!(
        Sha256::of(&read_device(&a.path, 272 * MIB)),
        before_a,
        "slot A changed"
    );
    let st = dev.status();
    assert_eq!(st["slots"][1]["version"], "1.0");
    assert_eq!(st["next_boot"], "B");
}

#[test]
fn a_mounted_slot_is_refused() {
    updraft_tests::require!("losetup", "mkfs.ext4", "mount", "umount");
    if !is_root() {
        updraft_tests::skip!("needs root to attach and mount loop devices");
    }
    let keys = TempDir::new("mounted-keys");
    let key = keygen(keys.path(), "release");
    let mut spec = DeviceSpec::simple(&key);
    spec.slot_size = 32 * MIB as u64;
    let mut dev = Device::new("mounted", spec);
    let a = LoopDevice::attach(&dev.slot_a);
    let b = LoopDevice::attach(&dev.slot_b);
    let paths = (a.path.clone(), b.path.clone());
    dev.reconfigure(|s| s.slot_paths = Some(paths));
    dev.init();
    // Tables and journal initialised now: with lazy init the kernel would
    // go on writing them after the mount, and the slot's bytes would
    // change with nobody but the filesystem writing.
    let mkfs = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"])
        .arg(&b.path)
        .status()
        .expect("mkfs.ext4 (e2fsprogs)");
    assert!(mkfs.success());
    let mnt = keys.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let mount = Command::new("mount")
        .arg(&b.path)
        .arg(&mnt)
        .status()
        .expect("mount");
    assert!(mount.success(), "mounting the slot failed");
    std::fs::write(mnt.join("data.txt"), "still here").unwrap();
    Command::new("sync").status().unwrap();
    let img = keys.join("v1.img");
    image(&img, 4 * MIB, 7);
    let repo = Repo::new(keys.join("site"));
    repo.release(&[&key], "1.0", &img, &[]);
    let before = dev.snapshot();
    let err = dev.fails(&["install", &repo.manifest_str()]);
    // Compare while still mounted and idle (unmounting writes the
    // filesystem's own metadata).
    let after = dev.snapshot();
    let still = std::fs::read_to_string(mnt.join("data.txt")).unwrap_or_default();
    let unmount = Command::new("umount").arg(&mnt).status();
    assert!(
        err.contains(&format!(
            "slot {} is in use (mounted or held open exclusively): refusing to write it",
            b.path.display()
        )),
        "{err}"
    );
    assert!(
        unmount.map(|s| s.success()).unwrap_or(false),
        "umount failed"
    );
    assert_eq!(still, "still here");
    assert_eq!(before.slot_a, after.slot_a);
    assert_eq!(before.slot_b, after.slot_b, "the mounted slot was written");
    assert_eq!(
        before.boot_state, after.boot_state,
        "boot selection changed"
    );
    assert_eq!(after.state, serde_json::json!("idle"));
}

/// A running root is an ext4 with a journal mounted read-only (the usual
/// Yocto image). The kernel keeps the journal superblock changed in the
/// device's page cache and never writes it, so the page cache differs from
/// the medium. The delta's source hash is checked on what the medium holds:
/// the delta must be applied from the same bytes, or it never produces the
/// signed image and every delta update falls back to the full image.
#[test]
fn a_delta_applies_from_a_mounted_journaled_root_as_the_medium_holds_it() {
    updraft_tests::require!("losetup", "mkfs.ext4", "mount", "umount");
    if !is_root() {
        updraft_tests::skip!("needs root to attach and mount loop devices");
    }
    let keys = TempDir::new("journaled-keys");
    let key = keygen(keys.path(), "release");
    let mut dev = Device::new("journaled", DeviceSpec::simple(&key));
    // Release 1.0 is the root filesystem image, release 2.0 the same with
    // some blocks changed.
    let root = keys.join("root");
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::write(root.join("etc/hostname"), "gateway\n").unwrap();
    std::fs::write(root.join("data.bin"), image_bytes(2 * MIB, 5)).unwrap();
    let v1 = keys.join("v1.img");
    let mkfs = Command::new("mkfs.ext4")
        .args([
            "-q",
            "-F",
            "-E",
            "lazy_itable_init=0,lazy_journal_init=0",
            "-d",
        ])
        .arg(&root)
        .arg(&v1)
        .arg("12M")
        .status()
        .expect("mkfs.ext4 (e2fsprogs)");
    assert!(mkfs.success());
    let v1_bytes = std::fs::read(&v1).unwrap();
    let mut v2_bytes = v1_bytes.clone();
    for i in (6 * MIB..8 * MIB).step_by(4099) {
        v2_bytes[i] ^= 0x5a;
    }
    let v2 = keys.join("v2.img");
    std::fs::write(&v2, &v2_bytes).unwrap();
    let mut slot_a = std::fs::read(&dev.slot_a).unwrap();
    slot_a[..v1_bytes.len()].copy_from_slice(&v1_bytes);
    std::fs::write(&dev.slot_a, &slot_a).unwrap();
    let a = LoopDevice::attach(&dev.slot_a);
    let b = LoopDevice::attach(&dev.slot_b);
    let paths = (a.path.clone(), b.path.clone());
    dev.reconfigure(|s| s.slot_paths = Some(paths));
    dev.init();
    let mnt = keys.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let mount = Command::new("mount")
        .args(["-o", "ro"])
        .arg(&a.path)
        .arg(&mnt)
        .status()
        .expect("mount");
    assert!(mount.success(), "mounting slot A failed");
    // What this is about: the page cache of the mounted device is not the
    // medium.
    let cached = read_device(&a.path, v1_bytes.len());
    let repo = Repo::new(keys.join("site"));
    let out = repo.release(&[&key], "2.0", &v2, &["--from", v1.to_str().unwrap()]);
    let result = dev.updraft(&["install", &repo.manifest_str()]);
    let history = dev.ok(&["history"]);
    let unmount = Command::new("umount").arg(&mnt).status();
    assert!(
        unmount.map(|s| s.success()).unwrap_or(false),
        "umount failed"
    );
    assert_ne!(
        Sha256::of(&cached),
        Sha256::of(&v1_bytes),
        "the mounted root reads as its image through the page cache: nothing to show here"
    );
    assert!(out.contains("delta from"), "no delta published: {out}");
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    assert!(
        history.contains("verified on the slot (delta)"),
        "{history}"
    );
    assert!(!history.contains("delta-fallback"), "{history}");
    assert_eq!(
        Sha256::of(&read_device(&b.path, v2_bytes.len())),
        Sha256::of(&v2_bytes),
        "slot B is not release 2.0"
    );
}
