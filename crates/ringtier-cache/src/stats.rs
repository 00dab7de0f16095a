//! [`CacheStats`]: hits, misses, bytes and prefetch lead per level, and their ratios.

use super::CachePolicy;

/// Totals of one cache level (see [`CacheStats`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LevelStats {
    /// `ram` or `dir`.
    pub name: &'static str,
    /// The level's capacity.
    pub capacity_bytes: u64,
    /// Bytes held (or reserved for copies being written) now.
    pub used_bytes: u64,
    /// Bytes of copies written and ready to serve now (`used_bytes` less the copies still
    /// being written): a reader finds these at once.
    pub ready_bytes: u64,
    /// Accesses served from a copy read before (or brought in by a miss): the hits a cache
    /// without prefetch can have, bounded by c for one reader.
    pub reuse_hits: u64,
    /// First reads of copies the prefetcher brought in ahead of use.
    pub prefetch_hits: u64,
}

/// A cache's totals since it was made. Accesses are reads at offset 0 (one per sample read
/// whole); bytes count every read. [`CacheStats::since`] gives the totals of an interval.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct CacheStats {
    /// The policy.
    pub policy: CachePolicy,
    /// Per level, fastest first.
    pub levels: Vec<LevelStats>,
    /// Accesses not served from the cache at once: those that went to the slow tier, and those
    /// that waited for a prefetch still in flight (also counted in `late_prefetches`).
    pub misses: u64,
    /// Accesses that found their prefetch still in flight and waited for it.
    pub late_prefetches: u64,
    /// Bytes served from the cache.
    pub hit_bytes: u64,
    /// Bytes read from the slow tier for readers (prefetches not included).
    pub miss_bytes: u64,
    /// Bytes the cache read from the slow tier for itself: whole objects after a partial
    /// read, and prefetches.
    pub fetched_bytes: u64,
    /// Objects the prefetcher fetched.
    pub prefetched: u64,
    /// Bytes the prefetcher fetched.
    pub prefetched_bytes: u64,
    /// Prefetched objects evicted before anyone read them.
    pub unused_evicted: u64,
    /// Bytes of those.
    pub unused_evicted_bytes: u64,
    /// Copies dropped to make room or because the placement changed.
    pub evictions: u64,
    /// Sum over prefetch hits of how long the copy was in the cache before it was read.
    pub prefetch_lead_seconds: f64,
}

impl CacheStats {
    /// Accesses served from the cache (reuse and prefetch hits, every level).
    pub fn hits(&self) -> u64 {
        self.levels.iter().map(|l| l.reuse_hits + l.prefetch_hits).sum()
    }

    /// Reuse hits, every level.
    pub fn reuse_hits(&self) -> u64 {
        self.levels.iter().map(|l| l.reuse_hits).sum()
    }

    /// Hits plus misses.
    pub fn accesses(&self) -> u64 {
        self.hits() + self.misses
    }

    /// Hits over accesses (0 without accesses).
    pub fn hit_ratio(&self) -> f64 {
        ratio(self.hits(), self.accesses())
    }

    /// Reuse hits over accesses: the share a cache without prefetch could serve (bounded by
    /// the cache's fraction c of the dataset for one reader).
    pub fn reuse_hit_ratio(&self) -> f64 {
        ratio(self.reuse_hits(), self.accesses())
    }

    /// Bytes read from the slow tier through the cache: readers' misses and the cache's own
    /// fetches (what a cache is there to save).
    pub fn slow_tier_bytes(&self) -> u64 {
        self.miss_bytes + self.fetched_bytes
    }

    /// Mean prefetch lead: seconds between a prefetched copy's arrival and its first read.
    pub fn mean_prefetch_lead_seconds(&self) -> f64 {
        let n: u64 = self.levels.iter().map(|l| l.prefetch_hits).sum();
        if n == 0 {
            0.0
        } else {
            self.prefetch_lead_seconds / n as f64
        }
    }

    /// The totals since `earlier` (the same cache's stats taken before); levels' used bytes
    /// are the current ones.
    pub fn since(&self, earlier: &CacheStats) -> CacheStats {
        let mut d = self.clone();
        for (l, e) in d.levels.iter_mut().zip(&earlier.levels) {
            l.reuse_hits -= e.reuse_hits;
            l.prefetch_hits -= e.prefetch_hits;
        }
        d.misses -= earlier.misses;
        d.late_prefetches -= earlier.late_prefetches;
        d.hit_bytes -= earlier.hit_bytes;
        d.miss_bytes -= earlier.miss_bytes;
        d.fetched_bytes -= earlier.fetched_bytes;
        d.prefetched -= earlier.prefetched;
        d.prefetched_bytes -= earlier.prefetched_bytes;
        d.unused_evicted -= earlier.unused_evicted;
        d.unused_evicted_bytes -= earlier.unused_evicted_bytes;
        d.evictions -= earlier.evictions;
        d.prefetch_lead_seconds -= earlier.prefetch_lead_seconds;
        d
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}
