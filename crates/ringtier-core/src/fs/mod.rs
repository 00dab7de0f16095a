//! Blocking filesystem helpers shared by the file tiers (posix and io_uring).
//!
//! [`FsRoot`] maps validated keys to files under one root directory. Files are opened with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` relative to the root's descriptor, so
//! neither a `..` nor a symlink can reach outside the root. Staged (uncommitted) objects live
//! in `ROOT/.ringtier-staging/`, which listing skips, and become visible only through
//! [`FsRoot::commit_staged`]: data fsync, atomic rename, directory fsync.
//!
//! A read-only dataset root may instead follow symbolic links ([`FsRoot::following_links`]):
//! files and directories that are links (to another disk, a shared copy) are listed and read
//! through the links, as torchvision's `ImageFolder` (`os.walk(followlinks=True)`) does; a
//! link that leads back to a directory it is in is reported as a loop. Keys are still
//! validated (no `..`, no absolute path), so only a link placed in the root leads out of it.
//! Tiers that write (checkpoint stores) never follow links out of their root.

use std::ffi::CString;
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::blocking::BlockingPool;

use crate::error::{Error, ErrorKind, Operation, Result};
use crate::key::{validate_key, validate_prefix, RESERVED_PREFIX};
use crate::tier::{ObjectMeta, Space};

/// Name of the staging directory inside a file tier's root.
pub const STAGING_DIR: &str = ".ringtier-staging";

static STAGING_SEQ: AtomicU64 = AtomicU64::new(0);

/// The path of a new staged file, removed when dropped unless [`StagedPath::keep`] takes it.
///
/// A staged file is made on a blocking thread for a caller that may have dropped its future
/// meanwhile: returning the path in this guard makes the unanswered result remove the file
/// (the pool drops it) instead of leaving it in the staging directory for the life of the
/// process.
#[derive(Debug)]
pub struct StagedPath(Option<PathBuf>);

impl StagedPath {
    /// Guards the staged file at `path`.
    pub fn new(path: PathBuf) -> Self {
        StagedPath(Some(path))
    }

    /// Hands the path on (to the writer that now owns the file); nothing is removed.
    pub fn keep(mut self) -> PathBuf {
        self.0.take().unwrap_or_default()
    }
}

impl Drop for StagedPath {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = fs::remove_file(path);
        }
    }
}

/// The root directory of a file tier.
#[derive(Debug)]
pub struct FsRoot {
    root: PathBuf,
    root_fd: OwnedFd,
    staging: PathBuf,
    durable: bool,
    follow_links: bool,
    /// Held while a commit checks for, creates and fsyncs missing parent directories: a
    /// directory another commit created but has not fsynced into its parent yet must not
    /// look durable to a concurrent commit that renames into it.
    dirs: std::sync::Mutex<()>,
}

/// `open_how` for `openat2` confined beneath the directory descriptor.
pub fn open_how_beneath(flags: i32, mode: u32) -> libc::open_how {
    // SAFETY: open_how is a plain C struct for which all-zero is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.mode = if flags & libc::O_CREAT != 0 { mode as u64 } else { 0 };
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    how
}

fn cstring(s: &[u8]) -> Result<CString> {
    CString::new(s).map_err(|_| Error::new(ErrorKind::InvalidKey, "path contains NUL"))
}

/// `fsync` of a directory, making renames and new entries in it durable.
pub fn fsync_dir(path: &Path) -> Result<()> {
    let dir = File::open(path).map_err(|e| Error::from(e).with_key(path.display().to_string()))?;
    dir.sync_all().map_err(|e| Error::from(e).with_key(path.display().to_string()))
}

impl FsRoot {
    /// Opens `root`, creating it (and the staging directory) when `create` is set.
    pub fn open(root: impl AsRef<Path>, create: bool) -> Result<Self> {
        let root = root.as_ref().to_path_buf();
        let ctx = |e: io::Error| Error::from(e).with_operation(Operation::Open).with_key(root.display().to_string());
        if create {
            fs::create_dir_all(&root).map_err(ctx)?;
        }
        let meta = fs::metadata(&root).map_err(ctx)?;
        if !meta.is_dir() {
            return Err(Error::new(ErrorKind::InvalidInput, "tier root is not a directory")
                .with_operation(Operation::Open)
                .with_key(root.display().to_string()));
        }
        let c = cstring(root.as_os_str().as_bytes())?;
        // SAFETY: c is a valid NUL-terminated path; the flags open a directory read-only.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(ctx(io::Error::last_os_error()));
        }
        // SAFETY: fd is a freshly opened descriptor that nothing else owns.
        let root_fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let staging = root.join(STAGING_DIR);
        let durable = fs_type_of_fd(root_fd.as_raw_fd()).is_none_or(|t| !is_volatile_fs_type(t));
        Ok(FsRoot { root, root_fd, staging, durable, follow_links: false, dirs: std::sync::Mutex::default() })
    }

    /// This root, following symbolic links that lead out of it when `follow` is set: for
    /// read-only dataset roots whose files or class folders are links. Opens then resolve with
    /// `RESOLVE_NO_MAGICLINKS` only (keys are still validated: no `..`, no absolute path),
    /// and listings descend into linked directories, detecting loops.
    pub fn following_links(mut self, follow: bool) -> Self {
        self.follow_links = follow;
        self
    }

    /// True when symbolic links out of the root are followed (see [`FsRoot::following_links`]).
    pub fn follows_links(&self) -> bool {
        self.follow_links
    }

    /// A root that follows links is read-only: a write or delete through a link could land
    /// outside the root.
    fn check_writable(&self, op: Operation, key: &str) -> Result<()> {
        if self.follow_links {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "this tier follows symbolic links out of its root and is read-only",
            )
            .with_operation(op)
            .with_key(key));
        }
        Ok(())
    }

    /// The `RESOLVE_*` flags of `openat2` for keys of this root: `RESOLVE_BENEATH |
    /// RESOLVE_NO_MAGICLINKS`, or only `RESOLVE_NO_MAGICLINKS` when following links.
    pub fn resolve_flags(&self) -> u64 {
        if self.follow_links {
            libc::RESOLVE_NO_MAGICLINKS
        } else {
            libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS
        }
    }

    /// Whether committed files survive a machine crash: false on a file system held in memory
    /// (tmpfs, ramfs), true otherwise (also when the type cannot be told). Decided at open.
    pub fn durable(&self) -> bool {
        self.durable
    }

    /// Free and total bytes of the root's file system now (`fstatvfs`): the room a writer has.
    pub fn space(&self) -> Result<Space> {
        space_of_fd(self.root_fd.as_raw_fd())
            .map_err(|e| e.with_operation(Operation::Stat).with_key(self.root.display().to_string()))
    }

    /// The root directory.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// Descriptor of the root directory (for `openat2` relative to it, e.g. from io_uring).
    pub fn root_fd(&self) -> RawFd {
        self.root_fd.as_raw_fd()
    }

    /// The file path of a key. The key must already be validated.
    pub fn path_of(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    /// Opens `key` relative to the root with `openat2(RESOLVE_BENEATH)`.
    pub fn open_beneath(&self, key: &str, flags: i32, mode: u32) -> Result<OwnedFd> {
        validate_key(key)?;
        let c = cstring(key.as_bytes())?;
        let mut how = open_how_beneath(flags, mode);
        how.resolve = self.resolve_flags();
        // SAFETY: root_fd is open, c is NUL-terminated and how is a valid open_how of the size
        // passed.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                self.root_fd.as_raw_fd(),
                c.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd < 0 {
            return Err(Error::from(io::Error::last_os_error()).with_operation(Operation::Open).with_key(key));
        }
        // SAFETY: fd is a freshly opened descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
    }

    /// Runs a blocking call of this root (`FsRoot::stat`, `list`, `delete`) on `pool` and adds
    /// the tier's error context: the metadata path shared by the file tiers.
    pub async fn run_on<R: Send + 'static>(
        self: &Arc<Self>,
        pool: &BlockingPool,
        op: Operation,
        key: &str,
        tier: &str,
        f: fn(&FsRoot, &str) -> Result<R>,
    ) -> Result<R> {
        let (root, k) = (Arc::clone(self), key.to_string());
        pool.run(move || f(&root, &k)).await.map_err(|e| e.context(op, key, tier))
    }

    /// Metadata of a committed object (a regular file under the root).
    pub fn stat(&self, key: &str) -> Result<ObjectMeta> {
        validate_key(key)?;
        let path = self.path_of(key);
        let meta = if self.follow_links { fs::metadata(&path) } else { fs::symlink_metadata(&path) };
        let meta = meta.map_err(|e| Error::from(e).with_operation(Operation::Stat).with_key(key))?;
        if !meta.is_file() {
            return Err(Error::new(ErrorKind::NotFound, "not a regular file")
                .with_operation(Operation::Stat)
                .with_key(key));
        }
        Ok(ObjectMeta { key: key.to_string(), size: meta.len(), modified: meta.modified().ok() })
    }

    /// Committed objects whose key starts with `prefix`, sorted.
    pub fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        validate_prefix(prefix)?;
        // Start at the deepest directory the prefix names completely.
        let dir_part = match prefix.rfind('/') {
            Some(i) => &prefix[..i],
            None => "",
        };
        let start = if dir_part.is_empty() { self.root.clone() } else { self.root.join(dir_part) };
        let mut out = Vec::new();
        // (directory, its key, the (device, inode) of it and of the directories above it:
        // a linked directory met again below itself is a loop).
        let ancestors = match fs::metadata(&start) {
            Ok(m) if self.follow_links => vec![(m.dev(), m.ino())],
            _ => Vec::new(),
        };
        let mut stack = vec![(start, dir_part.to_string(), ancestors)];
        while let Some((dir, rel, ancestors)) = stack.pop() {
            let rd = match fs::read_dir(&dir) {
                Ok(rd) => rd,
                Err(e) if e.kind() == io::ErrorKind::NotFound && dir != self.root => continue,
                Err(e) => return Err(Error::from(e).with_operation(Operation::List).with_key(prefix)),
            };
            for ent in rd {
                let ent = ent.map_err(|e| Error::from(e).with_operation(Operation::List).with_key(prefix))?;
                let name = ent.file_name();
                let Some(name) = name.to_str() else { continue };
                if name.starts_with(RESERVED_PREFIX) {
                    continue;
                }
                let key = if rel.is_empty() { name.to_string() } else { format!("{rel}/{name}") };
                let ft = match ent.file_type() {
                    Ok(ft) => ft,
                    Err(_) => continue,
                };
                // Through a link when following links: what it points at decides.
                let followed = if self.follow_links && ft.is_symlink() {
                    match fs::metadata(ent.path()) {
                        Ok(m) => Some(m),
                        Err(e) => {
                            return Err(Error::new(
                                crate::error::kind_of_errno(e.raw_os_error().unwrap_or(libc::EIO)),
                                format!("broken symbolic link ({e}): {}", ent.path().display()),
                            )
                            .with_operation(Operation::List)
                            .with_key(key))
                        }
                    }
                } else {
                    None
                };
                let is_dir = followed.as_ref().map_or(ft.is_dir(), |m| m.is_dir());
                let is_file = followed.as_ref().map_or(ft.is_file(), |m| m.is_file());
                if is_dir {
                    // Descend only where keys below can still match the prefix.
                    if prefix.starts_with(&format!("{key}/"))
                        || key.starts_with(prefix)
                        || format!("{key}/").starts_with(prefix)
                    {
                        let mut below = ancestors.clone();
                        if self.follow_links {
                            let id = match &followed {
                                Some(m) => (m.dev(), m.ino()),
                                None => match ent.metadata() {
                                    Ok(m) => (m.dev(), m.ino()),
                                    Err(_) => continue,
                                },
                            };
                            if ancestors.contains(&id) {
                                return Err(Error::new(
                                    ErrorKind::InvalidInput,
                                    format!(
                                        "symbolic link loop: {} leads back to a directory it is in",
                                        ent.path().display()
                                    ),
                                )
                                .with_operation(Operation::List)
                                .with_key(key));
                            }
                            below.push(id);
                        }
                        stack.push((ent.path(), key, below));
                    }
                } else if is_file && key.starts_with(prefix) {
                    let meta = match followed {
                        Some(m) => Ok(m),
                        None => ent.metadata(),
                    };
                    match meta {
                        Ok(m) => out.push(ObjectMeta { key, size: m.len(), modified: m.modified().ok() }),
                        // Deleted between readdir and stat: not listed.
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => return Err(Error::from(e).with_operation(Operation::List).with_key(key)),
                    }
                }
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// Takes the exclusive advisory lock `name` on the root: `flock` on
    /// `ROOT/.ringtier-lock-NAME` (never listed), which records the holder's pid. Fails at once
    /// with [`ErrorKind::Busy`] when another open file description holds it (another process,
    /// or another open in this one); the kernel releases it when the holder exits.
    pub fn lock(&self, name: &str) -> Result<crate::tier::TierLock> {
        use std::io::{Read, Seek, Write};
        validate_key(name)?;
        if name.contains('/') {
            return Err(Error::new(ErrorKind::InvalidKey, format!("lock name {name:?}: one path component")));
        }
        let path = self.root.join(format!("{RESERVED_PREFIX}-lock-{name}"));
        let ctx = |e: io::Error| Error::from(e).with_operation(Operation::Open).with_key(name);
        let mut file =
            fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).map_err(ctx)?;
        // SAFETY: flock on a descriptor we own; LOCK_NB never blocks.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                return Err(Error::new(
                    ErrorKind::Busy,
                    format!(
                        "{} is locked by {}",
                        path.display(),
                        if holder.is_empty() { "another process" } else { holder }
                    ),
                ));
            }
            return Err(ctx(e));
        }
        file.set_len(0).map_err(ctx)?;
        file.rewind().map_err(ctx)?;
        write!(file, "pid {}", std::process::id()).map_err(ctx)?;
        Ok(crate::tier::TierLock::new(file))
    }

    /// Removes a committed object and makes the removal durable.
    pub fn delete(&self, key: &str) -> Result<()> {
        self.check_writable(Operation::Delete, key)?;
        let meta = self.stat(key).map_err(|e| e.with_operation(Operation::Delete))?;
        let path = self.path_of(&meta.key);
        fs::remove_file(&path).map_err(|e| Error::from(e).with_operation(Operation::Delete).with_key(key))?;
        if let Some(parent) = path.parent() {
            fsync_dir(parent).map_err(|e| e.with_operation(Operation::Delete))?;
        }
        Ok(())
    }

    /// A fresh path in the staging directory (created on first use).
    pub fn new_staging_path(&self) -> Result<PathBuf> {
        self.check_writable(Operation::Create, STAGING_DIR)?;
        if !self.staging.is_dir() {
            fs::create_dir_all(&self.staging)
                .map_err(|e| Error::from(e).with_operation(Operation::Create).with_key(STAGING_DIR))?;
        }
        let seq = STAGING_SEQ.fetch_add(1, Ordering::Relaxed);
        Ok(self.staging.join(format!("{}-{seq}", std::process::id())))
    }

    /// Makes a staged file durable and visible under `key`: fsync the data, create missing
    /// parent directories, rename atomically, fsync every directory that changed.
    pub fn commit_staged(&self, file: &File, staged: &Path, key: &str) -> Result<ObjectMeta> {
        validate_key(key)?;
        file.sync_data().map_err(|e| Error::from(e).with_operation(Operation::Commit).with_key(key))?;
        self.publish_staged(file, staged, key)
    }

    /// The second half of [`FsRoot::commit_staged`], for callers that synced the data
    /// themselves: create missing parents, rename atomically, fsync the directories.
    pub fn publish_staged(&self, file: &File, staged: &Path, key: &str) -> Result<ObjectMeta> {
        self.rename_staged(file, staged, key, true)
    }

    /// Publishes a staged file without any fsync: create missing parents and rename
    /// atomically. The object is whole or absent after the process dies (the page cache
    /// keeps what was written), but after a power cut or an OS crash it may be missing or
    /// shorter than written. For copies whose source stays durable elsewhere (a checkpoint
    /// restored into a directory with `--no-sync`); [`FsRoot::commit_staged`] is the durable
    /// commit.
    pub fn publish_staged_unsynced(&self, file: &File, staged: &Path, key: &str) -> Result<ObjectMeta> {
        self.rename_staged(file, staged, key, false)
    }

    fn rename_staged(&self, file: &File, staged: &Path, key: &str, sync: bool) -> Result<ObjectMeta> {
        let ctx = |e: io::Error| Error::from(e).with_operation(Operation::Commit).with_key(key);
        validate_key(key)?;
        let dest = self.path_of(key);
        let parent = dest.parent().unwrap_or(&self.root).to_path_buf();
        // Create missing parents one level at a time so each new entry can be fsynced; under
        // the lock, so that a parent found present is one whose creation is durable.
        let dirs = self.dirs.lock().unwrap_or_else(|p| p.into_inner());
        let mut missing = Vec::new();
        let mut p = parent.as_path();
        while p != self.root && !p.is_dir() {
            missing.push(p.to_path_buf());
            p = match p.parent() {
                Some(pp) => pp,
                None => break,
            };
        }
        for dir in missing.iter().rev() {
            match fs::create_dir(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(ctx(e)),
            }
            if let Some(pp) = dir.parent().filter(|_| sync) {
                fsync_dir(pp).map_err(|e| e.with_operation(Operation::Commit))?;
            }
        }
        drop(dirs);
        if dest.is_dir() {
            return Err(Error::new(ErrorKind::AlreadyExists, "a directory exists under this key")
                .with_operation(Operation::Commit)
                .with_key(key));
        }
        fs::rename(staged, &dest).map_err(ctx)?;
        if sync {
            fsync_dir(&parent).map_err(|e| e.with_operation(Operation::Commit))?;
        }
        let meta = file.metadata().map_err(ctx)?;
        Ok(ObjectMeta { key: key.to_string(), size: meta.len(), modified: meta.modified().ok() })
    }

    /// Removes staged files left by processes that are no longer running (best effort).
    /// Returns how many were removed.
    pub fn remove_stale_staging(&self) -> Result<usize> {
        let rd = match fs::read_dir(&self.staging) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(Error::from(e).with_operation(Operation::Open).with_key(STAGING_DIR)),
        };
        let mut removed = 0;
        for ent in rd.flatten() {
            let name = ent.file_name();
            let pid = name.to_str().and_then(|n| n.split('-').next()).and_then(|p| p.parse::<i32>().ok());
            let alive = match pid {
                Some(pid) => {
                    // SAFETY: kill with signal 0 only checks whether the process exists.
                    let rc = unsafe { libc::kill(pid, 0) };
                    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
                }
                None => true,
            };
            if !alive && fs::remove_file(ent.path()).is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }
}

/// Reads `statx(STATX_DIOALIGN)` of an open file: `(mem_align, offset_align)`, both 0 when the
/// file does not support direct I/O.
pub fn dio_align_of_fd(fd: RawFd) -> Result<(u32, u32)> {
    // SAFETY: statx is a plain C struct; all-zero is valid.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let empty = c"";
    // SAFETY: fd is open, the empty path with AT_EMPTY_PATH refers to fd itself, stx is
    // writable and of the right type.
    let rc = unsafe { libc::statx(fd, empty.as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_DIOALIGN, &mut stx) };
    if rc != 0 {
        return Err(Error::from(io::Error::last_os_error()).with_operation(Operation::Stat));
    }
    if stx.stx_mask & libc::STATX_DIOALIGN == 0 {
        return Ok((0, 0));
    }
    Ok((stx.stx_dio_mem_align, stx.stx_dio_offset_align))
}

/// Probes the direct-I/O alignment of new files under `dir` with an unnamed `O_TMPFILE`
/// (statx reports no DIO alignment for directories). `None` when no probe file can be made
/// (read-only or unusual filesystem): decide per file instead.
pub fn probe_dio_align(dir_fd: RawFd) -> Option<(u32, u32)> {
    let dot = c".";
    // SAFETY: dir_fd is an open directory and "." a valid NUL-terminated path.
    let fd = unsafe { libc::openat(dir_fd, dot.as_ptr(), libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC, 0o600) };
    if fd < 0 {
        return None;
    }
    // SAFETY: fd is a fresh descriptor nobody else owns; dropping it removes the file.
    let file = unsafe { OwnedFd::from_raw_fd(fd) };
    dio_align_of_fd(file.as_raw_fd()).ok()
}

/// `f_type` of tmpfs.
const TMPFS_MAGIC: i64 = 0x0102_1994;
/// `f_type` of ramfs.
const RAMFS_MAGIC: i64 = 0x8584_58f6;

fn is_volatile_fs_type(f_type: i64) -> bool {
    f_type == TMPFS_MAGIC || f_type == RAMFS_MAGIC
}

/// `statfs(2)` `f_type` of the file system holding the open descriptor `fd`.
fn fs_type_of_fd(fd: RawFd) -> Option<i64> {
    // SAFETY: statfs is a plain C struct; all-zero is valid.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fd is an open descriptor and st is writable and of the right type.
    if unsafe { libc::fstatfs(fd, &mut st) } != 0 {
        return None;
    }
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between targets
    Some(st.f_type as i64)
}

/// Free (available to this user) and total bytes of the file system holding `fd`.
pub fn space_of_fd(fd: RawFd) -> Result<Space> {
    // SAFETY: statvfs is a plain C struct; all-zero is valid.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: fd is an open descriptor and st is writable and of the right type.
    if unsafe { libc::fstatvfs(fd, &mut st) } != 0 {
        return Err(Error::from(io::Error::last_os_error()));
    }
    #[allow(clippy::unnecessary_cast)] // the fields' widths differ between targets
    let (frsize, avail, blocks) = (st.f_frsize as u64, st.f_bavail as u64, st.f_blocks as u64);
    Ok(Space { free_bytes: avail.saturating_mul(frsize), total_bytes: blocks.saturating_mul(frsize) })
}

/// Whether files under `path` survive a machine crash: false when it lies on a file system held
/// in memory (tmpfs, ramfs); true otherwise, also when the type cannot be told.
pub fn is_durable_fs(path: &Path) -> bool {
    File::open(path).ok().and_then(|f| fs_type_of_fd(f.as_raw_fd())).is_none_or(|t| !is_volatile_fs_type(t))
}

/// Whether new files in the directory `dir` can be opened for direct I/O (`O_DIRECT`): the
/// `statx(STATX_DIOALIGN)` of an unnamed temporary file there, as the io_uring tier probes it.
/// `None` when it cannot be told (the directory cannot be opened, or holds no temporary file):
/// the io_uring tier then decides per file.
pub fn dir_supports_direct_io(dir: &Path) -> Option<bool> {
    let d = File::open(dir).ok()?;
    probe_dio_align(d.as_raw_fd()).map(|(mem, off)| mem > 0 && off > 0)
}

/// Filesystem type name of the filesystem holding `path` (ext4, tmpfs, xfs, ...), for
/// messages; "unknown" when it cannot be told.
pub fn fs_type_name(path: &Path) -> &'static str {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return "unknown";
    };
    // SAFETY: statfs is a plain C struct; all-zero is valid.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is NUL-terminated and st is writable.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return "unknown";
    }
    match st.f_type {
        0xEF53 => "ext4",
        0x0102_1994 => "tmpfs",
        0x8584_58f6 => "ramfs",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x6969 => "nfs",
        0x794c_7630 => "overlayfs",
        0x0BD0_0BD0 => "lustre",
        0x6573_5546 => "fuse",
        0x0102_1997 => "9p",
        0x9fa0 => "proc",
        0x6265_6572 => "sysfs",
        _ => "unknown",
    }
}
