//! Large files on 32-bit targets: the device binary must reach glibc only
//! through its 64-bit-offset file calls.
//!
//! On armv7, glibc keeps two sets of file functions: `open`, `fstat`,
//! `lseek`, `pread`, `readdir`, ... with a 32-bit `off_t`, and `open64`,
//! `fstat64`, ... with a 64-bit one. The 32-bit ones fail with `EOVERFLOW`
//! on a file of 2 GiB or more (or on a 64-bit inode number), so a slot
//! image, a bundle or an app file of that size would be refused on armv7
//! alone. Rust's standard library calls the 64-bit set; code that reaches
//! libc through the `libc` or `nix` crates gets the 32-bit set unless it
//! says otherwise. User-mode emulation cannot show the difference (qemu
//! runs the calls on a 64-bit kernel), so the check reads the binary's
//! imports instead: [`offending`] over `nm -D --undefined-only`.
//!
//! Three 32-bit names remain, each harmless where it is called:
//! `open` (getrandom's fallback opens `/dev/urandom`), `openat` (every
//! caller, `app::tree`, passes `O_LARGEFILE`, which is all `openat64`
//! adds) and `fcntl` (flags and descriptor flags only, never the record
//! locks whose `struct flock` holds offsets). `opendir` has no 64-bit
//! twin; `readdir64` is what reads the entries.

use std::path::Path;
use std::process::Command;

use crate::util::Result;

/// glibc's functions whose 32-bit `off_t`, `ino_t` or `rlim_t` makes them
/// fail on large files, and that have a `…64` twin.
const FORBIDDEN: &[&str] = &[
    "creat",
    "fopen",
    "freopen",
    "tmpfile",
    "stat",
    "fstat",
    "lstat",
    "fstatat",
    "statfs",
    "fstatfs",
    "statvfs",
    "fstatvfs",
    "lseek",
    "pread",
    "pwrite",
    "preadv",
    "pwritev",
    "truncate",
    "ftruncate",
    "readdir",
    "readdir_r",
    "scandir",
    "scandirat",
    "glob",
    "ftw",
    "nftw",
    "mmap",
    "fallocate",
    "posix_fallocate",
    "posix_fadvise",
    "lockf",
    "sendfile",
    "fseeko",
    "ftello",
    "fgetpos",
    "fsetpos",
    "getrlimit",
    "setrlimit",
    "mkstemp",
    "mkostemp",
    "__fxstat",
    "__xstat",
    "__lxstat",
    "__fxstatat",
];

/// The forbidden imports in `nm -D --undefined-only` output (`U name@VERSION`
/// lines), sorted.
pub(crate) fn offending(nm_output: &str) -> Vec<String> {
    let mut found: Vec<String> = nm_output
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .map(|sym| sym.split('@').next().unwrap_or(sym))
        .filter(|name| FORBIDDEN.contains(name))
        .map(str::to_owned)
        .collect();
    found.sort();
    found.dedup();
    found
}

/// Fail when `binary` (built for a 32-bit target whose binutils prefix is
/// `prefix`, e.g. `arm-linux-gnueabihf`) imports a forbidden function.
pub(crate) fn check(binary: &Path, prefix: &str) -> Result {
    let nm = format!("{prefix}-nm");
    let out = Command::new(&nm)
        .args(["-D", "--undefined-only"])
        .arg(binary)
        .output()
        .map_err(|e| format!("running {nm} (binutils for {prefix}): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{nm} -D {}: {}",
            binary.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let bad = offending(&String::from_utf8_lossy(&out.stdout));
    if bad.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{} imports glibc's 32-bit-offset {}, which fail(s) with EOVERFLOW on files of 2 GiB or more: \
         reach it through std, or through the …64 call (nix and libc give the 32-bit one on armv7)",
        binary.display(),
        bad.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::offending;

    #[test]
    fn only_the_32_bit_offset_calls_are_reported_each_once() {
        let rows: &[(&str, &[&str])] = &[
            ("", &[]),
            (
                "         U open64@GLIBC_2.4\n         U fstat64@GLIBC_2.33",
                &[],
            ),
            ("         U fstat@GLIBC_2.33", &["fstat"]),
            (
                "         U lseek@GLIBC_2.4\n         U fstat@GLIBC_2.33\n         U fstat@GLIBC_2.33",
                &["fstat", "lseek"],
            ),
            // Harmless where they are called (see the module's doc).
            (
                "         U open@GLIBC_2.4\n         U openat@GLIBC_2.4",
                &[],
            ),
            (
                "         U fcntl@GLIBC_2.4\n         U opendir@GLIBC_2.4",
                &[],
            ),
            // A weak or unversioned import counts the same.
            (
                "         w readdir\n         U pread",
                &["pread", "readdir"],
            ),
        ];
        for (nm, want) in rows {
            assert_eq!(offending(nm), *want, "{nm:?}");
        }
    }
}
