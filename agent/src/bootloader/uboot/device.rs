//! Device I/O for the U-Boot environment: libubootenv's lock, finding a
//! copy on its device, moving its bytes, and the write protection of eMMC
//! boot partitions.
//!
//! * Every access holds libubootenv's lock, `flock(LOCK_EX)` on
//!   [`DEFAULT_LOCK_FILE`], so `fw_setenv` and updraft never interleave.
//!   updraft's wait for it is bounded: a stuck `fw_setenv` makes an update
//!   fail as busy instead of hanging the daemon. The file must be the
//!   daemon's own (root's), mode 0600: in the world-writable `/run/lock`
//!   anyone could otherwise create or open it and hold the lock forever.
//! * A copy lives on a regular file (a Raspberry Pi's `uboot.env` on FAT)
//!   or a block device (an eMMC boot partition, a raw region of a disk). A
//!   negative offset counts back from the end of a block device. Offsets
//!   are resolved against the size of the opened device, and checked to
//!   fit, on every access, since the device can change between accesses.
//! * A write is one positioned write of the whole copy, then `fdatasync`,
//!   so the copy is on the medium before the lock is released.
//! * Writes to an eMMC boot partition (`/dev/mmcblkXbootY`) clear
//!   `/sys/block/mmcblkXbootY/force_ro` for the write and restore it after,
//!   also when the write fails: the kernel sets the switch because such a
//!   partition usually holds the boot loader too, and it must not be left
//!   writable.
//!
//! It moves whole copies where it is told and must never interpret their
//! bytes or choose which copy to write: the rule that the copy holding the
//! current state is never the one overwritten lives in one place, the
//! backend. It never touches MTD or UBI devices (they need erase handling
//! it does not have; the configuration parser refuses them).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::config::EnvLocation;
use crate::error::{Context, Error, Kind, Result};
use crate::progress::{Ticker, Uninterrupted};
use crate::{bail, err, slot};

/// The lock libubootenv takes around every access to the environment
/// (the default of `bootloader.lock_file`, where it is explained). updraft
/// takes the same lock, but opens it more carefully ([`take_lock`]).
pub use crate::config::DEFAULT_UBOOT_LOCK_FILE as DEFAULT_LOCK_FILE;

/// How long updraft waits for another holder of the lock (libubootenv
/// waits forever; updraft's waits are bounded) before failing as busy.
pub(super) const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// libubootenv's lock, held while it lives.
pub(super) struct EnvLock {
    _file: Option<File>,
}

/// Refuse a lock file that does not belong to the daemon's user, or that
/// has other names: where `fs.protected_hardlinks` is off, anyone may link
/// a file of root's (the database, a key) into the lock directory, and the
/// owner check alone would pass it to the `chmod` below.
fn check_owner(path: &Path, meta: &std::fs::Metadata) -> Result<()> {
    if meta.nlink() > 1 {
        bail!(
            Busy,
            "the U-Boot environment lock {} has {} hard links: it is another file's name too; refusing to use it (remove it; updraft's tmpfiles.d entry creates it at boot)",
            path.display(),
            meta.nlink()
        );
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        let who = if me == 0 {
            "root".to_string()
        } else {
            format!("uid {me}")
        };
        bail!(
            Busy,
            "the U-Boot environment lock {} is owned by uid {}, not {who}; refusing to use it (remove it; updraft's tmpfiles.d entry creates it root-owned, mode 0600, at boot)",
            path.display(),
            meta.uid()
        );
    }
    Ok(())
}

/// How often a held lock is tried again (flock has no descriptor to poll).
const LOCK_RETRY: Duration = Duration::from_millis(50);

/// Take the lock, waiting at most `timeout` for another holder; the
/// driver is served through `t` meanwhile.
///
/// The lock lives in a directory every user may write (`/run/lock`), and
/// `flock` works on any descriptor, read-only ones too: whoever can open
/// the file can hold the lock. So the file is opened without following a
/// symbolic link and without truncating it, created mode 0600 if missing
/// (the tmpfiles.d entry creates it so at boot), and must belong to the
/// daemon's user: a file someone else made is refused, and one of ours
/// that others could open is made 0600 first. Every refusal, like a lock
/// held too long, is [`Kind::Busy`]: the daemon tries again later.
pub(super) fn take_lock(path: &Path, timeout: Duration, t: &mut dyn Ticker) -> Result<EnvLock> {
    // O_NONBLOCK: a FIFO planted in its place must not hang the open.
    let file = match OpenOptions::new()
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        // libubootenv goes on without the lock when it cannot create the
        // file; then no fw_setenv can hold it either.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::EROFS)) => {
            log::warn!(
                "cannot create the U-Boot environment lock {} ({e}); going on without it, as libubootenv does",
                path.display()
            );
            return Ok(EnvLock { _file: None });
        }
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            bail!(
                Busy,
                "the U-Boot environment lock {} is a symbolic link; refusing to use it (remove it)",
                path.display()
            );
        }
        Err(e) => {
            // A file another user made in a sticky directory cannot be
            // opened with O_CREAT where fs.protected_regular is set: say
            // whose it is.
            if let Ok(meta) = std::fs::symlink_metadata(path) {
                check_owner(path, &meta)?;
            }
            return Err(Error::from(e)
                .wrap(format!(
                    "opening the U-Boot environment lock {}",
                    path.display()
                ))
                .with_kind(Kind::Bootloader));
        }
    };
    let meta = file.metadata().kind_context(
        Kind::Bootloader,
        format!("inspecting the U-Boot environment lock {}", path.display()),
    )?;
    if !meta.file_type().is_file() {
        bail!(
            Busy,
            "the U-Boot environment lock {} is not a regular file; refusing to use it",
            path.display()
        );
    }
    check_owner(path, &meta)?;
    if meta.mode() & 0o077 != 0 {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .kind_context(
                Kind::Bootloader,
                format!(
                    "making the U-Boot environment lock {} mode 0600",
                    path.display()
                ),
            )?;
        log::info!(
            "the U-Boot environment lock {} was mode {:04o}; made it 0600 so other users cannot hold it",
            path.display(),
            meta.mode() & 0o7777
        );
    }
    let start = Instant::now();
    let mut wait = Uninterrupted::new(t);
    loop {
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(EnvLock { _file: Some(file) });
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => {
                if start.elapsed() >= timeout {
                    bail!(
                        Busy,
                        "the U-Boot environment lock {} has been held by another process (fw_setenv?) for more than {} ms",
                        path.display(),
                        timeout.as_millis()
                    );
                }
                wait.wait(&[], LOCK_RETRY.min(timeout.saturating_sub(start.elapsed())));
            }
            _ => {
                return Err(Error::from(e)
                    .wrap(format!("locking {}", path.display()))
                    .with_kind(Kind::Bootloader));
            }
        }
    }
}

/// The absolute offset of a copy on its opened device, checked to fit.
fn resolve_offset(loc: &EnvLocation, file: &File) -> Result<u64> {
    let file_type = file
        .metadata()
        .kind_context(
            Kind::Bootloader,
            format!("inspecting {}", loc.device.display()),
        )?
        .file_type();
    let block = file_type.is_block_device();
    if !block && !file_type.is_file() {
        bail!(
            Bootloader,
            "{} is neither a regular file nor a block device",
            loc.device.display()
        );
    }
    // The slot module measures files and block devices alike; its errors
    // name the path and are classified here as the bootloader's.
    let size = slot::capacity_of(file, &loc.device).map_err(|e| e.with_kind(Kind::Bootloader))?;
    let offset = if loc.offset < 0 {
        if !block {
            bail!(
                Bootloader,
                "offset {} of {} counts from the end of a block device, but it is not one",
                loc.offset,
                loc.device.display()
            );
        }
        size.checked_sub(loc.offset.unsigned_abs()).ok_or_else(|| {
            err!(
                Bootloader,
                "offset {} reaches before the start of {} ({size} bytes)",
                loc.offset,
                loc.device.display()
            )
        })?
    } else {
        loc.offset as u64
    };
    if offset.saturating_add(loc.env_size as u64) > size {
        bail!(
            Bootloader,
            "{} holds {size} bytes, too few for an environment of {:#x} bytes at offset {offset:#x}",
            loc.device.display(),
            loc.env_size
        );
    }
    Ok(offset)
}

/// The `/sys/block/…/force_ro` switch of an eMMC boot partition
/// (`/dev/mmcblkXbootY`, also behind a symlink), if `device` is one.
fn emmc_force_ro_path(device: &Path) -> Option<PathBuf> {
    let real = std::fs::canonicalize(device).unwrap_or_else(|_| device.to_path_buf());
    let name = real.file_name()?.to_str()?;
    is_emmc_boot_name(name).then(|| Path::new("/sys/block").join(name).join("force_ro"))
}

/// `mmcblk<digits>boot<digits>`.
fn is_emmc_boot_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("mmcblk") else {
        return false;
    };
    let disk_digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if disk_digits == 0 {
        return false;
    }
    match rest[disk_digits..].strip_prefix("boot") {
        Some(part) => !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()),
        None => false,
    }
}

/// Clears a `force_ro` switch and sets it again when dropped.
struct ForceRoGuard {
    path: PathBuf,
}

impl ForceRoGuard {
    /// Clear `force_ro` at `path` if it is set. `None` when there is no
    /// such switch or it is already clear (then nothing is restored).
    fn clear(path: &Path) -> Result<Option<ForceRoGuard>> {
        let current = match std::fs::read_to_string(path) {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(Error::from(e)
                    .wrap(format!("reading {}", path.display()))
                    .with_kind(Kind::Bootloader));
            }
        };
        if current.trim() == "0" {
            return Ok(None);
        }
        write_switch(path, b"0")?;
        Ok(Some(ForceRoGuard {
            path: path.to_path_buf(),
        }))
    }
}

fn write_switch(path: &Path, value: &[u8]) -> Result<()> {
    use std::io::Write;
    OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| f.write_all(value))
        .kind_context(
            Kind::Bootloader,
            format!(
                "writing {:?} to {}",
                String::from_utf8_lossy(value),
                path.display()
            ),
        )
}

impl Drop for ForceRoGuard {
    fn drop(&mut self) {
        if let Err(e) = write_switch(&self.path, b"1") {
            log::warn!(
                "the environment was written but the write protection was not restored: {e}"
            );
        }
    }
}

fn open_device(loc: &EnvLocation, write: bool) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_CLOEXEC)
        .open(&loc.device)
        .kind_context(
            Kind::Bootloader,
            format!(
                "opening {} for {}",
                loc.device.display(),
                if write { "writing" } else { "reading" }
            ),
        )
}

/// One copy read from its device.
pub(super) struct CopyRead {
    pub(super) offset: u64,
    pub(super) bytes: Vec<u8>,
}

pub(super) fn read_copy(loc: &EnvLocation) -> Result<CopyRead> {
    let file = open_device(loc, false)?;
    let offset = resolve_offset(loc, &file)?;
    let mut bytes = vec![0u8; loc.env_size];
    file.read_exact_at(&mut bytes, offset).kind_context(
        Kind::Bootloader,
        format!(
            "reading {:#x} bytes at offset {offset:#x} of {}",
            loc.env_size,
            loc.device.display()
        ),
    )?;
    Ok(CopyRead { offset, bytes })
}

pub(super) fn write_copy(loc: &EnvLocation, image: &[u8]) -> Result<u64> {
    let _unprotected = match emmc_force_ro_path(&loc.device) {
        Some(p) => ForceRoGuard::clear(&p)?,
        None => None,
    };
    let file = open_device(loc, true)?;
    let offset = resolve_offset(loc, &file)?;
    let what = || {
        format!(
            "writing {:#x} bytes at offset {offset:#x} of {}",
            image.len(),
            loc.device.display()
        )
    };
    file.write_all_at(image, offset)
        .with_context(what)
        .map_err(|e| e.with_kind(Kind::Bootloader))?;
    file.sync_data()
        .with_context(what)
        .map_err(|e| e.with_kind(Kind::Bootloader))?;
    Ok(offset)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::scratch_dir;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_lock_file_with_another_name_is_refused_and_left_alone() {
        let dir = scratch_dir("uboot-device", "hardlink");
        // A file of ours someone linked into the lock directory.
        let precious = dir.join("updraft.db");
        std::fs::write(&precious, b"database").unwrap();
        std::fs::set_permissions(&precious, std::fs::Permissions::from_mode(0o644)).unwrap();
        let lock = dir.join("fw_printenv.lock");
        std::fs::hard_link(&precious, &lock).unwrap();
        let e = match take_lock(
            &lock,
            Duration::from_millis(100),
            &mut crate::progress::NoTick,
        ) {
            Ok(_) => panic!("a hard-linked lock file was taken"),
            Err(e) => e,
        };
        assert_eq!(e.kind(), Kind::Busy);
        assert!(e.to_string().contains("has 2 hard links"), "{e}");
        let meta = std::fs::metadata(&precious).unwrap();
        assert_eq!(
            meta.mode() & 0o7777,
            0o644,
            "the linked file's mode changed"
        );
        assert_eq!(std::fs::read(&precious).unwrap(), b"database");
        // Once the extra name is gone, the lock is taken as usual.
        std::fs::remove_file(&lock).unwrap();
        assert!(
            take_lock(
                &lock,
                Duration::from_millis(100),
                &mut crate::progress::NoTick
            )
            .is_ok()
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn emmc_boot_partitions_are_recognised() {
        assert!(is_emmc_boot_name("mmcblk0boot0"));
        assert!(is_emmc_boot_name("mmcblk12boot1"));
        assert!(!is_emmc_boot_name("mmcblk0"));
        assert!(!is_emmc_boot_name("mmcblk0p1"));
        assert!(!is_emmc_boot_name("mmcblkboot0"));
        assert!(!is_emmc_boot_name("mmcblk0boot"));
        assert!(!is_emmc_boot_name("mmcblk0boot0p1"));
        assert_eq!(
            emmc_force_ro_path(Path::new("/dev/mmcblk1boot0")),
            Some(PathBuf::from("/sys/block/mmcblk1boot0/force_ro"))
        );
        assert_eq!(emmc_force_ro_path(Path::new("/dev/sda")), None);
    }

    #[test]
    fn force_ro_is_cleared_for_the_write_and_restored() {
        let d = scratch_dir("uboot", "force-ro");
        let sw = d.join("force_ro");
        std::fs::write(&sw, "1\n").unwrap();
        {
            let guard = ForceRoGuard::clear(&sw).unwrap();
            assert!(guard.is_some());
            assert_eq!(std::fs::read_to_string(&sw).unwrap().trim(), "0");
        }
        assert_eq!(std::fs::read_to_string(&sw).unwrap().trim(), "1");
        // Already writable: left alone.
        std::fs::write(&sw, "0\n").unwrap();
        assert!(ForceRoGuard::clear(&sw).unwrap().is_none());
        assert_eq!(std::fs::read_to_string(&sw).unwrap().trim(), "0");
        assert!(ForceRoGuard::clear(&d.join("missing")).unwrap().is_none());
    }
}
