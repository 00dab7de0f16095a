//! The io_uring file tier: objects are files under a root directory, read and written through
//! io_uring driver threads, with O_DIRECT decided per file.

use std::fmt;
use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures_channel::oneshot;
use ringtier_core::blocking::BlockingPool;
use ringtier_core::buf::align_up;
use ringtier_core::error::{Error, ErrorKind, Operation, Result};
use ringtier_core::fs::{dio_align_of_fd, fs_type_name, probe_dio_align, FsRoot, StagedFile, StagedGuard};
use ringtier_core::key::validate_key;
use ringtier_core::{
    Adopted, AlignedBuf, BufferPool, Capabilities, ListOptions, Listing, ObjectMeta, ObjectReader, ObjectWriter,
    ReadBatch, Space, Tier, TierLock,
};

use crate::config::{BufferedWrites, DirectIoPolicy, UringConfig};
use crate::driver::{self, BatchJob, DriverHandle, FsyncJob, Job, Shared, Target, WriteJob, FIXED_FILE_SLOTS};
use crate::engine::UringRefusal;
#[cfg(feature = "fail-points")]
use crate::fail::FailPoints;
use crate::fd::{FixedSlot, SharedFile, SlotTable};
use ringtier_core::writes::{WriteTicket, WritesInFlight};

mod writer;
use writer::UringWriter;

/// A snapshot of a tier's io_uring counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UringStats {
    /// Reads issued with O_DIRECT.
    pub reads_direct: u64,
    /// Reads issued through the page cache.
    pub reads_buffered: u64,
    /// Files read buffered because direct I/O was not possible under policy `auto`.
    pub direct_io_fallbacks: u64,
    /// Reads into registered (fixed) buffers.
    pub fixed_buffer_reads: u64,
    /// Reads through registered (fixed) files.
    pub fixed_file_reads: u64,
    /// `io_uring_enter` calls that submitted work.
    pub submits: u64,
    /// Submission queue entries pushed.
    pub sqes: u64,
    /// Requests resubmitted after a short read or write, EAGAIN or EINTR.
    pub resubmits: u64,
    /// Times registered buffers or files could not be set up and plain ones were used.
    pub register_fallbacks: u64,
}

struct Inner {
    shared: Arc<Shared>,
    root: Arc<FsRoot>,
    config: UringConfig,
    drivers: Vec<DriverHandle>,
    next: AtomicUsize,
    meta: BlockingPool,
    pool: Option<BufferPool>,
    root_align: (u32, u32),
    fixed_slots: SlotTable,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for d in &mut self.drivers {
            d.stop();
        }
    }
}

impl Inner {
    fn driver(&self) -> &DriverHandle {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.drivers.len();
        &self.drivers[i]
    }

    fn name(&self) -> &str {
        &self.shared.name
    }

    async fn run_batch(&self, mut batch: ReadBatch, target: Target) -> ReadBatch {
        let (tx, rx) = oneshot::channel();
        let job = BatchJob::new(std::mem::take(&mut batch), target, Arc::clone(&self.shared), tx);
        if let Err(e) = self.driver().send(Job::Batch(job)) {
            // The job (and its buffers) went down with the channel: report on what is left.
            batch.fail_pending(&e);
            return batch;
        }
        match rx.await {
            Ok(b) => b,
            Err(_) => {
                let mut b = ReadBatch::new();
                b.fail_pending(&Error::new(ErrorKind::Shutdown, "io_uring driver stopped"));
                b
            }
        }
    }

    /// Writes `len` bytes of `buf`'s data window at `offset` through a ring. The job owns the
    /// buffer, the file and `ticket` until its last completion is reaped, whether or not this
    /// future is still there to hear about it.
    async fn write(
        &self,
        file: Arc<File>,
        offset: u64,
        len: usize,
        align: u64,
        buf: AlignedBuf,
        ticket: WriteTicket,
    ) -> (Result<()>, Option<AlignedBuf>) {
        let (tx, rx) = oneshot::channel();
        let job = Box::new(WriteJob {
            file,
            offset,
            len,
            align,
            buf: Some(buf),
            written: 0,
            retries: 0,
            done: Some(tx),
            _guard: Box::new(ticket),
        });
        if let Err(e) = self.driver().send(Job::Write(job)) {
            return (Err(e), None);
        }
        match rx.await {
            Ok(done) => done,
            Err(_) => (Err(Error::new(ErrorKind::Shutdown, "io_uring driver stopped")), None),
        }
    }

    async fn fdatasync(&self, file: Arc<File>) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        self.driver().send(Job::Fsync(Box::new(FsyncJob { file, retries: 0, done: Some(tx) })))?;
        rx.await.map_err(|_| Error::new(ErrorKind::Shutdown, "io_uring driver stopped"))?
    }

    fn senders(&self) -> Vec<crossbeam_channel::Sender<Job>> {
        self.drivers.iter().filter_map(|d| d.tx.clone()).collect()
    }
}

/// Files under a root directory, read and written through io_uring.
///
/// * Batch reads submit every request at once and keep `queue_depth` in flight per ring;
///   each request is `statx` -> `openat2` -> `read` -> `close`, all through the ring, with no
///   thread per file. `statx(STATX_DIOALIGN)` decides O_DIRECT per file.
/// * Opens use `openat2(RESOLVE_BENEATH)` relative to the root, so no key or symlink can
///   reach outside it.
/// * Writes go to a staged file through the ring (O_DIRECT where possible, the unaligned tail
///   padded and trimmed at commit); commit is fdatasync through the ring, then atomic rename
///   and directory fsync.
///
/// Needs Linux 5.15 or newer (`IORING_OP_STATX`, `OPENAT2`, `CLOSE`, `READ`, `WRITE`).
#[derive(Clone)]
pub struct UringTier {
    inner: Arc<Inner>,
}

impl fmt::Debug for UringTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UringTier")
            .field("name", &self.inner.shared.name)
            .field("root", &self.inner.root.path())
            .field("fs", &self.inner.shared.fs_type)
            .field("config", &self.inner.config)
            .finish()
    }
}

/// Options of a [`UringTier`] that are not engine knobs.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct UringTierOptions {
    /// Name used in errors and metric labels. Default `uring:ROOT` (what and where, so two
    /// tiers are told apart).
    pub name: Option<String>,
    /// Create the root directory when it is missing. Default false.
    pub create_root: bool,
    /// The buffer pool reads use; registered as fixed buffers when the config says so.
    pub pool: Option<BufferPool>,
    /// Use this `(memory, offset)` direct-I/O alignment for new files instead of probing the
    /// root with an `O_TMPFILE`. Reads open files with O_DIRECT on this guess, without `statx`
    /// (whole files and pieces at an offset), and go through `statx` when the kernel refuses
    /// or a piece finds nothing at its offset; `(0, 0)` disables the guess.
    pub assume_dio_alignment: Option<(u32, u32)>,
    /// Follow symbolic links out of the root (a dataset whose files or class folders are
    /// links), see [`FsRoot::following_links`]; the tier is then read-only. Default false.
    pub follow_links: bool,
    /// Fail points that rewrite this tier's completions (short reads and writes, errnos), to
    /// test every completion path. Feature `fail-points`.
    #[cfg(feature = "fail-points")]
    pub fail_points: Option<Arc<FailPoints>>,
    /// A trace of the root's operations and writes, for the crash-state explorer. Feature
    /// `fs-trace`.
    #[cfg(feature = "fs-trace")]
    pub fs_trace: Option<Arc<ringtier_core::fs::trace::FsTrace>>,
}

impl UringTierOptions {
    /// Sets [`UringTierOptions::name`].
    pub fn with_name(mut self, name: impl Into<Option<String>>) -> Self {
        self.name = name.into();
        self
    }

    /// Sets [`UringTierOptions::create_root`].
    pub fn with_create_root(mut self, create_root: bool) -> Self {
        self.create_root = create_root;
        self
    }

    /// Sets [`UringTierOptions::pool`].
    pub fn with_pool(mut self, pool: impl Into<Option<BufferPool>>) -> Self {
        self.pool = pool.into();
        self
    }

    /// Sets [`UringTierOptions::assume_dio_alignment`].
    pub fn with_assume_dio_alignment(mut self, assume_dio_alignment: impl Into<Option<(u32, u32)>>) -> Self {
        self.assume_dio_alignment = assume_dio_alignment.into();
        self
    }

    /// Sets [`UringTierOptions::follow_links`].
    pub fn with_follow_links(mut self, follow_links: bool) -> Self {
        self.follow_links = follow_links;
        self
    }

    #[cfg(feature = "fs-trace")]
    /// Sets [`UringTierOptions::fs_trace`].
    pub fn with_fs_trace(mut self, fs_trace: Option<Arc<ringtier_core::fs::trace::FsTrace>>) -> Self {
        self.fs_trace = fs_trace;
        self
    }

    #[cfg(feature = "fail-points")]
    /// Sets [`UringTierOptions::fail_points`].
    pub fn with_fail_points(mut self, fail_points: impl Into<Option<Arc<FailPoints>>>) -> Self {
        self.fail_points = fail_points.into();
        self
    }
}

impl UringTier {
    /// Opens a tier over an existing root directory with `config`.
    pub fn new(root: impl AsRef<Path>, config: UringConfig) -> Result<Self> {
        Self::with_options(root, config, UringTierOptions::default())
    }

    /// Opens a tier with `config` and `options`.
    pub fn with_options(root: impl AsRef<Path>, config: UringConfig, options: UringTierOptions) -> Result<Self> {
        let name = options.name.unwrap_or_else(|| format!("uring:{}", root.as_ref().display()));
        if config.rings == 0 || config.queue_depth == 0 {
            return Err(
                Error::new(ErrorKind::InvalidInput, "rings and queue_depth must be at least 1").with_tier(&name)
            );
        }
        config.validate().map_err(|why| Error::new(ErrorKind::InvalidInput, why).with_tier(&name))?;
        let root = Arc::new(
            FsRoot::open(root.as_ref(), options.create_root)
                .map_err(|e| e.with_tier(&name))?
                .following_links(options.follow_links),
        );
        #[cfg(feature = "fs-trace")]
        let root = match Arc::try_unwrap(root) {
            Ok(r) => Arc::new(r.with_trace(options.fs_trace.clone())),
            Err(r) => r,
        };
        let probed = options.assume_dio_alignment.or_else(|| probe_dio_align(root.root_fd()));
        let root_align = probed.unwrap_or((0, 0));
        let fs_type = fs_type_name(root.path());
        if config.direct_io == DirectIoPolicy::Required && probed.is_some() && root_align.0 == 0 {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "direct I/O is required but {} ({fs_type}) does not support it (statx reports no DIO alignment)",
                    root.path().display()
                ),
            )
            .with_operation(Operation::Open)
            .with_tier(&name));
        }
        let known = (root_align.0 > 0 && root_align.1 > 0).then(|| (u64::from(root_align.0), u64::from(root_align.1)));
        #[allow(unused_mut)]
        let mut shared = Shared::new(name, fs_type, config.direct_io, known);
        #[cfg(feature = "fail-points")]
        {
            shared.fail = options.fail_points.clone();
        }
        let shared = Arc::new(shared);
        let mut drivers = Vec::with_capacity(config.rings);
        for i in 0..config.rings {
            match driver::spawn(i, &config, options.pool.clone(), Arc::clone(&shared)) {
                Ok(d) => drivers.push(d),
                // Without CAP_IPC_LOCK the rings' memory counts against `ulimit -l`: the first
                // ring may take what is left (each ring is retried smaller on its own). The
                // rings made so far serve the tier.
                Err(e) if !drivers.is_empty() && crate::engine::setup_refusal(&e) == Some(UringRefusal::NoMemory) => {
                    tracing::warn!(
                        tier = %shared.name,
                        "io_uring_setup refused ring {} of {} (ENOMEM: locked-memory limit); using {i}. \
                         Raise `ulimit -l` for all of them.",
                        i + 1,
                        config.rings
                    );
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        let meta = BlockingPool::new("ringtier-uring-meta", config.metadata_threads)?;
        tracing::debug!(
            tier = %shared.name, root = %root.path().display(), fs = fs_type,
            dio_mem_align = root_align.0, dio_offset_align = root_align.1, "opened io_uring tier"
        );
        Ok(UringTier {
            inner: Arc::new(Inner {
                shared,
                root,
                config,
                drivers,
                next: AtomicUsize::new(0),
                meta,
                pool: options.pool,
                root_align,
                fixed_slots: Arc::new(Mutex::new(vec![false; FIXED_FILE_SLOTS as usize])),
            }),
        })
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        self.inner.root.path()
    }

    /// The engine configuration.
    pub fn config(&self) -> &UringConfig {
        &self.inner.config
    }

    /// The buffer pool given at construction.
    pub fn pool(&self) -> Option<&BufferPool> {
        self.inner.pool.as_ref()
    }

    /// The `statx` direct-I/O alignment `(memory, offset)` of a new file under the root;
    /// zeros when unsupported or unknown.
    pub fn root_dio_alignment(&self) -> (u32, u32) {
        self.inner.root_align
    }

    /// The filesystem type of the root (ext4, tmpfs, ...).
    pub fn filesystem(&self) -> &'static str {
        self.inner.shared.fs_type
    }

    /// A snapshot of the io_uring counters.
    pub fn stats(&self) -> UringStats {
        let s = &self.inner.shared.stats;
        let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        UringStats {
            reads_direct: l(&s.reads_direct),
            reads_buffered: l(&s.reads_buffered),
            direct_io_fallbacks: l(&s.dio_fallbacks),
            fixed_buffer_reads: l(&s.fixed_buffer_reads),
            fixed_file_reads: l(&s.fixed_file_reads),
            submits: l(&s.submits),
            sqes: l(&s.sqes),
            resubmits: l(&s.resubmits),
            register_fallbacks: l(&s.register_fallbacks),
        }
    }

    /// Opens one object for many reads (a large file read at random offsets), with O_DIRECT
    /// per the policy and, when `register_files` is on, as a fixed file on every ring.
    pub async fn open_file(&self, key: &str) -> Result<UringFile> {
        validate_key(key).map_err(|e| e.context(Operation::Open, key, self.name()))?;
        let inner = Arc::clone(&self.inner);
        let k = key.to_string();
        let (file, size, direct, align) = self
            .inner
            .meta
            .run(move || {
                let fd = inner.root.open_beneath(&k, libc::O_RDONLY, 0)?;
                let file = File::from(fd);
                let meta = file.metadata()?;
                if !meta.is_file() {
                    return Err(Error::new(ErrorKind::NotFound, "not a regular file"));
                }
                let (mem, off) = dio_align_of_fd(file.as_raw_fd())?;
                let policy = inner.shared.policy;
                let supported = mem > 0 && off > 0;
                let direct = match policy {
                    DirectIoPolicy::Off => false,
                    DirectIoPolicy::Auto if !supported => {
                        inner.shared.count_fallback("the filesystem reports no direct-I/O alignment");
                        false
                    }
                    DirectIoPolicy::Required if !supported => {
                        return Err(Error::new(
                            ErrorKind::Unsupported,
                            format!(
                                "direct I/O is required but {k:?} on {} does not support it (statx reports no DIO alignment)",
                                inner.shared.fs_type
                            ),
                        ))
                    }
                    _ => true,
                };
                if direct {
                    // SAFETY: fcntl on our own open descriptor; F_GETFL/F_SETFL take ints.
                    let rc = unsafe {
                        let fl = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
                        libc::fcntl(file.as_raw_fd(), libc::F_SETFL, fl | libc::O_DIRECT)
                    };
                    if rc != 0 {
                        return Err(Error::from(std::io::Error::last_os_error()));
                    }
                }
                Ok((file, meta.len(), direct, u64::from(mem.max(off)).max(1)))
            })
            .await
            .map_err(|e| e.context(Operation::Open, key, self.name()))?;
        let mut shared = SharedFile::new(file);
        if self.inner.config.register_files {
            if let Some(slot) = self.register_file(shared.fd()).await {
                shared.set_fixed(slot);
            }
        }
        Ok(UringFile { tier: self.clone(), key: key.to_string(), file: Arc::new(shared), size, direct, align })
    }

    /// Registers `fd` in a free fixed-file slot on every ring. The slot is unregistered when the
    /// returned value is dropped, also when this future is dropped half-way.
    async fn register_file(&self, fd: RawFd) -> Option<FixedSlot> {
        let slot = FixedSlot::reserve(&self.inner.fixed_slots, self.inner.senders())?;
        let mut ok = true;
        for d in &self.inner.drivers {
            let (tx, rx) = oneshot::channel();
            if d.send(Job::RegisterFile { slot: slot.slot(), fd, reply: tx }).is_err() {
                ok = false;
                continue;
            }
            ok &= matches!(rx.await, Ok(Ok(())));
        }
        if ok {
            Some(slot)
        } else {
            self.inner.shared.stats.register_fallbacks.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[async_trait]
impl Tier for UringTier {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        let (mem, off) = self.inner.root_align;
        let direct = self.inner.config.direct_io != DirectIoPolicy::Off && mem > 0;
        Capabilities {
            direct_io: direct,
            alignment: if direct { mem.max(off) as usize } else { 1 },
            durable: self.inner.root.durable(),
            capacity_bytes: None,
            native_batch: true,
            locks: true,
        }
    }

    fn buffer_pool(&self) -> Option<BufferPool> {
        self.inner.pool.clone()
    }

    async fn space(&self) -> Result<Option<Space>> {
        let inner = Arc::clone(&self.inner);
        self.inner.meta.run(move || inner.root.space().map(Some)).await.map_err(|e| e.with_tier(self.name()))
    }

    async fn stat(&self, key: &str) -> Result<ObjectMeta> {
        self.inner.root.run_on(&self.inner.meta, Operation::Stat, key, self.name(), FsRoot::stat).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        self.inner.root.run_on(&self.inner.meta, Operation::List, prefix, self.name(), FsRoot::list).await
    }

    async fn list_with(&self, prefix: &str, options: ListOptions) -> Result<Listing> {
        self.inner.root.list_with_on(&self.inner.meta, prefix, options, self.name()).await
    }

    async fn delete(&self, key: &str) -> Result<()> {
        self.inner.root.run_on(&self.inner.meta, Operation::Delete, key, self.name(), FsRoot::delete).await
    }

    async fn remove_empty_dirs(&self, prefix: &str) -> Result<()> {
        self.inner
            .root
            .run_on(&self.inner.meta, Operation::Delete, prefix, self.name(), FsRoot::remove_empty_dirs)
            .await
    }

    async fn lock(&self, name: &str) -> Result<Option<TierLock>> {
        self.inner.root.lock(name).map(Some).map_err(|e| e.context(Operation::Open, name, self.name()))
    }

    /// [`FsRoot::adopt`] on the metadata threads: the files this tier writes and the ones it
    /// adopts lie alike under its root, so adopted objects read as written ones do (O_DIRECT
    /// decided per file).
    async fn adopt(&self, from: &str, key: &str) -> Result<Option<Adopted>> {
        let (inner, f, k) = (Arc::clone(&self.inner), from.to_string(), key.to_string());
        self.inner.meta.run(move || inner.root.adopt(&f, &k)).await.map_err(|e| e.with_tier(self.name()))
    }

    async fn read_at(&self, key: &str, offset: u64, len: usize, buf: AlignedBuf) -> (Result<usize>, AlignedBuf) {
        let mut batch = ReadBatch::with_capacity(1, key.len());
        batch.push(key, offset, len, buf);
        single_result(self.read_batch(batch).await)
    }

    async fn create(&self, key: &str) -> Result<Box<dyn ObjectWriter>> {
        validate_key(key).map_err(|e| e.context(Operation::Create, key, self.name()))?;
        let inner = Arc::clone(&self.inner);
        let (file, staged, direct, align) = self
            .inner
            .meta
            .run(move || {
                let want_direct = inner.shared.policy != DirectIoPolicy::Off && inner.root_align.0 > 0;
                let (file, staged, direct) =
                    match inner.root.create_staged(if want_direct { libc::O_DIRECT } else { 0 }) {
                        Ok((f, s)) => (f, s, want_direct),
                        Err(e) if want_direct && e.os_code() == Some(libc::EINVAL) => {
                            if inner.shared.policy == DirectIoPolicy::Required {
                                return Err(Error::new(
                                    ErrorKind::Unsupported,
                                    format!("direct I/O is required but {} refuses O_DIRECT", inner.shared.fs_type),
                                ));
                            }
                            inner.shared.count_fallback("the filesystem refused O_DIRECT for a new file");
                            let (f, s) = inner.root.create_staged(0)?;
                            (f, s, false)
                        }
                        Err(e) => return Err(e),
                    };
                // From here the file exists: an error, or a result nobody waits for any more
                // (this future dropped), removes it.
                let staged = StagedGuard::new(staged);
                let (mem, off) = if direct { dio_align_of_fd(file.as_raw_fd())? } else { (1, 1) };
                Ok((file, staged, direct, u64::from(mem.max(off)).max(1)))
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
        Ok(Box::new(UringWriter {
            tier: self.clone(),
            key: key.to_string(),
            in_flight: Arc::default(),
            file: Some(Arc::new(file)),
            buffered: None,
            staged,
            direct,
            align,
            end: 0,
            padded: false,
        }))
    }

    async fn read_batch(&self, batch: ReadBatch) -> ReadBatch {
        self.inner.run_batch(batch, Target::Keys { root: Arc::clone(&self.inner.root) }).await
    }

    async fn open_read(&self, key: &str) -> Result<Option<Arc<dyn ObjectReader>>> {
        Ok(Some(Arc::new(self.open_file(key).await?)))
    }
}

#[async_trait]
impl ObjectReader for UringFile {
    fn size(&self) -> u64 {
        self.size
    }

    async fn read_at(&self, offset: u64, len: usize, buf: AlignedBuf) -> (Result<usize>, AlignedBuf) {
        let mut batch = ReadBatch::with_capacity(1, 0);
        batch.push_range(offset, len, buf);
        single_result(self.read_batch(batch).await)
    }
}

/// The result and buffer of a batch of one read.
fn single_result(mut batch: ReadBatch) -> (Result<usize>, AlignedBuf) {
    match batch.drain().next().map(|(_, _, res, buf)| (res, buf)) {
        Some((res, Some(buf))) => (res, buf),
        // Only when the driver died and took the buffer with it.
        Some((res, None)) => (res.and(Err(Error::new(ErrorKind::Shutdown, "buffer lost"))), fallback_buf()),
        None => (Err(Error::new(ErrorKind::Shutdown, "io_uring driver stopped")), fallback_buf()),
    }
}

fn fallback_buf() -> AlignedBuf {
    // A minimal buffer to hand back when the original was lost with a stopped driver.
    AlignedBuf::new(1, 1).unwrap_or_else(|e| panic!("cannot allocate a 4 KiB buffer: {e}"))
}

/// One object opened for many reads through the tier's rings.
///
/// Dropping it while reads are queued or in flight is safe: those reads keep the file open
/// (and its fixed-file slot registered) until they complete.
pub struct UringFile {
    tier: UringTier,
    key: String,
    file: Arc<SharedFile>,
    size: u64,
    direct: bool,
    align: u64,
}

impl fmt::Debug for UringFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UringFile")
            .field("key", &self.key)
            .field("size", &self.size)
            .field("direct", &self.direct)
            .field("align", &self.align)
            .field("fixed", &self.file.fixed())
            .finish()
    }
}

impl UringFile {
    /// Size in bytes when opened.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// True when reads bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// The file's direct-I/O alignment (1 when buffered).
    pub fn alignment(&self) -> u64 {
        if self.direct {
            self.align
        } else {
            1
        }
    }

    /// The fixed-file slot, when registered.
    pub fn fixed_slot(&self) -> Option<u32> {
        self.file.fixed()
    }

    /// Reads every request of `batch` (added with [`ReadBatch::push_range`]; keys are
    /// ignored) from this file. Under O_DIRECT each buffer must be aligned to
    /// [`UringFile::alignment`] and hold the aligned span of its request.
    pub async fn read_batch(&self, batch: ReadBatch) -> ReadBatch {
        let target = Target::File {
            file: Arc::clone(&self.file),
            key: self.key.clone(),
            direct: self.direct,
            align: self.alignment(),
            size: self.size,
        };
        self.tier.inner.run_batch(batch, target).await
    }
}
