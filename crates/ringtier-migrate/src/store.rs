//! The checkpoint store: save to the fastest tier, drain to slower ones, evict, restore,
//! recover.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::{Read, Seek, SeekFrom};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ringtier_core::buf::AlignedBuf;
use ringtier_core::catalog;
use ringtier_core::error::{Error, ErrorKind, Operation, Result};
use ringtier_core::key::validate_key;
use ringtier_core::layers::TokenBucket;
use ringtier_core::{Tier, TierLock};
use tokio::sync::{mpsc, Notify, Semaphore};

use crate::manifest::{CheckpointManifest, PartMeta, FORMAT, VERSION};

/// What `save` does when the fast tier has no room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFull {
    /// Wait until the drain and eviction make room.
    Wait,
    /// Write to the next, slower tier instead.
    WriteThrough,
}

/// Settings of a [`CheckpointStore`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StoreConfig {
    /// Key prefix of the store on every tier. Default `ckpt`.
    pub prefix: String,
    /// Bytes per write and per drain copy. Default 8 MiB.
    pub chunk_bytes: usize,
    /// Checkpoints drained at once. Default 1.
    pub drain_concurrency: usize,
    /// Drain bandwidth cap in bytes per second, so draining does not starve the loader.
    /// Default none.
    pub drain_bytes_per_sec: Option<u64>,
    /// Committed checkpoints kept on each faster tier once drained (the newest). Default 2.
    pub keep_last: usize,
    /// Bytes of checkpoints the fastest tier may hold. Default none (only a real ENOSPC).
    pub fast_capacity_bytes: Option<u64>,
    /// What `save` does when the fast tier is full. Default [`OnFull::Wait`].
    pub on_full: OnFull,
    /// Retries of an operation that failed with a temporary error. Default 3.
    pub retries: u32,
}

impl StoreConfig {
    /// Sets [`StoreConfig::prefix`].
    pub fn with_prefix(mut self, prefix: String) -> Self {
        self.prefix = prefix;
        self
    }

    /// Sets [`StoreConfig::chunk_bytes`].
    pub fn with_chunk_bytes(mut self, chunk_bytes: usize) -> Self {
        self.chunk_bytes = chunk_bytes;
        self
    }

    /// Sets [`StoreConfig::drain_concurrency`].
    pub fn with_drain_concurrency(mut self, drain_concurrency: usize) -> Self {
        self.drain_concurrency = drain_concurrency;
        self
    }

    /// Sets [`StoreConfig::drain_bytes_per_sec`].
    pub fn with_drain_bytes_per_sec(mut self, drain_bytes_per_sec: impl Into<Option<u64>>) -> Self {
        self.drain_bytes_per_sec = drain_bytes_per_sec.into();
        self
    }

    /// Sets [`StoreConfig::keep_last`].
    pub fn with_keep_last(mut self, keep_last: usize) -> Self {
        self.keep_last = keep_last;
        self
    }

    /// Sets [`StoreConfig::fast_capacity_bytes`].
    pub fn with_fast_capacity_bytes(mut self, fast_capacity_bytes: impl Into<Option<u64>>) -> Self {
        self.fast_capacity_bytes = fast_capacity_bytes.into();
        self
    }

    /// Sets [`StoreConfig::on_full`].
    pub fn with_on_full(mut self, on_full: OnFull) -> Self {
        self.on_full = on_full;
        self
    }

    /// Sets [`StoreConfig::retries`].
    pub fn with_retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            prefix: "ckpt".into(),
            chunk_bytes: 8 << 20,
            drain_concurrency: 1,
            drain_bytes_per_sec: None,
            keep_last: 2,
            fast_capacity_bytes: None,
            on_full: OnFull::Wait,
            retries: 3,
        }
    }
}

/// Where a part's bytes come from.
pub enum PartData<'a> {
    /// A buffer the caller holds (never copied whole: written chunk by chunk).
    Bytes(&'a [u8]),
    /// A stream, read chunk by chunk; `size_hint` helps the capacity check. It cannot be read
    /// twice: a save that finds the fast tier full part-way through it fails with
    /// [`ErrorKind::NoSpace`] (use [`PartData::Seekable`] where the source can be re-read).
    Reader {
        /// The stream.
        reader: Box<dyn Read + Send + 'a>,
        /// Its expected size, if known.
        size_hint: Option<u64>,
    },
    /// A stream that can be read again from where the save started (a file): a save that
    /// finds a tier full part-way through rewinds it and applies [`OnFull`].
    Seekable {
        /// The stream, read from its position when the save starts.
        reader: Box<dyn SeekRead + 'a>,
        /// Its expected size, if known.
        size_hint: Option<u64>,
    },
}

/// A readable, seekable stream (a [`std::fs::File`], a [`std::io::Cursor`], a
/// [`std::io::BufReader`] over either): the source of a [`PartData::Seekable`].
pub trait SeekRead: Read + Seek + Send {}

impl<T: Read + Seek + Send> SeekRead for T {}

impl fmt::Debug for PartData<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PartData::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            PartData::Reader { size_hint, .. } => write!(f, "Reader(size_hint {size_hint:?})"),
            PartData::Seekable { size_hint, .. } => write!(f, "Seekable(size_hint {size_hint:?})"),
        }
    }
}

/// A named part of a checkpoint (model weights, optimizer state, metadata).
#[derive(Debug)]
pub struct Part<'a> {
    /// One key component: no `/`, not `.` or `..`.
    pub name: String,
    /// The bytes.
    pub data: PartData<'a>,
}

impl<'a> Part<'a> {
    /// A part from a buffer.
    pub fn bytes(name: impl Into<String>, data: &'a [u8]) -> Self {
        Part { name: name.into(), data: PartData::Bytes(data) }
    }

    /// A part from a stream.
    pub fn reader(name: impl Into<String>, reader: impl Read + Send + 'a, size_hint: Option<u64>) -> Self {
        Part { name: name.into(), data: PartData::Reader { reader: Box::new(reader), size_hint } }
    }

    /// A part from a stream that can be rewound (a file): see [`PartData::Seekable`].
    pub fn seekable(name: impl Into<String>, reader: impl Read + Seek + Send + 'a, size_hint: Option<u64>) -> Self {
        Part { name: name.into(), data: PartData::Seekable { reader: Box::new(reader), size_hint } }
    }

    fn size_hint(&self) -> u64 {
        match &self.data {
            PartData::Bytes(b) => b.len() as u64,
            PartData::Reader { size_hint, .. } | PartData::Seekable { size_hint, .. } => size_hint.unwrap_or(0),
        }
    }
}

/// What a save did.
#[derive(Debug, Clone, PartialEq)]
pub struct SaveReport {
    /// The step saved.
    pub step: u64,
    /// Bytes written.
    pub bytes: u64,
    /// Name of the tier the checkpoint was committed on.
    pub tier: String,
    /// How long `save` blocked.
    pub blocking: Duration,
    /// True when the fast tier was full and the checkpoint went to a slower tier.
    pub wrote_through: bool,
}

/// A checkpoint as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointInfo {
    /// The step.
    pub step: u64,
    /// Total bytes.
    pub bytes: u64,
    /// Names of the tiers holding a committed copy, fastest first.
    pub tiers: Vec<String>,
}

/// A restored checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// The step.
    pub step: u64,
    /// The tier it was read from.
    pub tier: String,
    /// The parts, in save order.
    pub parts: Vec<(String, Vec<u8>)>,
    /// Why faster copies were not used, one line per skipped tier.
    pub fallbacks: Vec<String>,
}

#[derive(Debug, Default)]
struct State {
    /// step -> (tier index it drains from, bytes)
    pending: BTreeMap<u64, (usize, u64)>,
    /// steps whose drain failed permanently, with the reason
    failed: BTreeMap<u64, String>,
}

struct Metrics {
    backlog: metrics::Gauge,
    pending: metrics::Gauge,
    blocking: Vec<metrics::Histogram>,
    saves_ok: Vec<metrics::Counter>,
    saves_err: Vec<metrics::Counter>,
    drain_seconds: Vec<metrics::Histogram>,
    drained_bytes: Vec<metrics::Counter>,
    evictions: Vec<metrics::Counter>,
    fallbacks: Vec<metrics::Counter>,
}

impl Metrics {
    fn new(tiers: &[Arc<dyn Tier>]) -> Self {
        let per = |f: &dyn Fn(String) -> metrics::Counter| tiers.iter().map(|t| f(t.name().to_string())).collect();
        let hist = |name: &'static str| -> Vec<metrics::Histogram> {
            tiers.iter().map(|t| metrics::histogram!(name, "tier" => t.name().to_string())).collect()
        };
        Metrics {
            backlog: metrics::gauge!(catalog::CKPT_DRAIN_BACKLOG_BYTES),
            pending: metrics::gauge!(catalog::CKPT_PENDING),
            blocking: hist(catalog::CKPT_SAVE_BLOCKING_SECONDS),
            saves_ok: per(&|t| metrics::counter!(catalog::CKPT_SAVES_TOTAL, "tier" => t, "result" => "ok")),
            saves_err: per(&|t| metrics::counter!(catalog::CKPT_SAVES_TOTAL, "tier" => t, "result" => "error")),
            drain_seconds: hist(catalog::CKPT_DRAIN_SECONDS),
            drained_bytes: per(&|t| metrics::counter!(catalog::CKPT_DRAINED_BYTES_TOTAL, "tier" => t)),
            evictions: per(&|t| metrics::counter!(catalog::CKPT_EVICTIONS_TOTAL, "tier" => t)),
            fallbacks: per(&|t| metrics::counter!(catalog::CKPT_RESTORE_FALLBACKS_TOTAL, "tier" => t)),
        }
    }
}

/// What the drain has done since the store was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DrainStats {
    /// Checkpoints copied to a slower tier.
    pub checkpoints: u64,
    /// Bytes copied.
    pub bytes: u64,
    /// Seconds spent copying, summed over checkpoints (with a drain concurrency of 1, the time
    /// the drain was busy), pauses for saves included.
    pub busy_seconds: f64,
    /// Seconds of `busy_seconds` the drain spent paused because a save was writing.
    pub paused_seconds: f64,
}

impl DrainStats {
    /// Copy throughput in bytes per second while the drain was copying (pauses for saves
    /// excluded); `None` before anything was drained.
    pub fn copy_bytes_per_sec(&self) -> Option<f64> {
        let secs = self.busy_seconds - self.paused_seconds;
        (self.bytes > 0 && secs > 0.0).then(|| self.bytes as f64 / secs)
    }
}

struct Inner {
    tiers: Vec<Arc<dyn Tier>>,
    cfg: StoreConfig,
    drained: Mutex<DrainStats>,
    /// Chunk buffers kept for reuse (at most a few: two per concurrent stream).
    buffers: Mutex<Vec<AlignedBuf>>,
    /// Saves in progress: the drain pauses between chunks while any runs, so it never slows
    /// the training loop's blocking save.
    saving: std::sync::atomic::AtomicUsize,
    save_done: Notify,
    tx: mpsc::UnboundedSender<(u64, usize)>,
    state: Mutex<State>,
    changed: Notify,
    bucket: Option<TokenBucket>,
    m: Metrics,
    /// False for a store opened read-only (no lock, no recovery, no drain, no saves).
    writable: bool,
    /// Checkpoints evicted since the store was opened: a save waiting for room after ENOSPC
    /// retries only once this moved.
    evictions: std::sync::atomic::AtomicU64,
    /// The store's lock on every tier that has locks, held while the store is open.
    _locks: Vec<TierLock>,
}

/// A crash-consistent checkpoint store over tiers ordered fastest first, draining
/// asynchronously to slower ones. Cheap to clone.
#[derive(Clone)]
pub struct CheckpointStore {
    inner: Arc<Inner>,
}

impl fmt::Debug for CheckpointStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.inner.tiers.iter().map(|t| t.name()).collect();
        f.debug_struct("CheckpointStore").field("tiers", &names).field("config", &self.inner.cfg).finish()
    }
}

/// How long `open` retries a lock held by a store that is just shutting down.
const LOCK_GRACE: Duration = Duration::from_secs(2);

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn validate_part_name(name: &str) -> Result<()> {
    if name.contains('/') || name == "MANIFEST.json" {
        return Err(Error::new(
            ErrorKind::InvalidKey,
            format!("bad part name {name:?}: one path component, not MANIFEST.json"),
        ));
    }
    validate_key(name)
}

/// A committed or partial checkpoint found on a tier.
#[derive(Debug, Default, Clone)]
struct Found {
    manifest: bool,
    keys: Vec<String>,
    bytes: u64,
}

impl Inner {
    fn dir(&self, step: u64) -> String {
        format!("{}/{step:020}", self.cfg.prefix)
    }

    fn part_key(&self, step: u64, name: &str) -> String {
        format!("{}/parts/{name}", self.dir(step))
    }

    fn manifest_key(&self, step: u64) -> String {
        format!("{}/MANIFEST.json", self.dir(step))
    }

    /// Every checkpoint directory on tier `t`.
    async fn scan(&self, t: usize) -> Result<BTreeMap<u64, Found>> {
        let prefix = format!("{}/", self.cfg.prefix);
        let mut out: BTreeMap<u64, Found> = BTreeMap::new();
        for meta in self.tiers[t].list(&prefix).await? {
            let rest = &meta.key[prefix.len()..];
            let Some((step, tail)) = rest.split_once('/') else { continue };
            let Ok(step) = step.parse::<u64>() else { continue };
            let f = out.entry(step).or_default();
            if tail == "MANIFEST.json" {
                f.manifest = true;
            } else {
                f.bytes += meta.size;
            }
            f.keys.push(meta.key);
        }
        Ok(out)
    }

    /// Whether `step` is committed on tier `t`: one stat of its manifest, not a listing (the
    /// save path asks every tier, and a slow tier may hold thousands of checkpoints).
    async fn is_committed(&self, t: usize, step: u64) -> Result<bool> {
        match self.tiers[t].stat(&self.manifest_key(step)).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn committed(&self, t: usize) -> Result<BTreeSet<u64>> {
        Ok(self.scan(t).await?.into_iter().filter(|(_, f)| f.manifest).map(|(s, _)| s).collect())
    }

    async fn read_all(&self, t: usize, key: &str, size: u64) -> Result<Vec<u8>> {
        let data = ringtier_core::ops::read_exact_at(self.tiers[t].as_ref(), key, 0, size as usize).await?;
        if data.len() as u64 != size {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!("{key}: {} of {size} bytes present (truncated)", data.len()),
            ));
        }
        Ok(data)
    }

    async fn manifest(&self, t: usize, step: u64) -> Result<CheckpointManifest> {
        let key = self.manifest_key(step);
        let tier = self.tiers[t].as_ref();
        let bytes = ringtier_core::ops::get(tier, &key).await?;
        CheckpointManifest::parse(&bytes, step, &format!("{key} on tier {:?}", tier.name()))
    }

    async fn write_object(&self, t: usize, key: &str, data: &[u8]) -> Result<()> {
        let mut attempt = 0;
        loop {
            match ringtier_core::ops::put(self.tiers[t].as_ref(), key, data, self.cfg.chunk_bytes).await {
                Ok(_) => return Ok(()),
                Err(e) if e.is_temporary() && attempt < self.cfg.retries => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(10 << attempt)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Streams `next_chunk` into a new object `key` on tier `t`, returning its size and CRC.
    /// Two buffers: the next chunk is filled (copied or read, and checksummed) while the
    /// current one is written. Temporary write errors are retried; anything else aborts the
    /// staged object.
    async fn write_stream(
        &self,
        t: usize,
        key: &str,
        throttle: bool,
        mut next_chunk: impl AsyncChunks,
    ) -> Result<(u64, u32)> {
        let tier = self.tiers[t].as_ref();
        let (chunk, align) = self.chunk_layout(t);
        // Buffers are reused across parts and saves (first-touch page faults cost more than the
        // disk); one extra alignment block, as a direct read of a chunk may need the aligned span.
        let mut spare = self.take_buffer(chunk + align, align)?;
        let first = self.take_buffer(chunk + align, align)?;
        let mut writer = tier.create(key).await?;
        let mut off = 0u64;
        let (res, mut cur) = next_chunk.fill(first, chunk).await;
        let mut crc = crc32c::crc32c(cur.as_slice());
        let mut n = match res {
            Ok(n) => n,
            Err(e) => {
                let _ = writer.abort().await;
                return Err(e);
            }
        };
        while n > 0 {
            let write = async {
                if throttle {
                    // A drain: give way to saves in progress.
                    self.drain_pause().await;
                    if let Some(b) = &self.bucket {
                        let wait = b.take(n as u64);
                        if !wait.is_zero() {
                            tokio::time::sleep(wait).await;
                        }
                    }
                }
                let mut attempt = 0;
                let mut buf = cur;
                loop {
                    let (res, b) = writer.write_at(off, buf).await;
                    buf = b;
                    match res {
                        Err(e) if e.is_temporary() && attempt < self.cfg.retries => {
                            attempt += 1;
                            tokio::time::sleep(Duration::from_millis(10 << attempt)).await;
                        }
                        other => return (other, buf),
                    }
                }
            };
            // The next chunk is filled and checksummed while this one is written.
            let fill = async {
                if throttle {
                    // The drain's read of its next chunk gives way too.
                    self.drain_pause().await;
                }
                let (res, next) = next_chunk.fill(spare, chunk).await;
                crc = crc32c::crc32c_append(crc, next.as_slice());
                (res, next)
            };
            let ((wres, written), (fres, next)) = tokio::join!(write, fill);
            let filled = match (wres, fres) {
                (Ok(()), Ok(m)) => m,
                (Err(e), _) | (Ok(()), Err(e)) => {
                    let _ = writer.abort().await;
                    return Err(e);
                }
            };
            off += n as u64;
            n = filled;
            spare = written;
            cur = next;
        }
        self.give_buffer(spare);
        self.give_buffer(cur);
        writer.commit().await?;
        Ok((off, crc))
    }

    /// Bytes per write to tier `t` (the configured chunk, rounded up to the tier's alignment)
    /// and that alignment.
    fn chunk_layout(&self, t: usize) -> (usize, usize) {
        let align = self.tiers[t].capabilities().alignment.max(4096);
        (ringtier_core::buf::align_up(self.cfg.chunk_bytes.max(4096) as u64, align as u64) as usize, align)
    }

    /// A drain's wait for saves in progress, counted in [`DrainStats::paused_seconds`].
    async fn drain_pause(&self) {
        if self.saving.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            return;
        }
        let paused = Instant::now();
        self.yield_to_saves().await;
        self.drained.lock().unwrap_or_else(|p| p.into_inner()).paused_seconds += paused.elapsed().as_secs_f64();
    }

    /// Waits until no save is writing: background work (drain copies, evictions) runs between
    /// saves, never during one, so it does not add to the training loop's blocking time.
    async fn yield_to_saves(&self) {
        loop {
            let done = self.save_done.notified();
            if self.saving.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                break;
            }
            done.await;
        }
    }

    fn take_buffer(&self, size: usize, align: usize) -> Result<AlignedBuf> {
        let mut free = self.buffers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = free.iter().position(|b| b.capacity() >= size && b.align() >= align) {
            let mut b = free.swap_remove(i);
            b.clear();
            return Ok(b);
        }
        drop(free);
        AlignedBuf::new(size, align)
    }

    fn give_buffer(&self, buf: AlignedBuf) {
        let mut free = self.buffers.lock().unwrap_or_else(|p| p.into_inner());
        if free.len() < 2 * (self.cfg.drain_concurrency + 1) {
            free.push(buf);
        }
    }

    /// Removes every object of `step` on tier `t`, manifest first (so a crash midway leaves a
    /// partial checkpoint that recovery removes, never a committed one with missing parts).
    async fn remove(&self, t: usize, step: u64) -> Result<()> {
        let tier = self.tiers[t].as_ref();
        let mkey = self.manifest_key(step);
        match tier.delete(&mkey).await {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        for meta in tier.list(&format!("{}/", self.dir(step))).await? {
            match tier.delete(&meta.key).await {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn update_gauges(&self, st: &State) {
        self.m.pending.set(st.pending.len() as f64);
        self.m.backlog.set(st.pending.values().map(|(_, b)| *b as f64).sum::<f64>());
    }

    fn enqueue(&self, step: u64, from: usize, bytes: u64) {
        {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            st.pending.insert(step, (from, bytes));
            st.failed.remove(&step);
            self.update_gauges(&st);
        }
        let _ = self.tx.send((step, from));
    }

    fn finish_drain(&self, step: u64, failure: Option<String>) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.pending.remove(&step);
        if let Some(f) = failure {
            st.failed.insert(step, f);
        }
        self.update_gauges(&st);
        drop(st);
        self.changed.notify_waiters();
    }

    /// Copies `step` from tier `from` to `from + 1`, verifying every checksum, then commits
    /// its manifest there.
    async fn drain_one(&self, step: u64, from: usize) -> Result<u64> {
        let to = from + 1;
        let manifest = self.manifest(from, step).await?;
        if self.is_committed(to, step).await? {
            return Ok(0); // already there (recovered after a crash between commit and eviction)
        }
        // A partial copy from an interrupted drain is replaced part by part.
        let mut bytes = 0;
        for p in &manifest.parts {
            let key = self.part_key(step, &p.name);
            let src = TierChunks { tier: Arc::clone(&self.tiers[from]), key: key.clone(), size: p.size, off: 0 };
            let (size, crc) = self.write_stream(to, &key, true, src).await?;
            if size != p.size || crc != p.crc32c {
                let _ = self.tiers[to].delete(&key).await;
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!(
                        "part {:?} of step {step} on tier {:?} does not match its manifest (size {size} vs {}, crc32c {crc:08x} vs {:08x}); not drained",
                        p.name,
                        self.tiers[from].name(),
                        p.size,
                        p.crc32c
                    ),
                ));
            }
            bytes += size;
        }
        self.write_object(to, &self.manifest_key(step), &manifest.to_bytes()).await?;
        Ok(bytes)
    }

    /// Applies the eviction policy to tier `t` (not the slowest) and returns how many
    /// checkpoints it removed. Only checkpoints already committed on a slower tier are evicted,
    /// oldest first: those beyond the newest `keep_last`; then, for [`Evict::Room`], while the
    /// fast tier's capacity bound or the file system's free space (less [`free_slack`]) leaves
    /// no room for the bytes a save needs; for [`Evict::AfterEnospc`], also at least one (the
    /// file system said it is full, whatever its free count said).
    async fn evict(&self, t: usize, why: Evict) -> Result<usize> {
        if t + 1 >= self.tiers.len() {
            return Ok(0);
        }
        let need = match why {
            Evict::Policy => 0,
            Evict::Room(n) | Evict::AfterEnospc(n) => n,
        };
        let here = self.scan(t).await?;
        let mut slower = BTreeSet::new();
        for s in t + 1..self.tiers.len() {
            slower.extend(self.committed(s).await?);
        }
        let committed: Vec<u64> = here.iter().filter(|(_, f)| f.manifest).map(|(s, _)| *s).collect();
        let keep_from = committed.len().saturating_sub(self.cfg.keep_last);
        let mut used: u64 = here.values().filter(|f| f.manifest).map(|f| f.bytes).sum();
        let mut evicted = 0;
        for (i, step) in committed.iter().enumerate() {
            if !slower.contains(step) {
                continue; // never evict the only copy
            }
            let over_capacity = t == 0 && self.cfg.fast_capacity_bytes.is_some_and(|c| used + need > c);
            let short = match why {
                Evict::Policy => false,
                Evict::Room(_) => self.free_space(t).await.is_some_and(|free| free < need + free_slack(need)),
                Evict::AfterEnospc(_) => {
                    evicted == 0 || self.free_space(t).await.is_some_and(|free| free < need + free_slack(need))
                }
            };
            if i < keep_from || over_capacity || short {
                // Freeing a large file costs CPU (tmpfs frees every page on unlink): not while a
                // save writes.
                self.yield_to_saves().await;
                self.remove(t, *step).await?;
                used -= here[step].bytes;
                evicted += 1;
                self.evictions.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                self.m.evictions[t].increment(1);
                tracing::debug!(step, tier = self.tiers[t].name(), "evicted");
            }
        }
        Ok(evicted)
    }

    /// Free bytes of tier `t`'s file system (or bound) now; `None` where the tier cannot tell.
    async fn free_space(&self, t: usize) -> Option<u64> {
        match self.tiers[t].space().await {
            Ok(s) => s.map(|s| s.free_bytes),
            Err(e) => {
                tracing::debug!(tier = self.tiers[t].name(), "free space unknown: {e}");
                None
            }
        }
    }

    /// Whether `need` more bytes fit on tier `t` now: within the fast tier's capacity bound and
    /// the file system's free space (less [`free_slack`]).
    async fn room(&self, t: usize, step: u64, need: u64) -> Result<Room> {
        let name = self.tiers[t].name();
        if t == 0 {
            if let Some(cap) = self.cfg.fast_capacity_bytes {
                if need > cap {
                    return Ok(Room::Never(format!(
                        "checkpoint {step} ({need} bytes) is larger than the fast tier's capacity of {cap} bytes"
                    )));
                }
                let used = self.fast_used().await?;
                if used + need > cap {
                    return Ok(Room::Full(format!(
                        "the fast tier's capacity of {cap} bytes holds {used} bytes and cannot take checkpoint {step} \
                         ({need} bytes)"
                    )));
                }
            }
        }
        match self.tiers[t].space().await {
            Ok(Some(space)) if need > space.total_bytes => Ok(Room::Never(format!(
                "checkpoint {step} ({need} bytes) is larger than tier {name:?} ({} bytes in all)",
                space.total_bytes
            ))),
            Ok(Some(space)) if need + free_slack(need) > space.free_bytes => Ok(Room::Full(format!(
                "tier {name:?} has {} bytes free, too few for checkpoint {step} ({need} bytes)",
                space.free_bytes
            ))),
            Ok(_) => Ok(Room::Fits),
            Err(e) => {
                tracing::debug!(tier = name, "free space unknown: {e}");
                Ok(Room::Fits)
            }
        }
    }

    async fn fast_used(&self) -> Result<u64> {
        Ok(self.scan(0).await?.values().filter(|f| f.manifest).map(|f| f.bytes).sum())
    }
}

/// Why [`Inner::evict`] runs.
#[derive(Debug, Clone, Copy)]
enum Evict {
    /// Keep the newest `keep_last` drained checkpoints and the capacity bound.
    Policy,
    /// A save needs this many bytes on the tier.
    Room(u64),
    /// A save of this many bytes (0 when unknown) failed with ENOSPC on the tier.
    AfterEnospc(u64),
}

/// Whether a save fits on a tier.
#[derive(Debug)]
enum Room {
    Fits,
    /// Not now: draining and evicting may make room. Says why.
    Full(String),
    /// Not even on an empty tier. Says why.
    Never(String),
}

/// Bytes kept free on a file system beyond a checkpoint's own when deciding whether it fits:
/// file-system metadata and the alignment padding of direct writes (1/256 of it plus 1 MiB).
/// A save that still meets ENOSPC is handled as a full tier.
fn free_slack(need: u64) -> u64 {
    need / 256 + (1 << 20)
}

/// Counts a save in progress for as long as it lives.
struct SavingGuard<'a>(&'a Inner);

impl<'a> SavingGuard<'a> {
    fn new(inner: &'a Inner) -> Self {
        inner.saving.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        SavingGuard(inner)
    }
}

impl Drop for SavingGuard<'_> {
    fn drop(&mut self) {
        self.0.saving.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        self.0.save_done.notify_waiters();
    }
}

/// A source of chunks, filled asynchronously into an owned buffer.
trait AsyncChunks: Send {
    /// Fills up to `max` bytes of `buf` (setting its data window); 0 at the end.
    fn fill(
        &mut self,
        buf: AlignedBuf,
        max: usize,
    ) -> impl std::future::Future<Output = (Result<usize>, AlignedBuf)> + Send;
}

fn fill_from_slice(mut buf: AlignedBuf, src: &[u8]) -> (Result<usize>, AlignedBuf) {
    let n = src.len();
    buf.capacity_mut()[..n].copy_from_slice(src);
    let res = buf.set_window(0, n).map(|()| n);
    (res, buf)
}

struct BytesChunks<'a> {
    data: &'a [u8],
}

impl AsyncChunks for BytesChunks<'_> {
    async fn fill(&mut self, buf: AlignedBuf, max: usize) -> (Result<usize>, AlignedBuf) {
        let n = max.min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        fill_from_slice(buf, head)
    }
}

struct ReaderChunks<'r, 'a> {
    reader: &'r mut (dyn Read + Send + 'a),
}

impl AsyncChunks for ReaderChunks<'_, '_> {
    async fn fill(&mut self, mut buf: AlignedBuf, max: usize) -> (Result<usize>, AlignedBuf) {
        let mut n = 0;
        let dst = &mut buf.capacity_mut()[..max];
        while n < max {
            match self.reader.read(&mut dst[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return (Err(Error::from(e).with_operation(Operation::Write)), buf),
            }
        }
        let res = buf.set_window(0, n).map(|()| n);
        (res, buf)
    }
}

/// Reads an object of a tier straight into the buffer that is then written (no copy).
struct TierChunks {
    tier: Arc<dyn Tier>,
    key: String,
    size: u64,
    off: u64,
}

impl AsyncChunks for TierChunks {
    async fn fill(&mut self, buf: AlignedBuf, max: usize) -> (Result<usize>, AlignedBuf) {
        let want = (max as u64).min(self.size - self.off) as usize;
        if want == 0 {
            let mut buf = buf;
            buf.clear();
            return (Ok(0), buf);
        }
        let (res, buf) = self.tier.read_at(&self.key, self.off, want, buf).await;
        let res = match res {
            Ok(n) if n == want && buf.head() == 0 => {
                self.off += n as u64;
                Ok(n)
            }
            Ok(n) if n < want => Err(Error::new(
                ErrorKind::Corrupt,
                format!("{} on tier {:?} is truncated at {} bytes", self.key, self.tier.name(), self.off + n as u64),
            )),
            Ok(_) => Err(Error::new(ErrorKind::Misaligned, "chunk read landed off the start of the buffer")),
            Err(e) => Err(e),
        };
        (res, buf)
    }
}

async fn drain_loop(weak: Weak<Inner>, mut rx: mpsc::UnboundedReceiver<(u64, usize)>, concurrency: usize) {
    let sem = Arc::new(Semaphore::new(concurrency.max(1)));
    while let Some((step, from)) = rx.recv().await {
        let Ok(permit) = Arc::clone(&sem).acquire_owned().await else { break };
        let Some(inner) = weak.upgrade() else { break };
        tokio::spawn(async move {
            let _permit = permit;
            let start = Instant::now();
            let mut attempt = 0;
            let result = loop {
                match inner.drain_one(step, from).await {
                    Err(e) if e.is_temporary() && attempt < inner.cfg.retries => {
                        attempt += 1;
                        tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
                    }
                    other => break other,
                }
            };
            match result {
                Ok(bytes) => {
                    let secs = start.elapsed().as_secs_f64();
                    {
                        let mut d = inner.drained.lock().unwrap_or_else(|p| p.into_inner());
                        d.checkpoints += 1;
                        d.bytes += bytes;
                        d.busy_seconds += secs;
                    }
                    inner.m.drain_seconds[from + 1].record(secs);
                    inner.m.drained_bytes[from + 1].increment(bytes);
                    tracing::debug!(step, bytes, "drained to {}", inner.tiers[from + 1].name());
                    // Onward to an even slower tier, then eviction here.
                    let next_bytes =
                        inner.state.lock().unwrap_or_else(|p| p.into_inner()).pending.get(&step).map(|p| p.1);
                    let onward = from + 2 < inner.tiers.len();
                    if onward {
                        inner.enqueue(step, from + 1, next_bytes.unwrap_or(bytes));
                    }
                    // Evict before reporting the drain done, so `drain()` returns on a settled
                    // store.
                    if let Err(e) = inner.evict(from, Evict::Policy).await {
                        tracing::warn!("evicting from {}: {e}", inner.tiers[from].name());
                    }
                    if !onward {
                        inner.finish_drain(step, None);
                    }
                    inner.changed.notify_waiters();
                }
                Err(e) => {
                    tracing::error!(step, "drain to {} failed: {e}", inner.tiers[from + 1].name());
                    inner.finish_drain(step, Some(e.to_string()));
                }
            }
        });
    }
}

impl CheckpointStore {
    /// Opens a store over `tiers` (fastest first) and recovers: partial checkpoints (no
    /// manifest) are removed, committed ones not yet on the next tier are queued for the drain,
    /// the eviction policy is applied. Must be called inside a tokio runtime (the drain runs on
    /// it). The store locks every tier that has locks (file tiers) for as long as it is open:
    /// a second `open` of the same prefix, here or in another process, fails with
    /// [`ErrorKind::Busy`] (after retrying for two seconds, the time a store just dropped may
    /// need to stop its drain). Use [`CheckpointStore::open_read_only`] to look at a store
    /// another process has open.
    pub async fn open(tiers: Vec<Arc<dyn Tier>>, cfg: StoreConfig) -> Result<Self> {
        Self::open_with(tiers, cfg, true).await
    }

    /// Opens a store to list, verify and load checkpoints only, without its lock, without
    /// recovery (which would remove another process's save in progress as partial) and
    /// without a drain: `save` and `save_direct` fail with [`ErrorKind::Unsupported`]. Safe
    /// next to a store another process has open; a copy that process evicts while it is being
    /// read makes `load` fall back to a slower copy.
    pub async fn open_read_only(tiers: Vec<Arc<dyn Tier>>, cfg: StoreConfig) -> Result<Self> {
        Self::open_with(tiers, cfg, false).await
    }

    async fn open_with(tiers: Vec<Arc<dyn Tier>>, cfg: StoreConfig, writable: bool) -> Result<Self> {
        if tiers.is_empty() {
            return Err(Error::new(ErrorKind::InvalidInput, "a checkpoint store needs at least one tier"));
        }
        validate_key(&cfg.prefix).map_err(|e| e.with_operation(Operation::Open))?;
        if cfg.chunk_bytes == 0 {
            return Err(Error::new(ErrorKind::InvalidInput, "chunk_bytes must be positive"));
        }
        // One store per prefix and tier at a time: a second one (another process, or another
        // open in this one) would race this one's drain, eviction and recovery. A store just
        // dropped in this process releases its locks when its last background task ends, so a
        // held lock is retried for a moment before it is an error.
        let lock_name = format!("ckpt-{}", cfg.prefix.replace('/', "_"));
        let mut locks = Vec::new();
        let since = Instant::now();
        for t in tiers.iter().filter(|_| writable) {
            let res = loop {
                match t.lock(&lock_name).await {
                    Err(e) if e.kind() == ErrorKind::Busy && since.elapsed() < LOCK_GRACE => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    other => break other,
                }
            };
            match res {
                Ok(Some(l)) => locks.push(l),
                Ok(None) => {}
                Err(e) if e.kind() == ErrorKind::Busy => {
                    return Err(Error::new(
                        ErrorKind::Busy,
                        format!(
                            "checkpoint store {:?} on tier {:?} is open elsewhere: {}",
                            cfg.prefix,
                            t.name(),
                            e.message()
                        ),
                    )
                    .with_operation(Operation::Open))
                }
                Err(e) => return Err(e),
            }
        }
        if writable {
            warn_if_not_durable(&tiers, &cfg.prefix);
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let m = Metrics::new(&tiers);
        let bucket = cfg.drain_bytes_per_sec.map(|r| TokenBucket::new(r, Some(cfg.chunk_bytes as u64)));
        let concurrency = cfg.drain_concurrency;
        let inner = Arc::new(Inner {
            tiers,
            cfg,
            drained: Mutex::default(),
            buffers: Mutex::default(),
            saving: std::sync::atomic::AtomicUsize::new(0),
            save_done: Notify::new(),
            tx,
            state: Mutex::default(),
            changed: Notify::new(),
            bucket,
            m,
            writable,
            evictions: std::sync::atomic::AtomicU64::new(0),
            _locks: locks,
        });
        let store = CheckpointStore { inner };
        if !writable {
            return Ok(store);
        }
        let inner = &store.inner;
        // The save's two chunk buffers, allocated (and touched) now so that the first save does
        // not pay the page faults.
        let (chunk, align) = inner.chunk_layout(0);
        for _ in 0..2 {
            inner.give_buffer(AlignedBuf::new(chunk + align, align)?);
        }
        tokio::spawn(drain_loop(Arc::downgrade(inner), rx, concurrency));
        store.recover().await?;
        Ok(store)
    }

    async fn recover(&self) -> Result<()> {
        let inner = &self.inner;
        let n = inner.tiers.len();
        let mut scans = Vec::with_capacity(n);
        for t in 0..n {
            let mut found = inner.scan(t).await?;
            let partial: Vec<u64> = found.iter().filter(|(_, f)| !f.manifest).map(|(s, _)| *s).collect();
            for step in partial {
                tracing::info!(step, tier = inner.tiers[t].name(), "removing a partial checkpoint (no manifest)");
                inner.remove(t, step).await?;
                found.remove(&step);
            }
            scans.push(found);
        }
        for t in 0..n.saturating_sub(1) {
            for (step, f) in &scans[t] {
                if !scans[t + 1].contains_key(step) && !(t + 2..n).any(|s| scans[s].contains_key(step)) {
                    inner.enqueue(*step, t, f.bytes);
                }
            }
        }
        for t in 0..n.saturating_sub(1) {
            inner.evict(t, Evict::Policy).await?;
        }
        Ok(())
    }

    /// The tiers, fastest first.
    pub fn tiers(&self) -> &[Arc<dyn Tier>] {
        &self.inner.tiers
    }

    /// Saves `parts` as checkpoint `step` on the fastest tier (or, when it is full, as
    /// configured) and returns once it is durable: every part committed, then the manifest.
    /// The copy to slower tiers is queued. On error nothing of `step` stays visible and earlier
    /// checkpoints are untouched.
    pub async fn save(&self, step: u64, parts: Vec<Part<'_>>) -> Result<SaveReport> {
        self.save_to(step, parts, false).await
    }

    /// Saves straight to the slowest tier (no drain): the baseline the burst buffer beats.
    pub async fn save_direct(&self, step: u64, parts: Vec<Part<'_>>) -> Result<SaveReport> {
        self.save_to(step, parts, true).await
    }

    async fn save_to(&self, step: u64, mut parts: Vec<Part<'_>>, direct: bool) -> Result<SaveReport> {
        let inner = &self.inner;
        if !inner.writable {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("cannot save checkpoint {step}: the store is open read-only"),
            )
            .with_operation(Operation::Write));
        }
        let start = Instant::now();
        let mut names = BTreeSet::new();
        for p in &parts {
            validate_part_name(&p.name).map_err(|e| e.with_operation(Operation::Write))?;
            if !names.insert(p.name.clone()) {
                return Err(Error::new(ErrorKind::InvalidInput, format!("part {:?} given twice", p.name)));
            }
        }
        for t in 0..inner.tiers.len() {
            if inner.is_committed(t, step).await? {
                return Err(Error::new(
                    ErrorKind::AlreadyExists,
                    format!("checkpoint {step} already exists on tier {:?}", inner.tiers[t].name()),
                ));
            }
        }
        let last = inner.tiers.len() - 1;
        let checked = start.elapsed();
        let estimate: u64 = parts.iter().map(Part::size_hint).sum();
        // Where each seekable part starts, to rewind it for another attempt.
        let mut starts = Vec::with_capacity(parts.len());
        for p in parts.iter_mut() {
            starts.push(match &mut p.data {
                PartData::Seekable { reader, .. } => Some(reader.stream_position().map_err(|e| {
                    Error::from(e).with_operation(Operation::Write).with_key(inner.part_key(step, &p.name))
                })?),
                _ => None,
            });
        }
        let mut target = if direct { last } else { 0 };
        let mut wrote_through = false;
        // Room on the fast tier (its capacity bound, its file system's free space) before a
        // byte is written.
        if target < last && !self.make_room(target, step, estimate).await? {
            tracing::warn!(step, "tier {:?} is full; writing through", inner.tiers[target].name());
            target += 1;
            wrote_through = true;
        }
        loop {
            // The drain gives way while the checkpoint is written (not while waiting for room).
            let written = {
                let _saving = SavingGuard::new(inner);
                self.write_checkpoint(target, step, &mut parts).await
            };
            match written {
                Ok(bytes) => {
                    let blocking = start.elapsed();
                    tracing::debug!(
                        step,
                        tier = inner.tiers[target].name(),
                        checks_ms = checked.as_secs_f64() * 1e3,
                        blocking_ms = blocking.as_secs_f64() * 1e3,
                        "saved"
                    );
                    inner.m.blocking[target].record(blocking.as_secs_f64());
                    inner.m.saves_ok[target].increment(1);
                    if target < last {
                        inner.enqueue(step, target, bytes);
                    }
                    return Ok(SaveReport {
                        step,
                        bytes,
                        tier: inner.tiers[target].name().to_string(),
                        blocking,
                        wrote_through,
                    });
                }
                Err((e, consumed_stream)) => {
                    // Nothing of this attempt stays: the failed part's staged object is already
                    // aborted; committed parts go, manifest first.
                    let _ = inner.remove(target, step).await;
                    if e.kind() != ErrorKind::NoSpace || target == last {
                        inner.m.saves_err[target].increment(1);
                        return Err(e.with_operation(Operation::Write));
                    }
                    // The tier filled up part-way: apply the on-full policy to the whole save.
                    let name = inner.tiers[target].name();
                    if consumed_stream {
                        inner.m.saves_err[target].increment(1);
                        return Err(Error::from_errno(
                            libc_enospc(),
                            format!(
                                "checkpoint {step}: tier {name:?} is full ({e}), and a part given as a stream \
                                 that cannot be read again was part-way written; give parts as bytes or as \
                                 seekable streams (Part::seekable) so that a full tier can be retried"
                            ),
                        )
                        .with_operation(Operation::Write));
                    }
                    rewind(&mut parts, &starts).map_err(|e| e.with_operation(Operation::Write))?;
                    tracing::warn!(step, "tier {name:?} filled up during the save: {e}");
                    match self.room_after_enospc(target, step, estimate, &e).await {
                        Ok(true) => {}
                        Ok(false) => {
                            tracing::warn!(step, "tier {name:?} is full; writing through");
                            target += 1;
                            wrote_through = true;
                        }
                        Err(e) => {
                            inner.m.saves_err[target].increment(1);
                            return Err(e.with_operation(Operation::Write));
                        }
                    }
                }
            }
        }
    }

    /// Makes room for `need` bytes of checkpoint `step` on tier `t` before it is written:
    /// evicts drained checkpoints, and with [`OnFull::Wait`] waits for the drain while that
    /// can help. `Ok(true)` when it fits, `Ok(false)` to write through
    /// ([`OnFull::WriteThrough`]); [`ErrorKind::NoSpace`] when waiting cannot help.
    async fn make_room(&self, t: usize, step: u64, need: u64) -> Result<bool> {
        let inner = &self.inner;
        let mut last_look = false;
        // Most saves fit: one look at the tier's room, no eviction scan on the blocking path.
        let mut room = inner.room(t, step, need).await?;
        loop {
            if matches!(room, Room::Full(_)) {
                inner.evict(t, Evict::Room(need)).await?;
                room = inner.room(t, step, need).await?;
            }
            let why = match room {
                Room::Fits => return Ok(true),
                Room::Full(why) => why,
                Room::Never(why) => {
                    if inner.cfg.on_full == OnFull::WriteThrough {
                        return Ok(false);
                    }
                    return Err(Error::from_errno(
                        libc_enospc(),
                        format!("{why}: it can never be saved there (save with on_full write-through or save_direct)"),
                    ));
                }
            };
            if inner.cfg.on_full == OnFull::WriteThrough {
                return Ok(false);
            }
            if !self.wait_for_drain_progress().await {
                // Nothing to drain: one more look (a drain may have just finished and evicted).
                if last_look {
                    return Err(Error::from_errno(
                        libc_enospc(),
                        format!("{why}, and nothing is left to drain or evict (on_full write-through would write it to the next tier)"),
                    ));
                }
                last_look = true;
            }
            room = inner.room(t, step, need).await?;
        }
    }

    /// After a save of `step` met ENOSPC on tier `t` (`err`): `Ok(true)` to retry there once
    /// something was evicted (or, with [`OnFull::Wait`], once a drain finished), `Ok(false)` to
    /// write through ([`OnFull::WriteThrough`]); [`ErrorKind::NoSpace`] when waiting cannot
    /// help. Each retry follows an eviction or a finished drain, so retries end.
    async fn room_after_enospc(&self, t: usize, step: u64, need: u64, err: &Error) -> Result<bool> {
        let inner = &self.inner;
        let evictions = |i: &Inner| i.evictions.load(std::sync::atomic::Ordering::SeqCst);
        let before = evictions(inner);
        if inner.evict(t, Evict::AfterEnospc(need)).await? > 0 {
            return Ok(true);
        }
        if inner.cfg.on_full == OnFull::WriteThrough {
            return Ok(false);
        }
        if self.wait_for_drain_progress().await {
            return Ok(true);
        }
        // Nothing pending: retry only if a drain evicted something meanwhile.
        if evictions(inner) != before || inner.evict(t, Evict::AfterEnospc(need)).await? > 0 {
            return Ok(true);
        }
        Err(Error::from_errno(
            libc_enospc(),
            format!(
                "checkpoint {step}: tier {:?} is full ({err}), and nothing is left to drain or evict (on_full \
                 write-through would write it to the next tier)",
                inner.tiers[t].name()
            ),
        ))
    }

    /// Writes every part, then the manifest, on tier `t`. The bool says whether a part given as
    /// a plain stream was read (it cannot be written again).
    async fn write_checkpoint(
        &self,
        t: usize,
        step: u64,
        parts: &mut [Part<'_>],
    ) -> std::result::Result<u64, (Error, bool)> {
        let inner = &self.inner;
        let mut metas = Vec::with_capacity(parts.len());
        let mut consumed_stream = false;
        for p in parts.iter_mut() {
            let key = inner.part_key(step, &p.name);
            let res = match &mut p.data {
                PartData::Bytes(b) => inner.write_stream(t, &key, false, BytesChunks { data: b }).await,
                PartData::Reader { reader, .. } => {
                    consumed_stream = true;
                    inner.write_stream(t, &key, false, ReaderChunks { reader: reader.as_mut() }).await
                }
                PartData::Seekable { reader, .. } => {
                    inner.write_stream(t, &key, false, ReaderChunks { reader: reader.as_mut() }).await
                }
            };
            let (size, crc32c) = res.map_err(|e| (e, consumed_stream))?;
            metas.push(PartMeta { name: p.name.clone(), size, crc32c });
        }
        let manifest = CheckpointManifest {
            format: FORMAT.into(),
            version: VERSION,
            step,
            created_unix_ms: now_ms(),
            parts: metas,
        };
        inner
            .write_object(t, &inner.manifest_key(step), &manifest.to_bytes())
            .await
            .map_err(|e| (e, consumed_stream))?;
        Ok(manifest.total_bytes())
    }

    /// Waits until some drain finishes. False when nothing is pending (waiting cannot help).
    async fn wait_for_drain_progress(&self) -> bool {
        let notified = self.inner.changed.notified();
        let pending = !self.inner.state.lock().unwrap_or_else(|p| p.into_inner()).pending.is_empty();
        if !pending {
            return false;
        }
        notified.await;
        true
    }

    /// Waits until every queued checkpoint has reached the slowest tier. Errors list the
    /// checkpoints whose drain failed.
    pub async fn drain(&self) -> Result<()> {
        loop {
            let notified = self.inner.changed.notified();
            {
                let st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
                if st.pending.is_empty() {
                    if st.failed.is_empty() {
                        return Ok(());
                    }
                    let list: Vec<String> = st.failed.iter().map(|(s, e)| format!("step {s}: {e}")).collect();
                    return Err(Error::new(ErrorKind::Io, format!("drain failed for {}", list.join("; "))));
                }
            }
            notified.await;
        }
    }

    /// What the drain has done since the store was opened.
    pub fn drain_stats(&self) -> DrainStats {
        *self.inner.drained.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes of committed checkpoints waiting for or in the drain.
    pub fn drain_backlog_bytes(&self) -> u64 {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner()).pending.values().map(|p| p.1).sum()
    }

    /// Every checkpoint with a committed copy somewhere, by step.
    pub async fn list(&self) -> Result<Vec<CheckpointInfo>> {
        let inner = &self.inner;
        let mut out: BTreeMap<u64, CheckpointInfo> = BTreeMap::new();
        for t in 0..inner.tiers.len() {
            for (step, f) in inner.scan(t).await? {
                if !f.manifest {
                    continue;
                }
                let e = out.entry(step).or_insert(CheckpointInfo { step, bytes: f.bytes, tiers: Vec::new() });
                e.tiers.push(inner.tiers[t].name().to_string());
            }
        }
        Ok(out.into_values().collect())
    }

    /// The newest step with a committed copy.
    pub async fn latest(&self) -> Result<Option<u64>> {
        Ok(self.list().await?.last().map(|c| c.step))
    }

    /// Reads and verifies checkpoint `step` from the fastest tier holding a committed copy,
    /// falling back to slower copies when one fails verification (and saying why).
    pub async fn load(&self, step: u64) -> Result<Restored> {
        let inner = &self.inner;
        let mut fallbacks = Vec::new();
        for t in 0..inner.tiers.len() {
            if !inner.is_committed(t, step).await? {
                continue;
            }
            match self.load_from(t, step).await {
                Ok(parts) => {
                    for f in &fallbacks {
                        tracing::warn!("checkpoint {step}: {f}");
                    }
                    return Ok(Restored { step, tier: inner.tiers[t].name().to_string(), parts, fallbacks });
                }
                Err(e) => {
                    inner.m.fallbacks[t].increment(1);
                    fallbacks.push(format!("copy on tier {:?} unusable: {e}", inner.tiers[t].name()));
                }
            }
        }
        if fallbacks.is_empty() {
            return Err(Error::new(ErrorKind::NotFound, format!("no committed copy of checkpoint {step} on any tier")));
        }
        Err(Error::new(ErrorKind::Corrupt, format!("checkpoint {step}: every copy failed: {}", fallbacks.join("; "))))
    }

    async fn load_from(&self, t: usize, step: u64) -> Result<Vec<(String, Vec<u8>)>> {
        let inner = &self.inner;
        let manifest = inner.manifest(t, step).await?;
        let mut parts = Vec::with_capacity(manifest.parts.len());
        for p in &manifest.parts {
            let key = inner.part_key(step, &p.name);
            let data = inner.read_all(t, &key, p.size).await?;
            let crc = crc32c::crc32c(&data);
            if crc != p.crc32c {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!("part {:?}: checksum mismatch (crc32c {crc:08x}, manifest {:08x})", p.name, p.crc32c),
                ));
            }
            parts.push((p.name.clone(), data));
        }
        Ok(parts)
    }

    /// Verifies every committed copy of `step`: one line per tier, `Ok` or the reason.
    pub async fn verify(&self, step: u64) -> Result<Vec<(String, Result<()>)>> {
        let inner = &self.inner;
        let mut out = Vec::new();
        for t in 0..inner.tiers.len() {
            if inner.is_committed(t, step).await? {
                let res = self.load_from(t, step).await.map(|_| ());
                out.push((inner.tiers[t].name().to_string(), res));
            }
        }
        Ok(out)
    }
}

/// Warns (once per tier name and prefix in a process) when the slowest tier of a store is not
/// durable: a checkpoint there does not survive a power cut or a reboot (tmpfs, memory).
fn warn_if_not_durable(tiers: &[Arc<dyn Tier>], prefix: &str) {
    static WARNED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    let Some(slowest) = tiers.last() else { return };
    if slowest.capabilities().durable {
        return;
    }
    let first = WARNED.lock().unwrap_or_else(|p| p.into_inner()).insert(format!("{}\0{prefix}", slowest.name()));
    if first {
        tracing::warn!(
            tier = slowest.name(),
            prefix,
            "the checkpoint store's slowest tier {:?} is not durable (memory or tmpfs): its checkpoints do not \
             survive a power cut or a reboot",
            slowest.name()
        );
    }
}

/// Seeks every seekable part back to where the save started reading it.
fn rewind(parts: &mut [Part<'_>], starts: &[Option<u64>]) -> Result<()> {
    for (p, start) in parts.iter_mut().zip(starts) {
        if let (PartData::Seekable { reader, .. }, Some(pos)) = (&mut p.data, start) {
            reader.seek(SeekFrom::Start(*pos)).map_err(|e| {
                Error::from(e).with_key(format!("part {:?} (rewinding it for another attempt)", p.name))
            })?;
        }
    }
    Ok(())
}

fn libc_enospc() -> i32 {
    28
}
