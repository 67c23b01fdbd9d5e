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
use updraft_tests::publisher::{Repo, image, keygen};
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
