//! The FUSE side of [`PowerFs`](super::PowerFs): kernel requests become
//! [`Model`] operations, gated by the power switch and counted.
//!
//! This module owns the power state (alive, dead, armed cut) and the
//! counters. It never changes the model while the power is off or for a
//! session from before the last power-on, and it never sends the kernel
//! anything it may cache beyond the current state: entry and attribute TTLs
//! are zero and opens keep no page cache from an earlier open.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
    WriteFlags,
};

use super::model::{self, Model, SetAttr};
use super::{CutReport, PowerStats};

/// How long the kernel may trust an entry or attributes without asking:
/// never, so that after a cut even `stat` fails.
const TTL: Duration = Duration::ZERO;

/// Everything the FUSE thread and the controlling test share.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) model: Model,
    /// Sessions of an older generation (before the last power-on) get EIO.
    pub(crate) generation: u64,
    pub(crate) dead: bool,
    /// Power fails right after this mutating-op count is reached.
    pub(crate) cut_at: Option<u64>,
    pub(crate) stats: PowerStats,
    /// Log every mutating request on stderr (`UPDRAFT_POWERFS_TRACE=1`).
    pub(crate) trace: bool,
    /// Directory listings of open directory handles.
    pub(crate) dirs: HashMap<u64, Vec<(u64, FileType, OsString)>>,
    /// Processes killed (SIGKILL) at the instant of the cut, so nothing
    /// they do after it (network traffic included) can happen: a real power
    /// cut stops the CPU too.
    pub(crate) victims: Vec<i32>,
    next_fh: u64,
}

impl State {
    pub(crate) fn new(model: Model) -> State {
        State {
            model,
            generation: 0,
            dead: false,
            cut_at: None,
            stats: PowerStats::default(),
            trace: std::env::var_os("UPDRAFT_POWERFS_TRACE").is_some_and(|v| v == "1"),
            dirs: HashMap::new(),
            victims: Vec::new(),
            next_fh: 1,
        }
    }

    /// Cut the power now: nothing changes any more until power-on.
    pub(crate) fn cut(&mut self) {
        if self.dead {
            return;
        }
        self.dead = true;
        self.cut_at = None;
        for pid in self.victims.drain(..) {
            // SAFETY: signalling a process the test registered, by pid.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let loss = self.model.loss();
        self.stats.cuts += 1;
        self.stats.last_cut = Some(CutReport {
            after_op: self.stats.mutating_ops,
            bytes_dropped: loss.bytes,
            entries_reverted: loss.entries,
        });
    }
}

pub(crate) type Shared = Arc<Mutex<State>>;

/// Lock the shared state; a panic elsewhere must not wedge the filesystem.
pub(crate) fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The `fuser` filesystem of one mount (one power-on period).
#[derive(Debug)]
pub(crate) struct FuseFs {
    shared: Shared,
    generation: u64,
}

impl FuseFs {
    pub(crate) fn new(shared: Shared, generation: u64) -> FuseFs {
        FuseFs { shared, generation }
    }

    /// Run a query (not a cut point): EIO when the power is off or the
    /// session is stale.
    fn query<T>(&self, f: impl FnOnce(&mut State) -> model::Result<T>) -> Result<T, Errno> {
        let mut state = lock(&self.shared);
        if state.dead || state.generation != self.generation {
            return Err(Errno::EIO);
        }
        f(&mut state).map_err(Errno::from_i32)
    }

    /// Run a mutating request: EIO when the power is off or the session is
    /// stale; else count it, apply it, and cut the power right after it
    /// when the armed cut point is reached. `what` describes it for tracing.
    fn mutate<T>(
        &self,
        what: impl FnOnce() -> String,
        f: impl FnOnce(&mut State) -> model::Result<T>,
    ) -> Result<T, Errno> {
        let mut state = lock(&self.shared);
        if state.dead || state.generation != self.generation {
            return Err(Errno::EIO);
        }
        state.stats.mutating_ops += 1;
        let result = f(&mut state);
        if state.trace {
            let outcome = match &result {
                Ok(_) => "ok".to_string(),
                Err(e) => std::io::Error::from_raw_os_error(*e).to_string(),
            };
            eprintln!(
                "powerfs op {}: {} -> {outcome}",
                state.stats.mutating_ops,
                what()
            );
        }
        if state
            .cut_at
            .is_some_and(|at| state.stats.mutating_ops >= at)
        {
            state.cut();
            if state.trace {
                eprintln!("powerfs: power cut after op {}", state.stats.mutating_ops);
            }
        }
        result.map_err(Errno::from_i32)
    }

    fn entry(&self, reply: ReplyEntry, result: Result<FileAttr, Errno>) {
        match result {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn empty(reply: ReplyEmpty, result: Result<(), Errno>) {
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}

fn time(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

/// Largest WRITE request: a `write(2)` larger than this is split into
/// several requests, each one mutating op (and one possible cut point).
pub(crate) const MAX_WRITE: u32 = 1 << 20;

impl Filesystem for FuseFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Fixed rather than whatever the kernel's page size and
        // max_pages_limit allow, so cut points do not depend on the kernel.
        // No capability is added: in particular no FUSE_WRITEBACK_CACHE
        // (writes must reach us before write(2) returns) and no lock
        // capabilities (the kernel keeps flock/POSIX locks itself).
        config.set_max_write(MAX_WRITE).map_err(|nearest| {
            std::io::Error::other(format!("max_write {MAX_WRITE} refused (nearest {nearest})"))
        })?;
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let r = self.query(|s| s.model.lookup(parent.0, name));
        self.entry(reply, r);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let mut state = lock(&self.shared);
        if state.generation == self.generation {
            state.model.forget(ino.0, nlookup);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.query(|s| s.model.attr(ino.0)) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let change = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(time),
            mtime: mtime.map(time),
        };
        match self.mutate(
            || format!("setattr ino {} {change:?}", ino.0),
            |s| s.model.setattr(ino.0, &change),
        ) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.query(|s| s.model.readlink(ino.0)) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        let what = || format!("mknod {name:?} in ino {} mode {mode:o}", parent.0);
        let r = self.mutate(what, |s| {
            if mode & libc::S_IFMT != libc::S_IFREG {
                // Only regular files: devices, FIFOs and sockets have no
                // place in what updraft stores.
                return Err(libc::EPERM);
            }
            s.model.create(parent.0, name, mode, req.uid(), req.gid())
        });
        self.entry(reply, r);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let r = self.mutate(
            || format!("mkdir {name:?} in ino {}", parent.0),
            |s| s.model.mkdir(parent.0, name, mode, req.uid(), req.gid()),
        );
        self.entry(reply, r);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        Self::empty(
            reply,
            self.mutate(
                || format!("unlink {name:?} in ino {}", parent.0),
                |s| s.model.unlink(parent.0, name),
            ),
        );
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        Self::empty(
            reply,
            self.mutate(
                || format!("rmdir {name:?} in ino {}", parent.0),
                |s| s.model.rmdir(parent.0, name),
            ),
        );
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let what = || format!("symlink {link_name:?} in ino {}", parent.0);
        let r = self.mutate(what, |s| {
            s.model.symlink(
                parent.0,
                link_name,
                target.as_os_str(),
                req.uid(),
                req.gid(),
            )
        });
        self.entry(reply, r);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let what = || {
            let (from, to) = (parent.0, newparent.0);
            format!("rename {name:?} in ino {from} to {newname:?} in ino {to} flags {flags:?}")
        };
        let r = self.mutate(what, |s| {
            let known = RenameFlags::RENAME_NOREPLACE | RenameFlags::RENAME_EXCHANGE;
            if !known.contains(flags) {
                return Err(libc::EINVAL);
            }
            s.model.rename(
                parent.0,
                name,
                newparent.0,
                newname,
                flags.contains(RenameFlags::RENAME_NOREPLACE),
                flags.contains(RenameFlags::RENAME_EXCHANGE),
            )
        });
        Self::empty(reply, r);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let r = self.mutate(
            || format!("link ino {} as {newname:?} in ino {}", ino.0, newparent.0),
            |s| s.model.link(ino.0, newparent.0, newname),
        );
        self.entry(reply, r);
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // No FOPEN_KEEP_CACHE: the kernel drops cached pages of the inode on
        // every open. Cached pages cannot go stale anyway, since all writes
        // pass through the kernel (write-through, no writeback cache).
        match self.query(|s| s.model.attr(ino.0)) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.query(|s| s.model.read(ino.0, offset, size as usize)) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let what = || format!("write ino {} offset {offset} len {}", ino.0, data.len());
        let r = self.mutate(what, |s| {
            let len = u32::try_from(data.len()).map_err(|_| libc::EINVAL)?;
            s.model.write(ino.0, offset, data)?;
            s.stats.bytes_written += u64::from(len);
            Ok(len)
        });
        match r {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        Self::empty(reply, self.query(|s| s.model.attr(ino.0).map(|_| ())));
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let r = self.mutate(
            || format!("fsync ino {}", ino.0),
            |s| {
                s.model.fsync(ino.0)?;
                s.stats.fsyncs += 1;
                Ok(())
            },
        );
        Self::empty(reply, r);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let r = self.query(|s| {
            let listing = s.model.list(ino.0)?;
            let fh = s.next_fh;
            s.next_fh += 1;
            s.dirs.insert(fh, listing);
            Ok(fh)
        });
        match r {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = self.query(|s| {
            if offset == 0 {
                // rewinddir: list afresh.
                let listing = s.model.list(ino.0)?;
                s.dirs.insert(fh.0, listing);
            }
            let listing = s.dirs.get(&fh.0).ok_or(libc::EBADF)?;
            Ok(listing
                .iter()
                .skip(offset as usize)
                .cloned()
                .collect::<Vec<_>>())
        });
        match r {
            Ok(entries) => {
                for (i, (child, kind, name)) in entries.into_iter().enumerate() {
                    if reply.add(INodeNo(child), offset + i as u64 + 1, kind, &name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        lock(&self.shared).dirs.remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let r = self.mutate(
            || format!("fsyncdir ino {}", ino.0),
            |s| {
                s.model.fsync_dir(ino.0)?;
                s.stats.dir_fsyncs += 1;
                Ok(())
            },
        );
        Self::empty(reply, r);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.query(|s| Ok(s.model.statfs())) {
            Ok(st) => reply.statfs(
                st.blocks,
                st.bfree,
                st.bfree,
                st.files,
                st.ffree,
                model::BLOCK,
                model::NAME_MAX as u32,
                model::BLOCK,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // Mounted with default_permissions: the kernel checks modes itself.
        Self::empty(reply, self.query(|s| s.model.attr(ino.0).map(|_| ())));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let r = self.mutate(
            || format!("create {name:?} in ino {}", parent.0),
            |s| s.model.create(parent.0, name, mode, req.uid(), req.gid()),
        );
        match r {
            Ok(attr) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(0),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let r = self.mutate(
            || {
                format!(
                    "fallocate ino {} offset {offset} len {length} mode {mode:#x}",
                    ino.0
                )
            },
            |s| s.model.fallocate(ino.0, offset, length, mode),
        );
        Self::empty(reply, r);
    }
}
