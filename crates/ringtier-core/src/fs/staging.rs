//! Staged files: written in `ROOT/.ringtier-staging/`, invisible until committed (data fsync,
//! atomic rename, directory fsync), each held with a shared `flock` for its writer's life so
//! that a dead writer's leftovers can be told from a live one's and removed.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::*;

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
    /// A new name for a staged file of this process in the staging directory `dir` (the name
    /// [`FsRoot::create_staged`] gives), for a file moved there rather than created
    /// ([`FsRoot::adopt`]). Nothing is created; its operations are not traced.
    pub(super) fn new_name(dir: Arc<OwnedFd>) -> Result<Self> {
        let seq = STAGING_SEQ.fetch_add(1, Ordering::Relaxed);
        let name = at::c_name(&format!("{}-{seq}", std::process::id())).map_err(Error::from)?;
        Ok(StagedFile {
            dir,
            name,
            #[cfg(feature = "fs-trace")]
            traced: None,
        })
    }

    /// The staging directory's descriptor and the file's name in it.
    pub(super) fn dir_and_name(&self) -> (std::os::fd::RawFd, &std::ffi::CStr) {
        (self.dir.as_raw_fd(), &self.name)
    }

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

impl FsRoot {
    /// Creates a new staged file (the staging directory is made on first use), opened
    /// read-write with `extra_flags` (`O_DIRECT`), exclusively and never through a link, and
    /// held with a shared `flock` for as long as the returned file (or a descriptor duplicated
    /// from it) is open: what tells a live writer's staged file from a dead one's. On an error
    /// nothing stays behind.
    pub fn create_staged(&self, extra_flags: i32) -> Result<(File, StagedFile)> {
        self.check_writable(Operation::Create, STAGING_DIR)?;
        if !self.staging_swept.swap(true, Ordering::Relaxed) {
            // Once per root, before its first staged file: what writers killed mid-write left
            // here goes (a plain save takes no lock, whose taking also sweeps). A held lock
            // keeps its file without a wait.
            match self.remove_stale_staging_within(std::time::Duration::ZERO) {
                Ok(0) => {}
                Ok(n) => {
                    tracing::info!(root = %self.root.display(), removed = n, "removed staged files of dead writers")
                }
                Err(e) => tracing::debug!(root = %self.root.display(), "sweeping the staging directory: {e}"),
            }
        }
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
        let c_leaf = at::c_name(leaf).map_err(|e| ctx(Error::from(e)))?;
        let mut attempt = 0;
        let dir = loop {
            // Create missing parents one level at a time so each new entry can be fsynced; under
            // the lock, so that a parent found present is one whose creation is durable.
            let dirs = self.dirs.lock().unwrap_or_else(|p| p.into_inner());
            let dir = self.dir_fd(parent, true, sync).map_err(ctx)?;
            drop(dirs);
            match self.stat_in(dir.as_raw_fd(), leaf, key) {
                Ok(st) if at::is_dir(&st) => {
                    return Err(ctx(Error::new(ErrorKind::AlreadyExists, "a directory exists under this key")))
                }
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(ctx(e)),
            }
            match at::renameat(staged.dir.as_raw_fd(), &staged.name, dir.as_raw_fd(), &c_leaf) {
                Ok(()) => break dir,
                // The parent was removed as empty (`remove_empty_dirs` in another process) after
                // it was opened: open (make) it again, while the staged file is still there.
                Err(e)
                    if e.raw_os_error() == Some(libc::ENOENT)
                        && attempt < 3
                        && at::fstatat(staged.dir.as_raw_fd(), &staged.name, libc::AT_SYMLINK_NOFOLLOW).is_ok() =>
                {
                    attempt += 1;
                }
                Err(e) => return Err(ctx(Error::from(e))),
            }
        };
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
        self.remove_stale_staging_within(STALE_LOCK_WAIT)
    }

    /// [`FsRoot::remove_stale_staging`], asking a dead pid's held lock again for up to `wait`
    /// in all (zero: a held lock keeps its file, at once).
    fn remove_stale_staging_within(&self, wait: std::time::Duration) -> Result<usize> {
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
        let deadline = std::time::Instant::now() + wait;
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
