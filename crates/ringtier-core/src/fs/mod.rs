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
//! life: [`FsRoot::lock`] removes those of dead writers (pid gone, lock free), and so does a
//! root's first [`FsRoot::create_staged`]. A file that a
//! program wrote under the root itself becomes an object without a copy through
//! [`FsRoot::adopt`]: moved into staging, then the same commit.
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
use std::sync::Arc;

use crate::blocking::BlockingPool;

use crate::error::{Error, ErrorKind, Operation, Result};
use crate::key::{validate_key, RESERVED_PREFIX};
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

mod adopt;
mod listing;
mod listing_cache;
mod staging;
pub use listing_cache::{LISTING_CACHE_FILE, MAX_CACHE_BYTES};
pub use staging::{StagedFile, StagedGuard};

/// Name of the staging directory inside a file tier's root.
pub const STAGING_DIR: &str = ".ringtier-staging";

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
    /// Whether this root's staging directory was swept of dead writers' files (see
    /// [`FsRoot::create_staged`]).
    staging_swept: std::sync::atomic::AtomicBool,
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
            staging_swept: std::sync::atomic::AtomicBool::new(false),
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

    /// [`FsRoot::list_with`] on `pool`, with the tier's error context (and the tier's name on
    /// each entry a lenient listing left out).
    pub async fn list_with_on(
        self: &Arc<Self>,
        pool: &BlockingPool,
        prefix: &str,
        options: crate::listing::ListOptions,
        tier: &str,
    ) -> Result<crate::listing::Listing> {
        let (root, p) = (Arc::clone(self), prefix.to_string());
        let mut listing = pool
            .run(move || root.list_with(&p, options))
            .await
            .map_err(|e| e.context(Operation::List, prefix, tier))?;
        for s in listing.take_skipped() {
            let error = s.error.with_tier(tier);
            listing.push_skipped(s.key, error);
        }
        Ok(listing)
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
}

impl FsRoot {
    /// Removes the directory `rel` and the directories below it that hold nothing, deepest
    /// first: what deleting every object under a prefix leaves (a checkpoint step's `STEP/` and
    /// `STEP/parts/`). A directory that still holds anything stays, and so does everything
    /// above `rel`. Links are never followed (a link is a name the directory holds), nothing
    /// is removed in a root that follows links, and at most [`MAX_PRUNE_DEPTH`] levels are
    /// looked into. `rel` itself a link is [`ErrorKind::PermissionDenied`] naming it; a missing
    /// `rel` is no error.
    ///
    /// Commits in this process wait while it runs (the parent-creation lock); a commit whose
    /// parent another process removes between opening it and the rename opens it again.
    pub fn remove_empty_dirs(&self, rel: &str) -> Result<()> {
        let ctx = |e: Error| e.with_operation(Operation::Delete).with_key(rel);
        self.check_writable(Operation::Delete, rel)?;
        validate_key(rel).map_err(ctx)?;
        if self.follow_links {
            return Ok(());
        }
        let _dirs = self.dirs.lock().unwrap_or_else(|p| p.into_inner());
        let (parent, leaf) = split_key(rel);
        let parent_fd = match self.dir_fd(parent, false, false) {
            Ok(fd) => fd,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(ctx(e)),
        };
        // `rel` itself a link: an error naming it, as for every other operation on a path.
        let c = at::c_name(leaf).map_err(|e| ctx(Error::from(e)))?;
        if at::fstatat(parent_fd.as_raw_fd(), &c, libc::AT_SYMLINK_NOFOLLOW).is_ok_and(|st| at::is_link(&st)) {
            return Err(ctx(self.link_refused(rel)));
        }
        self.remove_if_empty(parent_fd.as_raw_fd(), leaf, rel, MAX_PRUNE_DEPTH).map_err(ctx)
    }

    /// Removes `name` in the directory `dir` (key `rel`) if it is a directory that is empty once
    /// its own empty subdirectories are gone, looking `depth` levels further down at most.
    fn remove_if_empty(&self, dir: RawFd, name: &str, rel: &str, depth: usize) -> Result<()> {
        let c = at::c_name(name).map_err(|e| Error::from(e).with_key(rel))?;
        let st = match at::fstatat(dir, &c, libc::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::from(e).with_key(rel)),
        };
        if !at::is_dir(&st) {
            return Ok(()); // a file or a link: what holds it is not empty
        }
        if depth > 0 {
            let sub = match at::openat2(
                dir,
                &c,
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                0,
                libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
            ) {
                Ok(fd) => fd,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(Error::from(e).with_key(rel)),
            };
            for n in at::read_dir_names(sub.as_raw_fd()).map_err(|e| Error::from(e).with_key(rel))? {
                let Ok(n) = n.into_string() else { return Ok(()) }; // a name no key has: not empty
                self.remove_if_empty(sub.as_raw_fd(), &n, &format!("{rel}/{n}"), depth - 1)?;
            }
        }
        match at::rmdirat(dir, &c) {
            Ok(()) => {
                #[cfg(feature = "fs-trace")]
                self.record(|| FsOp::Rmdir { path: self.root.join(rel) });
                Ok(())
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTEMPTY | libc::EEXIST | libc::ENOENT)) => Ok(()),
            Err(e) => Err(Error::from(e).with_key(rel)),
        }
    }
}

/// How many levels below the directory it is given [`FsRoot::remove_empty_dirs`] looks into.
pub const MAX_PRUNE_DEPTH: usize = 8;

/// Takes an exclusive advisory lock (`flock(LOCK_EX)`) on `file`, waiting for it (interrupted
/// waits are retried). The kernel releases it when the file is closed or the process dies, so
/// a crashed holder never wedges the others.
pub fn lock_exclusive(file: &File) -> io::Result<()> {
    loop {
        match at::flock(file.as_raw_fd(), libc::LOCK_EX) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
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
