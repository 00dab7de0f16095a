//! Sharded record datasets: TFRecord and WebDataset (tar) shards, streamed in bounded memory.
//!
//! A shard is read front to back with large requests kept in flight through the tier's batch
//! read (one submission per batch on the io_uring tier, O_DIRECT where the file system has
//! it), into pooled buffers; records are parsed straight out of those buffers, each record's
//! bytes copied once, into the record (the shuffle buffer and the prefetch queue move records,
//! they never copy them). The reads form a sliding window: as soon as one buffer is parsed,
//! the next request is submitted, across shard boundaries, so the device is never idle while a
//! batch is parsed.
//!
//! Memory is bounded by configuration, whatever the shard and record sizes: the pool
//! (2 x depth x read size) plus the records held, which the loader counts
//! ([`RecordEpoch::held`]): the shuffle buffer (at most `shuffle_buffer` records and
//! `shuffle_bytes` bytes), the prefetch queue (at most `prefetch` records and `prefetch_bytes`
//! bytes) and the records parsed out of the one buffer being parsed (at most a read size and a
//! record). [`RecordConfig::held_bound`] is that bound.
//!
//! An epoch over shards: the shards are shuffled (seeded by seed and epoch, the same on every
//! rank) and split across ranks and workers, `(rank, worker)` taking every
//! `world x workers`-th shard, so every record is read exactly once per epoch; records go
//! through a seeded shuffle buffer that spans shard boundaries. A saved position (records
//! delivered so far) resumes the epoch with exactly the remaining records.
//!
//! Bad input (a truncated record, a CRC mismatch, a corrupt tar header) is an error naming the
//! shard and byte offset; with [`OnBadSample::Skip`] it is counted and the epoch goes on (the
//! rest of a shard whose framing is lost is skipped; a record whose data CRC fails is skipped
//! alone).

mod batch;
#[doc(hidden)]
pub mod fuzzing;
mod index;
mod queue;
mod streamed;
mod tfrecord;
mod wds;

pub use batch::RecordBatch;
pub use index::{RecordIndex, MAX_INDEX_BYTES, MAX_INDEX_LINE_BYTES};

use std::fmt;
use std::sync::Arc;

use ringtier_core::error::{Error, ErrorKind, Result};
use ringtier_core::{AlignedBuf, BufferPool, ListOptions, PoolConfig, ReadBatch, Skipped, Tier};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

pub use tfrecord::{masked_crc32c, write_record as write_tfrecord};
pub use wds::{split_key, write_end as write_tar_end, write_member as write_tar_member};

use queue::*;
use ringtier_dataset::OnBadSample;
use ringtier_dataset::Sampler;
use streamed::*;

/// The framing of a shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordFormat {
    /// TensorFlow's TFRecord: length, masked CRC-32C of the length, data, masked CRC-32C of
    /// the data.
    TfRecord,
    /// WebDataset: a tar archive whose members sharing a key form one sample.
    WebDataset,
}

impl RecordFormat {
    /// `tfrecord` or `wds`.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordFormat::TfRecord => "tfrecord",
            RecordFormat::WebDataset => "wds",
        }
    }
}

/// One named part of a record: a WebDataset field (`jpg`, `cls`), or the single unnamed field
/// of a TFRecord.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// Extension of the tar member (`jpg`, `cls`); empty for TFRecord.
    pub name: String,
    /// The bytes.
    pub data: Vec<u8>,
}

/// One record of a shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Index of its shard in the dataset's shard list.
    pub shard: usize,
    /// Byte offset of the record (TFRecord) or of its first tar member (WebDataset).
    pub offset: u64,
    /// Bytes the record takes in the shard, framing included (what an index records).
    pub len: u64,
    /// The WebDataset sample key; empty for TFRecord.
    pub key: String,
    /// The fields, in shard order.
    pub fields: Vec<Field>,
}

impl Record {
    /// The field called `name`.
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields.iter().find(|f| f.name == name).map(|f| f.data.as_slice())
    }

    /// Bytes of all fields.
    pub fn bytes(&self) -> u64 {
        self.fields.iter().map(|f| f.data.len() as u64).sum()
    }
}

/// A record that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RecordError {
    shard: usize,
    offset: u64,
    /// The rest of the shard cannot be parsed.
    fatal: bool,
    why: String,
}

/// An incremental parser of a shard's bytes.
pub(crate) trait Parser: Send {
    /// Parses the next bytes of the shard, appending complete records (or errors) to `out`.
    fn feed(&mut self, chunk: &[u8], out: &mut Vec<std::result::Result<Record, RecordError>>);
    /// The shard ended: reports a record cut short, flushes a last sample.
    fn finish(&mut self, out: &mut Vec<std::result::Result<Record, RecordError>>);
}

/// One shard: its key on the tier and its size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    /// Key on the tier.
    pub key: String,
    /// Size in bytes.
    pub size: u64,
}

/// Settings of a [`RecordLoader`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RecordConfig {
    /// Bytes per read request. Default 4 MiB.
    pub read_size: usize,
    /// Read requests per batch; the pool holds 2 x depth buffers, and a stream keeps all but
    /// the one being parsed in flight. Default 8.
    pub depth: usize,
    /// Records in the shuffle buffer; 0 or 1 keeps shard order. Default 1024.
    pub shuffle_buffer: usize,
    /// Bytes of records in the shuffle buffer at most (0: no byte bound); the buffer holds
    /// `shuffle_buffer` records or this many bytes, whichever is reached first (one record
    /// larger than this passes through alone). Default 64 MiB.
    pub shuffle_bytes: usize,
    /// Shuffle the shard order each epoch. Default true.
    pub shuffle_shards: bool,
    /// Seed of the shard shuffle and the shuffle buffer. Default 0.
    pub seed: u64,
    /// This process's rank. Default 0.
    pub rank: usize,
    /// Number of ranks. Default 1.
    pub world: usize,
    /// This reader's worker index within the rank (a DataLoader worker). Default 0.
    pub worker: usize,
    /// Workers per rank. Default 1.
    pub workers: usize,
    /// Records parsed ahead of the consumer (the prefetch queue). Default 256.
    pub prefetch: usize,
    /// Bytes of records in the prefetch queue at most (0: no byte bound; a record larger than
    /// this waits for the queue to empty). Default 16 MiB.
    pub prefetch_bytes: usize,
    /// Bad records: skip (counted) or fail. Default fail.
    pub on_bad: OnBadSample,
}

macro_rules! with {
    ($name:ident, $field:ident, $t:ty) => {
        #[doc = concat!("Sets [`RecordConfig::", stringify!($field), "`].")]
        pub fn $name(mut self, $field: $t) -> Self {
            self.$field = $field;
            self
        }
    };
}

impl RecordConfig {
    with!(with_read_size, read_size, usize);
    with!(with_depth, depth, usize);
    with!(with_shuffle_buffer, shuffle_buffer, usize);
    with!(with_shuffle_bytes, shuffle_bytes, usize);
    with!(with_shuffle_shards, shuffle_shards, bool);
    with!(with_seed, seed, u64);
    with!(with_rank, rank, usize);
    with!(with_world, world, usize);
    with!(with_worker, worker, usize);
    with!(with_workers, workers, usize);
    with!(with_prefetch, prefetch, usize);
    with!(with_prefetch_bytes, prefetch_bytes, usize);
    with!(with_on_bad, on_bad, OnBadSample);

    /// The most record bytes an epoch holds at once ([`RecordEpoch::held`]'s peak), for
    /// records of at most `max_record` bytes: the shuffle buffer, the prefetch queue, and the
    /// records parsed out of one read buffer (the read size, plus a record begun in the buffer
    /// before). `None` where a byte bound is off (0). The read pool (`2 x depth x read size`)
    /// comes on top.
    pub fn held_bound(&self, max_record: usize) -> Option<usize> {
        if self.shuffle_bytes == 0 || self.prefetch_bytes == 0 {
            return None;
        }
        let shuffle = if self.shuffle_buffer <= 1 { 0 } else { self.shuffle_bytes.max(max_record) };
        Some(shuffle + self.prefetch_bytes.max(max_record) + self.read_size + max_record)
    }
}

impl Default for RecordConfig {
    fn default() -> Self {
        RecordConfig {
            read_size: 4 << 20,
            depth: 8,
            shuffle_buffer: 1024,
            shuffle_bytes: 64 << 20,
            shuffle_shards: true,
            seed: 0,
            rank: 0,
            world: 1,
            worker: 0,
            workers: 1,
            prefetch: 256,
            prefetch_bytes: 16 << 20,
            on_bad: OnBadSample::Fail,
        }
    }
}

struct Inner {
    tier: Arc<dyn Tier>,
    shards: Vec<Shard>,
    format: RecordFormat,
    cfg: RecordConfig,
    pool: BufferPool,
    sampler: Sampler,
}

/// Reads the records of a sharded dataset, epoch after epoch.
#[derive(Clone)]
pub struct RecordLoader {
    inner: Arc<Inner>,
}

impl fmt::Debug for RecordLoader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordLoader")
            .field("shards", &self.inner.shards.len())
            .field("format", &self.inner.format)
            .field("config", &self.inner.cfg)
            .finish()
    }
}

/// The shards of `dir` on `tier` in `format`: every listed key ending in `.tfrecord` /
/// `.tfrecords` (TFRecord) or `.tar` (WebDataset), sorted by key.
pub async fn list_shards(tier: &dyn Tier, format: RecordFormat) -> Result<Vec<Shard>> {
    Ok(list_shards_with(tier, format, false).await?.0)
}

/// The shards of `format` on `tier`, as [`list_shards`]; with `skip_bad`, an entry that cannot
/// be listed (a dangling symbolic link, a link loop, a directory that cannot be read) is left
/// out and returned with why, instead of failing the listing with an error naming it.
pub async fn list_shards_with(
    tier: &dyn Tier,
    format: RecordFormat,
    skip_bad: bool,
) -> Result<(Vec<Shard>, Vec<Skipped>)> {
    let exts: &[&str] = match format {
        RecordFormat::TfRecord => &[".tfrecord", ".tfrecords"],
        RecordFormat::WebDataset => &[".tar"],
    };
    let mut listing = tier.list_with("", ListOptions::default().with_skip_bad(skip_bad)).await?;
    let shards: Vec<Shard> = listing
        .iter()
        .filter(|(key, _)| exts.iter().any(|e| key.ends_with(e)))
        .map(|(key, size)| Shard { key: key.to_string(), size })
        .collect();
    let skipped = listing.take_skipped();
    if shards.is_empty() {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!("no {} shards ({}) on {}", format.as_str(), exts.join(", "), tier.name()),
        ));
    }
    Ok((shards, skipped))
}

impl RecordLoader {
    /// A loader over `shards` of `format` on `tier`. Allocates its buffer pool (2 x depth x
    /// read size, aligned for direct I/O) once.
    pub fn new(tier: Arc<dyn Tier>, shards: Vec<Shard>, format: RecordFormat, cfg: RecordConfig) -> Result<Self> {
        if cfg.read_size == 0 || cfg.depth == 0 || cfg.workers == 0 {
            return Err(Error::new(ErrorKind::InvalidInput, "read size, depth and workers must be at least 1"));
        }
        if cfg.worker >= cfg.workers {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("worker {} is not below the worker count {}", cfg.worker, cfg.workers),
            ));
        }
        let world =
            cfg.world.checked_mul(cfg.workers).ok_or_else(|| Error::new(ErrorKind::InvalidInput, "world too large"))?;
        let sampler =
            Sampler::new(shards.len(), cfg.seed, cfg.rank * cfg.workers + cfg.worker, world, cfg.shuffle_shards)?;
        let align = tier.capabilities().alignment.max(4096);
        let read = cfg.read_size.next_multiple_of(align);
        let pool = BufferPool::new(PoolConfig::new(read + align, 2 * cfg.depth, align))?;
        let cfg = RecordConfig { read_size: read, ..cfg };
        Ok(RecordLoader { inner: Arc::new(Inner { tier, shards, format, cfg, pool, sampler }) })
    }

    /// The shards.
    pub fn shards(&self) -> &[Shard] {
        &self.inner.shards
    }

    /// Shards this reader (rank, worker) reads in `epoch`, in order.
    pub fn epoch_shards(&self, epoch: u64) -> Vec<usize> {
        self.inner.sampler.epoch(epoch).into_iter().map(|i| i as usize).collect()
    }

    /// Bytes of the read buffer pool.
    pub fn pool_bytes(&self) -> usize {
        self.inner.pool.buf_size() * self.inner.pool.count()
    }

    /// Starts `epoch`, skipping the first `position` records this reader would deliver (a
    /// saved position resumes with exactly the remaining records; the skipped ones are read
    /// and parsed again, not delivered). Reading starts now, in the background; call inside a
    /// tokio runtime.
    pub fn epoch(&self, epoch: u64, position: u64) -> RecordEpoch {
        let (q, rx) = Queue::new(&self.inner.cfg);
        let held = Arc::clone(&q.held);
        let inner = Arc::clone(&self.inner);
        let task = start(async move {
            let _ = run_epoch(&inner, epoch, position, &q).await;
        });
        RecordEpoch { rx, task, stats: RecordStats::default(), position, held, failed: None }
    }
}

impl RecordLoader {
    /// Indexes every shard by streaming it (the offsets and sizes of its records), for
    /// [`RecordLoader::global_epoch`]. A bad record fails the shard's index whatever
    /// `on_bad` says: an index must match its shard exactly.
    pub async fn build_index(&self, shard: usize) -> Result<RecordIndex> {
        let inner = &self.inner;
        if shard >= inner.shards.len() {
            return Err(Error::new(ErrorKind::OutOfRange, format!("no shard {shard}")));
        }
        let (q, _rx) = Queue::new(&inner.cfg);
        let mut out = Out::new(&q, &inner.cfg, 0, 0);
        out.collect = Some(Vec::new());
        let strict =
            Inner { cfg: RecordConfig { on_bad: OnBadSample::Fail, ..inner.cfg.clone() }, ..inner.clone_parts() };
        match read_shards(&strict, &[shard], &mut out).await {
            Some(Ok(())) => Ok(RecordIndex { entries: out.collect.take().unwrap_or_default() }),
            Some(Err(e)) => Err(e),
            None => Err(Error::new(ErrorKind::Shutdown, "index build stopped")),
        }
    }

    /// Starts `epoch` in a fully random order over every record of every shard (the same
    /// permutation on every reader; (rank, worker) takes every `world x workers`-th record),
    /// read through `indexes` (one per shard, in shard order) with `depth` requests per batch
    /// and the next batch in flight. Each record is checked against its index entry (it must
    /// parse as exactly one record there). Records must fit a pooled buffer: `read_size` at
    /// least the largest record. `position` resumes as in [`RecordLoader::epoch`], without
    /// reading the skipped records.
    pub fn global_epoch(&self, indexes: Arc<Vec<RecordIndex>>, epoch: u64, position: u64) -> Result<RecordEpoch> {
        let inner = &self.inner;
        if indexes.len() != inner.shards.len() {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("{} indexes for {} shards", indexes.len(), inner.shards.len()),
            ));
        }
        let align = inner.pool.align() as u64;
        for (i, idx) in indexes.iter().enumerate() {
            let size = inner.shards[i].size;
            if let Some(&(o, l)) = idx.entries.iter().find(|&&(o, l)| o.checked_add(l).is_none_or(|e| e > size)) {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!(
                        "the index of shard {} does not match it: a record at byte offset {o} of {l} bytes ends past \
                         the shard's {size} bytes",
                        inner.shards[i].key
                    ),
                ));
            }
            let max = idx.max_len();
            if max + 2 * align > inner.pool.buf_size() as u64 {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "shard {} has a record of {max} bytes, larger than the read size {}: raise the read size",
                        inner.shards[i].key, inner.cfg.read_size
                    ),
                ));
            }
        }
        let total: usize = indexes.iter().map(|i| i.entries.len()).sum();
        let c = &inner.cfg;
        let sampler = Sampler::new(total, c.seed, c.rank * c.workers + c.worker, c.world * c.workers, true)?;
        let order = sampler.epoch_from(epoch, position as usize)?;
        let (q, rx) = Queue::new(c);
        let held = Arc::clone(&q.held);
        let inner = Arc::clone(&self.inner);
        let task = start(async move {
            if let Err(e) = run_global(&inner, &indexes, order, &q).await {
                let _ = q.note(Item::Failed(e)).await;
            }
        });
        Ok(RecordEpoch { rx, task, stats: RecordStats::default(), position, held, failed: None })
    }
}

impl Inner {
    fn clone_parts(&self) -> Inner {
        Inner {
            tier: Arc::clone(&self.tier),
            shards: self.shards.clone(),
            format: self.format,
            cfg: self.cfg.clone(),
            pool: self.pool.clone(),
            sampler: self.sampler,
        }
    }
}

/// Reads records in `order` (global record numbers) through the indexes.
async fn run_global(inner: &Inner, indexes: &[RecordIndex], order: Vec<u32>, q: &Queue) -> Result<()> {
    // Global record number -> (shard, entry): prefix sums of the per-shard counts.
    let mut starts = Vec::with_capacity(indexes.len());
    let mut n = 0usize;
    for idx in indexes {
        starts.push(n);
        n += idx.entries.len();
    }
    let locate = |g: u32| {
        let s = starts.partition_point(|&st| st <= g as usize) - 1;
        (s, indexes[s].entries[g as usize - starts[s]])
    };
    // A chunk takes its buffers here, before its reads are spawned: up to `depth` of those free
    // now, and the chunk is as long as the buffers it got. It waits for one only when this
    // epoch holds none (its current chunk parsed): waiting while holding buffers whose reads
    // are done would let two epochs sharing the pool each hold what the other waits for, and
    // waiting for `depth` at once would starve beside an epoch holding all but a few.
    let submit = |chunk: &[u32], bufs: Vec<AlignedBuf>| {
        let reqs: Vec<(usize, u64, u64)> = chunk.iter().map(|&g| locate(g)).map(|(s, (o, l))| (s, o, l)).collect();
        let tier = Arc::clone(&inner.tier);
        let keys: Vec<String> = reqs.iter().map(|r| inner.shards[r.0].key.clone()).collect();
        tokio::spawn(async move {
            let mut batch = ReadBatch::with_capacity(reqs.len(), reqs.len() * 32);
            for ((r, k), buf) in reqs.iter().zip(&keys).zip(bufs) {
                batch.push(k, r.1, r.2 as usize, buf);
            }
            (reqs, tier.read_batch(batch).await)
        })
    };
    let depth = inner.cfg.depth.max(1);
    let free_now = |n: usize| -> Vec<AlignedBuf> { (0..n).map_while(|_| inner.pool.try_acquire()).collect() };
    let mut at = 0usize;
    let mut pending = None;
    if !order.is_empty() {
        let mut bufs = free_now(depth.min(order.len()));
        if bufs.is_empty() {
            bufs.push(inner.pool.acquire().await);
        }
        let n = bufs.len();
        pending = Some(submit(&order[at..at + n], bufs));
        at += n;
    }
    while let Some(h) = pending.take() {
        let left = order.len() - at;
        if left > 0 {
            let bufs = free_now(depth.min(left));
            if !bufs.is_empty() {
                let n = bufs.len();
                pending = Some(submit(&order[at..at + n], bufs));
                at += n;
            }
        }
        let (reqs, mut batch) =
            h.await.map_err(|e| Error::new(ErrorKind::Shutdown, format!("a read task failed: {e}")))?;
        for ((key, _, res, buf), &(s, off, len)) in batch.drain().zip(&reqs) {
            let shard = &inner.shards[s];
            let got = match (res, buf) {
                (Ok(n), Some(buf)) if n as u64 == len => Ok(buf),
                (Ok(n), _) => Err(format!("short read ({n} of {len} bytes)")),
                (Err(e), _) => Err(e.to_string()),
            };
            let mut parsed = Vec::new();
            if let Ok(buf) = &got {
                let mut parser: Box<dyn Parser> = match inner.format {
                    RecordFormat::TfRecord => Box::new(tfrecord::TfRecordParser::new(s, shard.size).at(off, off + len)),
                    RecordFormat::WebDataset => Box::new(wds::WdsParser::new(s, shard.size).at(off, off + len)),
                };
                parser.feed(buf.as_slice(), &mut parsed);
                parser.finish(&mut parsed);
            }
            let one = match (got, parsed.len(), parsed.pop()) {
                (Err(why), ..) => Err(format!("{} shard {key}, byte offset {off}: {why}", inner.format.as_str())),
                (Ok(_), 1, Some(Ok(r))) if r.offset == off && r.len == len => Ok(r),
                (Ok(_), _, Some(Err(e))) => {
                    Err(format!("{}; the index does not match its shard", shard_error(inner, &e)))
                }
                (Ok(_), n, _) => Err(format!(
                    "{} shard {key}, byte offset {off}: the index does not match its shard ({n} records parsed in \
                     its {len} bytes)",
                    inner.format.as_str()
                )),
            };
            let sent = match one {
                Ok(r) => {
                    q.held.add(r.bytes());
                    q.send(r).await
                }
                Err(why) if inner.cfg.on_bad == OnBadSample::Skip => q.note(Item::Skipped(why)).await,
                Err(why) => return Err(Error::new(ErrorKind::Corrupt, why)),
            };
            if !sent {
                return Ok(());
            }
        }
        if pending.is_none() && at < order.len() {
            // The current chunk's buffers are back: this epoch holds none while it waits.
            let mut bufs = free_now(depth.min(order.len() - at));
            if bufs.is_empty() {
                bufs.push(inner.pool.acquire().await);
            }
            let n = bufs.len();
            pending = Some(submit(&order[at..at + n], bufs));
            at += n;
        }
    }
    Ok(())
}

/// Record bytes an epoch holds now and held at most (see [`RecordEpoch::held`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeldBytes {
    /// Bytes held now.
    pub now: u64,
    /// The most bytes held at once so far in this epoch.
    pub peak: u64,
}

/// Totals of a record epoch so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecordStats {
    /// Records delivered.
    pub records: u64,
    /// Bytes of the records delivered.
    pub bytes: u64,
    /// Bad records (or shard remainders) skipped.
    pub skipped: u64,
}

/// One epoch's records, in this reader's order.
pub struct RecordEpoch {
    rx: crate::queue::Receiver<Item>,
    task: Worker,
    stats: RecordStats,
    position: u64,
    held: Arc<Held>,
    /// The error that ended a batch early ([`RecordEpoch::fill_batch`]), for the next call.
    failed: Option<Error>,
}

impl fmt::Debug for RecordEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordEpoch").field("stats", &self.stats).field("position", &self.position).finish()
    }
}

impl Drop for RecordEpoch {
    fn drop(&mut self) {
        // The worker stops at its next send or wait for queue room (the receiver, dropped
        // with the epoch, closes the queue).
        if let Worker::Task(t) = &self.task {
            t.abort();
        }
    }
}

impl RecordEpoch {
    /// The next record; `None` at the end of the epoch. With skip, bad records are counted in
    /// [`RecordEpoch::stats`] ([`RecordStats::skipped`]), each with a warning naming it.
    pub async fn next(&mut self) -> Option<Result<Record>> {
        match self.take().await? {
            Ok(r) => {
                self.deliver(&r);
                Some(Ok(r))
            }
            Err(e) => Some(Err(e)),
        }
    }

    /// The next record or error out of the queue (an error that ended a batch first), skipped
    /// records counted; the record is not counted as delivered yet.
    async fn take(&mut self) -> Option<Result<Record>> {
        if let Some(e) = self.failed.take() {
            return Some(Err(e));
        }
        loop {
            let held = &self.held;
            let item = self
                .rx
                .recv_then(|item| {
                    if let Item::Record(r) = item {
                        held.sub(r.bytes());
                    }
                })
                .await?;
            match item {
                Item::Record(r) => return Some(Ok(r)),
                Item::Skipped(why) => {
                    self.stats.skipped += 1;
                    tracing::warn!("skipped: {why}");
                }
                Item::Failed(e) => return Some(Err(e)),
            }
        }
    }

    /// Counts `r` as delivered (stats, position).
    fn deliver(&mut self, r: &Record) {
        self.stats.records += 1;
        self.stats.bytes += r.bytes();
        self.position += 1;
    }

    /// Totals so far.
    pub fn stats(&self) -> RecordStats {
        self.stats
    }

    /// Record bytes the epoch holds that the consumer has not taken (parsed, in the shuffle
    /// buffer, in the prefetch queue), now and at most so far: the loader's own accounting of
    /// its memory beyond the read pool, bounded by [`RecordConfig::held_bound`].
    pub fn held(&self) -> HeldBytes {
        HeldBytes { now: self.held.now.load(Ordering::Relaxed), peak: self.held.peak.load(Ordering::Relaxed) }
    }

    /// Records delivered in this epoch, counting the resumed-from position: save it to resume.
    pub fn position(&self) -> u64 {
        self.position
    }
}

#[cfg(test)]
mod tests;
