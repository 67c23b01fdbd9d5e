//! The in-memory tree behind [`PowerFs`](super::PowerFs): every inode has a
//! *current* state, which requests read and change, and a *durable* state,
//! which is all that survives a power cut.
//!
//! This module owns the durability rules and nothing else: it knows neither
//! FUSE nor power. It never lets an operation change durable state except
//! `fsync` (a file's data and attributes) and `fsync_dir` (a directory's
//! entries and attributes), and [`Model::power_on`] never keeps anything that
//! was not durable. Errors are plain `errno` values for the FUSE layer to send.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{FileAttr, FileType, INodeNo};

/// Inode number of the root directory (fixed by the FUSE protocol).
pub(crate) const ROOT: u64 = 1;
/// File data is stored in chunks of this many bytes, shared copy-on-write
/// between the current and the durable state, so an fsync costs one pointer
/// copy per chunk and a write after it copies only the chunks it touches.
const CHUNK: usize = 64 * 1024;
/// Largest file size accepted (EFBIG beyond): data is held in memory.
const MAX_FILE_SIZE: u64 = 1 << 40;
/// Block size reported by `stat` and `statfs`.
pub(crate) const BLOCK: u32 = 4096;
/// Capacity reported by `statfs`, in [`BLOCK`]s (64 GiB).
const CAPACITY_BLOCKS: u64 = 16 << 20;
/// Inode capacity reported by `statfs`.
const CAPACITY_INODES: u64 = 1 << 20;
/// Longest file name accepted.
pub(crate) const NAME_MAX: usize = 255;

/// An `errno` value.
pub(crate) type Errno = i32;
pub(crate) type Result<T> = std::result::Result<T, Errno>;

/// Attributes that `fsync` makes durable together with the content.
#[derive(Clone, Debug)]
struct Meta {
    perm: u16,
    uid: u32,
    gid: u32,
    atime: SystemTime,
    mtime: SystemTime,
    ctime: SystemTime,
}

impl Meta {
    fn new(perm: u16, uid: u32, gid: u32) -> Meta {
        let now = SystemTime::now();
        Meta {
            perm,
            uid,
            gid,
            atime: now,
            mtime: now,
            ctime: now,
        }
    }

    fn touch(&mut self) {
        let now = SystemTime::now();
        self.mtime = now;
        self.ctime = now;
    }
}

/// File data: `size` bytes; a missing chunk reads as zeros, and bytes of the
/// last chunk past `size` are always zero.
#[derive(Clone, Debug, Default)]
struct Data {
    size: u64,
    chunks: Vec<Option<Arc<Vec<u8>>>>,
}

impl Data {
    fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        if offset >= self.size {
            return Vec::new();
        }
        let end = self.size.min(offset.saturating_add(len as u64));
        let mut out = vec![0u8; (end - offset) as usize];
        let mut pos = offset;
        while pos < end {
            let index = (pos / CHUNK as u64) as usize;
            let within = (pos % CHUNK as u64) as usize;
            let n = (CHUNK - within).min((end - pos) as usize);
            if let Some(Some(chunk)) = self.chunks.get(index) {
                let at = (pos - offset) as usize;
                out[at..at + n].copy_from_slice(&chunk[within..within + n]);
            }
            pos += n as u64;
        }
        out
    }

    fn write(&mut self, offset: u64, bytes: &[u8]) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        let end = offset
            .checked_add(bytes.len() as u64)
            .filter(|&end| end <= MAX_FILE_SIZE)
            .ok_or(libc::EFBIG)?;
        let chunks_needed = end.div_ceil(CHUNK as u64) as usize;
        if self.chunks.len() < chunks_needed {
            self.chunks.resize(chunks_needed, None);
        }
        let mut pos = offset;
        while pos < end {
            let index = (pos / CHUNK as u64) as usize;
            let within = (pos % CHUNK as u64) as usize;
            let n = (CHUNK - within).min((end - pos) as usize);
            let at = (pos - offset) as usize;
            let chunk = self.chunks[index].get_or_insert_with(|| Arc::new(vec![0u8; CHUNK]));
            Arc::make_mut(chunk)[within..within + n].copy_from_slice(&bytes[at..at + n]);
            pos += n as u64;
        }
        self.size = self.size.max(end);
        Ok(())
    }

    /// Zero `[offset, end)` (clamped to the size), dropping whole chunks.
    fn zero(&mut self, offset: u64, end: u64) {
        let end = end.min(self.size);
        let mut pos = offset;
        while pos < end {
            let index = (pos / CHUNK as u64) as usize;
            let within = (pos % CHUNK as u64) as usize;
            let n = (CHUNK - within).min((end - pos) as usize);
            if let Some(slot) = self.chunks.get_mut(index) {
                if n == CHUNK {
                    *slot = None;
                } else if let Some(chunk) = slot {
                    Arc::make_mut(chunk)[within..within + n].fill(0);
                }
            }
            pos += n as u64;
        }
    }

    fn set_size(&mut self, size: u64) -> Result<()> {
        if size > MAX_FILE_SIZE {
            return Err(libc::EFBIG);
        }
        if size < self.size {
            // Keep the invariant: bytes past the size read as zero if the
            // file grows again.
            self.zero(size, self.size);
            self.chunks.truncate(size.div_ceil(CHUNK as u64) as usize);
        }
        self.size = size;
        Ok(())
    }

    fn allocated_bytes(&self) -> u64 {
        self.chunks.iter().filter(|c| c.is_some()).count() as u64 * CHUNK as u64
    }
}

#[derive(Clone, Debug)]
enum Content {
    File(Data),
    Dir(BTreeMap<OsString, u64>),
    Symlink(OsString),
}

impl Content {
    fn kind(&self) -> FileType {
        match self {
            Content::File(_) => FileType::RegularFile,
            Content::Dir(_) => FileType::Directory,
            Content::Symlink(_) => FileType::Symlink,
        }
    }
}

#[derive(Debug)]
struct Node {
    meta: Meta,
    content: Content,
    durable_meta: Meta,
    durable_content: Content,
    /// Directories: the directory holding the current entry (for `..`).
    parent: u64,
    /// Entries naming this inode in the current namespace.
    links: u32,
    /// Outstanding FUSE lookups (the kernel still knows this inode).
    lookups: u64,
    /// Entries naming this inode in some directory's durable state.
    durable_refs: u32,
    /// Bytes written since the last fsync.
    unsynced: u64,
}

impl Node {
    fn new(content: Content, meta: Meta, parent: u64) -> Node {
        Node {
            durable_meta: meta.clone(),
            // A new inode is durable only as the empty thing it was created
            // as (a symlink's target never changes).
            durable_content: match &content {
                Content::File(_) => Content::File(Data::default()),
                Content::Dir(_) => Content::Dir(BTreeMap::new()),
                Content::Symlink(t) => Content::Symlink(t.clone()),
            },
            meta,
            content,
            parent,
            links: 1,
            lookups: 1,
            durable_refs: 0,
            unsynced: 0,
        }
    }

    fn is_dir(&self) -> bool {
        matches!(self.content, Content::Dir(_))
    }
}

/// What a cut throws away, measured at the instant of the cut.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Loss {
    /// Bytes of file data that will not read back: bytes written since the
    /// last fsync of files that stay reachable, and the whole size of files
    /// whose name is not durable.
    pub(crate) bytes: u64,
    /// Directory entries whose current state differs from the durable one
    /// (created, removed or renamed and not yet covered by a directory fsync).
    pub(crate) entries: u64,
}

/// Attribute changes of a SETATTR request.
#[derive(Debug, Default)]
pub(crate) struct SetAttr {
    pub(crate) mode: Option<u32>,
    pub(crate) uid: Option<u32>,
    pub(crate) gid: Option<u32>,
    pub(crate) size: Option<u64>,
    pub(crate) atime: Option<SystemTime>,
    pub(crate) mtime: Option<SystemTime>,
}

/// `statfs` figures.
#[derive(Debug)]
pub(crate) struct FsStats {
    pub(crate) blocks: u64,
    pub(crate) bfree: u64,
    pub(crate) files: u64,
    pub(crate) ffree: u64,
}

/// The filesystem tree with current and durable state.
#[derive(Debug)]
pub(crate) struct Model {
    nodes: HashMap<u64, Node>,
    next_ino: u64,
}

impl Model {
    /// An empty filesystem whose (durable) root belongs to `uid:gid`.
    pub(crate) fn new(uid: u32, gid: u32) -> Model {
        let mut root = Node::new(
            Content::Dir(BTreeMap::new()),
            Meta::new(0o755, uid, gid),
            ROOT,
        );
        root.lookups = 0;
        Model {
            nodes: HashMap::from([(ROOT, root)]),
            next_ino: ROOT + 1,
        }
    }

    fn node(&self, ino: u64) -> Result<&Node> {
        self.nodes.get(&ino).ok_or(libc::ENOENT)
    }

    fn node_mut(&mut self, ino: u64) -> Result<&mut Node> {
        self.nodes.get_mut(&ino).ok_or(libc::ENOENT)
    }

    fn entries(&self, dir: u64) -> Result<&BTreeMap<OsString, u64>> {
        match &self.node(dir)?.content {
            Content::Dir(entries) => Ok(entries),
            _ => Err(libc::ENOTDIR),
        }
    }

    fn entries_mut(&mut self, dir: u64) -> Result<&mut BTreeMap<OsString, u64>> {
        match &mut self.node_mut(dir)?.content {
            Content::Dir(entries) => Ok(entries),
            _ => Err(libc::ENOTDIR),
        }
    }

    fn data_mut(&mut self, ino: u64) -> Result<&mut Data> {
        match &mut self.node_mut(ino)?.content {
            Content::File(data) => Ok(data),
            Content::Dir(_) => Err(libc::EISDIR),
            Content::Symlink(_) => Err(libc::EINVAL),
        }
    }

    /// Attributes of `ino` as FUSE reports them.
    pub(crate) fn attr(&self, ino: u64) -> Result<FileAttr> {
        let node = self.node(ino)?;
        let (size, blocks, nlink) = match &node.content {
            Content::File(data) => (data.size, data.allocated_bytes() / 512, node.links),
            Content::Dir(entries) => {
                let subdirs = entries
                    .values()
                    .filter(|c| self.nodes.get(c).is_some_and(Node::is_dir))
                    .count() as u32;
                let nlink = if node.links > 0 || ino == ROOT {
                    2 + subdirs
                } else {
                    0
                };
                (u64::from(BLOCK), u64::from(BLOCK) / 512, nlink)
            }
            Content::Symlink(target) => (target.len() as u64, 0, node.links),
        };
        Ok(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks,
            atime: node.meta.atime,
            mtime: node.meta.mtime,
            ctime: node.meta.ctime,
            crtime: node.meta.ctime,
            kind: node.content.kind(),
            perm: node.meta.perm,
            nlink,
            uid: node.meta.uid,
            gid: node.meta.gid,
            rdev: 0,
            blksize: BLOCK,
            flags: 0,
        })
    }

    /// Resolve `name` in `parent`, counting a kernel lookup on success.
    pub(crate) fn lookup(&mut self, parent: u64, name: &OsStr) -> Result<FileAttr> {
        let ino = *self.entries(parent)?.get(name).ok_or(libc::ENOENT)?;
        self.node_mut(ino)?.lookups += 1;
        self.attr(ino)
    }

    /// The kernel dropped `n` lookups of `ino`.
    pub(crate) fn forget(&mut self, ino: u64, n: u64) {
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.lookups = node.lookups.saturating_sub(n);
            self.collect(ino);
        }
    }

    fn check_new_name(&self, parent: u64, name: &OsStr) -> Result<()> {
        if name.len() > NAME_MAX {
            return Err(libc::ENAMETOOLONG);
        }
        if name.is_empty() || name == "." || name == ".." {
            return Err(libc::EINVAL);
        }
        if self.entries(parent)?.contains_key(name) {
            return Err(libc::EEXIST);
        }
        Ok(())
    }

    fn add(&mut self, parent: u64, name: &OsStr, content: Content, meta: Meta) -> Result<FileAttr> {
        self.check_new_name(parent, name)?;
        let ino = self.next_ino;
        self.next_ino += 1;
        self.nodes.insert(ino, Node::new(content, meta, parent));
        self.entries_mut(parent)?.insert(name.to_owned(), ino);
        self.node_mut(parent)?.meta.touch();
        self.attr(ino)
    }

    /// Create an empty regular file (`mode` already has the umask applied).
    pub(crate) fn create(
        &mut self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> Result<FileAttr> {
        let meta = Meta::new((mode & 0o7777) as u16, uid, gid);
        self.add(parent, name, Content::File(Data::default()), meta)
    }

    pub(crate) fn mkdir(
        &mut self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> Result<FileAttr> {
        let meta = Meta::new((mode & 0o7777) as u16, uid, gid);
        self.add(parent, name, Content::Dir(BTreeMap::new()), meta)
    }

    pub(crate) fn symlink(
        &mut self,
        parent: u64,
        name: &OsStr,
        target: &OsStr,
        uid: u32,
        gid: u32,
    ) -> Result<FileAttr> {
        let meta = Meta::new(0o777, uid, gid);
        self.add(parent, name, Content::Symlink(target.to_owned()), meta)
    }

    pub(crate) fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        match &self.node(ino)?.content {
            Content::Symlink(target) => Ok(target.as_encoded_bytes().to_vec()),
            _ => Err(libc::EINVAL),
        }
    }

    /// Hard link `ino` as `parent/name`.
    pub(crate) fn link(&mut self, ino: u64, parent: u64, name: &OsStr) -> Result<FileAttr> {
        if self.node(ino)?.is_dir() {
            return Err(libc::EPERM);
        }
        self.check_new_name(parent, name)?;
        self.entries_mut(parent)?.insert(name.to_owned(), ino);
        self.node_mut(parent)?.meta.touch();
        let node = self.node_mut(ino)?;
        node.links += 1;
        node.lookups += 1;
        node.meta.ctime = SystemTime::now();
        self.attr(ino)
    }

    /// Drop one current link to `ino` (already removed from its directory).
    fn unlinked(&mut self, ino: u64) {
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.links = node.links.saturating_sub(1);
            node.meta.ctime = SystemTime::now();
        }
        self.collect(ino);
    }

    pub(crate) fn unlink(&mut self, parent: u64, name: &OsStr) -> Result<()> {
        let ino = *self.entries(parent)?.get(name).ok_or(libc::ENOENT)?;
        if self.node(ino)?.is_dir() {
            return Err(libc::EISDIR);
        }
        self.entries_mut(parent)?.remove(name);
        self.node_mut(parent)?.meta.touch();
        self.unlinked(ino);
        Ok(())
    }

    pub(crate) fn rmdir(&mut self, parent: u64, name: &OsStr) -> Result<()> {
        let ino = *self.entries(parent)?.get(name).ok_or(libc::ENOENT)?;
        if !self.entries(ino)?.is_empty() {
            return Err(libc::ENOTEMPTY);
        }
        self.entries_mut(parent)?.remove(name);
        self.node_mut(parent)?.meta.touch();
        self.unlinked(ino);
        Ok(())
    }

    /// Rename `parent/name` to `new_parent/new_name`, atomically replacing a
    /// compatible target. `noreplace` and `exchange` are `renameat2` flags.
    pub(crate) fn rename(
        &mut self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        noreplace: bool,
        exchange: bool,
    ) -> Result<()> {
        if new_name.len() > NAME_MAX {
            return Err(libc::ENAMETOOLONG);
        }
        let src = *self.entries(parent)?.get(name).ok_or(libc::ENOENT)?;
        let dst = self.entries(new_parent)?.get(new_name).copied();
        let src_is_dir = self.node(src)?.is_dir();
        // A directory must not move below itself.
        if src_is_dir && self.is_within(new_parent, src)? {
            return Err(libc::EINVAL);
        }
        if exchange {
            let dst = dst.ok_or(libc::ENOENT)?;
            if dst != src && self.node(dst)?.is_dir() && self.is_within(parent, dst)? {
                return Err(libc::EINVAL);
            }
            self.entries_mut(parent)?.insert(name.to_owned(), dst);
            self.entries_mut(new_parent)?
                .insert(new_name.to_owned(), src);
            self.node_mut(src)?.parent = new_parent;
            self.node_mut(dst)?.parent = parent;
            self.node_mut(parent)?.meta.touch();
            self.node_mut(new_parent)?.meta.touch();
            return Ok(());
        }
        if let Some(dst) = dst {
            if noreplace {
                return Err(libc::EEXIST);
            }
            if dst == src {
                return Ok(());
            }
            match (src_is_dir, self.node(dst)?.is_dir()) {
                (true, false) => return Err(libc::ENOTDIR),
                (false, true) => return Err(libc::EISDIR),
                (true, true) if !self.entries(dst)?.is_empty() => return Err(libc::ENOTEMPTY),
                _ => {}
            }
        }
        self.entries_mut(parent)?.remove(name);
        self.entries_mut(new_parent)?
            .insert(new_name.to_owned(), src);
        let node = self.node_mut(src)?;
        if src_is_dir {
            node.parent = new_parent;
        }
        node.meta.ctime = SystemTime::now();
        self.node_mut(parent)?.meta.touch();
        self.node_mut(new_parent)?.meta.touch();
        if let Some(dst) = dst {
            self.unlinked(dst);
        }
        Ok(())
    }

    /// True when directory `dir` is `ancestor` or lies below it.
    fn is_within(&self, dir: u64, ancestor: u64) -> Result<bool> {
        let mut at = dir;
        // Parent links form a tree; the bound only guards against a bug.
        for _ in 0..=self.nodes.len() {
            if at == ancestor {
                return Ok(true);
            }
            if at == ROOT {
                return Ok(false);
            }
            at = self.node(at)?.parent;
        }
        Err(libc::ELOOP)
    }

    pub(crate) fn setattr(&mut self, ino: u64, change: &SetAttr) -> Result<FileAttr> {
        if let Some(size) = change.size {
            self.data_mut(ino)?.set_size(size)?;
            self.node_mut(ino)?.meta.touch();
        }
        let node = self.node_mut(ino)?;
        if let Some(mode) = change.mode {
            node.meta.perm = (mode & 0o7777) as u16;
        }
        if let Some(uid) = change.uid {
            node.meta.uid = uid;
        }
        if let Some(gid) = change.gid {
            node.meta.gid = gid;
        }
        if let Some(atime) = change.atime {
            node.meta.atime = atime;
        }
        if let Some(mtime) = change.mtime {
            node.meta.mtime = mtime;
        }
        node.meta.ctime = SystemTime::now();
        self.attr(ino)
    }

    pub(crate) fn read(&self, ino: u64, offset: u64, len: usize) -> Result<Vec<u8>> {
        match &self.node(ino)?.content {
            Content::File(data) => Ok(data.read(offset, len)),
            Content::Dir(_) => Err(libc::EISDIR),
            Content::Symlink(_) => Err(libc::EINVAL),
        }
    }

    pub(crate) fn write(&mut self, ino: u64, offset: u64, bytes: &[u8]) -> Result<()> {
        self.data_mut(ino)?.write(offset, bytes)?;
        let node = self.node_mut(ino)?;
        node.meta.touch();
        node.unsynced += bytes.len() as u64;
        Ok(())
    }

    /// `fallocate` modes 0, KEEP_SIZE, PUNCH_HOLE|KEEP_SIZE and ZERO_RANGE
    /// (with or without KEEP_SIZE); others are EOPNOTSUPP.
    pub(crate) fn fallocate(&mut self, ino: u64, offset: u64, len: u64, mode: i32) -> Result<()> {
        let end = offset
            .checked_add(len)
            .filter(|&end| end <= MAX_FILE_SIZE)
            .ok_or(libc::EFBIG)?;
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let data = self.data_mut(ino)?;
        match mode & !libc::FALLOC_FL_KEEP_SIZE {
            0 => {}
            libc::FALLOC_FL_PUNCH_HOLE if keep_size => data.zero(offset, end),
            libc::FALLOC_FL_ZERO_RANGE => data.zero(offset, end),
            _ => return Err(libc::EOPNOTSUPP),
        }
        if !keep_size && end > data.size {
            data.set_size(end)?;
        }
        self.node_mut(ino)?.meta.touch();
        Ok(())
    }

    /// Make the content and attributes of `ino` durable (FSYNC). A
    /// directory synced this way gets [`Model::fsync_dir`].
    pub(crate) fn fsync(&mut self, ino: u64) -> Result<()> {
        if self.node(ino)?.is_dir() {
            return self.fsync_dir(ino);
        }
        let node = self.node_mut(ino)?;
        node.durable_meta = node.meta.clone();
        node.durable_content = node.content.clone();
        node.unsynced = 0;
        Ok(())
    }

    /// Make the entries and attributes of directory `ino` durable (FSYNCDIR).
    pub(crate) fn fsync_dir(&mut self, ino: u64) -> Result<()> {
        let node = self.node_mut(ino)?;
        let Content::Dir(current) = &node.content else {
            return Err(libc::ENOTDIR);
        };
        let current = current.clone();
        let old = std::mem::replace(&mut node.durable_content, Content::Dir(current.clone()));
        node.durable_meta = node.meta.clone();
        for child in current.values() {
            if let Some(c) = self.nodes.get_mut(child) {
                c.durable_refs += 1;
            }
        }
        if let Content::Dir(old) = old {
            for child in old.values() {
                if let Some(c) = self.nodes.get_mut(child) {
                    c.durable_refs = c.durable_refs.saturating_sub(1);
                }
                self.collect(*child);
            }
        }
        Ok(())
    }

    /// Entries of directory `ino` for READDIR, with `.` and `..` first.
    pub(crate) fn list(&self, ino: u64) -> Result<Vec<(u64, FileType, OsString)>> {
        let entries = self.entries(ino)?;
        let mut out = Vec::with_capacity(entries.len() + 2);
        out.push((ino, FileType::Directory, OsString::from(".")));
        out.push((
            self.node(ino)?.parent,
            FileType::Directory,
            OsString::from(".."),
        ));
        for (name, child) in entries {
            let kind = self.node(*child)?.content.kind();
            out.push((*child, kind, name.clone()));
        }
        Ok(out)
    }

    pub(crate) fn statfs(&self) -> FsStats {
        let used: u64 = self
            .nodes
            .values()
            .map(|n| match &n.content {
                Content::File(d) => d.allocated_bytes().div_ceil(u64::from(BLOCK)),
                _ => 1,
            })
            .sum();
        FsStats {
            blocks: CAPACITY_BLOCKS,
            bfree: CAPACITY_BLOCKS.saturating_sub(used),
            files: CAPACITY_INODES,
            ffree: CAPACITY_INODES.saturating_sub(self.nodes.len() as u64),
        }
    }

    /// Forget `ino` once nothing can reach it any more: no current entry, no
    /// kernel reference, no durable entry. Removing a directory releases the
    /// inodes its durable entries kept alive.
    fn collect(&mut self, ino: u64) {
        let mut work = vec![ino];
        while let Some(ino) = work.pop() {
            let Some(node) = self.nodes.get(&ino) else {
                continue;
            };
            if ino == ROOT || node.links > 0 || node.lookups > 0 || node.durable_refs > 0 {
                continue;
            }
            let Some(node) = self.nodes.remove(&ino) else {
                continue;
            };
            if let Content::Dir(durable) = node.durable_content {
                for child in durable.into_values() {
                    if let Some(c) = self.nodes.get_mut(&child) {
                        c.durable_refs = c.durable_refs.saturating_sub(1);
                    }
                    work.push(child);
                }
            }
        }
    }

    /// Walk the durable tree from the root: each directory's durable entries
    /// that lead to an existing inode, visiting a directory only once (a
    /// directory renamed between two directories that were both synced may
    /// be named twice; the first name in walk order wins).
    fn durable_tree(&self) -> HashMap<u64, (u64, BTreeMap<OsString, u64>)> {
        let mut dirs: HashMap<u64, (u64, BTreeMap<OsString, u64>)> = HashMap::new();
        let mut seen = HashSet::from([ROOT]);
        let mut queue = vec![(ROOT, ROOT)];
        while let Some((dir, parent)) = queue.pop() {
            let Some(Content::Dir(durable)) = self.nodes.get(&dir).map(|n| &n.durable_content)
            else {
                continue;
            };
            let mut kept = BTreeMap::new();
            for (name, &child) in durable {
                let Some(node) = self.nodes.get(&child) else {
                    continue;
                };
                let child_is_dir = matches!(node.durable_content, Content::Dir(_));
                if child_is_dir {
                    if !seen.insert(child) {
                        continue;
                    }
                    queue.push((child, dir));
                }
                kept.insert(name.clone(), child);
            }
            dirs.insert(dir, (parent, kept));
        }
        dirs
    }

    /// What a cut at this instant loses.
    pub(crate) fn loss(&self) -> Loss {
        let tree = self.durable_tree();
        let mut reachable: HashSet<u64> = tree.keys().copied().collect();
        reachable.extend(tree.values().flat_map(|(_, e)| e.values().copied()));
        let mut loss = Loss::default();
        for (&ino, node) in &self.nodes {
            if node.links == 0 && ino != ROOT {
                continue;
            }
            match &node.content {
                Content::File(_) if reachable.contains(&ino) => loss.bytes += node.unsynced,
                Content::File(data) => loss.bytes += data.size,
                Content::Dir(current) => {
                    let empty = BTreeMap::new();
                    let durable = match &node.durable_content {
                        Content::Dir(d) if reachable.contains(&ino) => d,
                        _ => &empty,
                    };
                    loss.entries += current
                        .iter()
                        .filter(|(name, ino)| durable.get(*name) != Some(ino))
                        .count() as u64;
                    loss.entries += durable
                        .keys()
                        .filter(|name| !current.contains_key(*name))
                        .count() as u64;
                }
                Content::Symlink(_) => {}
            }
        }
        loss
    }

    /// Power on: every inode reachable through durable directory entries
    /// comes back in its durable state; everything else is gone. The kernel
    /// knows no inode afterwards (a fresh mount follows).
    pub(crate) fn power_on(&mut self) {
        let tree = self.durable_tree();
        let mut links: HashMap<u64, u32> = HashMap::new();
        for (_, entries) in tree.values() {
            for child in entries.values() {
                *links.entry(*child).or_default() += 1;
            }
        }
        let old = std::mem::take(&mut self.nodes);
        for (ino, mut node) in old {
            let content = match tree.get(&ino) {
                Some((parent, entries)) => {
                    node.parent = *parent;
                    Content::Dir(entries.clone())
                }
                None if links.contains_key(&ino) => node.durable_content,
                None => continue,
            };
            node.meta = node.durable_meta.clone();
            node.content = content.clone();
            node.durable_content = content;
            node.links = links.get(&ino).copied().unwrap_or(0);
            node.durable_refs = node.links;
            node.lookups = 0;
            node.unsynced = 0;
            self.nodes.insert(ino, node);
        }
    }

    /// Make everything durable, as if the machine had shut down cleanly.
    pub(crate) fn sync_all(&mut self) {
        let inos: Vec<u64> = self.nodes.keys().copied().collect();
        for ino in inos {
            // Every inode exists; fsync cannot fail here.
            let _ = self.fsync(ino);
        }
    }

    /// Number of inodes held (current or durable).
    #[cfg(test)]
    fn inode_count(&self) -> usize {
        self.nodes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> &OsStr {
        OsStr::new(s)
    }

    fn file(m: &mut Model, dir: u64, n: &str) -> u64 {
        m.create(dir, name(n), 0o644, 0, 0)
            .map(|a| a.ino.0)
            .unwrap_or(0)
    }

    fn content(m: &Model, dir: u64, n: &str) -> Option<Vec<u8>> {
        let ino = *m.entries(dir).ok()?.get(name(n))?;
        m.read(ino, 0, usize::MAX >> 1).ok()
    }

    #[test]
    fn unsynced_write_is_lost_and_synced_write_survives() {
        let mut m = Model::new(0, 0);
        let a = file(&mut m, ROOT, "a");
        let b = file(&mut m, ROOT, "b");
        m.fsync_dir(ROOT).unwrap();
        m.write(a, 0, b"lost").unwrap();
        m.write(b, 0, b"kept").unwrap();
        m.fsync(b).unwrap();
        m.write(b, 4, b"+lost").unwrap();
        assert_eq!(
            m.loss(),
            Loss {
                bytes: 9,
                entries: 0
            }
        );
        m.power_on();
        assert_eq!(content(&m, ROOT, "a"), Some(Vec::new()));
        assert_eq!(content(&m, ROOT, "b"), Some(b"kept".to_vec()));
    }

    #[test]
    fn rename_without_dir_sync_reverts_to_the_old_entry() {
        let mut m = Model::new(0, 0);
        let old = file(&mut m, ROOT, "f");
        m.write(old, 0, b"old").unwrap();
        m.fsync(old).unwrap();
        m.fsync_dir(ROOT).unwrap();
        let new = file(&mut m, ROOT, "f.tmp");
        m.write(new, 0, b"new").unwrap();
        m.fsync(new).unwrap();
        m.rename(ROOT, name("f.tmp"), ROOT, name("f"), false, false)
            .unwrap();
        assert_eq!(content(&m, ROOT, "f"), Some(b"new".to_vec()));
        m.power_on();
        assert_eq!(content(&m, ROOT, "f"), Some(b"old".to_vec()));
        assert_eq!(content(&m, ROOT, "f.tmp"), None);
        assert_eq!(m.inode_count(), 2, "the new inode is forgotten");
    }

    #[test]
    fn cross_directory_rename_synced_only_at_the_target_keeps_both_names() {
        let mut m = Model::new(0, 0);
        let d1 = m.mkdir(ROOT, name("d1"), 0o755, 0, 0).unwrap().ino.0;
        let d2 = m.mkdir(ROOT, name("d2"), 0o755, 0, 0).unwrap().ino.0;
        let f = file(&mut m, d1, "f");
        m.write(f, 0, b"x").unwrap();
        m.fsync(f).unwrap();
        m.fsync_dir(d1).unwrap();
        m.fsync_dir(ROOT).unwrap();
        m.rename(d1, name("f"), d2, name("g"), false, false)
            .unwrap();
        m.fsync_dir(d2).unwrap();
        m.power_on();
        assert_eq!(content(&m, d1, "f"), Some(b"x".to_vec()));
        assert_eq!(content(&m, d2, "g"), Some(b"x".to_vec()));
        assert_eq!(m.attr(f).unwrap().nlink, 2);
    }

    #[test]
    fn directory_named_twice_durably_comes_back_once() {
        let mut m = Model::new(0, 0);
        let d1 = m.mkdir(ROOT, name("d1"), 0o755, 0, 0).unwrap().ino.0;
        let d2 = m.mkdir(ROOT, name("d2"), 0o755, 0, 0).unwrap().ino.0;
        m.mkdir(d1, name("sub"), 0o755, 0, 0).unwrap();
        m.fsync_dir(d1).unwrap();
        m.fsync_dir(ROOT).unwrap();
        m.rename(d1, name("sub"), d2, name("sub"), false, false)
            .unwrap();
        m.fsync_dir(d2).unwrap();
        m.power_on();
        let named = [d1, d2]
            .iter()
            .filter(|d| m.entries(**d).unwrap().contains_key(name("sub")))
            .count();
        assert_eq!(named, 1);
    }

    #[test]
    fn truncate_then_extend_reads_zeros_and_fsync_shares_chunks() {
        let mut m = Model::new(0, 0);
        let f = file(&mut m, ROOT, "f");
        m.write(f, 0, &vec![7u8; 3 * CHUNK + 5]).unwrap();
        m.fsync(f).unwrap();
        let shrink = SetAttr {
            size: Some(CHUNK as u64 + 1),
            ..SetAttr::default()
        };
        m.setattr(f, &shrink).unwrap();
        let grow = SetAttr {
            size: Some(2 * CHUNK as u64),
            ..SetAttr::default()
        };
        m.setattr(f, &grow).unwrap();
        let now = m.read(f, 0, 2 * CHUNK).unwrap();
        assert_eq!(now.len(), 2 * CHUNK);
        assert!(now[..=CHUNK].iter().all(|&b| b == 7));
        assert!(now[CHUNK + 1..].iter().all(|&b| b == 0));
        m.fsync_dir(ROOT).unwrap();
        m.power_on();
        assert_eq!(m.read(f, 0, 4 * CHUNK).unwrap(), vec![7u8; 3 * CHUNK + 5]);
    }

    #[test]
    fn unlinked_inodes_are_forgotten_once_nothing_refers_to_them() {
        let mut m = Model::new(0, 0);
        let f = file(&mut m, ROOT, "f");
        m.fsync_dir(ROOT).unwrap();
        m.unlink(ROOT, name("f")).unwrap();
        m.forget(f, 1);
        assert_eq!(m.inode_count(), 2, "the durable entry still names it");
        m.fsync_dir(ROOT).unwrap();
        assert_eq!(m.inode_count(), 1);
    }
}
