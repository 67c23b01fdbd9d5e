//! A FAT boot partition, as a Raspberry Pi or a UEFI machine has one: an
//! image made by Debian's `mkfs.vfat`, mounted read-write with Debian's
//! `fusefat` (the FAT file system through FUSE: the kernels tests run on
//! may have no `vfat`), checked after use by `fsck.fat` and read back by
//! mtools' `mtype`, which parse the image themselves. What updraft writes
//! through the mount must therefore be a FAT file system that another FAT
//! implementation reads.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::bootenv::{run, tool};

/// A FAT32 image mounted at `mount`; unmounted when dropped.
pub struct FatPartition {
    pub image: PathBuf,
    pub mount: PathBuf,
    /// `fusefat` in the foreground while mounted: waited for after the
    /// unmount, so that the image is whole before anything reads it.
    fusefat: Option<Child>,
}

impl FatPartition {
    /// Make a `mib` MiB FAT32 image `<dir>/boot.vfat` and mount it at
    /// `<dir>/boot`.
    pub fn new(dir: &Path, mib: u64) -> FatPartition {
        let image = dir.join("boot.vfat");
        let mount = dir.join("boot");
        let file = std::fs::File::create(&image).expect("creating the FAT image");
        file.set_len(mib << 20).expect("sizing the FAT image");
        drop(file);
        run(Command::new(tool("mkfs.vfat"))
            .args(["-F", "32", "-n", "BOOT"])
            .arg(&image))
        .unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir_all(&mount).expect("the FAT mount point");
        let mut p = FatPartition {
            image,
            mount,
            fusefat: None,
        };
        p.mount_rw();
        p
    }

    fn mount_rw(&mut self) {
        let child = Command::new(tool("fusefat"))
            .args(["-f", "-o", "rw+"])
            .arg(&self.image)
            .arg(&self.mount)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("running fusefat: {e}"));
        self.fusefat = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.is_mounted() {
            assert!(
                Instant::now() < deadline,
                "fusefat did not mount {}",
                self.mount.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn is_mounted(&self) -> bool {
        let mount = self.mount.display().to_string();
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .any(|l| l.split(' ').nth(4) == Some(mount.as_str()))
    }

    /// Unmount, check the image with `fsck.fat -n` (which must find
    /// nothing to repair) and mount it again; `fsck.fat`'s summary.
    pub fn check(&mut self) -> String {
        self.unmount();
        let out = run(Command::new(tool("fsck.fat")).arg("-n").arg(&self.image))
            .unwrap_or_else(|e| panic!("the FAT image is damaged: {e}"));
        self.mount_rw();
        out
    }

    /// `path` (e.g. `/slot-b/config.txt`) as mtools reads it from the
    /// unmounted image.
    pub fn read_image(&mut self, path: &str) -> Vec<u8> {
        self.try_read_image(path)
            .unwrap_or_else(|| panic!("mtype finds no {path} in {}", self.image.display()))
    }

    /// `path` as mtools reads it from the unmounted image, `None` when
    /// the image holds no such file (or is no FAT mtools can read).
    pub fn try_read_image(&mut self, path: &str) -> Option<Vec<u8>> {
        self.unmount();
        let out = Command::new(tool("mtype"))
            .args(["-i"])
            .arg(&self.image)
            .arg(format!("::{path}"))
            .output()
            .expect("running mtype");
        self.mount_rw();
        out.status.success().then_some(out.stdout)
    }

    fn unmount(&mut self) {
        if let Some(mut child) = self.fusefat.take() {
            run(Command::new("umount").arg(&self.mount)).unwrap_or_else(|e| panic!("{e}"));
            let _ = child.wait();
        }
    }
}

impl Drop for FatPartition {
    fn drop(&mut self) {
        if let Some(mut child) = self.fusefat.take() {
            let unmounted = Command::new("umount")
                .arg(&self.mount)
                .status()
                .is_ok_and(|s| s.success());
            if !unmounted {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }
}

/// A device polling `ps` every second, booted from slot A that its
/// release marker says holds `release`, with a FAT boot partition whose
/// `slot-a/` holds `factory` (path, contents) and component `firmware`
/// configured as the slots' boot files (`slot-a/`, `slot-b/`). The
/// partition is dropped (unmounted) before the device when bound after it.
pub fn boot_files_device(
    ps: &crate::proxied::ProxiedServer,
    dev_name: &str,
    release: &str,
    factory: &[(&str, &str)],
) -> (crate::device::Device, FatPartition) {
    let mut dev = crate::device::Device::new(dev_name, ps.device_spec("1s", ""));
    let marker = dev.path("etc-updraft-release");
    std::fs::write(&marker, format!("UPDRAFT_RELEASE={release}\n")).expect("release marker");
    let fat = FatPartition::new(dev.dir(), 64);
    let (a, b) = (fat.mount.join("slot-a"), fat.mount.join("slot-b"));
    crate::apps::write_tree(&a, factory);
    std::fs::create_dir_all(&b).expect("slot-b on the FAT partition");
    dev.reconfigure(|s| {
        s.device = format!("release_file = {:?}", marker.display().to_string());
        s.sections = format!("[components.firmware]\nkind = \"boot\"\na = {a:?}\nb = {b:?}\n");
    });
    dev.init();
    (dev, fat)
}
