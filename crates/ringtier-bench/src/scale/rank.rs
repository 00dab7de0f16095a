//! One rank of `ringtier bench scale`: a child process the parent starts per rank (as a
//! launcher would: rank and world as arguments, `LOCAL_WORLD_SIZE` in the environment). It waits
//! for the parent's start signal on stdin (every rank of the pass starts together), then times
//! its work from before its engine starts: the listing (`Dataset::from_dir_with`, from the cache
//! beside the data or not), the loader, the first batch and the rest of one epoch. It prints
//! one [`RankResult`] as JSON on stdout; with a record file it also writes each sample's key,
//! CRC-32C and size there (the verify pass).

use std::io::{BufRead as _, BufWriter, Write as _};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use nix::unistd::{sysconf, SysconfVar};
use ringtier::open::Engine;
use ringtier_core::{BufferPool, ListOptions, Tier};
use ringtier_dataset::Dataset;
use ringtier_loader::{Loader, LoaderConfig};
use serde::{Deserialize, Serialize};

use super::Listing;
use crate::harness::{peak_rss_bytes, process_cpu};

/// The environment variable that sets a process's engine threads (the tokio runtime's worker
/// threads), as the Python package reads it (`ringtier-py/src/engine.rs`); a value the user set
/// wins over the fitted one.
pub(crate) const THREADS_ENV: &str = "RINGTIER_ENGINE_THREADS";

/// The engine threads of a process when nothing says otherwise (the Python package's default).
const ENGINE_THREADS: usize = 2;

/// What one rank measured in one pass.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RankResult {
    pub(crate) rank: usize,
    pub(crate) world: usize,
    /// Samples this rank read in the epoch.
    pub(crate) samples: u64,
    /// Bytes of those samples.
    pub(crate) bytes: u64,
    /// Samples skipped (a file gone or unreadable); 0 on an intact data set.
    pub(crate) skipped: u64,
    /// Seconds from the start of the rank's work to the listing done (dataset made).
    pub(crate) listing_s: f64,
    /// Seconds from the start of the rank's work to its first batch in hand.
    pub(crate) first_batch_s: f64,
    /// Seconds from the start of the rank's work to the end of its epoch.
    pub(crate) epoch_s: f64,
    /// This process's user + system CPU seconds over its work (every thread).
    pub(crate) cpu_s: f64,
    /// This process's peak resident memory (`VmHWM`), bytes.
    pub(crate) peak_rss_bytes: u64,
    /// The runtime threads the rank's engine ran with, and where the number came from.
    pub(crate) engine_threads: usize,
    pub(crate) engine_threads_from: String,
    /// The file engine the tier opened with (`uring`, `posix`, or the fallback and why).
    pub(crate) engine: String,
    /// Samples in the listing (the whole data set, every rank's).
    pub(crate) listed: usize,
    /// Whether the listing came from the cache beside the data.
    pub(crate) from_cache: bool,
    /// The listing's heap bytes (keys plus 16 bytes a sample).
    pub(crate) listing_bytes: usize,
    /// Bytes of the loader's buffer pool.
    pub(crate) pool_bytes: usize,
}

/// How many engine threads a rank runs with, and why: `RINGTIER_ENGINE_THREADS` when set to a
/// number from 1 to 64 (the user's value wins); otherwise the cores this process may run on
/// (its affinity), divided by the ranks on the machine (`LOCAL_WORLD_SIZE`) where the affinity
/// is the whole machine (ranks not pinned by the launcher share every core), at most 2: the
/// rule of `ringtier.torch` (`fit_engine_to_worker`).
pub(crate) fn engine_threads() -> (usize, String) {
    if let Some(n) = std::env::var(THREADS_ENV).ok().and_then(|v| v.trim().parse::<usize>().ok()) {
        if (1..=64).contains(&n) {
            return (n, format!("{THREADS_ENV}={n}"));
        }
    }
    let local = std::env::var("LOCAL_WORLD_SIZE").ok().and_then(|v| v.trim().parse::<usize>().ok()).unwrap_or(1).max(1);
    if local == 1 {
        return (ENGINE_THREADS, "default (one rank on the machine)".to_string());
    }
    let mut cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let online = sysconf(SysconfVar::_NPROCESSORS_ONLN).ok().flatten().unwrap_or(0).max(0) as usize;
    let pinned = cores < online;
    if !pinned {
        cores = (cores / local).max(1);
    }
    let n = cores.clamp(1, ENGINE_THREADS);
    let why = if pinned {
        format!("{cores} cores of its affinity, at most {ENGINE_THREADS}")
    } else {
        format!("{online} cores / {local} ranks (LOCAL_WORLD_SIZE), at most {ENGINE_THREADS}")
    };
    (n, why)
}

/// The settings of one rank's run.
#[derive(Debug, Clone)]
pub(crate) struct RankRun<'a> {
    pub(crate) dir: &'a Path,
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) listing: Listing,
    pub(crate) batch: usize,
    pub(crate) prefetch: usize,
    pub(crate) seed: u64,
    pub(crate) engine: Engine,
    /// Where to write each sample's `key\tcrc32c\tsize` line (the verify pass).
    pub(crate) record: Option<&'a Path>,
}

/// The child's entry: waits for the start line on stdin, runs the rank, prints its result.
pub(crate) fn main(run: &RankRun<'_>) -> Result<()> {
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).context("waiting for the start signal on stdin")?;
    if line.trim() != "go" {
        bail!("the rank's start signal was {line:?}, not \"go\" (the parent stopped?)");
    }
    let result = one_rank(run)?;
    println!("{}", serde_json::to_string(&result)?);
    Ok(())
}

/// One epoch of one rank, timed from before its engine starts.
fn one_rank(run: &RankRun<'_>) -> Result<RankResult> {
    let t0 = Instant::now();
    let cpu0 = process_cpu();
    let (threads, threads_from) = engine_threads();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("ringtier-rank")
        .enable_all()
        .build()
        .context("starting the rank's runtime")?;
    let mut record = match run.record {
        Some(p) => Some(BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating the record file {}", p.display()))?,
        )),
        None => None,
    };
    let mut r = rt.block_on(async {
        // Listed through a tier without a pool, then read through one with the loader's pool
        // (registered with io_uring): as the Python package's `Loader` does.
        let dataset_options = ringtier::OpenOptions::dataset().with_engine(run.engine).with_metered(false);
        let lister =
            ringtier::open(run.dir, &dataset_options).with_context(|| format!("opening {}", run.dir.display()))?.tier;
        let alignment = lister.capabilities().alignment;
        let options = ListOptions::default()
            .with_skip_bad(true)
            .with_stat_files(run.listing == Listing::Stat)
            .with_cache(run.listing == Listing::Cached);
        let dataset = Dataset::from_dir_with(lister, run.dir, options)
            .await
            .with_context(|| format!("listing {}", run.dir.display()))?;
        let listing_s = t0.elapsed().as_secs_f64();
        let cfg = LoaderConfig::default()
            .with_batch_size(run.batch)
            .with_prefetch(run.prefetch)
            .with_seed(run.seed)
            .with_rank(run.rank)
            .with_world(run.world);
        let pool = BufferPool::new(Loader::pool_config(dataset.max_size(), alignment, &cfg))?;
        let opened = ringtier::open(run.dir, &dataset_options.clone().with_pool(pool))
            .with_context(|| format!("opening {} with the loader's pool", run.dir.display()))?;
        let engine = match &opened.backend {
            ringtier::open::Backend::Files(used) => used.describe(),
            other => format!("{other:?}"),
        };
        let tier: Arc<dyn Tier> = opened.tier;
        let (listed, from_cache, listing_bytes) = (dataset.len(), dataset.from_cache(), dataset.heap_bytes());
        let loader = Loader::new(dataset.with_tier(tier), cfg)?;
        let mut epoch = loader.epoch(0, 0)?;
        let mut first_batch_s = f64::NAN;
        let (mut samples, mut bytes, mut skipped) = (0u64, 0u64, 0u64);
        while let Some(batch) = epoch.next().await {
            let batch = batch?;
            if samples == 0 && first_batch_s.is_nan() {
                first_batch_s = t0.elapsed().as_secs_f64();
            }
            samples += batch.samples.len() as u64;
            bytes += batch.bytes;
            skipped += batch.skipped.len() as u64;
            if let Some(out) = record.as_mut() {
                for (&i, s) in batch.indices.iter().zip(&batch.samples) {
                    let data = s.as_slice();
                    writeln!(out, "{}\t{:08x}\t{}", loader.dataset().key(i as usize), crc32c::crc32c(data), data.len())
                        .context("writing the record file")?;
                }
            }
        }
        let epoch_s = t0.elapsed().as_secs_f64();
        anyhow::Ok(RankResult {
            rank: run.rank,
            world: run.world,
            samples,
            bytes,
            skipped,
            listing_s,
            first_batch_s,
            epoch_s,
            cpu_s: 0.0,
            peak_rss_bytes: 0,
            engine_threads: threads,
            engine_threads_from: threads_from.clone(),
            engine,
            listed,
            from_cache,
            listing_bytes,
            pool_bytes: loader.pool_bytes(),
        })
    })?;
    if let Some(mut out) = record {
        out.flush().context("writing the record file")?;
    }
    r.cpu_s = process_cpu().saturating_sub(cpu0).as_secs_f64();
    r.peak_rss_bytes = peak_rss_bytes();
    Ok(r)
}
