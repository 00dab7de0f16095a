//! One cold, shuffled pass over a dataset through an engine, measured.

use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use ringtier_core::{BufferPool, MemoryTier, PoolConfig, PosixConfig, PosixTier, ReadBatch, Tier};
use ringtier_uring::{DirectIoPolicy, UringConfig, UringTier, UringTierOptions};
use serde::Serialize;

use crate::dataset::Dataset;
use crate::stats::{evict, process_cpu, Rng};

/// How files are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Engine {
    /// The memory tier, preloaded: the ceiling without storage.
    Memory,
    /// Buffered pread from a pool of N threads (tf.data / PyTorch workers).
    PosixThreads,
    /// io_uring, O_DIRECT, N requests in flight on one ring.
    UringDirect,
    /// io_uring through the page cache.
    UringBuffered,
}

impl Engine {
    pub(crate) const ALL: [Engine; 4] =
        [Engine::Memory, Engine::PosixThreads, Engine::UringDirect, Engine::UringBuffered];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Engine::Memory => "memory",
            Engine::PosixThreads => "posix-threads",
            Engine::UringDirect => "uring-direct",
            Engine::UringBuffered => "uring-buffered",
        }
    }

    /// What the concurrency number means for this engine.
    pub(crate) fn concurrency_unit(self) -> &'static str {
        match self {
            Engine::Memory => "tasks",
            Engine::PosixThreads => "threads",
            Engine::UringDirect | Engine::UringBuffered => "depth",
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Engine {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Engine::ALL
            .into_iter()
            .find(|e| e.as_str() == s)
            .ok_or_else(|| format!("unknown engine {s:?} (memory, posix-threads, uring-direct, uring-buffered)"))
    }
}

/// io_uring knobs for the uring engines.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct UringKnobs {
    pub rings: usize,
    pub sqpoll: bool,
    pub register_buffers: bool,
}

impl Default for UringKnobs {
    fn default() -> Self {
        UringKnobs { rings: 1, sqpoll: false, register_buffers: true }
    }
}

/// An engine set up over a dataset, reusable across passes.
pub(crate) struct Reader {
    pub engine: Engine,
    pub concurrency: usize,
    tier: Arc<dyn Tier>,
    pool: BufferPool,
    batch_size: usize,
}

/// Measurements of one pass.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct PassResult {
    pub bytes: u64,
    pub files: u64,
    pub wall_seconds: f64,
    pub cpu_seconds: f64,
}

impl PassResult {
    pub(crate) fn mb_per_sec(&self) -> f64 {
        self.bytes as f64 / self.wall_seconds / 1e6
    }

    pub(crate) fn files_per_sec(&self) -> f64 {
        self.files as f64 / self.wall_seconds
    }

    pub(crate) fn cpu_seconds_per_gib(&self) -> f64 {
        self.cpu_seconds / (self.bytes as f64 / (1u64 << 30) as f64)
    }
}

impl Reader {
    /// Sets up `engine` with `concurrency` over `ds`.
    pub(crate) fn new(engine: Engine, concurrency: usize, ds: &Dataset, knobs: UringKnobs) -> Result<Reader> {
        let concurrency = concurrency.max(1);
        // Two batches in flight, each large enough to keep every thread or ring slot busy.
        let batch_size = (2 * concurrency).max(32);
        let buf_size = (ds.max_size() as usize).next_multiple_of(4096) + 4096;
        let pool = BufferPool::new(PoolConfig { buf_size, count: 2 * batch_size, align: 4096 })
            .context("allocating the buffer pool")?;
        let tier: Arc<dyn Tier> = match engine {
            Engine::Memory => {
                let mem = MemoryTier::new();
                let src = PosixTier::new(PosixConfig::new(&ds.root)).context("opening the dataset")?;
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                rt.block_on(async {
                    for f in &ds.files {
                        let data = ringtier_core::ops::get(&src, &f.key).await?;
                        ringtier_core::ops::put(&mem, &f.key, &data, 1 << 20).await?;
                    }
                    Ok::<_, ringtier_core::Error>(())
                })
                .context("loading the dataset into memory")?;
                Arc::new(mem)
            }
            Engine::PosixThreads => Arc::new(
                PosixTier::new(PosixConfig { threads: concurrency, ..PosixConfig::new(&ds.root) })
                    .context("opening the posix tier")?,
            ),
            Engine::UringDirect | Engine::UringBuffered => {
                let config = UringConfig {
                    queue_depth: concurrency as u32,
                    rings: knobs.rings,
                    sqpoll_idle_ms: knobs.sqpoll.then_some(50),
                    register_buffers: knobs.register_buffers,
                    direct_io: if engine == Engine::UringDirect {
                        DirectIoPolicy::Required
                    } else {
                        DirectIoPolicy::Off
                    },
                    ..UringConfig::default()
                };
                let options = UringTierOptions { pool: Some(pool.clone()), ..Default::default() };
                Arc::new(UringTier::with_options(&ds.root, config, options).context("opening the io_uring tier")?)
            }
        };
        Ok(Reader { engine, concurrency, tier, pool, batch_size })
    }

    /// One pass over every file of `ds` in an order shuffled by `seed`; cold unless `warm`.
    pub(crate) async fn pass(&self, ds: &Dataset, seed: u64, warm: bool) -> Result<PassResult> {
        if !warm {
            for f in &ds.files {
                evict(&ds.root.join(&f.key)).with_context(|| format!("evicting {}", f.key))?;
            }
        }
        let mut order: Vec<usize> = (0..ds.files.len()).collect();
        Rng::new(seed).shuffle(&mut order);
        let cpu0 = process_cpu();
        let t0 = Instant::now();
        let mut bytes = 0u64;
        let mut in_flight: VecDeque<tokio::task::JoinHandle<ReadBatch>> = VecDeque::new();
        let mut spare: Vec<ReadBatch> =
            (0..2).map(|_| ReadBatch::with_capacity(self.batch_size, self.batch_size * 32)).collect();
        let mut chunks = order.chunks(self.batch_size);
        loop {
            while in_flight.len() < 2 {
                let Some(chunk) = chunks.next() else { break };
                let mut batch = spare.pop().unwrap_or_default();
                for &i in chunk {
                    let f = &ds.files[i];
                    batch.push(&f.key, 0, f.size as usize, self.pool.acquire().await);
                }
                let tier = Arc::clone(&self.tier);
                in_flight.push_back(tokio::spawn(async move { tier.read_batch(batch).await }));
            }
            let Some(h) = in_flight.pop_front() else {
                break;
            };
            let mut batch = h.await.context("reader task failed")?;
            for (key, _, res, _buf) in batch.drain() {
                match res {
                    Ok(n) => bytes += n as u64,
                    Err(e) => bail!("reading {key} through {}: {e}", self.engine),
                }
            }
            spare.push(batch);
        }
        let wall = t0.elapsed().as_secs_f64();
        let cpu = (process_cpu() - cpu0).as_secs_f64();
        if bytes != ds.total_bytes() {
            bail!("read {bytes} bytes but the dataset holds {}", ds.total_bytes());
        }
        Ok(PassResult { bytes, files: ds.files.len() as u64, wall_seconds: wall, cpu_seconds: cpu })
    }
}
