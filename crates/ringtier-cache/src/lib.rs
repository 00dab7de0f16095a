#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod node_dir;
mod state;
mod stats;
mod tier;
mod window;

use std::path::PathBuf;

use ringtier_core::error::{Error, ErrorKind, Result};

pub use stats::CacheStats;
pub use tier::{CachedTier, NodeDirStats};

/// Which objects a [`CachedTier`] keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CachePolicy {
    /// Keep nothing: every read goes to the slow tier (counted as a miss).
    None,
    /// Least recently used: admit every object read, evict the least recently read one to make
    /// room (from memory to the directory level when there is one, then out). With shuffled
    /// epochs a cache of a fraction c of the dataset hits about c²/2 of the reads.
    Lru,
    /// Filled once, never evicted (CoorDL's MinIO policy): the first objects read stay while
    /// there is room. One reader hits about c of its reads.
    Static,
    /// Belady's placement on the future reads of the ranks sharing the cache (from the seed):
    /// a copy is kept when it is read again before the copies it would displace (those read
    /// furthest ahead go), plus a prefetcher that fills free room in read order with the read
    /// budget the readers leave (NoPFS, Dryden et al., SC21). Optimal in slow-tier bytes for
    /// samples of one size. Wins over static only where the readers sharing the cache read a
    /// different part of the dataset each epoch (see the crate docs). Needs the readers'
    /// future: the loader's cache, or [`CachedTier::for_node`].
    Clairvoyant,
}

impl CachePolicy {
    /// Every policy, in the order benchmarks report them.
    pub const ALL: [CachePolicy; 4] =
        [CachePolicy::None, CachePolicy::Lru, CachePolicy::Static, CachePolicy::Clairvoyant];

    /// The policy's name: `none`, `lru`, `static`, `clairvoyant`.
    pub fn as_str(self) -> &'static str {
        match self {
            CachePolicy::None => "none",
            CachePolicy::Lru => "lru",
            CachePolicy::Static => "static",
            CachePolicy::Clairvoyant => "clairvoyant",
        }
    }
}

impl std::fmt::Display for CachePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for CachePolicy {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        CachePolicy::ALL.into_iter().find(|p| p.as_str() == s).ok_or_else(|| {
            Error::new(ErrorKind::InvalidInput, format!("unknown cache policy {s:?} (none, lru, static, clairvoyant)"))
        })
    }
}

/// Where one cache level keeps its copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheMedium {
    /// Process memory.
    Memory,
    /// Files under a local directory (created when missing; it must be writable). Its content
    /// is a cache: it is not reused across runs, and files this cache did not write are left
    /// alone.
    Dir(PathBuf),
}

/// One level of the cache: a medium and its capacity in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheLevel {
    /// Where the copies live.
    pub medium: CacheMedium,
    /// Bytes of objects the level may hold at once (never exceeded).
    pub capacity_bytes: u64,
}

impl CacheLevel {
    /// A level in process memory holding at most `capacity_bytes`.
    pub fn memory(capacity_bytes: u64) -> Self {
        CacheLevel { medium: CacheMedium::Memory, capacity_bytes }
    }

    /// A level of files under `dir` holding at most `capacity_bytes`.
    pub fn dir(dir: impl Into<PathBuf>, capacity_bytes: u64) -> Self {
        CacheLevel { medium: CacheMedium::Dir(dir.into()), capacity_bytes }
    }

    /// The level's name, used as the `tier` metric label: `ram` or `dir`.
    pub fn name(&self) -> &'static str {
        match self.medium {
            CacheMedium::Memory => "ram",
            CacheMedium::Dir(_) => "dir",
        }
    }
}

/// Settings of a [`CachedTier`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct CacheConfig {
    /// The policy. Default [`CachePolicy::Static`] (see the crate docs for when another wins).
    pub policy: CachePolicy,
    /// The levels, fastest first (at most one memory level, which must come first). Default:
    /// none; give at least one (except for [`CachePolicy::None`]).
    pub levels: Vec<CacheLevel>,
    /// Epochs of the rank's future the clairvoyant placement counts accesses over, from the
    /// current epoch on. Default 3.
    pub lookahead_epochs: u64,
    /// The job's number of epochs, when known (the loader's or trainer's `epochs`). A node
    /// cache shared across processes ([`CachedTier::for_node_dir`]) then plans its clairvoyant
    /// placement over the rest of the job (at most 64 epochs ahead) instead of
    /// `lookahead_epochs`, and keeps no copy for an epoch past the end; an epoch past it falls
    /// back to `lookahead_epochs`. Every rank must give the same value (it is part of the
    /// plan's identity). The planner's memory is 4 bytes per sample per epoch looked at.
    /// Default `None`: unknown, `lookahead_epochs` is the horizon.
    pub total_epochs: Option<u64>,
    /// Bytes of the first level the clairvoyant prefetcher may fill with samples that the
    /// placement would not keep (each is dropped once read); the placement gets the rest.
    /// `None` (the default): 0, the prefetcher only fills room the placement leaves free (a
    /// staged budget is room taken from reuse). Must be below the first level's capacity.
    pub prefetch_bytes: Option<u64>,
    /// The read budget of the clairvoyant prefetcher: objects in flight at the slow tier, the
    /// readers' reads through the cache counted first (the prefetcher uses what they leave; in
    /// batches of up to 16). Give it the readers' own depth (the loader's prefetch batches x
    /// batch size x ranks sharing the cache) so every policy has the same budget. Default 128.
    pub prefetch_depth: usize,
    /// Largest request when an object is fetched whole into the cache (larger objects are read
    /// in ranges of this size). Default 8 MiB.
    pub range_bytes: usize,
    /// The cache is a node cache shared across processes by this many consecutive ranks (the
    /// node's local ranks, as `torchrun --nproc-per-node` starts them): its one directory level
    /// is the node's directory ([`CachedTier::for_node_dir`]; the loader derives the node's
    /// samplers from its rank). Default `None`: the cache is this process's.
    pub local_ranks: Option<usize>,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            policy: CachePolicy::Static,
            levels: Vec::new(),
            lookahead_epochs: 3,
            total_epochs: None,
            prefetch_bytes: None,
            prefetch_depth: 128,
            range_bytes: 8 << 20,
            local_ranks: None,
        }
    }
}

impl CacheConfig {
    /// A cache with `policy` over `levels` (fastest first), other settings default.
    pub fn new(policy: CachePolicy, levels: Vec<CacheLevel>) -> Self {
        CacheConfig { policy, levels, ..Self::default() }
    }

    /// Sets [`CacheConfig::policy`].
    pub fn with_policy(mut self, policy: CachePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Sets [`CacheConfig::levels`].
    pub fn with_levels(mut self, levels: Vec<CacheLevel>) -> Self {
        self.levels = levels;
        self
    }

    /// Sets [`CacheConfig::lookahead_epochs`].
    pub fn with_lookahead_epochs(mut self, epochs: u64) -> Self {
        self.lookahead_epochs = epochs;
        self
    }

    /// Sets [`CacheConfig::total_epochs`] (the job's number of epochs, when known).
    pub fn with_total_epochs(mut self, epochs: Option<u64>) -> Self {
        self.total_epochs = epochs;
        self
    }

    /// Sets [`CacheConfig::prefetch_bytes`].
    pub fn with_prefetch_bytes(mut self, bytes: impl Into<Option<u64>>) -> Self {
        self.prefetch_bytes = bytes.into();
        self
    }

    /// Sets [`CacheConfig::prefetch_depth`].
    pub fn with_prefetch_depth(mut self, depth: usize) -> Self {
        self.prefetch_depth = depth;
        self
    }

    /// Sets [`CacheConfig::range_bytes`].
    pub fn with_range_bytes(mut self, bytes: usize) -> Self {
        self.range_bytes = bytes;
        self
    }

    /// Sets [`CacheConfig::local_ranks`].
    pub fn with_local_ranks(mut self, ranks: impl Into<Option<usize>>) -> Self {
        self.local_ranks = ranks.into();
        self
    }

    /// Bytes of all levels together.
    pub fn capacity_bytes(&self) -> u64 {
        self.levels.iter().map(|l| l.capacity_bytes).sum()
    }

    /// The clairvoyant prefetch budget in bytes of the first level (0 for other policies).
    pub fn prefetch_budget(&self) -> u64 {
        if self.policy != CachePolicy::Clairvoyant {
            return 0;
        }
        let first = self.levels.first().map_or(0, |l| l.capacity_bytes);
        self.prefetch_bytes.unwrap_or(0).min(first)
    }

    /// Checks the settings: a capacity of 0, a memory level after a directory, a budget that
    /// leaves the first level nothing, a depth or range of 0 are [`ErrorKind::InvalidInput`].
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::new(ErrorKind::InvalidInput, m));
        if self.policy != CachePolicy::None && self.levels.is_empty() {
            return bad(format!("cache policy {} needs at least one cache level", self.policy));
        }
        for (i, l) in self.levels.iter().enumerate() {
            if l.capacity_bytes == 0 {
                return bad(format!("cache level {i} ({}) has a capacity of 0 bytes", l.name()));
            }
            if i > 0 && l.medium == CacheMedium::Memory {
                return bad("a memory cache level must be the first (levels go fastest first)".into());
            }
        }
        if self.prefetch_depth == 0 {
            return bad("cache prefetch depth must be at least 1".into());
        }
        if self.range_bytes == 0 {
            return bad("cache range size must be at least 1 byte".into());
        }
        if let Some(n) = self.local_ranks {
            if n == 0 {
                return bad("a node cache needs at least 1 local rank".into());
            }
            let one_dir = matches!(self.levels.as_slice(), [CacheLevel { medium: CacheMedium::Dir(_), .. }]);
            if !one_dir && self.policy != CachePolicy::None {
                return bad("a node cache shared across processes needs exactly one directory level \
                     (the node's directory; on tmpfs it is memory)"
                    .into());
            }
        }
        if self.policy == CachePolicy::Clairvoyant {
            if self.lookahead_epochs == 0 {
                return bad("clairvoyant lookahead must be at least 1 epoch".into());
            }
            if self.total_epochs == Some(0) {
                return bad("a job's number of epochs must be at least 1 when given".into());
            }
            let first = self.levels[0].capacity_bytes;
            if let Some(b) = self.prefetch_bytes {
                if b >= first && self.levels.len() == 1 {
                    return bad(format!(
                        "prefetch budget of {b} bytes leaves no room to place samples in a cache of {first} bytes"
                    ));
                }
            }
        }
        Ok(())
    }
}
