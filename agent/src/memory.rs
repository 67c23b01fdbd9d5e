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
//! * glibc serves a large allocation from its own mapping, returned to the
//!   kernel when freed, but only up to a threshold it raises each time
//!   such a mapping is freed: after the first frame buffer of an install
//!   goes back, the next ones come from the heap, where freed memory
//!   stays resident. [`tune_allocator`] fixes the threshold at 128 KiB, so
//!   frame and read-back buffers are always mappings of their own (an
//!   install's peak RSS measured 16.0 MiB instead of 16.9 by `cargo xtask
//!   bench install`).
//! * freed memory inside the heap is not returned to the kernel unless it
//!   sits at the very top. After a round of work, when the daemon is about
//!   to sleep, [`release_idle`] hands every free page back
//!   (`malloc_trim(0)`), and the store drops its page cache.
//!
//! Both calls are specific to glibc and do nothing with other C libraries
//! (musl keeps no per-thread arenas and returns memory on its own).
//! `cargo xtask bench daemon` prints the figures.

/// Allocations from this size up get a mapping of their own (glibc's
/// default, kept fixed).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 128 * 1024;

/// Configure the allocator for a long-running single-threaded daemon and
/// for an install's frame buffers. Call before any thread is started.
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
        // SAFETY: as above; a fixed mmap threshold only decides where
        // large blocks come from.
        let ok = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) };
        if ok == 0 {
            log::debug!("mallopt(M_MMAP_THRESHOLD) was refused; keeping glibc's threshold");
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
