//! The loader's settings: batch size, prefetch, shuffle, decode, verification, the cache and
//! the materialised split point.

use ringtier_cache::{CacheConfig, CachedTier};
use ringtier_dataset::OnBadSample;
use ringtier_decode::DecodeConfig;

use crate::materialize::Materialize;

/// Settings of a [`Loader`](crate::Loader).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LoaderConfig {
    /// Samples per batch. Default 64.
    pub batch_size: usize,
    /// Batches read ahead of the consumer: up to `prefetch + 1` batches' reads in flight at
    /// once (each in its own task, its buffers taken in batch order), delivered in order; 0
    /// reads each batch when asked (no overlap). Default 2.
    pub prefetch: usize,
    /// Drop a last batch smaller than `batch_size`. Default false.
    pub drop_last: bool,
    /// Shuffle each epoch. Default true.
    pub shuffle: bool,
    /// Seed of the shuffle. Default 0.
    pub seed: u64,
    /// This process's rank. Default 0.
    pub rank: usize,
    /// Number of ranks. Default 1.
    pub world: usize,
    /// Decode JPEGs and resize them. Default none (raw bytes).
    pub decode: Option<DecodeConfig>,
    /// Bad samples: skip or fail. Default skip.
    pub on_bad: OnBadSample,
    /// Check CRC-32C against the manifest where it has one. Default false.
    pub verify: bool,
    /// Largest single read, in bytes: the pool's buffers are this size (or the largest
    /// sample's, when smaller), and a larger sample is read in pieces of it and assembled with
    /// one copy. 0, the default, means [`crate::DEFAULT_MAX_READ`] (8 MiB). The pool is
    /// (prefetch + 2) x batch size buffers, whatever the sample sizes.
    pub read_size: usize,
    /// The split point: store decode + resize in a tier once, run only the random steps
    /// online in later epochs (needs `decode`). Default none.
    pub materialize: Option<Materialize>,
    /// A cache in front of the dataset's tier (see [`ringtier_cache`]): policy (none, LRU,
    /// static, clairvoyant), levels (memory, a local directory) with their capacities, the
    /// clairvoyant lookahead and prefetch budget. Default none.
    pub cache: Option<CacheConfig>,
    /// A cache shared by the loaders of a node's ranks in this process
    /// ([`CachedTier::for_node`], one copy of a sample per node) and this loader's index among
    /// the samplers it was made with (their ranks must be this loader's rank, seed and
    /// world). Instead of `cache`. Default none.
    pub node_cache: Option<(CachedTier, usize)>,
}

impl LoaderConfig {
    /// Sets [`LoaderConfig::batch_size`].
    pub fn with_batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size;
        self
    }

    /// Sets [`LoaderConfig::prefetch`].
    pub fn with_prefetch(mut self, prefetch: usize) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// Sets [`LoaderConfig::drop_last`].
    pub fn with_drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Sets [`LoaderConfig::shuffle`].
    pub fn with_shuffle(mut self, shuffle: bool) -> Self {
        self.shuffle = shuffle;
        self
    }

    /// Sets [`LoaderConfig::seed`].
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Sets [`LoaderConfig::rank`].
    pub fn with_rank(mut self, rank: usize) -> Self {
        self.rank = rank;
        self
    }

    /// Sets [`LoaderConfig::world`].
    pub fn with_world(mut self, world: usize) -> Self {
        self.world = world;
        self
    }

    /// Sets [`LoaderConfig::decode`].
    pub fn with_decode(mut self, decode: impl Into<Option<DecodeConfig>>) -> Self {
        self.decode = decode.into();
        self
    }

    /// Sets [`LoaderConfig::on_bad`].
    pub fn with_on_bad(mut self, on_bad: OnBadSample) -> Self {
        self.on_bad = on_bad;
        self
    }

    /// Sets [`LoaderConfig::verify`].
    pub fn with_verify(mut self, verify: bool) -> Self {
        self.verify = verify;
        self
    }

    /// Sets [`LoaderConfig::read_size`].
    pub fn with_read_size(mut self, read_size: usize) -> Self {
        self.read_size = read_size;
        self
    }

    /// Sets [`LoaderConfig::materialize`].
    pub fn with_materialize(mut self, materialize: impl Into<Option<Materialize>>) -> Self {
        self.materialize = materialize.into();
        self
    }

    /// Sets [`LoaderConfig::cache`].
    pub fn with_cache(mut self, cache: impl Into<Option<CacheConfig>>) -> Self {
        self.cache = cache.into();
        self
    }

    /// Sets [`LoaderConfig::node_cache`]: read through `cache`, shared with the node's other
    /// ranks, as its sampler number `index`.
    pub fn with_node_cache(mut self, cache: CachedTier, index: usize) -> Self {
        self.node_cache = Some((cache, index));
        self
    }
}

impl Default for LoaderConfig {
    fn default() -> Self {
        LoaderConfig {
            batch_size: 64,
            prefetch: 2,
            drop_last: false,
            shuffle: true,
            seed: 0,
            rank: 0,
            world: 1,
            decode: None,
            on_bad: OnBadSample::Skip,
            verify: false,
            read_size: 0,
            materialize: None,
            cache: None,
            node_cache: None,
        }
    }
}
