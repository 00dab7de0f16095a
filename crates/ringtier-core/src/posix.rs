//! The posix tier: buffered `pread`/`pwrite` through the page cache, run on a thread pool.
//!
//! This is the honest baseline: tf.data's parallel map and PyTorch's DataLoader workers amount
//! to N threads doing buffered reads. `read_batch` spreads a batch over the pool's threads.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;

use crate::blocking::BlockingPool;
use crate::buf::AlignedBuf;
use crate::error::{Error, ErrorKind, Operation, Result};
use crate::fs::{FsRoot, StagedFile, StagedGuard};
use crate::key::validate_key;
use crate::listing::{ListOptions, Listing};
use crate::tier::{Adopted, Capabilities, ObjectMeta, ObjectWriter, ReadBatch, Space, Tier, TierLock};
use crate::writes::WritesInFlight;

/// Configuration of a [`PosixTier`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PosixConfig {
    /// Root directory of the tier.
    pub root: PathBuf,
    /// Create the root when it is missing. Default false: a missing dataset is an error.
    pub create: bool,
    /// Threads doing blocking I/O. Default 8.
    pub threads: usize,
    /// Name used in errors and metric labels. Default `posix:ROOT` (what and where, so two
    /// tiers are told apart).
    pub name: String,
    /// Largest single `pread`, in bytes; larger requests are read in chunks of this size
    /// (fio's `--bs`). 0, the default, reads each request with one call.
    pub read_chunk: usize,
    /// Follow symbolic links out of the root (a dataset whose files or class folders are
    /// links), see [`FsRoot::following_links`]; the tier is then read-only. Default false.
    pub follow_links: bool,
    /// Commits are durable: data fsync, atomic rename, directory fsync. Default true. With
    /// false a commit only renames the staged file into place: the object is whole or absent
    /// after the process dies, but a power cut or OS crash may lose it or leave it short.
    /// For copies whose source stays durable elsewhere (`ringtier ckpt restore --no-sync`),
    /// where a write at page-cache speed is what `cp` gives.
    pub sync: bool,
    /// Fail points of the root's system calls (feature `fail-points`, tests only).
    #[cfg(feature = "fail-points")]
    pub fail_points: Option<Arc<crate::fs::FsFailPoints>>,
    /// A trace of the root's operations (feature `fs-trace`, tests only).
    #[cfg(feature = "fs-trace")]
    pub fs_trace: Option<Arc<crate::fs::trace::FsTrace>>,
}

impl PosixConfig {
    /// Sets [`PosixConfig::root`].
    pub fn with_root(mut self, root: PathBuf) -> Self {
        self.root = root;
        self
    }

    /// Sets [`PosixConfig::create`].
    pub fn with_create(mut self, create: bool) -> Self {
        self.create = create;
        self
    }

    /// Sets [`PosixConfig::threads`].
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// Sets [`PosixConfig::name`].
    pub fn with_name(mut self, name: String) -> Self {
        self.name = name;
        self
    }

    /// Sets [`PosixConfig::read_chunk`].
    pub fn with_read_chunk(mut self, read_chunk: usize) -> Self {
        self.read_chunk = read_chunk;
        self
    }

    /// Sets [`PosixConfig::follow_links`].
    pub fn with_follow_links(mut self, follow_links: bool) -> Self {
        self.follow_links = follow_links;
        self
    }

    /// Sets [`PosixConfig::fail_points`].
    #[cfg(feature = "fail-points")]
    pub fn with_fail_points(mut self, fail_points: Option<Arc<crate::fs::FsFailPoints>>) -> Self {
        self.fail_points = fail_points;
        self
    }

    /// Sets [`PosixConfig::fs_trace`].
    #[cfg(feature = "fs-trace")]
    pub fn with_fs_trace(mut self, fs_trace: Option<Arc<crate::fs::trace::FsTrace>>) -> Self {
        self.fs_trace = fs_trace;
        self
    }

    /// Sets [`PosixConfig::sync`].
    pub fn with_sync(mut self, sync: bool) -> Self {
        self.sync = sync;
        self
    }
}

impl PosixConfig {
    /// Defaults for `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        let name = format!("posix:{}", root.display());
        PosixConfig {
            root,
            create: false,
            threads: 8,
            name,
            read_chunk: 0,
            follow_links: false,
            sync: true,
            #[cfg(feature = "fail-points")]
            fail_points: None,
            #[cfg(feature = "fs-trace")]
            fs_trace: None,
        }
    }
}

struct Inner {
    name: String,
    root: Arc<FsRoot>,
    pool: BlockingPool,
    read_chunk: usize,
    sync: bool,
}

/// Files under a root directory, read and written with buffered positional I/O from a pool.
#[derive(Clone)]
pub struct PosixTier {
    inner: Arc<Inner>,
}

impl fmt::Debug for PosixTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PosixTier")
            .field("name", &self.inner.name)
            .field("root", &self.inner.root.path())
            .field("threads", &self.inner.pool.threads())
            .finish()
    }
}

/// Reads `[offset, offset+len)` of `file`, looping over short reads and EINTR, clipped at EOF,
/// in `pread` calls of at most `chunk` bytes (0: no limit).
pub fn pread_full(file: &File, offset: u64, len: usize, chunk: usize, buf: &mut AlignedBuf) -> Result<usize> {
    let size = file.metadata()?.len();
    if offset > size {
        return Err(Error::new(ErrorKind::OutOfRange, format!("offset {offset} is past the end ({size} bytes)")));
    }
    if len > buf.capacity() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("buffer of {} bytes is too small for a {len}-byte read", buf.capacity()),
        ));
    }
    let want = len.min((size - offset) as usize);
    let dst = &mut buf.capacity_mut()[..want];
    let mut done = 0;
    while done < want {
        let end = if chunk == 0 { want } else { want.min(done + chunk) };
        match file.read_at(&mut dst[done..end], offset + done as u64) {
            Ok(0) => break, // shrank under us: report what is there
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        }
    }
    buf.set_window(0, done)?;
    Ok(done)
}

impl PosixTier {
    /// Opens the tier and starts its threads.
    pub fn new(config: PosixConfig) -> Result<Self> {
        let root = Arc::new(
            FsRoot::open(&config.root, config.create)
                .map_err(|e| e.with_tier(&config.name))?
                .following_links(config.follow_links),
        );
        #[cfg(feature = "fail-points")]
        let root = match Arc::try_unwrap(root) {
            Ok(r) => Arc::new(r.with_fail_points(config.fail_points.clone())),
            Err(r) => r,
        };
        #[cfg(feature = "fs-trace")]
        let root = match Arc::try_unwrap(root) {
            Ok(r) => Arc::new(r.with_trace(config.fs_trace.clone())),
            Err(r) => r,
        };
        let pool = BlockingPool::new("ringtier-posix", config.threads)?;
        Ok(PosixTier {
            inner: Arc::new(Inner { name: config.name, root, pool, read_chunk: config.read_chunk, sync: config.sync }),
        })
    }

    /// Root directory.
    pub fn root(&self) -> &Path {
        self.inner.root.path()
    }

    fn read_blocking(inner: &Inner, key: &str, offset: u64, len: usize, buf: &mut AlignedBuf) -> Result<usize> {
        let fd = inner.root.open_beneath(key, libc::O_RDONLY, 0)?;
        let file = File::from(fd);
        pread_full(&file, offset, len, inner.read_chunk, buf)
    }
}

#[async_trait]
impl Tier for PosixTier {
    fn name(&self) -> &str {
        &self.inner.name
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { durable: self.inner.root.durable(), ..Capabilities::default() }
    }

    async fn space(&self) -> Result<Option<Space>> {
        let inner = Arc::clone(&self.inner);
        self.inner.pool.run(move || inner.root.space().map(Some)).await.map_err(|e| e.with_tier(self.name()))
    }

    async fn stat(&self, key: &str) -> Result<ObjectMeta> {
        self.inner.root.run_on(&self.inner.pool, Operation::Stat, key, self.name(), FsRoot::stat).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        self.inner.root.run_on(&self.inner.pool, Operation::List, prefix, self.name(), FsRoot::list).await
    }

    async fn list_with(&self, prefix: &str, options: ListOptions) -> Result<Listing> {
        self.inner.root.list_with_on(&self.inner.pool, prefix, options, self.name()).await
    }

    async fn delete(&self, key: &str) -> Result<()> {
        self.inner.root.run_on(&self.inner.pool, Operation::Delete, key, self.name(), FsRoot::delete).await
    }

    async fn remove_empty_dirs(&self, prefix: &str) -> Result<()> {
        self.inner
            .root
            .run_on(&self.inner.pool, Operation::Delete, prefix, self.name(), FsRoot::remove_empty_dirs)
            .await
    }

    async fn lock(&self, name: &str) -> Result<Option<TierLock>> {
        self.inner.root.lock(name).map(Some).map_err(|e| e.context(Operation::Open, name, self.name()))
    }

    /// [`FsRoot::adopt`] on the pool; declined (`Ok(None)`) when commits are not synced
    /// ([`PosixConfig::sync`] false), so that a copy is committed the way this tier commits.
    async fn adopt(&self, from: &str, key: &str) -> Result<Option<Adopted>> {
        if !self.inner.sync {
            return Ok(None);
        }
        let (inner, f, k) = (Arc::clone(&self.inner), from.to_string(), key.to_string());
        self.inner.pool.run(move || inner.root.adopt(&f, &k)).await.map_err(|e| e.with_tier(self.name()))
    }

    async fn read_at(&self, key: &str, offset: u64, len: usize, buf: AlignedBuf) -> (Result<usize>, AlignedBuf) {
        if let Err(e) = validate_key(key) {
            return (Err(e.context(Operation::Read, key, self.name())), buf);
        }
        let inner = Arc::clone(&self.inner);
        let k = key.to_string();
        let slot = Arc::new(std::sync::Mutex::new(Some(buf)));
        let slot2 = Arc::clone(&slot);
        let res = self
            .inner
            .pool
            .run(move || {
                let mut guard = slot2.lock().unwrap_or_else(|p| p.into_inner());
                match guard.as_mut() {
                    Some(buf) => Self::read_blocking(&inner, &k, offset, len, buf),
                    None => Err(Error::new(ErrorKind::Shutdown, "buffer lost")),
                }
            })
            .await;
        let buf = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
        match buf {
            Some(buf) => (res.map_err(|e| e.context(Operation::Read, key, self.name())), buf),
            // The pool thread owns the buffer only while the job runs; run() returned, so the
            // job is finished or was never started and the buffer is still in the slot.
            None => unreachable!("buffer slot emptied by a finished job"),
        }
    }

    async fn create(&self, key: &str) -> Result<Box<dyn ObjectWriter>> {
        validate_key(key).map_err(|e| e.context(Operation::Create, key, self.name()))?;
        let inner = Arc::clone(&self.inner);
        let (file, staged) = self
            .inner
            .pool
            .run(move || {
                let (file, staged) = inner.root.create_staged(0)?;
                // Removed with the result if this future is dropped before it arrives.
                Ok((file, StagedGuard::new(staged)))
            })
            .await
            .map_err(|e| e.context(Operation::Create, key, self.name()))?;
        let Some(staged) = staged.keep() else {
            return Err(Error::new(ErrorKind::Shutdown, "staged file lost").context(
                Operation::Create,
                key,
                self.name(),
            ));
        };
        Ok(Box::new(PosixWriter {
            tier: self.clone(),
            key: key.to_string(),
            in_flight: Arc::default(),
            file: Some(Arc::new(file)),
            staged,
        }))
    }

    async fn read_batch(&self, mut batch: ReadBatch) -> ReadBatch {
        // Hand every pending request to the pool at once, then collect in order.
        let mut pending = Vec::with_capacity(batch.len());
        {
            let (keys, entries) = batch.parts_mut();
            for (i, entry) in entries.iter_mut().enumerate() {
                if entry.is_done() {
                    continue;
                }
                let Some(mut buf) = entry.take_buf() else {
                    continue;
                };
                let inner = Arc::clone(&self.inner);
                let key = entry.key(keys).to_string();
                let (offset, len) = (entry.offset(), entry.len());
                let fut = self.inner.pool.run(move || {
                    let start = std::time::Instant::now();
                    let res = Self::read_blocking(&inner, &key, offset, len, &mut buf);
                    Ok((res, buf, start.elapsed()))
                });
                pending.push((i, fut));
            }
        }
        let name = self.inner.name.clone();
        let (keys, entries) = batch.parts_mut();
        for (i, fut) in pending {
            match fut.await {
                Ok((res, buf, latency)) => {
                    let key = entries[i].key(keys);
                    entries[i].set_latency(latency);
                    entries[i].finish(res.map_err(|e| e.context(Operation::Read, key, &name)), buf)
                }
                Err(e) => entries[i].set_result(Err(e.with_tier(&name))),
            }
        }
        batch
    }
}

struct PosixWriter {
    tier: PosixTier,
    key: String,
    /// Writes not yet done on the pool (some perhaps abandoned by a dropped future).
    in_flight: Arc<WritesInFlight>,
    file: Option<Arc<File>>,
    staged: StagedFile,
}

impl fmt::Debug for PosixWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PosixWriter").field("key", &self.key).field("staged", &self.staged).finish()
    }
}

#[async_trait]
impl ObjectWriter for PosixWriter {
    fn key(&self) -> &str {
        &self.key
    }

    async fn write_at(&mut self, offset: u64, buf: AlignedBuf) -> (Result<()>, AlignedBuf) {
        let Some(file) = self.file.clone() else {
            return (Err(Error::new(ErrorKind::InvalidInput, "writer already finished")), buf);
        };
        // Writes of a writer land in order, even after a dropped write_at future.
        self.in_flight.idle().await;
        let ticket = self.in_flight.ticket();
        let slot = Arc::new(std::sync::Mutex::new(Some(buf)));
        let slot2 = Arc::clone(&slot);
        #[cfg(feature = "fs-trace")]
        let staged = self.staged.clone();
        let res = self
            .tier
            .inner
            .pool
            .run(move || {
                let _ticket = ticket;
                let guard = slot2.lock().unwrap_or_else(|p| p.into_inner());
                match guard.as_ref() {
                    Some(buf) => {
                        file.write_all_at(buf.as_slice(), offset).map_err(Error::from)?;
                        #[cfg(feature = "fs-trace")]
                        staged.trace_write(offset, buf.as_slice(), false);
                        Ok(())
                    }
                    None => Err(Error::new(ErrorKind::Shutdown, "buffer lost")),
                }
            })
            .await
            .map_err(|e| e.context(Operation::Write, &self.key, self.tier.name()));
        let buf = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
        match buf {
            Some(buf) => (res, buf),
            None => unreachable!("buffer slot emptied by a finished job"),
        }
    }

    async fn commit(mut self: Box<Self>) -> Result<ObjectMeta> {
        if self.file.is_none() {
            return Err(Error::new(ErrorKind::InvalidInput, "writer already finished"));
        }
        // Writes abandoned by dropped futures finish before the data fsync.
        self.in_flight.idle().await;
        let Some(file) = self.file.take() else {
            return Err(Error::new(ErrorKind::InvalidInput, "writer already finished"));
        };
        let inner = Arc::clone(&self.tier.inner);
        let staged = self.staged.clone();
        let key = self.key.clone();
        let res = self
            .tier
            .inner
            .pool
            .run(move || {
                if inner.sync {
                    inner.root.commit_staged(&file, &staged, &key)
                } else {
                    inner.root.publish_staged_unsynced(&file, &staged, &key)
                }
            })
            .await;
        if res.is_err() {
            let _ = self.staged.remove();
        }
        res.map_err(|e| e.context(Operation::Commit, &self.key, self.tier.name()))
    }

    async fn abort(mut self: Box<Self>) -> Result<()> {
        self.file.take();
        self.staged.remove().map_err(|e| e.context(Operation::Abort, &self.key, self.tier.name()))
    }
}

impl Drop for PosixWriter {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = self.staged.remove();
        }
    }
}
