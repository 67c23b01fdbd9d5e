//! Attaching a [`FuseFs`] to a directory and detaching it again.
//!
//! This module owns the kernel side of a mount: the `/dev/fuse` connection,
//! `mount(2)`, `umount2(2)` and, when a mount is still busy, aborting the
//! connection through the fuse control filesystem. It mounts directly (root
//! only) rather than through `fusermount3`, so that unmounting is under its
//! control. It never leaves a mount behind that still reaches the model:
//! after [`Mounted::unmount`] the old connection is gone or aborted.

use std::ffi::CString;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fuser::{BackgroundSession, Config, Session, SessionACL};

use super::fuse::FuseFs;

/// Where the fuse control filesystem lives; `<conn>/abort` ends a connection.
const FUSECTL: &str = "/sys/fs/fuse/connections";
/// How long an unmounted session may take to notice its connection is gone
/// (seconds under qemu-user on a loaded machine).
const SESSION_END: Duration = Duration::from_secs(30);

/// Add what was being done to an OS error, keeping its kind.
fn context(err: io::Error, what: impl std::fmt::Display) -> io::Error {
    io::Error::new(err.kind(), format!("{what}: {err}"))
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} contains NUL", path.display()),
        )
    })
}

/// One live mount served by a background FUSE thread.
#[derive(Debug)]
pub(crate) struct Mounted {
    session: Option<BackgroundSession>,
    mountpoint: PathBuf,
    /// Connection number under [`FUSECTL`] (the mount's device number).
    conn: u64,
}

/// Mount `fs` at `mountpoint` and serve it on a background thread.
pub(crate) fn mount(mountpoint: &Path, fs: FuseFs) -> io::Result<Mounted> {
    let target = c_path(mountpoint)?;
    let dev = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/fuse")
        .map_err(|e| context(e, "opening /dev/fuse"))?;
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    // allow_other: the daemon and tools under test may run as other users.
    // default_permissions: the kernel checks modes, as on a disk filesystem.
    let data = CString::new(format!(
        "fd={},rootmode=40000,user_id={uid},group_id={gid},allow_other,default_permissions",
        dev.as_raw_fd()
    ))
    .map_err(|_| io::Error::other("mount options contain NUL"))?;
    // SAFETY: all pointers are valid NUL-terminated strings for the call.
    let rc = unsafe {
        libc::mount(
            c"powerfs".as_ptr(),
            target.as_ptr(),
            c"fuse.powerfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        let err = io::Error::last_os_error();
        return Err(context(
            err,
            format!("mounting powerfs at {}", mountpoint.display()),
        ));
    }
    let detach = || {
        // SAFETY: target is a valid C string.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    };
    let mut config = Config::default();
    config.acl = SessionACL::All;
    let session = match Session::from_fd(fs, OwnedFd::from(dev), SessionACL::All, config) {
        Ok(s) => s,
        Err(e) => {
            detach();
            return Err(context(
                e,
                format!("FUSE handshake for {}", mountpoint.display()),
            ));
        }
    };
    let session = match session.spawn() {
        Ok(s) => s,
        Err(e) => {
            detach();
            return Err(context(e, "starting the FUSE session thread"));
        }
    };
    let mut mounted = Mounted {
        session: Some(session),
        mountpoint: mountpoint.to_path_buf(),
        conn: 0,
    };
    let st_dev = std::fs::metadata(mountpoint)
        .map_err(|e| context(e, format!("stat of fresh mount {}", mountpoint.display())))?
        .dev();
    // The kernel names connections by its own dev_t encoding.
    mounted.conn = (u64::from(libc::major(st_dev)) << 20) | u64::from(libc::minor(st_dev));
    Ok(mounted)
}

/// Abort FUSE connection `conn`: every request pending or to come fails
/// with ENOTCONN and the serving thread sees the device go away.
fn abort(conn: u64) -> io::Result<()> {
    let file = Path::new(FUSECTL).join(conn.to_string()).join("abort");
    if !file.exists() {
        // The control filesystem is usually mounted at boot; mount it if not.
        // SAFETY: all pointers are valid NUL-terminated strings.
        unsafe {
            libc::mount(
                c"fusectl".as_ptr(),
                c"/sys/fs/fuse/connections".as_ptr(),
                c"fusectl".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
    }
    match std::fs::write(&file, b"1") {
        Ok(()) => Ok(()),
        // The connection went away on its own between the busy unmount and
        // now: that is the outcome aborting it was for.
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(context(e, format!("writing {}", file.display()))),
    }
}

impl Mounted {
    /// Unmount and wait for the serving thread to end. A mount still in use
    /// (a process holds a file or its working directory there) is detached
    /// and its connection aborted, so the old users get ENOTCONN.
    pub(crate) fn unmount(mut self) -> io::Result<()> {
        self.unmount_inner()
    }

    fn unmount_inner(&mut self) -> io::Result<()> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        let target = c_path(&self.mountpoint)?;
        // SAFETY: target is a valid C string.
        if unsafe { libc::umount2(target.as_ptr(), 0) } != 0 {
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EBUSY) => {
                    // SAFETY: as above.
                    unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
                    abort(self.conn).map_err(|e| {
                        let at = self.mountpoint.display();
                        context(e, format!("aborting the busy mount at {at}"))
                    })?;
                }
                // Unmounted by someone else: make sure the connection is gone.
                Some(libc::EINVAL) => {
                    let _ = abort(self.conn);
                }
                _ => {
                    return Err(context(
                        err,
                        format!("unmounting {}", self.mountpoint.display()),
                    ));
                }
            }
        }
        let deadline = Instant::now() + SESSION_END;
        while !session.guard.is_finished() {
            if Instant::now() > deadline {
                // Detached and unreachable through the path: the thread is
                // left behind rather than blocking the caller forever.
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "FUSE session of {} still running {}s after unmount",
                        self.mountpoint.display(),
                        SESSION_END.as_secs()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        session
            .join()
            .map_err(|e| context(e, "FUSE session ended with an error"))
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Err(e) = self.unmount_inner() {
            eprintln!("powerfs: {e}");
        }
    }
}
