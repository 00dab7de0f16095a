//! [`CachedTier`]: the cache's API (constructors for one reader, a rank, a node and a node
//! directory shared across processes; epochs; statistics) and its state. The rest is in
//! submodules:
//!
//! * `io`: the levels' stores, reads served from them, misses admitted, copies written and
//!   dropped;
//! * `layer`: the cache as a [`Tier`] layer over its backing tier;
//! * `prefetch`: the clairvoyant prefetcher;
//! * `shared_io`: reads and prefetches over a node directory shared by processes.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};

use async_trait::async_trait;
use ringtier_core::buf::AlignedBuf;
use ringtier_core::catalog;
use ringtier_core::error::{Error, ErrorKind, Operation, Result};
use ringtier_core::{ObjectWriter, PosixConfig, PosixTier, ReadBatch, Tier};
use tokio::sync::{Notify, Semaphore};

use super::state::{Admission, Lookup, State, Victim};
use super::stats::{CacheStats, LevelStats};
use super::{CacheConfig, CacheLevel, CacheMedium, CachePolicy};
use ringtier_dataset::Dataset;
use ringtier_dataset::Sampler;

mod io;
mod layer;
mod prefetch;
mod shared_io;

use io::{copy_out, open_dir, DemandGuard, Store};
use prefetch::prefetcher;

/// Object names: ids are dataset indices first, then keys seen on reads.
#[derive(Default)]
struct Keys {
    ids: HashMap<String, u32>,
    names: Vec<String>,
    sizes: Vec<u64>,
}

const UNKNOWN: u64 = u64::MAX;

struct Metrics {
    hits: Vec<[metrics::Counter; 2]>,
    misses: metrics::Counter,
    bytes: Vec<metrics::Gauge>,
    evictions: metrics::Counter,
    prefetched: metrics::Counter,
    unused: metrics::Counter,
    lead: metrics::Histogram,
}

struct Inner {
    backing: Arc<dyn Tier>,
    cfg: CacheConfig,
    stores: Vec<Store>,
    state: Mutex<State>,
    keys: RwLock<Keys>,
    /// The order of each rank sharing the cache (one for a rank's cache, every local rank's
    /// for a node cache), for the clairvoyant policy.
    samplers: Vec<Sampler>,
    /// The epoch each of those ranks is in (`None` before its first).
    epochs: Mutex<Vec<Option<u64>>>,
    /// Reads of readers in flight at the slow tier (the prefetcher uses what they leave of
    /// `prefetch_depth`).
    demand: AtomicUsize,
    notify: Arc<Notify>,
    prefetcher: Mutex<Option<tokio::task::JoinHandle<()>>>,
    metrics: Metrics,
    /// What the metrics have been told so far (the state's counters are the truth).
    reported: Mutex<super::state::Counters>,
    /// A node directory shared with other processes ([`CachedTier::for_node_dir`]): reads go
    /// by its plan, and `stores` and the placement state are unused.
    shared: Option<super::node_dir::Shared>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self.prefetcher.get_mut().ok().and_then(|t| t.take()) {
            task.abort();
        }
        if let Some(sh) = self.shared.as_ref().filter(|s| s.local == 0) {
            sh.dir.remove();
        }
        for s in &self.stores {
            if let Store::Dir { root, .. } = s {
                if let Err(e) = std::fs::remove_dir_all(root) {
                    tracing::warn!("removing the cache directory {}: {e}", root.display());
                }
            }
        }
    }
}

/// A read-through cache in front of a slow tier (see the [module docs](super)). Cheap to
/// clone (one shared cache).
#[derive(Clone)]
pub struct CachedTier {
    inner: Arc<Inner>,
}

impl fmt::Debug for CachedTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedTier").field("backing", &self.inner.backing).field("config", &self.inner.cfg).finish()
    }
}

static INSTANCE: AtomicU64 = AtomicU64::new(0);

impl CachedTier {
    /// A cache over `backing` for any reader (LRU, static or none; the clairvoyant policy needs
    /// the reader's future: [`CachedTier::for_dataset`]). Directory levels are checked now: one
    /// that cannot be created or written is a clear error.
    pub fn new(backing: Arc<dyn Tier>, cfg: CacheConfig) -> Result<Self> {
        if cfg.policy == CachePolicy::Clairvoyant {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "the clairvoyant cache needs the reader's future order: build it with CachedTier::for_dataset \
                 (or LoaderConfig::with_cache)",
            ));
        }
        Self::build(backing, cfg, Keys::default(), Vec::new(), None)
    }

    /// A cache over `dataset`'s tier for the rank `sampler` reads for: it knows every sample's
    /// size, and the clairvoyant policy computes this rank's future from the sampler (the
    /// shared seed), with no coordination with other ranks. Call [`CachedTier::begin_epoch`]
    /// when an epoch starts (the loader does).
    pub fn for_dataset(dataset: &Dataset, sampler: Sampler, cfg: CacheConfig) -> Result<Self> {
        Self::for_node(dataset, vec![sampler], cfg)
    }

    /// One cache over `dataset`'s tier for the ranks of a node (NoPFS's node-local cache): one
    /// copy of a sample per node, whichever rank reads it. `samplers` are the node's ranks'
    /// (the same dataset, seed and world; each rank's loader reads through this cache). The
    /// clairvoyant policy computes the future of all of them from the seed and places by
    /// Belady on their union. Each rank calls [`CachedTier::begin_rank_epoch`] with its index
    /// in `samplers` when it starts an epoch.
    pub fn for_node(dataset: &Dataset, samplers: Vec<Sampler>, cfg: CacheConfig) -> Result<Self> {
        if samplers.is_empty() {
            return Err(Error::new(ErrorKind::InvalidInput, "a node cache needs the sampler of at least one rank"));
        }
        let mut keys = Keys::default();
        for (i, s) in dataset.iter().enumerate() {
            keys.ids.entry(s.key.to_string()).or_insert(i as u32);
            keys.names.push(s.key.to_string());
            keys.sizes.push(s.size);
        }
        Self::build(Arc::clone(dataset.tier()), cfg, keys, samplers, None)
    }

    /// Rank `local`'s share of a node cache in a directory that the node's ranks share across
    /// processes (as `torchrun` starts them): one copy of a sample per node. `samplers` are
    /// every rank of the node's (the same dataset, seed and world, in local-rank order; each
    /// process passes all of them and its own index), and `cfg.levels` is one directory level
    /// whose path every rank gives the same (a directory on tmpfs, such as `/dev/shm/...`, is
    /// memory). Every rank computes the same placement plan from the seed (the policy's: LRU
    /// or Belady on the union of the node's reads, or the first copies read for static), so
    /// placement needs no messages; the directory protocol keeps one copy per run, verifies
    /// every copy it reads and never holds more than the capacity in copies. Local rank 0
    /// removes the directory when its cache is dropped. See `docs/CACHE.md`.
    pub fn for_node_dir(dataset: &Dataset, samplers: Vec<Sampler>, local: usize, cfg: CacheConfig) -> Result<Self> {
        cfg.validate()?;
        let dir =
            match cfg.levels.as_slice() {
                [CacheLevel { medium: CacheMedium::Dir(d), .. }] => d.clone(),
                _ if cfg.policy == CachePolicy::None => std::env::temp_dir(),
                _ => return Err(Error::new(
                    ErrorKind::InvalidInput,
                    "a node cache shared across processes needs exactly one directory level (its path is shared by \
                     the node's ranks)",
                )),
            };
        let mut keys = Keys::default();
        for (i, s) in dataset.iter().enumerate() {
            keys.ids.entry(s.key.to_string()).or_insert(i as u32);
            keys.names.push(s.key.to_string());
            keys.sizes.push(s.size);
        }
        let shared = if cfg.policy == CachePolicy::None {
            None
        } else {
            Some(super::node_dir::Shared::open(
                &dir,
                cfg.policy,
                samplers.clone(),
                local,
                &keys.sizes,
                cfg.capacity_bytes(),
                super::node_dir::Horizon { lookahead: cfg.lookahead_epochs, total: cfg.total_epochs },
            )?)
        };
        Self::build(Arc::clone(dataset.tier()), cfg, keys, samplers, shared)
    }

    /// For a node cache shared across processes ([`CachedTier::for_node_dir`]): bytes of copies
    /// in its directory now and bytes of temporary files being written (a scan of the
    /// directory). `None` for other caches.
    pub fn node_dir_usage(&self) -> Option<(u64, u64)> {
        self.inner.shared.as_ref().map(|s| s.dir.usage())
    }

    /// For a node cache shared across processes ([`CachedTier::for_node_dir`]): this process's
    /// totals of the directory protocol and the plan of its current epoch. `None` for other
    /// caches.
    pub fn node_dir_stats(&self) -> Option<NodeDirStats> {
        let sh = self.inner.shared.as_ref()?;
        let cur = sh.current();
        let c = &sh.counters;
        Some(NodeDirStats {
            slots: sh.slots,
            copies_placed: c.placed.load(Ordering::Relaxed),
            copies_skipped: c.skipped.load(Ordering::Relaxed),
            copies_dropped: c.dropped.load(Ordering::Relaxed),
            bad_files: c.bad.load(Ordering::Relaxed),
            epoch: cur.as_ref().map(|c| c.epoch),
            planned_starts: cur.as_ref().map_or(0, |c| c.plan.starts() as u64),
            planned_hits: cur.as_ref().map_or(0, |c| c.plan.planned_hits() as u64),
        })
    }

    /// For a node cache shared across processes: its directory (a subdirectory of the
    /// configured one, named by the plan).
    pub fn node_dir(&self) -> Option<&std::path::Path> {
        self.inner.shared.as_ref().map(|s| s.dir.root())
    }

    fn build(
        backing: Arc<dyn Tier>,
        cfg: CacheConfig,
        keys: Keys,
        samplers: Vec<Sampler>,
        shared: Option<super::node_dir::Shared>,
    ) -> Result<Self> {
        if shared.is_none() {
            cfg.validate()?;
        }
        let levels = if cfg.policy == CachePolicy::None { Vec::new() } else { cfg.levels.clone() };
        let store_levels = if shared.is_some() { &[][..] } else { &levels[..] };
        let mut stores = Vec::with_capacity(levels.len());
        for level in store_levels {
            stores.push(match &level.medium {
                CacheMedium::Memory => Store::Memory,
                CacheMedium::Dir(dir) => open_dir(dir)?,
            });
        }
        let names: Vec<&'static str> = levels.iter().map(|l| l.name()).collect();
        let metrics = Metrics {
            hits: names
                .iter()
                .map(|&n| {
                    [
                        metrics::counter!(catalog::CACHE_HITS_TOTAL, "tier" => n, "kind" => "reuse"),
                        metrics::counter!(catalog::CACHE_HITS_TOTAL, "tier" => n, "kind" => "prefetch"),
                    ]
                })
                .collect(),
            misses: metrics::counter!(catalog::CACHE_MISSES_TOTAL, "policy" => cfg.policy.as_str()),
            bytes: names.iter().map(|&n| metrics::gauge!(catalog::CACHE_BYTES, "tier" => n)).collect(),
            evictions: metrics::counter!(catalog::CACHE_EVICTIONS_TOTAL, "policy" => cfg.policy.as_str()),
            prefetched: metrics::counter!(catalog::CACHE_PREFETCHED_BYTES_TOTAL),
            unused: metrics::counter!(catalog::CACHE_PREFETCH_UNUSED_BYTES_TOTAL),
            lead: metrics::histogram!(catalog::CACHE_PREFETCH_LEAD_SECONDS),
        };
        // With a shared directory, the state only counts (its one level is never admitted to).
        let caps: Vec<u64> = levels.iter().map(|l| l.capacity_bytes).collect();
        let state = State::new(cfg.policy, caps, cfg.prefetch_budget());
        let reported = Mutex::new(state.counters.clone());
        Ok(CachedTier {
            inner: Arc::new(Inner {
                backing,
                cfg,
                stores,
                state: Mutex::new(state),
                keys: RwLock::new(keys),
                epochs: Mutex::new(vec![None; samplers.len()]),
                samplers,
                demand: AtomicUsize::new(0),
                notify: Arc::new(Notify::new()),
                prefetcher: Mutex::new(None),
                metrics,
                reported,
                shared,
            }),
        })
    }

    /// The slow tier behind the cache.
    pub fn backing(&self) -> &Arc<dyn Tier> {
        &self.inner.backing
    }

    /// The settings.
    pub fn config(&self) -> &CacheConfig {
        &self.inner.cfg
    }

    /// Tells the cache that the reader starts `epoch` at `position` (a cache with one sampler:
    /// [`CachedTier::for_dataset`]); see [`CachedTier::begin_rank_epoch`].
    pub fn begin_epoch(&self, epoch: u64, position: usize) -> Result<()> {
        self.begin_rank_epoch(0, epoch, position)
    }

    /// Tells the cache that rank `local` (its index among the samplers the cache was made
    /// with) starts `epoch` at `position`: the clairvoyant policy moves its window to the
    /// epochs from the earliest any sharing rank is in to `lookahead_epochs` past the latest,
    /// renews every copy's next read, and (re)starts prefetching. Must be called inside a
    /// tokio runtime. Without samplers (a cache from [`CachedTier::new`]) it does nothing.
    pub fn begin_rank_epoch(&self, local: usize, epoch: u64, position: usize) -> Result<()> {
        let inner = &self.inner;
        if let Some(sh) = &inner.shared {
            return self.begin_shared_epoch(sh, local, epoch, position);
        }
        if inner.samplers.is_empty() || inner.cfg.policy != CachePolicy::Clairvoyant {
            return Ok(());
        }
        let Some(sampler) = inner.samplers.get(local) else {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("rank index {local} is not one of the cache's {} ranks", inner.samplers.len()),
            ));
        };
        let rt = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::new(
                ErrorKind::InvalidInput,
                "the clairvoyant cache prefetches in the background: start epochs inside a tokio runtime",
            )
        })?;
        let all = sampler.epoch(epoch);
        if position > all.len() {
            sampler.epoch_from(epoch, position)?; // the sampler's own out-of-range error
        }
        let skipped = all[..position.min(all.len())].to_vec();
        let (first, count) = {
            let mut epochs = inner.epochs.lock().unwrap_or_else(|p| p.into_inner());
            epochs[local] = Some(epoch);
            let begun = epochs.iter().flatten();
            let first = begun.clone().copied().min().unwrap_or(epoch);
            let last = begun.copied().max().unwrap_or(epoch);
            (first, (last - first + inner.cfg.lookahead_epochs.max(1)) as usize)
        };
        let ids = inner.keys.read().unwrap_or_else(|p| p.into_inner()).sizes.len();
        let moved = inner.lock().window.range() != (first, count);
        if moved {
            // Computed without the lock (a shuffle of the dataset per rank and epoch).
            let orders: Vec<Vec<Vec<u32>>> =
                (first..first + count as u64).map(|e| inner.samplers.iter().map(|s| s.epoch(e)).collect()).collect();
            let victims = {
                let mut st = inner.lock();
                let v = st.set_window(first, orders, ids);
                st.window.mark_read(epoch, &skipped);
                v
            };
            inner.drop_files(victims);
        } else if !skipped.is_empty() {
            inner.lock().window.mark_read(epoch, &skipped);
        }
        inner.report();
        let mut task = inner.prefetcher.lock().unwrap_or_else(|p| p.into_inner());
        if task.as_ref().is_none_or(|t| t.is_finished()) {
            *task = Some(rt.spawn(prefetcher(Arc::downgrade(inner), Arc::clone(&inner.notify))));
        }
        drop(task);
        inner.notify.notify_waiters();
        Ok(())
    }

    fn begin_shared_epoch(
        &self,
        sh: &super::node_dir::Shared,
        local: usize,
        epoch: u64,
        position: usize,
    ) -> Result<()> {
        let inner = &self.inner;
        if local != sh.local && inner.samplers.len() > 1 {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("this process is local rank {} of the node cache, not {local}", sh.local),
            ));
        }
        if position > inner.samplers[sh.local].len() {
            inner.samplers[sh.local].epoch_from(epoch, position)?;
        }
        sh.begin_epoch(epoch, position);
        if sh.policy == CachePolicy::Clairvoyant {
            let rt = tokio::runtime::Handle::try_current().map_err(|_| {
                Error::new(
                    ErrorKind::InvalidInput,
                    "the clairvoyant cache prefetches in the background: start epochs inside a tokio runtime",
                )
            })?;
            let mut task = inner.prefetcher.lock().unwrap_or_else(|p| p.into_inner());
            if task.as_ref().is_none_or(|t| t.is_finished()) {
                *task = Some(rt.spawn(shared_io::shared_prefetcher(Arc::downgrade(inner), Arc::clone(&inner.notify))));
            }
        }
        inner.notify.notify_waiters();
        Ok(())
    }

    /// Totals since the cache was made.
    pub fn stats(&self) -> CacheStats {
        let st = self.inner.lock();
        let c = &st.counters;
        CacheStats {
            policy: self.inner.cfg.policy,
            levels: self
                .inner
                .cfg
                .levels
                .iter()
                .take(st.caps.len())
                .enumerate()
                .map(|(i, l)| LevelStats {
                    name: l.name(),
                    capacity_bytes: l.capacity_bytes,
                    used_bytes: st.used[i],
                    ready_bytes: st.ready_bytes(i),
                    reuse_hits: c.hits[i],
                    prefetch_hits: c.prefetch_hits[i],
                })
                .collect(),
            misses: c.misses,
            late_prefetches: c.late,
            hit_bytes: c.hit_bytes,
            miss_bytes: c.miss_bytes,
            fetched_bytes: c.fetched_bytes,
            prefetched: c.prefetched,
            prefetched_bytes: c.prefetched_bytes,
            unused_evicted: c.unused_evicted,
            unused_evicted_bytes: c.unused_evicted_bytes,
            evictions: c.evictions,
            prefetch_lead_seconds: c.lead_seconds_sum,
        }
    }

    /// Waits until no prefetch is in flight and none can start (the budget is full or the
    /// future is all fetched), or `timeout` passes. For tests and benchmarks that want a warm
    /// cache before they measure.
    pub async fn settle(&self, timeout: std::time::Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.inner.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.inner.lock().inflight.is_empty() {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return;
            }
        }
    }
}

/// One process's view of a node cache shared across processes
/// ([`CachedTier::node_dir_stats`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeDirStats {
    /// Copies the directory holds at most (capacity over the largest sample).
    pub slots: usize,
    /// Copies this process wrote into their slot.
    pub copies_placed: u64,
    /// Copies this process did not place: the slot held the run already (another rank wrote
    /// it) or a newer one, or the write failed.
    pub copies_skipped: u64,
    /// Copies this process dropped at the end of their run.
    pub copies_dropped: u64,
    /// Files found where a copy was expected that were not a valid copy (a link, a torn or
    /// foreign file): read as misses.
    pub bad_files: u64,
    /// The epoch this rank is in.
    pub epoch: Option<u64>,
    /// Runs the plan starts in that epoch, every rank of the node together.
    pub planned_starts: u64,
    /// Reads the plan serves from a copy in that epoch, every rank together.
    pub planned_hits: u64,
}

/// The cache's own state: the placement state's lock, object ids and sizes, metrics.
impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The id of `key`, assigned on first sight; and its size when known.
    fn id_of(&self, key: &str) -> (u32, u64) {
        if let Some(&id) = self.keys.read().unwrap_or_else(|p| p.into_inner()).ids.get(key) {
            let size = self.keys.read().unwrap_or_else(|p| p.into_inner()).sizes[id as usize];
            return (id, size);
        }
        let mut keys = self.keys.write().unwrap_or_else(|p| p.into_inner());
        let next = keys.sizes.len() as u32;
        let id = *keys.ids.entry(key.to_string()).or_insert(next);
        if id == next {
            keys.sizes.push(UNKNOWN);
            keys.names.push(key.to_string());
        }
        (id, keys.sizes[id as usize])
    }

    fn learn_size(&self, id: u32, size: u64) {
        let mut keys = self.keys.write().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = keys.sizes.get_mut(id as usize) {
            *s = size;
        }
    }

    /// Brings the metrics up to the state's counters.
    fn report(&self) {
        // The reported totals' lock first: two reports never go backwards.
        let mut rep = self.reported.lock().unwrap_or_else(|p| p.into_inner());
        let (now, used) = {
            let st = self.lock();
            (st.counters.clone(), st.used.clone())
        };
        let m = &self.metrics;
        for (l, h) in m.hits.iter().enumerate() {
            h[0].increment(now.hits[l].saturating_sub(rep.hits[l]));
            h[1].increment(now.prefetch_hits[l].saturating_sub(rep.prefetch_hits[l]));
        }
        m.misses.increment(now.misses.saturating_sub(rep.misses));
        m.evictions.increment(now.evictions.saturating_sub(rep.evictions));
        m.prefetched.increment(now.prefetched_bytes.saturating_sub(rep.prefetched_bytes));
        m.unused.increment(now.unused_evicted_bytes.saturating_sub(rep.unused_evicted_bytes));
        if now.lead_count > rep.lead_count {
            let n = now.lead_count - rep.lead_count;
            m.lead.record((now.lead_seconds_sum - rep.lead_seconds_sum) / n as f64);
        }
        for (g, u) in m.bytes.iter().zip(used) {
            g.set(u as f64);
        }
        *rep = now;
    }
}
