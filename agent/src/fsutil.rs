//! Small filesystem primitives with the durability updraft relies on.
//!
//! `atomic_write` is the only way updraft replaces a small file (the `file`
//! bootloader's state, the device id, metrics; not GRUB's environment,
//! which GRUB must find in place: see `bootloader::grub`): write a temporary file in
//! the same directory, fsync it, rename it over the target, fsync the
//! directory. After a power cut the target holds either the old or the new
//! content, never a torn mix.
//!
//! The directory may be shared with other accounts (Debian's node-exporter
//! textfile directory, where the metrics go, is written by other
//! collectors), so the temporary file is never opened by a name someone
//! else can have made: it gets a random name and is created with
//! `O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK`. A symlink planted under
//! that name is not followed and a FIFO does not block the open: either
//! makes the create fail, and another random name is tried. The rename
//! replaces a symlink at the target's own name rather than following it.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::err;
use crate::error::{Context, Result};

/// Replace `path` with `data` atomically and durably. `mode` applies to a
/// newly created file.
pub fn atomic_write(path: &Path, data: &[u8], mode: u32) -> Result<()> {
    let dir = parent_dir(path);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into());
    let (mut f, tmp) = create_temp(dir, &name, mode)?;
    let result = (|| -> Result<()> {
        f.write_all(data)
            .with_context(|| format!("writing {}", tmp.display()))?;
        f.sync_all()
            .with_context(|| format!("fsync {}", tmp.display()))?;
        std::fs::rename(&tmp, path)
            .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// How many random names [`create_temp`] tries before giving up: a name
/// already taken is an accident or a plant, and 64 random bits make a
/// second collision by accident impossible in practice.
const TEMP_TRIES: usize = 8;

/// Create a new temporary file for `name` in `dir`, never opening anything
/// that was there before (see the module documentation).
fn create_temp(dir: &Path, name: &str, mode: u32) -> Result<(File, std::path::PathBuf)> {
    let mut last = None;
    for _ in 0..TEMP_TRIES {
        let suffix = u64::from_ne_bytes(crate::random::bytes::<8>()?);
        let tmp = dir.join(format!(".{name}.tmp.{suffix:016x}"));
        match create_new(&tmp, mode) {
            Ok(f) => return Ok((f, tmp)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e).with_context(|| format!("creating {}", tmp.display())),
        }
    }
    let why = last.map_or_else(String::new, |e| format!(": {e}"));
    Err(err!(
        Io,
        "creating a temporary file for {name} in {}: {TEMP_TRIES} random names were all taken{why}; \
         is another account planting files in that directory?",
        dir.display()
    ))
}

/// `open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK |
/// O_CLOEXEC, mode)`: a new regular file or an error, never an existing
/// file, a symlink's target or a FIFO.
fn create_new(path: &Path, mode: u32) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
}

/// The directory `path` is in: its parent, or `.` for a bare file name.
pub fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// fsync a directory so a rename or create in it is durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("fsync directory {}", dir.display()))
}

/// Create a directory (and parents) with `mode` if missing.
pub fn ensure_dir(dir: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .with_context(|| format!("creating directory {}", dir.display()))
}

/// Why [`load_or_make_key`] has no key.
#[derive(Debug)]
pub(crate) enum KeyFileError {
    /// The secret file is there but cannot be read.
    Read(std::io::Error),
    /// The secret file is there but does not hold a key.
    Parse(String),
    /// There was none, and making one failed.
    Make(String),
}

/// A device key kept as a secret file (mode 0600) beside its public half
/// (0644): the secret read and parsed with `parse`, or, when there is none,
/// made by `make` (the key and the file's text) and written atomically;
/// an existing file that cannot be read or parsed is never replaced. The
/// public file is rewritten from the key (`public_text`) only when missing
/// or different, so a start writes nothing. Also whether the key was made
/// now.
pub(crate) fn load_or_make_key<K>(
    secret: &Path,
    public: &Path,
    parse: impl FnOnce(&str) -> std::result::Result<K, String>,
    make: impl FnOnce() -> std::result::Result<(K, String), String>,
    public_text: impl FnOnce(&K) -> String,
) -> std::result::Result<(K, bool), KeyFileError> {
    let (key, made) = match std::fs::read_to_string(secret) {
        Ok(text) => (parse(&text).map_err(KeyFileError::Parse)?, false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let (key, text) = make().map_err(KeyFileError::Make)?;
            atomic_write(secret, text.as_bytes(), 0o600)
                .map_err(|e| KeyFileError::Make(e.to_string()))?;
            (key, true)
        }
        Err(e) => return Err(KeyFileError::Read(e)),
    };
    let text = public_text(&key);
    if std::fs::read_to_string(public).ok().as_deref() != Some(text.as_str()) {
        if let Err(e) = atomic_write(public, text.as_bytes(), 0o644) {
            log::warn!("writing {}: {e}", public.display());
        }
    }
    Ok((key, made))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("updraft-fsutil-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        ensure_dir(&dir, 0o700).unwrap();
        dir
    }

    #[test]
    fn a_planted_symlink_is_not_followed_and_the_file_it_names_is_untouched() {
        let dir = scratch("symlink");
        let victim = dir.join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let planted = dir.join(".x.tmp.planted");
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        let e = create_new(&planted, 0o644).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{e}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        // A dangling one is not followed either (it would create its target).
        let dangling = dir.join(".y.tmp.planted");
        std::os::unix::fs::symlink(dir.join("made-by-root"), &dangling).unwrap();
        assert!(create_new(&dangling, 0o644).is_err());
        assert!(!dir.join("made-by-root").exists());
        // The target itself a symlink: the rename replaces the link.
        let target = dir.join("metrics.prom");
        std::os::unix::fs::symlink(&victim, &target).unwrap();
        atomic_write(&target, b"metrics", 0o644).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(std::fs::read(&target).unwrap(), b"metrics");
        assert!(
            !std::fs::symlink_metadata(&target)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_planted_fifo_neither_blocks_nor_receives_the_data() {
        let dir = scratch("fifo");
        let fifo = dir.join(".x.tmp.planted");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo reads it only.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
        // Returns at once (no reader would ever come): the name is taken.
        let e = create_new(&fifo, 0o644).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn temporary_names_are_random() {
        let dir = scratch("names");
        let (_, a) = create_temp(&dir, "x", 0o600).unwrap();
        let (_, b) = create_temp(&dir, "x", 0o600).unwrap();
        assert_ne!(a, b);
        let a = a.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            a.starts_with(".x.tmp.") && a.len() == ".x.tmp.".len() + 16,
            "{a}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let dir = std::env::temp_dir().join(format!("updraft-fsutil-{}", std::process::id()));
        ensure_dir(&dir, 0o700).unwrap();
        let p = dir.join("x");
        atomic_write(&p, b"one", 0o600).unwrap();
        atomic_write(&p, b"two", 0o600).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
