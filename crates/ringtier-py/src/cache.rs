//! `ringtier.Cache`: the settings of the loader's read-through cache in front of a dataset
//! (`ringtier_cache::CacheConfig`, docs/CACHE.md), checked when they are made, and the cache's
//! totals as a dict (`Loader.cache_stats()`).

use std::path::{Path, PathBuf};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::sync::Arc;

use ringtier_cache::{CacheConfig, CacheLevel, CacheMedium, CachePolicy, CacheStats, CachedTier};
use ringtier_core::Tier;
use ringtier_dataset::manifest::{Manifest, ManifestEntry};
use ringtier_dataset::{Dataset, Sampler};
use ringtier_loader::records::Shard;

use crate::errors::{self, IntoPy};

/// The `medium` that means process memory.
const MEMORY: &str = "memory";

/// One level as Python gives it: `"memory"` or a directory.
fn level(medium: &Path, capacity: u64) -> CacheLevel {
    if medium == Path::new(MEMORY) {
        CacheLevel::memory(capacity)
    } else {
        CacheLevel::dir(medium, capacity)
    }
}

/// The settings of a loader's cache (see the stub for the Python documentation).
#[pyclass(module = "ringtier._ringtier", name = "Cache", frozen)]
#[derive(Debug, Clone)]
pub(crate) struct Cache {
    pub(crate) cfg: CacheConfig,
}

#[pymethods]
impl Cache {
    #[new]
    #[pyo3(signature = (capacity=None, *, policy=None, medium=PathBuf::from(MEMORY), levels=None,
        lookahead_epochs=3, prefetch_bytes=None, prefetch_depth=128, range_bytes=8 << 20, node_dir=None,
        local_ranks=None, total_epochs=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        capacity: Option<u64>,
        policy: Option<&str>,
        medium: PathBuf,
        levels: Option<Vec<(PathBuf, u64)>>,
        lookahead_epochs: u64,
        prefetch_bytes: Option<u64>,
        prefetch_depth: usize,
        range_bytes: usize,
        node_dir: Option<PathBuf>,
        local_ranks: Option<usize>,
        total_epochs: Option<u64>,
    ) -> PyResult<Self> {
        // A node cache shared by the node's ranks (processes): its directory is the one level.
        let medium = match (&node_dir, local_ranks) {
            (Some(d), Some(_)) => d.clone(),
            (Some(_), None) | (None, Some(_)) => {
                return Err(errors::invalid(
                    "a node cache shared across processes needs both node_dir (the same directory on every rank \
                     of the node; on tmpfs it is memory) and local_ranks (ranks per node)"
                        .into(),
                ))
            }
            (None, None) => medium,
        };
        // The Rust default policy (static) when none is given.
        let policy: CachePolicy = match policy {
            Some(p) => p.parse().py_err()?,
            None => CacheConfig::default().policy,
        };
        let levels = match (capacity, levels) {
            (Some(_), Some(_)) => {
                return Err(errors::invalid("give the cache either capacity (with medium) or levels, not both".into()))
            }
            (Some(c), None) => vec![level(&medium, c)],
            (None, Some(ls)) => ls.iter().map(|(m, c)| level(m, *c)).collect(),
            (None, None) if policy == CachePolicy::None => Vec::new(),
            (None, None) => {
                return Err(errors::invalid(format!(
                    "a {policy} cache needs a capacity in bytes (Cache(capacity, policy=...)) or levels \
                     ([(\"memory\", BYTES), (DIR, BYTES)])"
                )))
            }
        };
        let cfg = CacheConfig::new(policy, levels)
            .with_lookahead_epochs(lookahead_epochs)
            .with_prefetch_bytes(prefetch_bytes)
            .with_prefetch_depth(prefetch_depth)
            .with_range_bytes(range_bytes)
            .with_local_ranks(local_ranks)
            .with_total_epochs(total_epochs);
        cfg.validate().py_err()?;
        Ok(Cache { cfg })
    }

    /// `none`, `lru`, `static` or `clairvoyant`.
    #[getter]
    fn policy(&self) -> &'static str {
        self.cfg.policy.as_str()
    }

    /// The levels, fastest first: `("memory", bytes)` or `(directory, bytes)`.
    #[getter]
    fn levels(&self) -> Vec<(String, u64)> {
        self.cfg
            .levels
            .iter()
            .map(|l| match &l.medium {
                CacheMedium::Memory => (MEMORY.to_string(), l.capacity_bytes),
                CacheMedium::Dir(d) => (d.display().to_string(), l.capacity_bytes),
            })
            .collect()
    }

    /// Bytes of every level together.
    #[getter]
    fn capacity_bytes(&self) -> u64 {
        self.cfg.capacity_bytes()
    }

    /// Epochs the clairvoyant placement looks ahead.
    #[getter]
    fn lookahead_epochs(&self) -> u64 {
        self.cfg.lookahead_epochs
    }

    /// The job's number of epochs, if given (a node cache's plan then looks over the whole job).
    #[getter]
    fn total_epochs(&self) -> Option<u64> {
        self.cfg.total_epochs
    }

    /// Bytes of the first level the clairvoyant prefetcher may fill.
    #[getter]
    fn prefetch_bytes(&self) -> u64 {
        self.cfg.prefetch_budget()
    }

    /// Ranks per node sharing the node directory across processes, or None.
    #[getter]
    fn local_ranks(&self) -> Option<usize> {
        self.cfg.local_ranks
    }

    /// Samples the clairvoyant prefetcher reads at once.
    #[getter]
    fn prefetch_depth(&self) -> usize {
        self.cfg.prefetch_depth
    }

    fn __repr__(&self) -> String {
        let levels: Vec<String> = self.levels().iter().map(|(m, c)| format!("({m:?}, {c})")).collect();
        format!("ringtier.Cache(policy={:?}, levels=[{}])", self.policy(), levels.join(", "))
    }
}

/// The cache settings of a `cache=` argument: a `ringtier.Cache`, or a dict of its arguments.
pub(crate) fn cache_config(obj: &Bound<'_, PyAny>) -> PyResult<CacheConfig> {
    if let Ok(c) = obj.cast::<Cache>() {
        return Ok(c.get().cfg.clone());
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let made = obj.py().get_type::<Cache>().call((), Some(d))?;
        return Ok(made.cast::<Cache>()?.get().cfg.clone());
    }
    Err(errors::type_error(format!(
        "cache must be a ringtier.Cache or a dict of its arguments, not {}",
        obj.get_type().name()?
    )))
}

/// A cache's totals as a dict: policy, hits, reuse_hits, misses, late_prefetches, hit_bytes,
/// miss_bytes, prefetched, prefetched_bytes, unused_evicted, evictions, hit_ratio, levels.
pub(crate) fn stats_dict<'py>(py: Python<'py>, s: &CacheStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("policy", s.policy.as_str())?;
    d.set_item("hits", s.hits())?;
    d.set_item("reuse_hits", s.reuse_hits())?;
    d.set_item("misses", s.misses)?;
    d.set_item("late_prefetches", s.late_prefetches)?;
    d.set_item("hit_bytes", s.hit_bytes)?;
    d.set_item("miss_bytes", s.miss_bytes)?;
    d.set_item("prefetched", s.prefetched)?;
    d.set_item("prefetched_bytes", s.prefetched_bytes)?;
    d.set_item("unused_evicted", s.unused_evicted)?;
    d.set_item("evictions", s.evictions)?;
    d.set_item("hit_ratio", s.hit_ratio())?;
    let levels = PyList::empty(py);
    for l in &s.levels {
        let ld = PyDict::new(py);
        ld.set_item("name", l.name)?;
        ld.set_item("capacity_bytes", l.capacity_bytes)?;
        ld.set_item("used_bytes", l.used_bytes)?;
        ld.set_item("ready_bytes", l.ready_bytes)?;
        ld.set_item("reuse_hits", l.reuse_hits)?;
        ld.set_item("prefetch_hits", l.prefetch_hits)?;
        levels.append(ld)?;
    }
    d.set_item("levels", levels)?;
    Ok(d)
}

/// The cache in front of a record loader's shards (`RecordLoader(cache=...)`): one object per
/// shard, admitted whole (fetched in the background in `range_bytes` pieces after a miss).
/// `reader`/`readers`, `seed` and `shuffle_shards` are the record loader's: the clairvoyant
/// policy computes this reader's future shard order from them, as the loader does. In a global
/// order every reader reads from every shard each epoch, where Belady keeps what static keeps:
/// the clairvoyant policy is refused there, with that advice.
#[allow(clippy::too_many_arguments)]
pub(crate) fn record_cache(
    tier: Arc<dyn Tier>,
    shards: &[Shard],
    cfg: CacheConfig,
    global: bool,
    seed: u64,
    reader: usize,
    readers: usize,
    shuffle_shards: bool,
) -> PyResult<CachedTier> {
    if global && cfg.policy == CachePolicy::Clairvoyant {
        return Err(errors::invalid(
            "the clairvoyant cache plans by shard order; in order=\"global\" every reader reads from every shard each \
             epoch, where it keeps what policy=\"static\" keeps: use static (or order=\"stream\")"
                .into(),
        ));
    }
    if cfg.local_ranks.is_some() {
        // A node cache plans one copy per sample across the node's processes from the file
        // datasets' sampler; a record reader's cache holds whole shards in its own process.
        return Err(errors::invalid(
            "a node cache shared across processes (node_dir=, local_ranks=) is for the file datasets \
             (IterableDataset, ImageFolder, Loader); a record dataset caches whole shards per process: \
             give its Cache no node_dir"
                .into(),
        ));
    }
    // The shards as a dataset (key and size; the cache reads no checksum).
    let entries = shards.iter().map(|s| ManifestEntry { key: s.key.clone(), size: s.size, crc32c: 0 }).collect();
    let dataset = Dataset::from_manifest(tier, &Manifest { entries });
    let sampler = Sampler::new(shards.len(), seed, reader, readers, shuffle_shards).py_err()?;
    CachedTier::for_dataset(&dataset, sampler, cfg).py_err()
}
