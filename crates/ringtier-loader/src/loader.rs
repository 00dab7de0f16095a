//! Batches with a bounded prefetch.

use std::sync::Arc;
use std::time::Instant;

use ringtier_core::blocking::BlockingPool;
use ringtier_core::buf::AlignedBuf;
use ringtier_core::catalog;
use ringtier_core::error::{Error, ErrorKind, Result};
use ringtier_core::{BufferPool, PoolConfig};
use ringtier_dataset::manifest::checksum;
use ringtier_dataset::OnBadSample;

use crate::config::LoaderConfig;
use crate::materialize::{materialized_prefix_cropped, sample_key, Materialize};
use crate::pieces::Want;
use ringtier_cache::CachedTier;
use ringtier_dataset::Dataset;
use ringtier_dataset::Sampler;
use ringtier_decode::{Crop, DecodeConfig, JpegDecoder, SampleRng};

/// One sample's contents.
#[derive(Debug)]
pub enum SampleData {
    /// The file's bytes in a pooled buffer (returned to the pool when dropped).
    Raw(AlignedBuf),
    /// A decoded, transformed sample in a pooled buffer (returned to the pool when dropped):
    /// [`DecodeConfig::output_bytes`] bytes, `u8` or native-endian `f32` in the configured
    /// layout.
    Decoded(AlignedBuf),
}

impl SampleData {
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        match self {
            SampleData::Raw(b) => b.as_slice(),
            SampleData::Decoded(b) => b.as_slice(),
        }
    }
}

/// A batch of samples.
#[derive(Debug)]
pub struct Batch {
    /// The epoch.
    pub epoch: u64,
    /// Index of the batch in this rank's epoch.
    pub index: usize,
    /// Dataset indices of the samples, in batch order (skipped ones left out).
    pub indices: Vec<u32>,
    /// The samples.
    pub samples: Vec<SampleData>,
    /// Samples left out, with the reason.
    pub skipped: Vec<String>,
    /// Bytes read.
    pub bytes: u64,
    /// Seconds the batch read took.
    pub read_seconds: f64,
    /// Seconds the decode stage took (0 without decode).
    pub decode_seconds: f64,
}

/// Totals of an epoch so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EpochStats {
    /// Batches delivered.
    pub batches: u64,
    /// Samples delivered.
    pub samples: u64,
    /// Samples skipped.
    pub skipped: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Seconds the consumer waited for batches.
    pub stall_seconds: f64,
    /// Seconds the consumer waited for the first batch (the pipeline filling up).
    pub first_stall_seconds: f64,
    /// Seconds spent reading (summed over batches).
    pub read_seconds: f64,
    /// Seconds spent decoding (summed over batches).
    pub decode_seconds: f64,
}

struct Shared {
    dataset: Dataset,
    cfg: LoaderConfig,
    pool: BufferPool,
    decoders: Option<BlockingPool>,
    /// Decoded samples' buffers, (prefetch + 2) x batch size of one output each.
    outputs: Option<BufferPool>,
    /// The materialized copy's settings and key prefix.
    materialized: Option<(Materialize, String)>,
    /// The materialized samples' writes still running: an epoch ends when they are done.
    writes: Arc<PendingWrites>,
    /// The cache the dataset's tier is wrapped in.
    /// And this rank's index among its samplers (0 for its own).
    cache: Option<(CachedTier, usize)>,
    stall: metrics::Histogram,
    batches: metrics::Counter,
    skipped: metrics::Counter,
    read: metrics::Histogram,
    decode: metrics::Histogram,
}

/// Reads a dataset in batches, epoch after epoch.
pub struct Loader {
    shared: Arc<Shared>,
    sampler: Sampler,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader").field("samples", &self.shared.dataset.len()).field("config", &self.shared.cfg).finish()
    }
}

impl Loader {
    /// The buffer pool a loader with `cfg` over samples of at most `max_sample_bytes` needs on a
    /// tier of direct-I/O `alignment`: (prefetch + 2) x batch_size buffers, each the largest
    /// sample (capped at [`LoaderConfig::read_size`]) plus one byte (a file that grew is
    /// noticed) rounded up to the alignment, plus one alignment block for an unaligned start.
    /// Give a pool of this shape to the io_uring tier (`UringTierOptions::pool`) and the loader
    /// reads into its registered buffers.
    pub fn pool_config(max_sample_bytes: u64, alignment: usize, cfg: &LoaderConfig) -> PoolConfig {
        let align = alignment.max(4096);
        let read_size = if cfg.read_size == 0 { crate::DEFAULT_MAX_READ } else { cfg.read_size.max(align) };
        let largest = (max_sample_bytes as usize).min(read_size);
        let buf_size = (largest + 1).next_multiple_of(align) + align;
        PoolConfig::new(buf_size, (cfg.prefetch + 2) * cfg.batch_size, align)
    }

    /// A loader over `dataset`. Its buffers come from the tier's own pool
    /// ([`ringtier_core::Tier::buffer_pool`], registered with io_uring) when that pool is at
    /// least the shape of [`Loader::pool_config`]; otherwise it allocates one of that shape,
    /// once.
    pub fn new(dataset: Dataset, cfg: LoaderConfig) -> Result<Self> {
        if cfg.batch_size == 0 {
            return Err(Error::new(ErrorKind::InvalidInput, "batch size must be at least 1"));
        }
        let sampler = Sampler::new(dataset.len(), cfg.seed, cfg.rank, cfg.world, cfg.shuffle)?;
        // Reads go through the cache, which knows this rank's order from the sampler.
        let (dataset, cache) = match (&cfg.cache, &cfg.node_cache) {
            (Some(_), Some(_)) => {
                return Err(Error::new(ErrorKind::InvalidInput, "a loader takes a cache or a node cache, not both"))
            }
            (Some(c), None) if c.local_ranks.is_some() => {
                // A node cache shared with the node's other ranks (other processes): this
                // rank's node is the run of `local_ranks` consecutive ranks it is in.
                let n = c.local_ranks.unwrap_or(1).max(1);
                let first = cfg.rank - cfg.rank % n;
                let samplers = (first..(first + n).min(cfg.world))
                    .map(|r| Sampler::new(dataset.len(), cfg.seed, r, cfg.world, cfg.shuffle))
                    .collect::<Result<Vec<_>>>()?;
                let local = cfg.rank - first;
                let cached = CachedTier::for_node_dir(&dataset, samplers, local, c.clone())?;
                (dataset.with_tier(Arc::new(cached.clone())), Some((cached, local)))
            }
            (Some(c), None) => {
                let cached = CachedTier::for_dataset(&dataset, sampler, c.clone())?;
                (dataset.with_tier(Arc::new(cached.clone())), Some((cached, 0)))
            }
            (None, Some((cached, index))) => {
                (dataset.with_tier(Arc::new(cached.clone())), Some((cached.clone(), *index)))
            }
            (None, None) => (dataset, None),
        };
        if sampler.len() < cfg.batch_size && cfg.drop_last {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "the dataset gives rank {} only {} samples, fewer than one batch of {} (with drop_last nothing would be read)",
                    cfg.rank,
                    sampler.len(),
                    cfg.batch_size
                ),
            ));
        }
        if dataset.is_empty() {
            return Err(Error::new(ErrorKind::InvalidInput, "the dataset has no samples"));
        }
        let largest = cfg.materialize.as_ref().map_or(dataset.max_size(), |m| dataset.max_size().max(m.sample_bytes()));
        let want = Self::pool_config(largest, dataset.tier().capabilities().alignment, &cfg);
        let pool = match dataset.tier().buffer_pool() {
            Some(p) if p.buf_size() >= want.buf_size && p.count() >= want.count && p.align() >= want.align => p,
            tier_pool => {
                if let Some(p) = tier_pool {
                    tracing::info!(
                        "the tier's buffer pool ({} x {} bytes) is smaller than the loader needs ({} x {} bytes); \
                         allocating a separate, unregistered pool",
                        p.count(),
                        p.buf_size(),
                        want.count,
                        want.buf_size
                    );
                }
                BufferPool::new(want)?
            }
        };
        let (decoders, outputs) = match cfg.decode {
            Some(d) => {
                d.validate()?;
                let outputs =
                    PoolConfig::new(d.output_bytes().next_multiple_of(4096), (cfg.prefetch + 2) * cfg.batch_size, 4096);
                (Some(BlockingPool::new("ringtier-decode", d.threads)?), Some(BufferPool::new(outputs)?))
            }
            None => (None, None),
        };
        let materialized = match (&cfg.materialize, cfg.decode) {
            (None, _) => None,
            (Some(_), None) => {
                return Err(Error::new(ErrorKind::InvalidInput, "materialize needs decode: it stores decoded samples"))
            }
            (Some(m), Some(_)) => {
                DecodeConfig::default().with_size(m.size).with_crop(m.crop).validate()?;
                Some((m.clone(), materialized_prefix_cropped(&dataset, m.size, m.crop)))
            }
        };
        let shared = Shared {
            dataset,
            cfg,
            pool,
            decoders,
            outputs,
            materialized,
            writes: Arc::default(),
            cache,
            stall: metrics::histogram!(catalog::LOADER_STALL_SECONDS),
            batches: metrics::counter!(catalog::LOADER_BATCHES_TOTAL),
            skipped: metrics::counter!(catalog::LOADER_SKIPPED_TOTAL),
            read: metrics::histogram!(catalog::LOADER_READ_SECONDS),
            decode: metrics::histogram!(catalog::LOADER_DECODE_SECONDS),
        };
        Ok(Loader { shared: Arc::new(shared), sampler })
    }

    /// The cache in front of the dataset's tier, when [`LoaderConfig::cache`] is set: its
    /// [`CachedTier::stats`] give hits, misses and prefetches.
    pub fn cache(&self) -> Option<&CachedTier> {
        self.shared.cache.as_ref().map(|(c, _)| c)
    }

    /// The dataset read (its tier: the cache's, when one is configured).
    pub fn dataset(&self) -> &Dataset {
        &self.shared.dataset
    }

    /// Samples this rank reads per epoch.
    pub fn samples_per_epoch(&self) -> usize {
        self.sampler.len()
    }

    /// Bytes of the buffer pool.
    pub fn pool_bytes(&self) -> usize {
        self.shared.pool.buf_size() * self.shared.pool.count()
    }

    /// The buffer pool samples are read into (a [`SampleData::Raw`] returns its buffer here
    /// when dropped): its `in_use()` against `count()` tells a consumer holding samples how
    /// close the reader is to waiting for one.
    pub fn buffer_pool(&self) -> &BufferPool {
        &self.shared.pool
    }

    /// True when the loader reads into the tier's own buffer pool (see [`Loader::new`]).
    pub fn uses_tier_pool(&self) -> bool {
        self.shared.dataset.tier().buffer_pool().is_some_and(|p| p.id() == self.shared.pool.id())
    }

    /// Starts `epoch` at `position` (0 for the start; a saved position resumes with exactly
    /// the remaining samples). With prefetch, reading starts now, in the background; must be
    /// called inside a tokio runtime.
    pub fn epoch(&self, epoch: u64, position: usize) -> Result<Epoch> {
        let order = self.sampler.epoch_from(epoch, position)?;
        if let Some((c, index)) = &self.shared.cache {
            c.begin_rank_epoch(*index, epoch, position)?;
        }
        let b = self.shared.cfg.batch_size;
        let mut chunks: Vec<Vec<u32>> = order.chunks(b).map(<[u32]>::to_vec).collect();
        if self.shared.cfg.drop_last && chunks.last().is_some_and(|c| c.len() < b) {
            chunks.pop();
        }
        let first_index = position / b;
        let source = if self.shared.cfg.prefetch == 0 {
            Source::Direct { chunks: chunks.into_iter().enumerate().collect(), next: 0 }
        } else {
            // Each batch's reads run in their own task, several at once (the queue's
            // capacity plus the one waiting to be sent: prefetch + 1 batches in flight), and
            // are delivered in order. The buffers a batch needs are taken here, in batch order,
            // before its task starts: the earliest batch always has all of its buffers, so it
            // always completes, however many buffers the consumer holds.
            let (tx, rx) = crate::queue::bounded(self.shared.cfg.prefetch, 0);
            let shared = Arc::clone(&self.shared);
            let task = tokio::spawn(async move {
                for (i, chunk) in chunks.into_iter().enumerate() {
                    let reserve = Reserve::take(&shared, &chunk).await;
                    let s = Arc::clone(&shared);
                    let handle = tokio::spawn(async move { fetch(&s, epoch, first_index + i, chunk, reserve).await });
                    if !tx.send(InFlight(handle), 0).await {
                        break;
                    }
                }
            });
            Source::Prefetch { rx, task, head: None, failed: false }
        };
        Ok(Epoch { shared: Arc::clone(&self.shared), epoch, first_index, source, stats: EpochStats::default() })
    }
}

/// Background writes (the materialized samples) still running, counted so that the end of an
/// epoch can wait for them: without that, a process that exits after its last batch (a
/// DataLoader worker) lost the writes of that batch.
#[derive(Debug, Default)]
struct PendingWrites {
    running: std::sync::atomic::AtomicUsize,
    done: tokio::sync::Notify,
}

/// One running write of [`PendingWrites`]; dropping it (also when its task is cancelled) ends it.
struct PendingWrite(Arc<PendingWrites>);

impl PendingWrites {
    fn start(self: &Arc<Self>) -> PendingWrite {
        self.running.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        PendingWrite(Arc::clone(self))
    }

    /// Returns once no write is running.
    async fn idle(&self) {
        loop {
            let done = self.done.notified();
            if self.running.load(std::sync::atomic::Ordering::Acquire) == 0 {
                return;
            }
            done.await;
        }
    }
}

impl Drop for PendingWrite {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, std::sync::atomic::Ordering::AcqRel) == 1 {
            self.0.done.notify_waiters();
        }
    }
}

/// Pooled buffers taken for one batch before its reads start: what its reads need at most at
/// once ([`crate::pieces::buffers_needed`]) and one decode output per sample. Whatever is not
/// used goes back to its pool when the batch is done.
#[derive(Default)]
struct Reserve {
    raw: Vec<AlignedBuf>,
    outputs: Vec<AlignedBuf>,
}

impl Reserve {
    async fn take(shared: &Shared, chunk: &[u32]) -> Reserve {
        let b = shared.cfg.batch_size.max(chunk.len());
        let raw_count = if shared.materialized.is_some() {
            // Stored samples first, then the misses: a whole batch's worth.
            b
        } else {
            let ds = &shared.dataset;
            let piece = crate::pieces::piece_size(shared.pool.buf_size(), shared.pool.align());
            // A size not known is planned as one buffer; more are taken as the read learns it.
            let size = |i: u32| ds.sample(i as usize).known_size().unwrap_or(0);
            crate::pieces::buffers_needed(chunk.iter().map(|&i| size(i)), piece, b)
        };
        let mut reserve = Reserve { raw: Vec::with_capacity(raw_count), outputs: Vec::new() };
        for _ in 0..raw_count {
            reserve.raw.push(shared.pool.acquire().await);
        }
        if let Some(outputs) = &shared.outputs {
            reserve.outputs.reserve(chunk.len());
            for _ in 0..chunk.len() {
                reserve.outputs.push(outputs.acquire().await);
            }
        }
        reserve
    }
}

/// One batch's task; aborted when dropped (an epoch dropped early stops its reads; a read's
/// buffer stays with the tier until the kernel is done with it).
struct InFlight(tokio::task::JoinHandle<Result<Batch>>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.abort();
    }
}

enum Source {
    Direct {
        chunks: Vec<(usize, Vec<u32>)>,
        next: usize,
    },
    Prefetch {
        rx: crate::queue::Receiver<InFlight>,
        task: tokio::task::JoinHandle<()>,
        /// The batch being waited for, kept here so that a `next()` dropped while waiting
        /// loses nothing.
        head: Option<InFlight>,
        /// A batch failed: the epoch ends there.
        failed: bool,
    },
}

/// One epoch's batches, in order.
pub struct Epoch {
    shared: Arc<Shared>,
    epoch: u64,
    first_index: usize,
    source: Source,
    stats: EpochStats,
}

impl std::fmt::Debug for Epoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Epoch").field("epoch", &self.epoch).field("stats", &self.stats).finish()
    }
}

impl Drop for Epoch {
    fn drop(&mut self) {
        if let Source::Prefetch { task, .. } = &self.source {
            task.abort();
        }
    }
}

impl Epoch {
    /// The next batch; `None` at the end of the epoch. The time spent waiting here is the
    /// consumer's stall.
    pub async fn next(&mut self) -> Option<Result<Batch>> {
        let start = Instant::now();
        let item = match &mut self.source {
            Source::Direct { chunks, next } => {
                let Some((i, chunk)) = chunks.get_mut(*next).map(|(i, c)| (*i, std::mem::take(c))) else {
                    self.shared.writes.idle().await;
                    return None;
                };
                *next += 1;
                let reserve = Reserve::take(&self.shared, &chunk).await;
                Some(fetch(&self.shared, self.epoch, self.first_index + i, chunk, reserve).await)
            }
            Source::Prefetch { rx, task, head, failed } => {
                if *failed {
                    return None;
                }
                if head.is_none() {
                    *head = rx.recv().await;
                }
                let joined = match head.as_mut() {
                    Some(InFlight(handle)) => handle.await,
                    None => {
                        self.shared.writes.idle().await;
                        return None;
                    }
                };
                *head = None;
                let item = joined
                    .unwrap_or_else(|e| Err(Error::new(ErrorKind::Io, format!("the task reading batch failed: {e}"))));
                if item.is_err() {
                    // Later batches are not delivered after an error: stop reading them.
                    *failed = true;
                    task.abort();
                    rx.drain();
                }
                Some(item)
            }
        };
        let stall = start.elapsed().as_secs_f64();
        if let Some(Ok(b)) = &item {
            self.shared.stall.record(stall);
            self.shared.batches.increment(1);
            self.stats.stall_seconds += stall;
            if self.stats.batches == 0 {
                self.stats.first_stall_seconds = stall;
            }
            self.stats.batches += 1;
            self.stats.samples += b.samples.len() as u64;
            self.stats.skipped += b.skipped.len() as u64;
            self.stats.bytes += b.bytes;
            self.stats.read_seconds += b.read_seconds;
            self.stats.decode_seconds += b.decode_seconds;
        }
        item
    }

    /// The next batch, blocking the thread (not inside an async context).
    pub fn blocking_next(&mut self, rt: &tokio::runtime::Handle) -> Option<Result<Batch>> {
        rt.block_on(self.next())
    }

    /// Totals so far.
    pub fn stats(&self) -> EpochStats {
        self.stats
    }

    /// The epoch as a blocking iterator, for synchronous training loops (call it from a
    /// thread that is not running async code; `rt` runs the reads).
    pub fn into_iter_blocking(self, rt: tokio::runtime::Handle) -> BlockingEpoch {
        BlockingEpoch { epoch: self, rt }
    }
}

/// An [`Epoch`] as an [`Iterator`] of batches.
#[derive(Debug)]
pub struct BlockingEpoch {
    epoch: Epoch,
    rt: tokio::runtime::Handle,
}

impl BlockingEpoch {
    /// Totals so far.
    pub fn stats(&self) -> EpochStats {
        self.epoch.stats()
    }
}

impl Iterator for BlockingEpoch {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Self::Item> {
        self.rt.block_on(self.epoch.next())
    }
}

async fn fetch(shared: &Shared, epoch: u64, index: usize, chunk: Vec<u32>, reserve: Reserve) -> Result<Batch> {
    let Reserve { raw: mut reserve, outputs: mut output_reserve } = reserve;
    let ds = &shared.dataset;
    let piece = crate::pieces::piece_size(shared.pool.buf_size(), shared.pool.align());
    let t = Instant::now();
    // With a materialized copy, its samples first; only the misses are read as JPEGs.
    let mut stored: Vec<Option<AlignedBuf>> = chunk.iter().map(|_| None).collect();
    let mut stored_bytes = 0u64;
    if let Some((m, prefix)) = &shared.materialized {
        let keys: Vec<String> = chunk.iter().map(|&i| sample_key(prefix, i)).collect();
        let refs: Vec<Want<'_>> = keys.iter().map(|k| Want::exact(k, m.sample_bytes())).collect();
        let got =
            crate::pieces::read_whole(m.tier.as_ref(), &shared.pool, &refs, piece, shared.cfg.batch_size, &mut reserve)
                .await;
        for (slot, r) in stored.iter_mut().zip(got) {
            if let Ok(b) = r {
                stored_bytes += b.len() as u64;
                *slot = Some(b);
            }
        }
    }
    let misses: Vec<u32> = chunk.iter().zip(&stored).filter(|(_, s)| s.is_none()).map(|(&i, _)| i).collect();
    // Sizes from a cached listing are hints and unknown ones are learned: the file wins.
    let hints = ds.sizes_are_hints();
    let wanted: Vec<Want<'_>> = misses
        .iter()
        .map(|&i| {
            let s = ds.sample(i as usize);
            if hints {
                Want::hint(s.key, s.size)
            } else {
                Want::exact(s.key, s.size)
            }
        })
        .collect();
    // Whole samples, each read in pieces no larger than a pooled buffer.
    let read = crate::pieces::read_whole(
        shared.dataset.tier().as_ref(),
        &shared.pool,
        &wanted,
        piece,
        shared.cfg.batch_size,
        &mut reserve,
    )
    .await;
    drop(reserve);
    let read_seconds = t.elapsed().as_secs_f64();
    shared.read.record(read_seconds);
    let mut out = Batch {
        epoch,
        index,
        indices: Vec::with_capacity(chunk.len()),
        samples: Vec::with_capacity(chunk.len()),
        skipped: Vec::new(),
        bytes: stored_bytes,
        read_seconds,
        decode_seconds: 0.0,
    };
    // A sample that cannot be used: skipped and named, or an error of its own kind (a file gone
    // since the listing is NotFound, one that may not be read PermissionDenied; bytes that fail
    // a check or do not decode are Corrupt).
    let bad = |out: &mut Batch, kind: ErrorKind, why: String| -> Result<()> {
        shared.skipped.increment(1);
        match shared.cfg.on_bad {
            OnBadSample::Skip => {
                out.skipped.push(why);
                Ok(())
            }
            OnBadSample::Fail => Err(Error::new(kind, why)),
        }
    };
    let mut raw = Vec::with_capacity(chunk.len());
    for (res, &i) in read.into_iter().zip(&misses) {
        let s = ds.sample(i as usize);
        match res {
            Ok(buf) => {
                if shared.cfg.verify && s.crc32c.is_some_and(|c| c != checksum(buf.as_slice())) {
                    bad(&mut out, ErrorKind::Corrupt, format!("{}: checksum mismatch", s.key))?;
                } else {
                    out.bytes += buf.len() as u64;
                    raw.push((i, buf));
                }
            }
            Err(e) => bad(&mut out, e.kind(), e.message().to_string())?,
        }
    }
    match (&shared.decoders, &shared.outputs, shared.cfg.decode) {
        (Some(pool), Some(outputs), Some(d)) => {
            let t = Instant::now();
            let seed = shared.cfg.seed;
            let store = shared.materialized.as_ref().map(|(m, prefix)| (m.tier.clone(), m.size, prefix.clone()));
            let m_crop = shared.materialized.as_ref().map_or(Crop::Resize, |(m, _)| m.crop);
            // Inputs in batch order: a stored sample's pixels, or a JPEG just read.
            let mut raw = raw.into_iter().peekable();
            let mut jobs = Vec::with_capacity(chunk.len());
            for (&i, stored) in chunk.iter().zip(stored) {
                let (input, is_pixels) = match stored {
                    Some(px) => (px, true),
                    None => match raw.next_if(|(j, _)| *j == i) {
                        Some((_, buf)) => (buf, false),
                        None => continue, // skipped above
                    },
                };
                // Each sample decodes into a pooled buffer; its random crop and flip depend only
                // on (seed, epoch, dataset index).
                let mut px = match output_reserve.pop() {
                    Some(px) => px,
                    None => outputs.acquire().await,
                };
                let m_size = store.as_ref().map(|(_, size, _)| *size);
                let job = pool.run(move || {
                    px.set_window(0, d.output_bytes())?;
                    let mut rng = SampleRng::new(seed, epoch, i as u64);
                    JpegDecoder::with_thread_local(|dec| match (m_size, is_pixels) {
                        (Some(m), true) => {
                            dec.transform_rgb(input.as_slice(), m, m, &d, &mut rng, px.as_mut_slice())?;
                            Ok((px, None))
                        }
                        (Some(m), false) => {
                            // The deterministic steps once, kept for the store; the rest online.
                            let mcfg = DecodeConfig::default().with_size(m).with_crop(m_crop).with_threads(1);
                            let mut stored = vec![0u8; mcfg.output_bytes()];
                            dec.decode_into(input.as_slice(), &mcfg, &mut SampleRng::new(0, 0, 0), &mut stored)?;
                            dec.transform_rgb(&stored, m, m, &d, &mut rng, px.as_mut_slice())?;
                            Ok((px, Some(stored)))
                        }
                        (None, _) => {
                            dec.decode_into(input.as_slice(), &d, &mut rng, px.as_mut_slice())?;
                            Ok((px, None))
                        }
                    })
                });
                jobs.push((i, job));
            }
            for (i, job) in jobs {
                match job.await {
                    Ok((pixels, to_store)) => {
                        if let (Some(bytes), Some((tier, _, prefix))) = (to_store, &store) {
                            // Written in the background (staged, then renamed by the tier); a
                            // failed write only means the sample is decoded again next epoch.
                            // The epoch's end waits for them (`PendingWrites`): a process may
                            // exit right after its last batch (a DataLoader worker does).
                            let (tier, key) = (Arc::clone(tier), sample_key(prefix, i));
                            let write = shared.writes.start();
                            tokio::spawn(async move {
                                if let Err(e) = ringtier_core::ops::put(tier.as_ref(), &key, &bytes, 1 << 20).await {
                                    tracing::warn!("materializing {key}: {e}");
                                }
                                drop(write);
                            });
                        }
                        out.indices.push(i);
                        out.samples.push(SampleData::Decoded(pixels));
                    }
                    Err(e) => bad(&mut out, ErrorKind::Corrupt, format!("{}: {e}", ds.key(i as usize)))?,
                }
            }
            out.decode_seconds = t.elapsed().as_secs_f64();
            shared.decode.record(out.decode_seconds);
        }
        _ => {
            for (i, buf) in raw {
                out.indices.push(i);
                out.samples.push(SampleData::Raw(buf));
            }
        }
    }
    Ok(out)
}
