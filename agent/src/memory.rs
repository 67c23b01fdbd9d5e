//! Keeping the idle daemon's resident memory small.
//!
//! The daemon spends nearly all its life asleep between polls, so what it
//! holds then is what a device pays for it. Two things would otherwise keep
//! memory that nothing uses:
//!
//! * glibc's allocator gives every thread that allocates its own arena, and
//!   each poll, report and download runs on a short-lived helper thread
//!   ([`crate::worker`]). Memory freed in those arenas stays resident, and
//!   with the main arena that is several partly used heaps for a program
//!   that needs one. [`tune_allocator`] limits glibc to a single arena
//!   before any thread starts; the helper threads then share the main heap,
//!   which costs nothing measurable at the daemon's allocation rate.
//! * freed memory inside the heap is not returned to the kernel unless it
//!   sits at the very top. After a round of work, when the daemon is about
//!   to sleep, [`release_idle`] hands every free page back
//!   (`malloc_trim(0)`), and the store drops its page cache.
//!
//! Both calls are specific to glibc and do nothing with other C libraries
//! (musl keeps no per-thread arenas and returns memory on its own).
//! `cargo xtask bench daemon` prints the figures.

/// Configure the allocator for a long-running single-threaded daemon.
/// Call before any thread is started.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only changes glibc's allocator parameters; it is
        // called before the daemon starts any thread, as glibc requires for
        // M_ARENA_MAX to apply to every thread. A failure (return value 0)
        // leaves the defaults, which are correct, only larger.
        let ok = unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
        if ok == 0 {
            log::debug!("mallopt(M_ARENA_MAX, 1) was refused; keeping glibc's arenas");
        }
    }
}

/// Return freed heap memory to the kernel. Cheap (a walk over the free
/// lists); call when the daemon is about to sleep after a round of work.
pub fn release_idle() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim takes the allocator's own locks and only
        // releases pages of free chunks (madvise MADV_DONTNEED); memory in
        // use, by this thread or a helper thread, is not touched.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

/// Unmap the pages of code and read-only data (of this program and the
/// shared libraries it uses) that the process has touched so far, so that
/// only what later work touches is mapped again. The kernel maps file
/// pages around each one touched (fault-around, 64 KiB), so code that ran
/// once keeps most of the program mapped. The pages stay in the page cache
/// (they are clean file pages) and come back at the next access with a
/// minor fault; what changes is that code run only at start or during an
/// install no longer counts as the daemon's resident memory, and the
/// kernel may reclaim it like any unmapped file page. Only private file
/// mappings that are not writable and hold no copy-on-write page are
/// touched; relocated data is left alone.
pub fn release_code() {
    #[cfg(target_os = "linux")]
    {
        let smaps = match std::fs::read_to_string("/proc/self/smaps") {
            Ok(t) => t,
            Err(e) => {
                log::debug!("not releasing code pages: /proc/self/smaps: {e}");
                return;
            }
        };
        for (start, end) in clean_file_mappings(&smaps) {
            // SAFETY: [start, end) is a whole private mapping of a file,
            // read-only and without copy-on-write pages (checked in
            // `clean_file_mappings`): MADV_DONTNEED only drops its
            // page-table entries, and the next access maps the same file
            // contents again, as after the kernel reclaimed them. It
            // cannot free memory anything points into; a mapping unmapped
            // meanwhile (a library unloaded by another thread) only makes
            // the call fail, which is harmless.
            let rc = unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED)
            };
            if rc != 0 {
                log::debug!(
                    "madvise(MADV_DONTNEED) on code pages: {}",
                    std::io::Error::last_os_error()
                );
            }
        }
    }
}

/// Address ranges in `smaps` (the text of `/proc/self/smaps`) that
/// privately map a file (an absolute path, not `[vdso]` and the like),
/// are readable but not writable, and hold no anonymous (copy-on-write)
/// page.
fn clean_file_mappings(smaps: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    // The mapping being read: its range, and whether it qualifies so far.
    let mut current: Option<(usize, usize, bool)> = None;
    let finish = |c: Option<(usize, usize, bool)>, out: &mut Vec<(usize, usize)>| {
        if let Some((lo, hi, true)) = c {
            out.push((lo, hi));
        }
    };
    for line in smaps.lines() {
        let mut f = line.split_whitespace();
        let first = f.next().unwrap_or("");
        let range = first.split_once('-').and_then(|(lo, hi)| {
            Some((
                usize::from_str_radix(lo, 16).ok()?,
                usize::from_str_radix(hi, 16).ok()?,
            ))
        });
        match range {
            Some((lo, hi)) if !first.ends_with(':') => {
                finish(current.take(), &mut out);
                let perms = f.next().unwrap_or("");
                let name = f.nth(3).unwrap_or("");
                let ok = perms.len() == 4
                    && perms.starts_with('r')
                    && !perms.contains('w')
                    && perms.ends_with('p')
                    && name.starts_with('/')
                    && lo < hi;
                current = Some((lo, hi, ok));
            }
            _ => {
                if let (Some(c), Some(v)) = (current.as_mut(), line.strip_prefix("Anonymous:")) {
                    if v.trim() != "0 kB" {
                        c.2 = false;
                    }
                }
            }
        }
    }
    finish(current.take(), &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // Addresses that fit a 32-bit usize, so the test runs on armv7 too.
    const SMAPS: &str = "\
00400000-004d4000 r--p 00000000 fe:01 123 /usr/bin/updraft
Rss:                 100 kB
Anonymous:             0 kB
004d4000-00733000 r-xp 000d3000 fe:01 123 /usr/bin/updraft
Rss:                2000 kB
Anonymous:             0 kB
00734000-00746000 r--p 00332000 fe:01 123 /usr/bin/updraft
Rss:                  72 kB
Anonymous:            72 kB
00746000-0074a000 rw-p 00343000 fe:01 123 /usr/bin/updraft
Anonymous:            16 kB
01000000-01100000 rw-p 00000000 00:00 0 [heap]
Anonymous:          1024 kB
b6000000-b6100000 r-xp 00000000 fe:01 456 /usr/lib/libc.so.6
Anonymous:             0 kB
b6200000-b6201000 r--s 00000000 fe:01 789 /var/lib/updraft/shared
Anonymous:             0 kB
b6300000-b6302000 r-xp 00000000 00:00 0 [vdso]
Anonymous:             0 kB
b6400000-b6401000 r--p 00000000 00:00 0
Anonymous:             0 kB
";

    #[test]
    fn only_clean_read_only_private_file_mappings_are_released() {
        assert_eq!(
            clean_file_mappings(SMAPS),
            vec![
                (0x00400000, 0x004d4000),
                (0x004d4000, 0x00733000),
                (0xb6000000, 0xb6100000),
            ]
        );
    }

    #[test]
    fn an_empty_table_releases_nothing() {
        assert!(clean_file_mappings("").is_empty());
    }
}
