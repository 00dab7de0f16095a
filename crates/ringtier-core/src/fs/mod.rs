//! Blocking filesystem helpers shared by the file tiers (posix and io_uring).
//!
//! [`FsRoot`] maps validated keys to files under one root directory, and every operation is
//! relative to the root's descriptor: opens with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)`, and stat, list, create, mkdir, rename, unlink and the lock file with
//! `*at` calls on descriptors of directories opened that way. Neither a `..` nor a symbolic
//! link, at any component of any path, can lead an operation out of the root or anywhere else:
//! a link met inside the root is an error that names it ([`ErrorKind::PermissionDenied`]).
//! Staged (uncommitted) objects live in `ROOT/.ringtier-staging/`, which listing skips, and
//! become visible only through [`FsRoot::commit_staged`]: data fsync, atomic rename, directory
//! fsync. A staged file carries its writer's pid in its name and a shared `flock` for its
//! life: [`FsRoot::lock`] removes those of dead writers (pid gone, lock free).
//!
//! A read-only dataset root may instead follow symbolic links ([`FsRoot::following_links`]):
//! files and directories that are links (to another disk, a shared copy) are listed and read
//! through the links, as torchvision's `ImageFolder` (`os.walk(followlinks=True)`) does; a
//! link that leads back to a directory it is in is reported as a loop. Keys are still
//! validated (no `..`, no absolute path), so only a link placed in the root leads out of it.
//! Such a root refuses every write. docs/SECURITY.md states the rule.

use std::ffi::CString;
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::blocking::BlockingPool;

use crate::error::{Error, ErrorKind, Operation, Result};
use crate::key::{validate_key, validate_prefix, RESERVED_PREFIX};
use crate::tier::{ObjectMeta, Space};

use crate::sys as at;
#[cfg(feature = "fail-points")]
mod fail;
#[cfg(feature = "fail-points")]
pub use fail::FsFailPoints;
#[cfg(feature = "fs-trace")]
pub mod trace;
#[cfg(feature = "fs-trace")]
use trace::{FsOp, FsTrace};

/// Name of the staging directory inside a file tier's root.
pub const STAGING_DIR: &str = ".ringtier-staging";

static STAGING_SEQ: AtomicU64 = AtomicU64::new(0);

/// How long [`FsRoot::remove_stale_staging`] waits, in all, for the locks of staged files
/// whose writer's pid is gone (a killed process's io_uring is torn down asynchronously).
const STALE_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// A staged file: its name in the staging directory, reached through that directory's
/// descriptor (never through a path that a link could redirect). Cheap to clone.
#[derive(Debug, Clone)]
pub struct StagedFile {
    dir: Arc<OwnedFd>,
    name: CString,
    #[cfg(feature = "fs-trace")]
    traced: Option<(Arc<FsTrace>, u64, PathBuf)>,
}

impl StagedFile {
    /// Removes the staged file (a missing one counts as removed).
    pub fn remove(&self) -> Result<()> {
        match at::unlinkat(self.dir.as_raw_fd(), &self.name) {
            Ok(()) => {
                #[cfg(feature = "fs-trace")]
                if let Some((t, _, path)) = &self.traced {
                    t.record(FsOp::Unlink { path: path.clone() });
                }
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::from(e).with_key(self.display())),
        }
    }

    /// Opens the staged file again with `flags` (`O_WRONLY` for a buffered writer next to a
    /// direct one); never through a link.
    pub fn reopen(&self, flags: i32) -> Result<File> {
        let fd = at::openat2(
            self.dir.as_raw_fd(),
            &self.name,
            flags | libc::O_NOFOLLOW,
            0,
            libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
        )
        .map_err(|e| Error::from(e).with_key(self.display()))?;
        Ok(File::from(fd))
    }

    /// The trace this file's operations go to and its id there (feature `fs-trace`).
    #[cfg(feature = "fs-trace")]
    pub fn trace(&self) -> Option<(&Arc<FsTrace>, u64)> {
        self.traced.as_ref().map(|(t, id, _)| (t, *id))
    }

    /// Records a write of `data` at `offset` (feature `fs-trace`).
    #[cfg(feature = "fs-trace")]
    pub fn trace_write(&self, offset: u64, data: &[u8], direct: bool) {
        if let Some((t, file)) = self.trace() {
            t.record(FsOp::Write { file, offset, data: data.to_vec(), direct });
        }
    }

    /// `.ringtier-staging/NAME`, for messages.
    pub fn display(&self) -> String {
        format!("{STAGING_DIR}/{}", self.name.to_string_lossy())
    }
}

/// Removes a staged file when dropped unless [`StagedGuard::keep`] takes it.
///
/// A staged file is made on a blocking thread for a caller that may have dropped its future
/// meanwhile: returning it in this guard makes the unanswered result remove the file (the pool
/// drops it) instead of leaving it in the staging directory for the life of the process.
#[derive(Debug)]
pub struct StagedGuard(Option<StagedFile>);

impl StagedGuard {
    /// Guards `staged`.
    pub fn new(staged: StagedFile) -> Self {
        StagedGuard(Some(staged))
    }

    /// Hands the staged file on (to the writer that now owns it, or published); nothing is
    /// removed.
    pub fn keep(mut self) -> Option<StagedFile> {
        self.0.take()
    }
}

impl Drop for StagedGuard {
    fn drop(&mut self) {
        if let Some(staged) = self.0.take() {
            let _ = staged.remove();
        }
    }
}

/// The root directory of a file tier.
#[derive(Debug)]
pub struct FsRoot {
    root: PathBuf,
    root_fd: OwnedFd,
    durable: bool,
    follow_links: bool,
    /// Held while a commit checks for, creates and fsyncs missing parent directories: a
    /// directory another commit created but has not fsynced into its parent yet must not
    /// look durable to a concurrent commit that renames into it.
    dirs: std::sync::Mutex<()>,
    #[cfg(feature = "fail-points")]
    fail: Option<Arc<FsFailPoints>>,
    #[cfg(feature = "fs-trace")]
    trace: Option<Arc<FsTrace>>,
}

/// `open_how` for `openat2` confined beneath the directory descriptor, following no link.
pub fn open_how_beneath(flags: i32, mode: u32) -> libc::open_how {
    at::open_how(flags, mode, libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS)
}

fn cstring(s: &[u8]) -> Result<CString> {
    CString::new(s).map_err(|_| Error::new(ErrorKind::InvalidKey, "path contains NUL"))
}

/// `fsync` of a directory, making renames and new entries in it durable.
pub fn fsync_dir(path: &Path) -> Result<()> {
    let dir = File::open(path).map_err(|e| Error::from(e).with_key(path.display().to_string()))?;
    dir.sync_all().map_err(|e| Error::from(e).with_key(path.display().to_string()))
}

/// `(parent, leaf)` of a validated key: `("", key)` at the root.
fn split_key(key: &str) -> (&str, &str) {
    match key.rfind('/') {
        Some(i) => (&key[..i], &key[i + 1..]),
        None => ("", key),
    }
}

impl FsRoot {
    /// Opens `root`, creating it when `create` is set. The root itself may be reached through
    /// links (it is the caller's choice); nothing below it is.
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
        let root_fd = at::openat2(libc::AT_FDCWD, &c, libc::O_RDONLY | libc::O_DIRECTORY, 0, 0).map_err(ctx)?;
        let durable = fs_type_of_fd(root_fd.as_raw_fd()).is_none_or(|t| !is_volatile_fs_type(t));
        Ok(FsRoot {
            root,
            root_fd,
            durable,
            follow_links: false,
            dirs: std::sync::Mutex::default(),
            #[cfg(feature = "fail-points")]
            fail: None,
            #[cfg(feature = "fs-trace")]
            trace: None,
        })
    }

    /// This root, following symbolic links that lead out of it when `follow` is set: for
    /// read-only dataset roots whose files or class folders are links. Opens then resolve with
    /// `RESOLVE_NO_MAGICLINKS` only (keys are still validated: no `..`, no absolute path),
    /// and listings descend into linked directories, detecting loops.
    pub fn following_links(mut self, follow: bool) -> Self {
        self.follow_links = follow;
        self
    }

    /// This root with fail points (feature `fail-points`, for tests).
    #[cfg(feature = "fail-points")]
    pub fn with_fail_points(mut self, fail: Option<Arc<FsFailPoints>>) -> Self {
        self.fail = fail;
        self
    }

    /// This root recording its operations into `trace` (feature `fs-trace`, for tests).
    #[cfg(feature = "fs-trace")]
    pub fn with_trace(mut self, trace: Option<Arc<FsTrace>>) -> Self {
        self.trace = trace;
        self
    }

    /// The trace this root records into (feature `fs-trace`).
    #[cfg(feature = "fs-trace")]
    pub fn trace(&self) -> Option<&Arc<FsTrace>> {
        self.trace.as_ref()
    }

    #[cfg(feature = "fs-trace")]
    fn record(&self, op: impl FnOnce() -> FsOp) {
        if let Some(t) = &self.trace {
            t.record(op());
        }
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
    /// RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`, or only `RESOLVE_NO_MAGICLINKS` when
    /// following links.
    pub fn resolve_flags(&self) -> u64 {
        if self.follow_links {
            libc::RESOLVE_NO_MAGICLINKS
        } else {
            libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS
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

    /// The file path of a key, for messages (operations never use it). The key must already
    /// be validated.
    pub fn path_of(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    /// The error for a symbolic link met at `rel` (a path under the root) by a root that does
    /// not follow links.
    pub fn link_refused(&self, rel: &str) -> Error {
        Error::new(
            ErrorKind::PermissionDenied,
            format!(
                "{} is a symbolic link inside the tier root {}: a tier that writes never follows links \
                 (remove it, or read a dataset through a link-following tier; see docs/SECURITY.md)",
                self.root.join(rel).display(),
                self.root.display()
            ),
        )
        .with_key(rel)
    }

    /// After an `ELOOP` from a path under the root: the error naming the first link on
    /// `rel`'s way, or the plain error when none is found (it changed meanwhile).
    pub fn explain_eloop(&self, rel: &str, e: io::Error) -> Error {
        if e.raw_os_error() == Some(libc::ELOOP) && !self.follow_links {
            let mut end = 0;
            for comp in rel.split('/') {
                end += comp.len();
                let sub = &rel[..end];
                if let Ok(c) = at::c_name(sub) {
                    if at::fstatat(self.root_fd(), &c, libc::AT_SYMLINK_NOFOLLOW).is_ok_and(|st| at::is_link(&st)) {
                        return self.link_refused(sub);
                    }
                }
                end += 1;
            }
        }
        Error::from(e).with_key(rel)
    }

    /// Opens the directory `rel` under the root (`""`: the root itself), never through a link
    /// unless following links. With `create`, missing directories are made one at a time, and
    /// with `sync` each new entry is fsynced into its parent. A missing directory is
    /// [`ErrorKind::NotFound`].
    fn dir_fd(&self, rel: &str, create: bool, sync: bool) -> Result<OwnedFd> {
        let flags = libc::O_RDONLY | libc::O_DIRECTORY;
        if !create {
            let path = if rel.is_empty() { "." } else { rel };
            let c = at::c_name(path).map_err(|e| Error::from(e).with_key(rel))?;
            return at::openat2(self.root_fd(), &c, flags, 0, self.resolve_flags())
                .map_err(|e| self.explain_eloop(rel, e));
        }
        let dot = at::c_name(".").map_err(Error::from)?;
        let mut cur = at::openat2(self.root_fd(), &dot, flags, 0, self.resolve_flags()).map_err(Error::from)?;
        let mut end = 0;
        for comp in rel.split('/').filter(|c| !c.is_empty()) {
            end += comp.len();
            let sub = &rel[..end];
            end += 1;
            let c = at::c_name(comp).map_err(|e| Error::from(e).with_key(sub))?;
            let next = match at::openat2(cur.as_raw_fd(), &c, flags, 0, self.resolve_flags()) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    match at::mkdirat(cur.as_raw_fd(), &c) {
                        Ok(()) => {
                            #[cfg(feature = "fs-trace")]
                            self.record(|| FsOp::Mkdir { path: self.root.join(sub) });
                            if sync {
                                let parent = sub.rsplit_once('/').map_or("", |(p, _)| p);
                                self.fsync_dir_fd(cur.as_raw_fd(), parent, None)?;
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(Error::from(e).with_key(sub)),
                    }
                    at::openat2(cur.as_raw_fd(), &c, flags, 0, self.resolve_flags())
                }
                other => other,
            };
            cur = next.map_err(|e| self.explain_eloop(sub, e))?;
        }
        Ok(cur)
    }

    /// `fsync` of a directory of this root. `after_rename`: the key whose publishing rename
    /// this fsync makes durable (a fail point may fail it in tests).
    fn fsync_dir_fd(&self, fd: RawFd, rel: &str, after_rename: Option<&str>) -> Result<()> {
        #[cfg(feature = "fail-points")]
        if let Some(key) = after_rename {
            if let Some(errno) = self.fail.as_ref().and_then(|f| f.take_dir_fsync(key)) {
                return Err(Error::from(io::Error::from_raw_os_error(errno)).with_key(rel));
            }
        }
        #[cfg(feature = "fs-trace")]
        if self.trace.as_ref().is_some_and(|t| t.skips_dir_fsync(&self.root, after_rename)) {
            return Ok(());
        }
        let _ = after_rename;
        at::fsync(fd).map_err(|e| Error::from(e).with_key(rel))?;
        #[cfg(feature = "fs-trace")]
        self.record(|| FsOp::FsyncDir { path: self.root.join(rel) });
        Ok(())
    }

    /// Opens `key` relative to the root with `openat2`, confined as [`FsRoot::resolve_flags`]
    /// says. A link on the way is an error that names it.
    pub fn open_beneath(&self, key: &str, flags: i32, mode: u32) -> Result<OwnedFd> {
        validate_key(key)?;
        let c = cstring(key.as_bytes())?;
        at::openat2(self.root_fd(), &c, flags, mode, self.resolve_flags())
            .map_err(|e| self.explain_eloop(key, e).with_operation(Operation::Open).with_key(key))
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

    /// `fstatat` of `name` in `dir` (a directory of this root at `rel_dir`), following a link
    /// only when following links; a link otherwise is an error naming it.
    fn stat_in(&self, dir: RawFd, name: &str, rel: &str) -> Result<libc::stat> {
        let c = at::c_name(name).map_err(|e| Error::from(e).with_key(rel))?;
        let flags = if self.follow_links { 0 } else { libc::AT_SYMLINK_NOFOLLOW };
        let st = at::fstatat(dir, &c, flags).map_err(|e| Error::from(e).with_key(rel))?;
        if !self.follow_links && at::is_link(&st) {
            return Err(self.link_refused(rel));
        }
        Ok(st)
    }

    /// Metadata of a committed object (a regular file under the root).
    pub fn stat(&self, key: &str) -> Result<ObjectMeta> {
        validate_key(key)?;
        let (parent, leaf) = split_key(key);
        let dir = self.dir_fd(parent, false, false).map_err(|e| e.with_operation(Operation::Stat).with_key(key))?;
        let st = self.stat_in(dir.as_raw_fd(), leaf, key).map_err(|e| e.with_operation(Operation::Stat))?;
        if !at::is_file(&st) {
            return Err(Error::new(ErrorKind::NotFound, "not a regular file")
                .with_operation(Operation::Stat)
                .with_key(key));
        }
        Ok(ObjectMeta { key: key.to_string(), size: st.st_size as u64, modified: at::mtime(&st) })
    }

    /// Committed objects whose key starts with `prefix`, sorted. In a root that does not
    /// follow links, a link met on the way is an error that names it.
    pub fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        validate_prefix(prefix)?;
        let list_err = |e: Error| e.with_operation(Operation::List);
        // Start at the deepest directory the prefix names completely.
        let dir_part = match prefix.rfind('/') {
            Some(i) => &prefix[..i],
            None => "",
        };
        let start = match self.dir_fd(dir_part, false, false) {
            Ok(fd) => fd,
            Err(e) if e.kind() == ErrorKind::NotFound && !dir_part.is_empty() => return Ok(Vec::new()),
            Err(e) => return Err(list_err(e).with_key(prefix)),
        };
        let mut out = Vec::new();
        // (directory, its key, the (device, inode) of it and of the directories above it:
        // a linked directory met again below itself is a loop).
        let ancestors = match at::fstat(start.as_raw_fd()) {
            Ok(st) if self.follow_links => vec![(st.st_dev, st.st_ino)],
            _ => Vec::new(),
        };
        let mut stack = vec![(start, dir_part.to_string(), ancestors)];
        while let Some((dir, rel, ancestors)) = stack.pop() {
            let names = at::read_dir_names(dir.as_raw_fd()).map_err(|e| list_err(Error::from(e)).with_key(prefix))?;
            for name in names {
                let Ok(name) = name.into_string() else { continue };
                if name.starts_with(RESERVED_PREFIX) {
                    continue;
                }
                let key = if rel.is_empty() { name.clone() } else { format!("{rel}/{name}") };
                // Descend only where keys below can still match the prefix.
                let wanted_dir = prefix.starts_with(&format!("{key}/"))
                    || key.starts_with(prefix)
                    || format!("{key}/").starts_with(prefix);
                if !wanted_dir && !key.starts_with(prefix) {
                    continue;
                }
                let st = match self.stat_in(dir.as_raw_fd(), &name, &key) {
                    Ok(st) => st,
                    // Deleted between readdir and stat: not listed.
                    Err(e) if e.kind() == ErrorKind::NotFound && e.os_code() == Some(libc::ENOENT) => {
                        if self.follow_links && self.is_link_at(dir.as_raw_fd(), &name) {
                            return Err(Error::new(
                                ErrorKind::NotFound,
                                format!("broken symbolic link: {}", self.root.join(&key).display()),
                            )
                            .with_operation(Operation::List)
                            .with_key(key));
                        }
                        continue;
                    }
                    Err(e) => return Err(list_err(e)),
                };
                if at::is_dir(&st) {
                    if !wanted_dir {
                        continue;
                    }
                    let id = (st.st_dev, st.st_ino);
                    if self.follow_links && ancestors.contains(&id) {
                        return Err(Error::new(
                            ErrorKind::InvalidInput,
                            format!(
                                "symbolic link loop: {} leads back to a directory it is in",
                                self.root.join(&key).display()
                            ),
                        )
                        .with_operation(Operation::List)
                        .with_key(key));
                    }
                    let c = at::c_name(&name).map_err(|e| list_err(Error::from(e)).with_key(key.as_str()))?;
                    let sub = match at::openat2(
                        dir.as_raw_fd(),
                        &c,
                        libc::O_RDONLY | libc::O_DIRECTORY,
                        0,
                        self.resolve_flags(),
                    ) {
                        Ok(fd) => fd,
                        Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(list_err(self.explain_eloop(&key, e))),
                    };
                    let mut below = ancestors.clone();
                    if self.follow_links {
                        below.push(id);
                    }
                    stack.push((sub, key, below));
                } else if at::is_file(&st) && key.starts_with(prefix) {
                    out.push(ObjectMeta { key, size: st.st_size as u64, modified: at::mtime(&st) });
                }
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    fn is_link_at(&self, dir: RawFd, name: &str) -> bool {
        at::c_name(name)
            .ok()
            .and_then(|c| at::fstatat(dir, &c, libc::AT_SYMLINK_NOFOLLOW).ok())
            .is_some_and(|st| at::is_link(&st))
    }

    /// Takes the exclusive advisory lock `name` on the root: `flock` on
    /// `ROOT/.ringtier-lock-NAME` (never listed, opened with `O_NOFOLLOW`: a link there is an
    /// error naming it), which records the holder's pid. Fails at once with
    /// [`ErrorKind::Busy`] when another open file description holds it (another process, or
    /// another open in this one); the kernel releases it when the holder exits. Once held, the
    /// staged files of dead writers are removed ([`FsRoot::remove_stale_staging`]).
    pub fn lock(&self, name: &str) -> Result<crate::tier::TierLock> {
        use std::io::{Read, Seek, Write};
        validate_key(name)?;
        if name.contains('/') {
            return Err(Error::new(ErrorKind::InvalidKey, format!("lock name {name:?}: one path component")));
        }
        self.check_writable(Operation::Open, name)?;
        let file_name = format!("{RESERVED_PREFIX}-lock-{name}");
        let path = self.root.join(&file_name);
        let ctx = |e: io::Error| Error::from(e).with_operation(Operation::Open).with_key(name);
        let c = at::c_name(&file_name).map_err(ctx)?;
        let fd = at::openat2(
            self.root_fd(),
            &c,
            libc::O_RDWR | libc::O_CREAT | libc::O_NOFOLLOW,
            0o644,
            self.resolve_flags(),
        )
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                self.link_refused(&file_name).with_operation(Operation::Open)
            } else {
                ctx(e)
            }
        })?;
        let mut file = File::from(fd);
        if let Err(e) = at::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) {
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut holder = String::new();
                let _ = (&mut file).take(256).read_to_string(&mut holder);
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
        match self.remove_stale_staging() {
            Ok(0) => {}
            Ok(n) => tracing::info!(root = %self.root.display(), removed = n, "removed staged files of dead writers"),
            Err(e) => tracing::warn!(root = %self.root.display(), "cleaning the staging directory: {e}"),
        }
        Ok(crate::tier::TierLock::new(file))
    }

    /// Removes a committed object and makes the removal durable. Never removes through a link:
    /// a link on the way, or at the key, is an error naming it.
    pub fn delete(&self, key: &str) -> Result<()> {
        self.check_writable(Operation::Delete, key)?;
        validate_key(key).map_err(|e| e.with_operation(Operation::Delete))?;
        let (parent, leaf) = split_key(key);
        let del = |e: Error| e.with_operation(Operation::Delete).with_key(key);
        let dir = self.dir_fd(parent, false, false).map_err(del)?;
        let st = self.stat_in(dir.as_raw_fd(), leaf, key).map_err(del)?;
        if !at::is_file(&st) {
            return Err(del(Error::new(ErrorKind::NotFound, "not a regular file")));
        }
        let c = at::c_name(leaf).map_err(|e| del(Error::from(e)))?;
        at::unlinkat(dir.as_raw_fd(), &c).map_err(|e| del(Error::from(e)))?;
        #[cfg(feature = "fs-trace")]
        self.record(|| FsOp::Unlink { path: self.root.join(key) });
        self.fsync_dir_fd(dir.as_raw_fd(), parent, None).map_err(del)
    }

    /// Creates a new staged file (the staging directory is made on first use), opened
    /// read-write with `extra_flags` (`O_DIRECT`), exclusively and never through a link, and
    /// held with a shared `flock` for as long as the returned file (or a descriptor duplicated
    /// from it) is open: what tells a live writer's staged file from a dead one's. On an error
    /// nothing stays behind.
    pub fn create_staged(&self, extra_flags: i32) -> Result<(File, StagedFile)> {
        self.check_writable(Operation::Create, STAGING_DIR)?;
        let dir = Arc::new(self.dir_fd(STAGING_DIR, true, false).map_err(|e| e.with_operation(Operation::Create))?);
        let seq = STAGING_SEQ.fetch_add(1, Ordering::Relaxed);
        let name = at::c_name(&format!("{}-{seq}", std::process::id())).map_err(Error::from)?;
        #[cfg(feature = "fs-trace")]
        let traced = self.trace.as_ref().map(|t| {
            let path = self.root.join(STAGING_DIR).join(name.to_string_lossy().as_ref());
            (Arc::clone(t), t.new_file(), path)
        });
        let staged = StagedFile {
            dir,
            name,
            #[cfg(feature = "fs-trace")]
            traced,
        };
        let fd = at::openat2(
            staged.dir.as_raw_fd(),
            &staged.name,
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | extra_flags,
            0o644,
            libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
        );
        let fd = match fd {
            Ok(fd) => fd,
            Err(e) => {
                // The kernel may create the file before it refuses O_DIRECT.
                if e.raw_os_error() != Some(libc::EEXIST) {
                    let _ = staged.remove();
                }
                return Err(Error::from(e).with_operation(Operation::Create).with_key(staged.display()));
            }
        };
        #[cfg(feature = "fs-trace")]
        if let Some((t, file, path)) = &staged.traced {
            t.record(FsOp::Create { file: *file, path: path.clone() });
        }
        if let Err(e) = at::flock(fd.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) {
            let _ = staged.remove();
            return Err(Error::from(e).with_operation(Operation::Create).with_key(staged.display()));
        }
        Ok((File::from(fd), staged))
    }

    /// Makes a staged file durable and visible under `key`: fsync the data, create missing
    /// parent directories, rename atomically, fsync every directory that changed.
    pub fn commit_staged(&self, file: &File, staged: &StagedFile, key: &str) -> Result<ObjectMeta> {
        validate_key(key)?;
        #[cfg(feature = "fs-trace")]
        if let Some(t) = &self.trace {
            if t.renames_before_sync() {
                let meta = self.publish_staged(file, staged, key)?;
                self.data_sync(file, staged, key)?;
                return Ok(meta);
            }
        }
        self.data_sync(file, staged, key)?;
        self.publish_staged(file, staged, key)
    }

    /// The data fsync of a staged file before its commit.
    fn data_sync(&self, file: &File, staged: &StagedFile, key: &str) -> Result<()> {
        #[cfg(feature = "fs-trace")]
        if self.trace.as_ref().is_some_and(|t| t.skips_data_sync()) {
            return Ok(());
        }
        file.sync_data().map_err(|e| Error::from(e).with_operation(Operation::Commit).with_key(key))?;
        #[cfg(feature = "fs-trace")]
        if let Some((t, id)) = staged.trace() {
            t.record(FsOp::Fsync { file: id });
        }
        let _ = staged;
        Ok(())
    }

    /// The second half of [`FsRoot::commit_staged`], for callers that synced the data
    /// themselves: create missing parents, rename atomically, fsync the directories.
    pub fn publish_staged(&self, file: &File, staged: &StagedFile, key: &str) -> Result<ObjectMeta> {
        self.rename_staged(file, staged, key, true)
    }

    /// Publishes a staged file without any fsync: create missing parents and rename
    /// atomically. The object is whole or absent after the process dies (the page cache
    /// keeps what was written), but after a power cut or an OS crash it may be missing or
    /// shorter than written. For copies whose source stays durable elsewhere (a checkpoint
    /// restored into a directory with `--no-sync`); [`FsRoot::commit_staged`] is the durable
    /// commit.
    pub fn publish_staged_unsynced(&self, file: &File, staged: &StagedFile, key: &str) -> Result<ObjectMeta> {
        self.rename_staged(file, staged, key, false)
    }

    fn rename_staged(&self, file: &File, staged: &StagedFile, key: &str, sync: bool) -> Result<ObjectMeta> {
        let ctx = |e: Error| e.with_operation(Operation::Commit).with_key(key);
        self.check_writable(Operation::Commit, key)?;
        validate_key(key)?;
        let (parent, leaf) = split_key(key);
        // Create missing parents one level at a time so each new entry can be fsynced; under
        // the lock, so that a parent found present is one whose creation is durable.
        let dirs = self.dirs.lock().unwrap_or_else(|p| p.into_inner());
        let dir = self.dir_fd(parent, true, sync).map_err(ctx)?;
        drop(dirs);
        let c_leaf = at::c_name(leaf).map_err(|e| ctx(Error::from(e)))?;
        match self.stat_in(dir.as_raw_fd(), leaf, key) {
            Ok(st) if at::is_dir(&st) => {
                return Err(ctx(Error::new(ErrorKind::AlreadyExists, "a directory exists under this key")))
            }
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(ctx(e)),
        }
        at::renameat(staged.dir.as_raw_fd(), &staged.name, dir.as_raw_fd(), &c_leaf)
            .map_err(|e| ctx(Error::from(e)))?;
        #[cfg(feature = "fs-trace")]
        if let Some((_, _, from)) = &staged.traced {
            self.record(|| FsOp::Rename { from: from.clone(), to: self.root.join(key) });
        }
        if sync {
            // The rename is durable only with its directory's fsync. Retried once; if it still
            // fails, the object is un-published (renamed back into staging, where its writer's
            // guard removes it), so that an error never leaves a visible object that a later
            // open would take for committed.
            let first = self.fsync_dir_fd(dir.as_raw_fd(), parent, Some(key));
            if let Err(e1) = first {
                if let Err(e2) = self.fsync_dir_fd(dir.as_raw_fd(), parent, Some(key)) {
                    let undone = at::renameat(dir.as_raw_fd(), &c_leaf, staged.dir.as_raw_fd(), &staged.name);
                    #[cfg(feature = "fs-trace")]
                    if let (Ok(()), Some((_, _, back))) = (&undone, &staged.traced) {
                        self.record(|| FsOp::Rename { from: self.root.join(key), to: back.clone() });
                    }
                    let _ = at::fsync(dir.as_raw_fd());
                    let what = match undone {
                        Ok(()) => "the object was un-published".to_string(),
                        Err(u) => format!("un-publishing it failed too ({u})"),
                    };
                    return Err(ctx(Error::new(
                        e2.kind(),
                        format!("the directory fsync after the rename failed twice ({e1}; {e2}): {what}"),
                    )));
                }
                tracing::warn!(key, "a directory fsync after the rename failed once and succeeded when retried: {e1}");
            }
        }
        let st = at::fstat(file.as_raw_fd()).map_err(|e| ctx(Error::from(e)))?;
        Ok(ObjectMeta { key: key.to_string(), size: st.st_size as u64, modified: at::mtime(&st) })
    }

    /// Removes staged files left by writers that are no longer running: the pid in the name
    /// is not alive and nobody holds the file's `flock` (a live writer holds it shared for the
    /// file's life, which also covers a writer in another pid namespace). This process's own
    /// files are left to their guards. Returns how many were removed.
    pub fn remove_stale_staging(&self) -> Result<usize> {
        if self.follow_links {
            return Ok(0);
        }
        let dir = match self.dir_fd(STAGING_DIR, false, false) {
            Ok(d) => d,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e.with_operation(Operation::Open)),
        };
        let names = at::read_dir_names(dir.as_raw_fd()).map_err(|e| Error::from(e).with_key(STAGING_DIR))?;
        let me = std::process::id() as i32;
        let mut removed = 0;
        // A writer killed a moment ago may still hold its lock while the kernel tears its
        // io_uring down (requests in flight keep files open): a dead pid's held lock is asked
        // again for up to STALE_LOCK_WAIT, in case it is one of those.
        let deadline = std::time::Instant::now() + STALE_LOCK_WAIT;
        for name in names {
            let pid = name.to_str().ok().and_then(|n| n.split('-').next()).and_then(|p| p.parse::<i32>().ok());
            if pid.is_none_or(|p| p == me || at::pid_alive(p)) {
                continue;
            }
            let stale = loop {
                let free = match at::openat2(
                    dir.as_raw_fd(),
                    &name,
                    libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
                    0,
                    libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
                ) {
                    // Nobody holds it: no live writer.
                    Ok(fd) => at::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB).is_ok(),
                    // A link or something else that is not ours to open: not a staged file.
                    Err(e) if e.raw_os_error() == Some(libc::ELOOP) => true,
                    Err(_) => false,
                };
                if free || std::time::Instant::now() >= deadline {
                    break free;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            };
            if stale && at::unlinkat(dir.as_raw_fd(), &name).is_ok() {
                #[cfg(feature = "fs-trace")]
                self.record(|| FsOp::Unlink {
                    path: self.root.join(STAGING_DIR).join(name.to_string_lossy().as_ref()),
                });
                removed += 1;
            }
        }
        if removed > 0 {
            let _ = at::fsync(dir.as_raw_fd());
        }
        Ok(removed)
    }
}

/// Reads `statx(STATX_DIOALIGN)` of an open file: `(mem_align, offset_align)`, both 0 when the
/// file does not support direct I/O.
pub fn dio_align_of_fd(fd: RawFd) -> Result<(u32, u32)> {
    match at::statx_dio_align(fd) {
        Ok(a) => Ok(a.unwrap_or((0, 0))),
        Err(e) => Err(Error::from(e).with_operation(Operation::Stat)),
    }
}

/// Probes the direct-I/O alignment of new files under `dir` with an unnamed `O_TMPFILE`
/// (statx reports no DIO alignment for directories). `None` when no probe file can be made
/// (read-only or unusual filesystem): decide per file instead.
pub fn probe_dio_align(dir_fd: RawFd) -> Option<(u32, u32)> {
    let file = at::open_tmpfile(dir_fd).ok()?;
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
    at::fstatfs_type(fd).ok()
}

/// Free (available to this user) and total bytes of the file system holding `fd`.
pub fn space_of_fd(fd: RawFd) -> Result<Space> {
    let (frsize, avail, blocks) = at::fstatvfs(fd).map_err(Error::from)?;
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
    let Ok(f_type) = at::statfs_type(&c) else {
        return "unknown";
    };
    match f_type {
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
