//! The checkpoint store: save to the fastest tier, drain to slower ones, evict, restore,
//! recover.
//!
//! * this module: the store's state, opening (the locks) and recovery;
//! * [`config`]: [`StoreConfig`] and [`OnFull`];
//! * [`part`]: what a save takes ([`Part`]) and the chunk sources saves and drains read;
//! * [`save`]: room on the fast tier, streaming parts, the commit order;
//! * [`adopt`]: committing files already on the fast tier without writing them again;
//! * [`drain`]: the background copy to slower tiers;
//! * [`evict`]: removing drained faster copies, manifest first;
//! * [`read`]: the one read path (chunks in flight, in order) and [`RestoreSink`];
//! * [`restore`]: list, restore into sinks, load, verify, with fallback to slower copies;
//! * [`restore_request`]: the one restore path under them: a [`RestoreRequest`] (which copies,
//!   what of each part, which buffers) and how it runs;
//! * [`heal`]: checking copies, quarantine, repair from an intact copy, deleting a step.

use crate::manifest::{CheckpointManifest, PartMeta, FORMAT, VERSION};
use ringtier_core::buf::AlignedBuf;
use ringtier_core::catalog;
use ringtier_core::error::{Error, ErrorKind, Operation, Result};
use ringtier_core::key::validate_key;
use ringtier_core::layers::TokenBucket;
use ringtier_core::{Tier, TierLock};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::{Read, Seek, SeekFrom};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, Notify, Semaphore};

mod adopt;
mod committed;
mod config;
mod direct;
mod drain;
mod evict;
mod heal;
mod part;
mod read;
mod restore;
mod restore_request;
mod save;
mod sinks;

pub use config::{OnFull, StoreConfig};
use direct::DIRECT_DECLINED;
pub use direct::{DirectRestored, ReadTargets};
use drain::drain_loop;
pub use drain::DrainStats;
use evict::Evict;
pub use heal::QuarantinedCopy;
use part::*;
pub use part::{Part, PartData, SeekRead};
use read::{ChunkReads, Span};
pub use read::{PartInfo, RestoreSink};
pub use restore::{is_bad_copy, CheckpointInfo, RestoreOptions, RestoreReport, Restored};
use restore_request::RestoreRequest;
pub use save::SaveReport;
use save::*;
pub use sinks::{BufferSink, FnSink, RestoreEvent, TierSink};

#[derive(Debug, Default)]
struct State {
    /// step -> (tier index it drains from, bytes)
    pending: BTreeMap<u64, (usize, u64)>,
    /// steps whose drain failed permanently, with the reason
    failed: BTreeMap<u64, String>,
    /// steps quarantined since the store was opened (no intact copy), with the reason
    quarantined: BTreeMap<u64, String>,
    /// steps deleted while a drain of theirs may be running: the drain drops what it copied
    deleted: BTreeSet<u64>,
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
    quarantined: Vec<metrics::Counter>,
    repairs: Vec<metrics::Counter>,
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
            quarantined: per(&|t| metrics::counter!(catalog::CKPT_QUARANTINED_TOTAL, "tier" => t)),
            repairs: per(&|t| metrics::counter!(catalog::CKPT_REPAIRS_TOTAL, "tier" => t)),
        }
    }
}

struct Inner {
    tiers: Vec<Arc<dyn Tier>>,
    cfg: StoreConfig,
    drained: Mutex<DrainStats>,
    /// Chunk buffers kept for reuse (at most a few: two per concurrent stream).
    buffers: Mutex<Vec<AlignedBuf>>,
    /// Read buffers of restores kept for the next restore (at most [`READ_BUFFERS_KEPT`]):
    /// a load of many parts faults in its buffers once, not once per part.
    read_buffers: Mutex<Vec<AlignedBuf>>,
    /// Saves in progress: the drain pauses between chunks while any runs, so it never slows
    /// the training loop's blocking save.
    saving: std::sync::atomic::AtomicUsize,
    save_done: Notify,
    /// Steps being saved now: a second save of one of them is refused.
    saving_steps: Mutex<BTreeSet<u64>>,
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

/// The `tracing` target of the event logged when a copy is quarantined (level error), so that a
/// program that reports quarantines itself (the CLI does, from
/// [`CheckpointStore::quarantined_since_open`]) can turn this one event off.
pub const QUARANTINE_LOG_TARGET: &str = "ringtier_migrate::quarantine";

/// Name of the marker that sets a step's copy aside (quarantine), next to its manifest.
pub const QUARANTINE_FILE: &str = "QUARANTINE.json";

/// Read buffers a store keeps between restores: as many as a restore has in flight by default
/// (8 of 4 MiB, 32 MiB), released when the store closes.
const READ_BUFFERS_KEPT: usize = 8;

/// How long `open` retries a lock held by a store that is just shutting down.
const LOCK_GRACE: Duration = Duration::from_secs(2);

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// A committed, partial or quarantined checkpoint found on a tier.
#[derive(Debug, Default, Clone)]
struct Found {
    manifest: bool,
    /// A quarantine marker: the copy is set aside (whatever else is there).
    quarantined: bool,
    keys: Vec<String>,
    bytes: u64,
    /// Part name -> size, as listed.
    parts: BTreeMap<String, u64>,
}

impl Found {
    /// Committed and not quarantined.
    fn committed(&self) -> bool {
        self.manifest && !self.quarantined
    }
}

/// Digits of a step's directory name: steps are written as `{step:020}`, and only such names
/// are steps (a directory `99` someone made under the prefix is not one).
const STEP_DIGITS: usize = 20;

/// The step a directory name stands for, if it is one.
fn parse_step_dir(name: &str) -> Option<u64> {
    if name.len() != STEP_DIGITS || !name.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    name.parse().ok()
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

impl Inner {
    pub(super) fn dir(&self, step: u64) -> String {
        format!("{}/{step:020}", self.cfg.prefix)
    }

    pub(super) fn part_key(&self, step: u64, name: &str) -> String {
        format!("{}/parts/{name}", self.dir(step))
    }

    pub(super) fn manifest_key(&self, step: u64) -> String {
        format!("{}/MANIFEST.json", self.dir(step))
    }

    pub(super) fn quarantine_key(&self, step: u64) -> String {
        format!("{}/{QUARANTINE_FILE}", self.dir(step))
    }

    /// Every checkpoint directory on tier `t`.
    pub(super) async fn scan(&self, t: usize) -> Result<BTreeMap<u64, Found>> {
        let prefix = format!("{}/", self.cfg.prefix);
        let mut out: BTreeMap<u64, Found> = BTreeMap::new();
        for meta in self.tiers[t].list(&prefix).await? {
            let rest = &meta.key[prefix.len()..];
            let Some((step, tail)) = rest.split_once('/') else { continue };
            let Some(step) = parse_step_dir(step) else { continue };
            let f = out.entry(step).or_default();
            if tail == "MANIFEST.json" {
                f.manifest = true;
            } else if tail == QUARANTINE_FILE {
                f.quarantined = true;
            } else {
                f.bytes += meta.size;
                if let Some(name) = tail.strip_prefix("parts/") {
                    f.parts.insert(name.to_string(), meta.size);
                }
            }
            f.keys.push(meta.key);
        }
        Ok(out)
    }

    /// Whether `step` is committed on tier `t`: one stat of its manifest, not a listing (the
    /// save path asks every tier, and a slow tier may hold thousands of checkpoints).
    pub(super) async fn is_committed(&self, t: usize, step: u64) -> Result<bool> {
        match self.tiers[t].stat(&self.manifest_key(step)).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub(super) async fn committed(&self, t: usize) -> Result<BTreeSet<u64>> {
        Ok(self.scan(t).await?.into_iter().filter(|(_, f)| f.committed()).map(|(s, _)| s).collect())
    }

    pub(super) fn update_gauges(&self, st: &State) {
        self.m.pending.set(st.pending.len() as f64);
        self.m.backlog.set(st.pending.values().map(|(_, b)| *b as f64).sum::<f64>());
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
            read_buffers: Mutex::default(),
            saving: std::sync::atomic::AtomicUsize::new(0),
            save_done: Notify::new(),
            saving_steps: Mutex::default(),
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
        // The save's chunk buffers (two per part written at once), allocated (and touched) now
        // so that the first save does not pay the page faults.
        let (chunk, align) = inner.chunk_layout(0);
        for _ in 0..2 * inner.cfg.save_parallelism.max(1) {
            inner.give_buffer(AlignedBuf::new(chunk + align, align)?);
        }
        tokio::spawn(drain_loop(Arc::downgrade(inner), rx, concurrency));
        store.recover().await?;
        Ok(store)
    }

    /// Recovery at open: partial checkpoints (no manifest) are removed; every manifest is read
    /// and checked (its own checksum, its parts present at their sizes); a bad copy with an
    /// intact copy elsewhere is removed (and, where the intact copy is slower, replaced from
    /// it in the background); a step with no intact copy is quarantined. Then committed steps
    /// not yet on the next tier are queued for the drain, and the eviction policy applied.
    async fn recover(&self) -> Result<()> {
        let inner = &self.inner;
        let n = inner.tiers.len();
        let mut scans = Vec::with_capacity(n);
        for t in 0..n {
            let mut found = inner.scan(t).await?;
            let partial: Vec<u64> =
                found.iter().filter(|(_, f)| !f.manifest && !f.quarantined).map(|(s, _)| *s).collect();
            for step in partial {
                tracing::info!(step, tier = inner.tiers[t].name(), "removing a partial checkpoint (no manifest)");
                inner.remove(t, step).await?;
                found.remove(&step);
            }
            scans.push(found);
        }
        inner.heal(&mut scans).await?;
        for t in 0..n.saturating_sub(1) {
            for (step, f) in scans[t].iter().filter(|(_, f)| f.committed()) {
                let below = |s: usize| scans[s].get(step).is_some_and(|f| f.committed());
                if !(t + 1..n).any(below) {
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
}
