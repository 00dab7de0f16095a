#![doc = include_str!("../README.md")]

use std::sync::Arc;
use std::time::Instant;

use ringtier_core::blocking::BlockingPool;
use ringtier_core::error::{Error, ErrorKind, Operation, Result};
use ringtier_core::{AlignedBuf, BufferPool, ReadBatch, Tier};

#[cfg(feature = "cuda")]
mod cuda;

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
    pub fn new(buf_size: usize, count: usize, target: Target) -> Result<Self> {
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

fn no_cuda_feature() -> Error {
    Error::new(
        ErrorKind::Unsupported,
        "staging to a CUDA device needs ringtier built with the `cuda` feature; use the host target",
    )
    .with_operation(Operation::Setup)
}

/// Host destination buffers, reused across batches (as device memory would be): a fresh
/// allocation per sample would pay first-touch page faults on every copy.
type HostFree = Arc<std::sync::Mutex<Vec<Vec<u8>>>>;

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

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A batch whose copies to the target may still be running.
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

/// A host copy running on the copy thread.
type HostCopy = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<HostBuf>>> + Send>>;

enum Pending {
    Host(HostCopy),
    #[cfg(feature = "cuda")]
    Cuda(cuda::InFlight),
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

    /// Waits for the copies; the batch's pinned buffers return to the pool.
    pub async fn wait(self) -> Result<Vec<Staged>> {
        match self.inner {
            Pending::Host(f) => Ok(f.await?.into_iter().map(Staged::Host).collect()),
            #[cfg(feature = "cuda")]
            Pending::Cuda(inflight) => inflight.wait().await,
        }
    }
}

/// Reads batches into pinned buffers and copies them to the target, overlapping the copy of
/// one batch with the read of the next.
pub struct Stager {
    tier: Arc<dyn Tier>,
    pool: PinnedPool,
    target: Target,
    copier: BlockingPool,
    host_free: HostFree,
    #[cfg(feature = "cuda")]
    device: Option<cuda::Device>,
}

impl std::fmt::Debug for Stager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stager").field("target", &self.target).field("pool", &self.pool).finish()
    }
}

impl Stager {
    /// A stager reading from `tier` into `pool`, staging to `target`.
    pub fn new(tier: Arc<dyn Tier>, pool: PinnedPool, target: Target) -> Result<Self> {
        #[cfg(feature = "cuda")]
        let device = match target {
            Target::Cuda(d) => Some(cuda::Device::open(d)?),
            Target::Host => None,
        };
        #[cfg(not(feature = "cuda"))]
        if let Target::Cuda(_) = target {
            return Err(no_cuda_feature());
        }
        let copier = BlockingPool::new("ringtier-stage-copy", 1)?;
        Ok(Stager {
            tier,
            pool,
            target,
            copier,
            host_free: HostFree::default(),
            #[cfg(feature = "cuda")]
            device,
        })
    }

    /// Reads `requests` into buffers of `pool`.
    async fn read_into(&self, pool: &BufferPool, requests: &[(String, usize)]) -> Result<(Vec<AlignedBuf>, u64, f64)> {
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
        for (key, len) in requests {
            batch.push(key, 0, *len, pool.acquire().await);
        }
        let t = Instant::now();
        let mut batch = self.tier.read_batch(batch).await;
        let read_seconds = t.elapsed().as_secs_f64();
        let mut bufs: Vec<AlignedBuf> = Vec::with_capacity(requests.len());
        let mut bytes = 0;
        for (key, _, res, buf) in batch.drain() {
            let n = res.map_err(|e| e.with_key(key))?;
            bytes += n as u64;
            bufs.push(buf.ok_or_else(|| Error::new(ErrorKind::Shutdown, "buffer lost").with_key(key))?);
        }
        Ok((bufs, bytes, read_seconds))
    }

    /// Reads `requests` (key, bytes) into pinned buffers and launches their copies to the
    /// target; returns without waiting for the copies. A batch needs one pinned buffer per
    /// request, each at least as large as its request.
    pub async fn stage(&self, requests: &[(String, usize)]) -> Result<StagedBatch> {
        let (bufs, bytes, read_seconds) = self.read_into(self.pool.pool(), requests).await?;
        let inner = match self.target {
            Target::Host => {
                // The CPU path: a copy thread stands in for the DMA engine; the pinned buffers
                // are dropped (recycled) only after their copy.
                let free = Arc::clone(&self.host_free);
                let fut = self.copier.run(move || {
                    let out = bufs
                        .iter()
                        .map(|b| {
                            let mut data = free.lock().unwrap_or_else(|p| p.into_inner()).pop().unwrap_or_default();
                            data.clear();
                            data.extend_from_slice(b.as_slice());
                            HostBuf { data, free: Arc::clone(&free) }
                        })
                        .collect();
                    drop(bufs);
                    Ok(out)
                });
                Pending::Host(Box::pin(fut))
            }
            #[cfg(feature = "cuda")]
            Target::Cuda(_) => match &self.device {
                Some(d) => Pending::Cuda(d.copy(bufs)?),
                None => return Err(no_cuda_feature()),
            },
            #[cfg(not(feature = "cuda"))]
            Target::Cuda(_) => return Err(no_cuda_feature()),
        };
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
        for _ in 0..batch {
            let mut b = pool.acquire().await;
            let cap = b.capacity();
            b.set_window(0, cap)?;
            bufs.push(b);
        }
        let bytes = (batch * pool.buf_size()) as f64 * rounds.max(1) as f64;
        // Through the stager: per-buffer copies, completion tracked per batch.
        let t = Instant::now();
        for _ in 0..rounds.max(1) {
            bufs = self.copy_batch(bufs).await?;
        }
        let staged = bytes / t.elapsed().as_secs_f64();
        // The reference: one copy of the same bytes, into one destination touched beforehand.
        let mut dst = vec![0u8; batch * pool.buf_size()];
        (bufs, dst) = self.copy_reference(bufs, dst).await?;
        let t = Instant::now();
        for _ in 0..rounds.max(1) {
            (bufs, dst) = self.copy_reference(bufs, dst).await?;
        }
        drop(dst);
        let reference = bytes / t.elapsed().as_secs_f64();
        Ok((staged, reference))
    }

    /// Copies `bufs` the way `stage` does and hands them back once done.
    async fn copy_batch(&self, bufs: Vec<AlignedBuf>) -> Result<Vec<AlignedBuf>> {
        match self.target {
            Target::Host => {
                let free = Arc::clone(&self.host_free);
                self.copier
                    .run(move || {
                        for b in &bufs {
                            let mut data = free.lock().unwrap_or_else(|p| p.into_inner()).pop().unwrap_or_default();
                            data.clear();
                            data.extend_from_slice(b.as_slice());
                            drop(HostBuf { data, free: Arc::clone(&free) });
                        }
                        Ok(bufs)
                    })
                    .await
            }
            #[cfg(feature = "cuda")]
            Target::Cuda(_) => match &self.device {
                Some(d) => d.copy(bufs)?.wait_keep().await,
                None => Err(no_cuda_feature()),
            },
            #[cfg(not(feature = "cuda"))]
            Target::Cuda(_) => Err(no_cuda_feature()),
        }
    }

    /// One big copy of the whole pinned slab range the buffers cover (the reference).
    async fn copy_reference(&self, bufs: Vec<AlignedBuf>, mut dst: Vec<u8>) -> Result<(Vec<AlignedBuf>, Vec<u8>)> {
        let (base, _) = self.pool.pool().slab();
        let len = bufs.len() * self.pool.pool().buf_size();
        let base = base as usize;
        match self.target {
            Target::Host => {
                self.copier
                    .run(move || {
                        // SAFETY: [base, base+len) is the whole pinned slab and `bufs` holds
                        // every buffer of it, so nothing else reads or writes it meanwhile.
                        let src = unsafe { std::slice::from_raw_parts(base as *const u8, len) };
                        dst[..len].copy_from_slice(src);
                        Ok((bufs, dst))
                    })
                    .await
            }
            #[cfg(feature = "cuda")]
            Target::Cuda(_) => match &self.device {
                Some(d) => {
                    d.copy_one(base as *const u8, len)?;
                    Ok((bufs, dst))
                }
                None => Err(no_cuda_feature()),
            },
            #[cfg(not(feature = "cuda"))]
            Target::Cuda(_) => Err(no_cuda_feature()),
        }
    }

    /// Baseline: reads into the pinned buffers and stops there (the raw read the staging
    /// overhead is measured against). Returns the bytes read.
    pub async fn read_only(&self, requests: &[(String, usize)]) -> Result<u64> {
        Ok(self.read_into(self.pool.pool(), requests).await?.1)
    }

    /// Baseline: reads into `pageable` (ordinary, unpinned buffers) and copies to the target
    /// synchronously, with no overlap. Returns the bytes staged.
    pub async fn stage_pageable(&self, requests: &[(String, usize)], pageable: &BufferPool) -> Result<u64> {
        let (bufs, bytes, _) = self.read_into(pageable, requests).await?;
        match self.target {
            Target::Host => {
                // Into the same reused destination buffers as the pipelined path.
                let copies: Vec<HostBuf> = bufs
                    .iter()
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
            Target::Cuda(_) => match &self.device {
                Some(d) => d.copy_sync(&bufs)?,
                None => return Err(no_cuda_feature()),
            },
            #[cfg(not(feature = "cuda"))]
            Target::Cuda(_) => return Err(no_cuda_feature()),
        }
        Ok(bytes)
    }
}
