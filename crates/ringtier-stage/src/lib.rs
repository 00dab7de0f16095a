#![doc = include_str!("../README.md")]

use std::sync::Arc;
use std::time::Instant;

use ringtier_core::error::{Error, ErrorKind, Result};
use ringtier_core::{AlignedBuf, BufferPool, ReadBatch, Tier};

use crate::hooks::Hooks;
use crate::inflight::{CopyItem, InFlight, Span};

#[cfg(test)]
mod cancel_tests;
#[cfg(feature = "cuda")]
mod cuda;
mod hooks;
mod host;
mod inflight;

/// Where staged batches end up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Host memory (the CPU path; also what a machine without a GPU stages into).
    Host,
    /// A CUDA device by index (feature `cuda`).
    Cuda(usize),
}

/// How the slab of a [`PinnedPool`] is pinned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pinning {
    /// `mlock`ed page-locked host memory.
    Mlock,
    /// Registered with the CUDA driver (page-locked, DMA-able).
    CudaRegistered,
    /// Not locked: `mlock` was refused (RLIMIT_MEMLOCK too small); a warning was logged.
    Unlocked,
}

/// A buffer pool over one page-locked slab.
#[derive(Debug, Clone)]
pub struct PinnedPool {
    pool: BufferPool,
    pinning: Pinning,
}

impl PinnedPool {
    /// `count` buffers of `buf_size` bytes (rounded up to 4096), pinned for `target`.
    ///
    /// The slab is unlocked (or unregistered from the CUDA driver) and freed only when this
    /// pool, its clones and every buffer taken from it are gone; a buffer that a copy to the
    /// target may still read is held by that copy's batch until the copy completed, so the
    /// slab outlives every copy from it whatever is dropped first.
    pub fn new(buf_size: usize, count: usize, target: Target) -> Result<Self> {
        Self::build(buf_size, count, target, || {})
    }

    /// As `new`; `before_release` runs when the slab is about to be released (tests watch it).
    fn build(
        buf_size: usize,
        count: usize,
        target: Target,
        before_release: impl FnOnce() + Send + Sync + 'static,
    ) -> Result<Self> {
        if buf_size == 0 || count == 0 {
            return Err(Error::new(ErrorKind::InvalidInput, "a pinned pool needs buf_size > 0 and count > 0"));
        }
        let buf_size = buf_size.next_multiple_of(4096);
        let len = buf_size
            .checked_mul(count)
            .ok_or_else(|| Error::new(ErrorKind::InvalidInput, "pinned pool size overflows"))?;
        // Zeroed and touched now, huge pages where the system allows them: a direct read into
        // 2 MiB pages needs far fewer device segments than one into scattered 4 KiB pages.
        let slab = ringtier_core::buf::alloc_touched(len, 4096)?;
        let ptr = slab.ptr();
        #[cfg(feature = "cuda")]
        let mut registration = None;
        let pinning = match target {
            Target::Host => {
                // SAFETY: mlock of our own allocation.
                if unsafe { libc::mlock(ptr.as_ptr().cast(), len) } == 0 {
                    Pinning::Mlock
                } else {
                    let e = std::io::Error::last_os_error();
                    tracing::warn!(
                        "could not mlock {len} bytes of staging buffers ({e}); RLIMIT_MEMLOCK is probably too small. \
                         Staging from unlocked memory."
                    );
                    Pinning::Unlocked
                }
            }
            #[cfg(feature = "cuda")]
            Target::Cuda(device) => match cuda::register(device, ptr, len) {
                Ok(r) => {
                    registration = Some(r);
                    Pinning::CudaRegistered
                }
                Err(e) => {
                    // SAFETY: allocated above, not shared yet.
                    unsafe { slab.free() };
                    return Err(e);
                }
            },
            #[cfg(not(feature = "cuda"))]
            Target::Cuda(_) => {
                // SAFETY: allocated above, not shared yet.
                unsafe { slab.free() };
                return Err(no_cuda_feature());
            }
        };
        let release = move || {
            before_release();
            if pinning == Pinning::Mlock {
                // SAFETY: unlock our own allocation once, when the pool and every buffer taken
                // from it are gone.
                unsafe { libc::munlock(slab.ptr().as_ptr().cast(), slab.len()) };
            }
            #[cfg(feature = "cuda")]
            if let Some(r) = registration {
                r.unregister();
            }
            // SAFETY: as above; nothing uses the slab after this.
            unsafe { slab.free() };
        };
        // SAFETY: the slab is `len` initialised bytes, used only through the pool, released
        // by `release`; 4096 divides both base (2 MiB aligned) and buf_size.
        let pool = unsafe { BufferPool::from_raw_slab(ptr, buf_size, count, 4096, release)? };
        Ok(PinnedPool { pool, pinning })
    }

    /// The pool (give it to the io_uring tier to have it registered as fixed buffers).
    pub fn pool(&self) -> &BufferPool {
        &self.pool
    }

    /// How the slab is pinned.
    pub fn pinning(&self) -> Pinning {
        self.pinning
    }

    /// True when the slab is page-locked.
    pub fn is_locked(&self) -> bool {
        self.pinning != Pinning::Unlocked
    }
}

/// Whether the CUDA driver library (libcuda) loads on this machine, checked without creating
/// a context: `Some(true)` or `Some(false)` in a build with feature `cuda`, `None` in a build
/// without it (batches are then staged into pinned host memory only). `ringtier doctor`
/// reports it.
pub fn cuda_driver_present() -> Option<bool> {
    #[cfg(feature = "cuda")]
    {
        Some(cuda::driver_present())
    }
    #[cfg(not(feature = "cuda"))]
    {
        None
    }
}

#[cfg(not(feature = "cuda"))]
fn no_cuda_feature() -> Error {
    Error::new(
        ErrorKind::Unsupported,
        "staging to a CUDA device needs ringtier built with the `cuda` feature; use the host target",
    )
    .with_operation(ringtier_core::Operation::Setup)
}

/// Host destination buffers, reused across batches (as device memory would be): a fresh
/// allocation per sample would pay first-touch page faults on every copy.
pub(crate) type HostFree = Arc<std::sync::Mutex<Vec<Vec<u8>>>>;

/// A staged sample in host memory; its buffer returns to the stager's free list on drop.
#[derive(Debug)]
pub struct HostBuf {
    data: Vec<u8>,
    free: HostFree,
}

impl HostBuf {
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        let data = std::mem::take(&mut self.data);
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if free.len() < 4096 {
            free.push(data);
        }
    }
}

/// One staged sample: on the device (feature `cuda`) or in host memory.
#[derive(Debug)]
pub enum Staged {
    /// Host memory (the CPU path).
    Host(HostBuf),
    /// Device memory.
    #[cfg(feature = "cuda")]
    Device(cudarc::driver::CudaSlice<u8>),
}

impl Staged {
    /// Bytes staged.
    pub fn len(&self) -> usize {
        match self {
            Staged::Host(v) => v.data.len(),
            #[cfg(feature = "cuda")]
            Staged::Device(d) => d.len(),
        }
    }

    /// The staged bytes when they are in host memory (the CPU path); `None` for device memory.
    pub fn as_host_slice(&self) -> Option<&[u8]> {
        match self {
            Staged::Host(v) => Some(v.as_slice()),
            #[cfg(feature = "cuda")]
            Staged::Device(_) => None,
        }
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A batch whose copies to the target may still be running.
///
/// Dropping it without [`wait`](StagedBatch::wait), or dropping the `wait` future at its
/// await, is safe at any time: the pinned buffers the copies read are owned by the batch's
/// in-flight request, not by this handle, and return to the pool only once the copy engine's
/// completion (the CUDA event, or the host copy thread) has been observed.
pub struct StagedBatch {
    inner: Pending,
    bytes: u64,
    read_seconds: f64,
}

impl std::fmt::Debug for StagedBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagedBatch").field("bytes", &self.bytes).finish()
    }
}

/// A batch in flight on one of the copy engines.
enum Pending {
    Host(InFlight<HostBuf>),
    #[cfg(feature = "cuda")]
    Cuda(InFlight<cudarc::driver::CudaSlice<u8>>),
}

impl Pending {
    /// The staged samples in order, and the pinned buffers if the batch kept them.
    async fn wait(self) -> Result<(Vec<Staged>, Vec<AlignedBuf>)> {
        match self {
            Pending::Host(f) => {
                let (out, kept) = f.wait().await?;
                Ok((out.into_iter().map(Staged::Host).collect(), kept))
            }
            #[cfg(feature = "cuda")]
            Pending::Cuda(f) => {
                let (out, kept) = f.wait().await?;
                Ok((out.into_iter().map(Staged::Device).collect(), kept))
            }
        }
    }
}

impl StagedBatch {
    /// Bytes in the batch.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Seconds the read into pinned buffers took.
    pub fn read_seconds(&self) -> f64 {
        self.read_seconds
    }

    /// Waits for the copies and returns the staged samples in request order. The batch's
    /// pinned buffers have returned to the pool by then (they do as soon as the copies
    /// complete, waited for or not). A copy engine's error is returned here.
    pub async fn wait(self) -> Result<Vec<Staged>> {
        Ok(self.inner.wait().await?.0)
    }
}

/// The copy engine of a stager.
enum Engine {
    /// A thread standing in for the DMA engine.
    Host(host::HostStream),
    /// A CUDA stream, events, and a thread observing them.
    #[cfg(feature = "cuda")]
    Cuda(cuda::Device),
}

/// Reads batches into pinned buffers and copies them to the target, overlapping the copy of
/// one batch with the read of the next.
///
/// Cancellation: every future it returns may be dropped at any await, and every
/// [`StagedBatch`] may be dropped unwaited; pinned buffers still being copied stay owned by
/// their in-flight batch until the copy completed (see the crate docs).
pub struct Stager {
    /// Dropped first: the copy engine finishes what it has queued before the rest goes.
    engine: Engine,
    tier: Arc<dyn Tier>,
    pool: PinnedPool,
    target: Target,
    host_free: HostFree,
    /// Taken while a batch acquires pinned buffers, so that concurrent batches never each
    /// hold part of the pool while waiting for the rest.
    acquiring: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Stager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stager").field("target", &self.target).field("pool", &self.pool).finish()
    }
}

impl Stager {
    /// A stager reading from `tier` into `pool`, staging to `target`.
    pub fn new(tier: Arc<dyn Tier>, pool: PinnedPool, target: Target) -> Result<Self> {
        Self::with_hooks(tier, pool, target, Arc::default())
    }

    /// As `new`, with the copy engine's test hooks (empty outside this crate's tests).
    fn with_hooks(tier: Arc<dyn Tier>, pool: PinnedPool, target: Target, hooks: Arc<Hooks>) -> Result<Self> {
        let host_free = HostFree::default();
        let engine = match target {
            Target::Host => Engine::Host(host::HostStream::new(Arc::clone(&host_free), hooks)?),
            #[cfg(feature = "cuda")]
            Target::Cuda(d) => Engine::Cuda(cuda::Device::open(d, hooks)?),
            #[cfg(not(feature = "cuda"))]
            Target::Cuda(_) => return Err(no_cuda_feature()),
        };
        Ok(Stager { engine, tier, pool, target, host_free, acquiring: tokio::sync::Mutex::new(()) })
    }

    /// Starts the copies of `items` on the engine; see [`host::HostStream::launch`].
    fn launch(&self, items: Vec<CopyItem>, keep: bool) -> Result<Pending> {
        match &self.engine {
            Engine::Host(h) => h.launch(items, keep).map(Pending::Host),
            #[cfg(feature = "cuda")]
            Engine::Cuda(d) => d.launch(items, keep).map(Pending::Cuda),
        }
    }

    /// Reads `requests` into buffers of `pool`: one copy item per request, named by its key.
    async fn read_into(&self, pool: &BufferPool, requests: &[(String, usize)]) -> Result<(Vec<CopyItem>, u64, f64)> {
        if requests.len() > pool.count() {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "a batch of {} requests is larger than the pinned pool ({} buffers)",
                    requests.len(),
                    pool.count()
                ),
            ));
        }
        if let Some((k, n)) = requests.iter().find(|(_, n)| *n > pool.buf_size()) {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("{k}: {n} bytes do not fit a pinned buffer of {} bytes", pool.buf_size()),
            ));
        }
        let mut batch = ReadBatch::with_capacity(requests.len(), requests.len() * 32);
        {
            let _one_batch_at_a_time =
                if pool.id() == self.pool.pool().id() { Some(self.acquiring.lock().await) } else { None };
            for (key, len) in requests {
                batch.push(key, 0, *len, pool.acquire().await);
            }
        }
        let t = Instant::now();
        let mut batch = self.tier.read_batch(batch).await;
        let read_seconds = t.elapsed().as_secs_f64();
        let mut items = Vec::with_capacity(requests.len());
        let mut bytes = 0;
        for (key, _, res, buf) in batch.drain() {
            let n = res.map_err(|e| e.with_key(key))?;
            bytes += n as u64;
            let buf = buf.ok_or_else(|| Error::new(ErrorKind::Shutdown, "buffer lost").with_key(key))?;
            items.push(CopyItem::of(buf, key));
        }
        Ok((items, bytes, read_seconds))
    }

    /// Reads `requests` (key, bytes) into pinned buffers and launches their copies to the
    /// target; returns without waiting for the copies. A batch needs one pinned buffer per
    /// request, each at least as large as its request.
    ///
    /// If the copy of request `k` cannot be started, the error names it; the buffers of
    /// requests `k..` are released at once and those of the copies already started once
    /// they complete.
    pub async fn stage(&self, requests: &[(String, usize)]) -> Result<StagedBatch> {
        let (items, bytes, read_seconds) = self.read_into(self.pool.pool(), requests).await?;
        // No await from here on: the copies start and their batch owns the buffers.
        let inner = self.launch(items, false)?;
        Ok(StagedBatch { inner, bytes, read_seconds })
    }

    /// Copy bandwidth without storage, in bytes per second: `(through the stager's copy path
    /// from every pinned buffer, one big copy of the whole pinned slab)`, each repeated
    /// `rounds` times. The second is the reference the first is judged against (the device's
    /// pinned copy bandwidth on a GPU, memory bandwidth on the CPU path). Holds every buffer of
    /// the pool while it runs: call it while nothing else stages.
    pub async fn copy_bandwidth(&self, rounds: usize) -> Result<(f64, f64)> {
        let pool = self.pool.pool();
        let batch = pool.count();
        let mut bufs = Vec::with_capacity(batch);
        {
            let _one_batch_at_a_time = self.acquiring.lock().await;
            for _ in 0..batch {
                let mut b = pool.acquire().await;
                let cap = b.capacity();
                b.set_window(0, cap)?;
                bufs.push(b);
            }
        }
        let bytes = (batch * pool.buf_size()) as f64 * rounds.max(1) as f64;
        // Through the stager: per-buffer copies, completion tracked per batch.
        let t = Instant::now();
        for _ in 0..rounds.max(1) {
            bufs = self.copy_batch(bufs).await?;
        }
        let staged = bytes / t.elapsed().as_secs_f64();
        // The reference: one copy of the same bytes, into a destination touched beforehand
        // (the first copy).
        bufs = self.copy_reference(bufs).await?;
        let t = Instant::now();
        for _ in 0..rounds.max(1) {
            bufs = self.copy_reference(bufs).await?;
        }
        drop(bufs);
        let reference = bytes / t.elapsed().as_secs_f64();
        Ok((staged, reference))
    }

    /// Copies `bufs` the way `stage` does and hands them back once done.
    async fn copy_batch(&self, bufs: Vec<AlignedBuf>) -> Result<Vec<AlignedBuf>> {
        let items = bufs.into_iter().map(|b| CopyItem::of(b, "pinned buffer")).collect();
        Ok(self.launch(items, true)?.wait().await?.1)
    }

    /// One big copy of the whole pinned slab (the reference); `bufs` must be every buffer of
    /// the pool, and are handed back once done.
    async fn copy_reference(&self, bufs: Vec<AlignedBuf>) -> Result<Vec<AlignedBuf>> {
        let pool = self.pool.pool();
        if bufs.len() != pool.count() || bufs.iter().any(|b| b.pool_slot().map(|(id, _)| id) != Some(pool.id())) {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "the reference copy needs every buffer of the pinned pool",
            ));
        }
        let (base, len) = pool.slab();
        // SAFETY: `bufs` holds all `count` buffers of the pool (each slot is handed out once),
        // so the whole slab lies inside memory they own and nothing else writes it while the
        // copy item holds them.
        let span = unsafe { Span::raw(base, len) };
        let item = CopyItem { span, bufs, label: "pinned slab".into() };
        Ok(self.launch(vec![item], true)?.wait().await?.1)
    }

    /// Baseline: reads into the pinned buffers and stops there (the raw read the staging
    /// overhead is measured against). Returns the bytes read.
    pub async fn read_only(&self, requests: &[(String, usize)]) -> Result<u64> {
        Ok(self.read_into(self.pool.pool(), requests).await?.1)
    }

    /// Baseline: reads into `pageable` (ordinary, unpinned buffers) and copies to the target
    /// with no overlap: the copies are waited for before it returns. Returns the bytes staged.
    pub async fn stage_pageable(&self, requests: &[(String, usize)], pageable: &BufferPool) -> Result<u64> {
        let (items, bytes, _) = self.read_into(pageable, requests).await?;
        match &self.engine {
            Engine::Host(_) => {
                // On this thread, into the same reused destination buffers as the pipelined
                // path: the buffers are ours throughout.
                let copies: Vec<HostBuf> = items
                    .iter()
                    .flat_map(|item| item.bufs.iter())
                    .map(|b| {
                        let mut data =
                            self.host_free.lock().unwrap_or_else(|p| p.into_inner()).pop().unwrap_or_default();
                        data.clear();
                        data.extend_from_slice(b.as_slice());
                        HostBuf { data, free: Arc::clone(&self.host_free) }
                    })
                    .collect();
                drop(copies);
            }
            #[cfg(feature = "cuda")]
            Engine::Cuda(_) => {
                self.launch(items, false)?.wait().await?;
            }
        }
        Ok(bytes)
    }
}
