//! Settings of a checkpoint store.

/// What `save` does when the fast tier has no room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFull {
    /// Wait until the drain and eviction make room.
    Wait,
    /// Write to the next, slower tier instead.
    WriteThrough,
}

/// Settings of a [`CheckpointStore`](super::CheckpointStore).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StoreConfig {
    /// Key prefix of the store on every tier. Default `ckpt`.
    pub prefix: String,
    /// Bytes per write and per drain copy. Default 32 MiB: fewer, larger writes per part (a
    /// 1 GiB save of 111 parts from Python measured 1.36x a raw write at 8 MiB, 1.02x at 32;
    /// `bench/results/python-ckpt-chunks.txt`).
    pub chunk_bytes: usize,
    /// Checkpoints drained at once. Default 1.
    pub drain_concurrency: usize,
    /// Parts a save writes at once (at least 1), each with one chunk write in flight while
    /// its next chunk is copied: one part's commit (on a file tier its fsync and rename)
    /// overlaps the others' writes. Memory: two chunk buffers per part in flight. Default 1.
    pub save_parallelism: usize,
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

    /// Sets [`StoreConfig::save_parallelism`].
    pub fn with_save_parallelism(mut self, save_parallelism: usize) -> Self {
        self.save_parallelism = save_parallelism;
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
            chunk_bytes: 32 << 20,
            drain_concurrency: 1,
            save_parallelism: 1,
            drain_bytes_per_sec: None,
            keep_last: 2,
            fast_capacity_bytes: None,
            on_full: OnFull::Wait,
            retries: 3,
        }
    }
}
