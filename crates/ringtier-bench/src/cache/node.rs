//! One side of `bench cache` in its own process: the node's ranks as loaders over one
//! throttled, counted slow tier, with one cache for the node or one per rank; every epoch
//! starts on all ranks together and ends when the slowest is done.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ringtier_cache::{CacheConfig, CacheLevel, CachePolicy, CacheStats, CachedTier};
use ringtier_core::layers::{Throttle, Throttled};
use ringtier_core::{PosixConfig, PosixTier, Tier};
use ringtier_dataset::{Dataset, Sampler};
use ringtier_loader::{Loader, LoaderConfig};

use super::{policy_of, sample_key, CacheBenchArgs, CacheScope, EpochResult, SideResult};
use crate::harness::peak_rss_bytes;

/// Runs the side `spec` ("policy,fraction,ranks") and prints its [`SideResult`] as JSON.
pub(super) fn worker(a: &CacheBenchArgs, spec: &str) -> Result<()> {
    let parts: Vec<&str> = spec.split(',').collect();
    let [policy, fraction, ranks] = parts[..] else { bail!("bad --worker {spec}") };
    let policy = policy_of(policy)?;
    let fraction: f64 = fraction.parse()?;
    let ranks: usize = ranks.parse()?;
    let dir = a.dir.clone().context("--worker needs --dir")?;
    let rt = crate::runtime(2)?;
    let result = rt.block_on(run(a, policy, fraction, ranks, &dir, a.local.filter(|_| a.processes)))?;
    println!("{}", serde_json::to_string(&result)?);
    Ok(())
}

fn cache_config(a: &CacheBenchArgs, policy: CachePolicy, capacity: u64, dir: &std::path::Path) -> CacheConfig {
    let level =
        if a.cache_in_dir { CacheLevel::dir(dir.join("cache-levels"), capacity) } else { CacheLevel::memory(capacity) };
    CacheConfig::new(policy, vec![level])
        .with_lookahead_epochs(a.lookahead)
        .with_prefetch_bytes(((capacity as f64 * a.prefetch_frac) as u64).min(capacity.saturating_sub(1)))
}

async fn run(
    a: &CacheBenchArgs,
    policy: CachePolicy,
    fraction: f64,
    ranks: usize,
    dir: &std::path::Path,
    local: Option<usize>,
) -> Result<SideResult> {
    let files: Arc<dyn Tier> = Arc::new(PosixTier::new(PosixConfig::new(dir.join("cache-dataset")))?);
    // As separate processes, each rank has its share of the node's bandwidth.
    let share = if local.is_some() { ranks as f64 } else { 1.0 };
    let throttle = Throttle {
        read_bytes_per_sec: Some((a.bandwidth_mbs * 1e6 / share) as u64),
        write_bytes_per_sec: None,
        latency: Duration::from_secs_f64(a.latency_ms / 1000.0),
        burst_bytes: None,
    };
    let slow: Arc<dyn Tier> = Arc::new(Throttled::new(Arc::clone(&files), throttle));
    // Sizes from the files directly (not through the throttle), then read through it.
    let ds = Dataset::from_keys(files, (0..a.samples).map(sample_key)).await?.with_tier(slow);
    let world = ranks * a.nodes;
    let samplers = (0..ranks)
        .map(|r| Sampler::new(a.samples, a.seed, r, world, true))
        .collect::<ringtier_core::Result<Vec<_>>>()?;
    let total = (a.samples * a.sample_bytes) as u64;
    let capacity = ((total as f64 * fraction) as u64).max(1);
    // (cache, which of its samplers a rank is) per rank.
    let caches: Vec<(CachedTier, usize)> = match (a.scope, local) {
        (CacheScope::Node, Some(l)) => {
            let node_dir = a.node_dir.clone().unwrap_or_else(|| dir.join("node-cache"));
            // The node's plan looks over the whole job: the benchmark knows its epochs.
            let cfg = CacheConfig::new(policy, vec![CacheLevel::dir(node_dir, capacity)])
                .with_lookahead_epochs(a.lookahead)
                .with_total_epochs(Some(a.epochs))
                .with_prefetch_depth(a.in_flight);
            vec![(CachedTier::for_node_dir(&ds, samplers.clone(), l, cfg)?, l)]
        }
        (CacheScope::Rank, Some(l)) => {
            let mut cfg = cache_config(a, policy, (capacity / ranks as u64).max(1), dir);
            cfg.prefetch_depth = a.in_flight;
            vec![(CachedTier::for_dataset(&ds, samplers[l], cfg)?, 0)]
        }
        (CacheScope::Node, None) => {
            let mut cfg = cache_config(a, policy, capacity, dir);
            cfg.prefetch_depth = a.in_flight * ranks;
            let c = CachedTier::for_node(&ds, samplers.clone(), cfg)?;
            (0..ranks).map(|r| (c.clone(), r)).collect()
        }
        (CacheScope::Rank, None) => {
            let mut v = Vec::new();
            for s in &samplers {
                let mut cfg = cache_config(a, policy, (capacity / ranks as u64).max(1), dir);
                cfg.prefetch_depth = a.in_flight;
                v.push((CachedTier::for_dataset(&ds, *s, cfg)?, 0));
            }
            v
        }
    };
    let mut loaders = Vec::new();
    for (i, (cache, _)) in caches.iter().enumerate() {
        let r = local.unwrap_or(i);
        let cfg = LoaderConfig::default()
            .with_batch_size(a.batch)
            .with_prefetch(a.loader_prefetch())
            .with_seed(a.seed)
            .with_rank(r)
            .with_world(world);
        loaders.push(Arc::new(Loader::new(ds.clone().with_tier(Arc::new(cache.clone())), cfg)?));
    }
    let distinct: Vec<&CachedTier> = match a.scope {
        CacheScope::Node => vec![&caches[0].0],
        CacheScope::Rank => caches.iter().map(|c| &c.0).collect(),
    };
    let stats = |cs: &[&CachedTier]| -> Vec<CacheStats> { cs.iter().map(|c| c.stats()).collect() };
    // Bytes held: the levels' own count, or a scan of a shared node directory (its copies).
    let held = |c: &CachedTier| -> u64 {
        match c.node_dir_usage() {
            Some((copies, _)) => copies,
            None => c.stats().levels.iter().map(|l| l.used_bytes).sum(),
        }
    };
    let used = |cs: &[&CachedTier]| -> u64 { cs.iter().map(|c| held(c)).sum() };
    // The node's planned hits of the epoch (shared directory only; one process reports them).
    let planned = |cs: &[&CachedTier]| -> u64 {
        cs.iter().filter_map(|c| c.node_dir_stats()).map(|s| s.planned_hits).sum::<u64>()
            * u64::from(local.is_none_or(|l| l == 0))
    };
    let step = Duration::from_secs_f64(a.step_ms / 1000.0);
    let mut epochs = Vec::new();
    let mut max_used = 0u64;
    for e in 0..a.epochs {
        if let (Some(l), Some(b)) = (local, &a.barrier) {
            barrier(b, e, l, ranks).await?;
        }
        let before = stats(&distinct);
        let t = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for (r, loader) in loaders.iter().enumerate() {
            let (cache, local) = caches[r].clone();
            let loader = Arc::clone(loader);
            let all: Vec<CachedTier> = distinct.iter().map(|c| (*c).clone()).collect();
            let shared = cache.node_dir_usage().is_some();
            tasks.spawn(async move {
                cache.begin_rank_epoch(local, e, 0)?;
                let mut epoch = loader.epoch(e, 0)?;
                let mut max_used = 0u64;
                let mut n = 0usize;
                while let Some(batch) = epoch.next().await {
                    let batch = batch?;
                    if !batch.skipped.is_empty() {
                        bail!("samples skipped: {:?}", batch.skipped);
                    }
                    n += 1;
                    // A shared directory is scanned every 4 batches (a scan reads the directory).
                    if !shared || n % 4 == 0 {
                        max_used = max_used.max(
                            all.iter()
                                .map(|c| match c.node_dir_usage() {
                                    Some((copies, _)) => copies,
                                    None => c.stats().levels.iter().map(|l| l.used_bytes).sum(),
                                })
                                .sum(),
                        );
                    }
                    drop(batch);
                    tokio::time::sleep(step).await; // the training step
                }
                let seconds = t.elapsed().as_secs_f64();
                Ok::<_, anyhow::Error>((seconds, epoch.stats().stall_seconds, max_used))
            });
        }
        let mut seconds = 0f64;
        let mut stall = 0f64;
        while let Some(done) = tasks.join_next().await {
            let (s, st, m) = done.context("a rank's task")??;
            seconds = seconds.max(s);
            stall += st / s.max(1e-9);
            max_used = max_used.max(m);
        }
        max_used = max_used.max(used(&distinct));
        let after = stats(&distinct);
        let d: Vec<CacheStats> = after.iter().zip(&before).map(|(a, b)| a.since(b)).collect();
        let sum = |f: &dyn Fn(&CacheStats) -> u64| d.iter().map(f).sum::<u64>();
        epochs.push(EpochResult {
            epoch: e,
            seconds,
            stall_share: stall / loaders.len() as f64,
            planned_hits: planned(&distinct),
            slow_bytes: sum(&|s| s.slow_tier_bytes()),
            accesses: sum(&|s| s.accesses()),
            hits: sum(&|s| s.hits()),
            reuse_hits: sum(&|s| s.reuse_hits()),
            late_prefetches: sum(&|s| s.late_prefetches),
            prefetched_bytes: sum(&|s| s.prefetched_bytes),
            prefetched_unused_bytes: sum(&|s| s.unused_evicted_bytes),
        });
    }
    // Every rank done before any drops its cache (local rank 0 removes the node directory).
    if let (Some(l), Some(b)) = (local, &a.barrier) {
        barrier(b, a.epochs, l, ranks).await?;
    }
    let capacity_bytes = if policy == CachePolicy::None { 0 } else { capacity };
    // A shared directory's copies carry a 48-byte header each.
    let headers =
        if local.is_some() && a.scope == CacheScope::Node { 48 * (capacity / a.sample_bytes as u64) } else { 0 };
    if max_used > capacity_bytes + headers {
        bail!("the cache held {max_used} bytes, over its capacity of {capacity_bytes}");
    }
    Ok(SideResult {
        policy: policy.to_string(),
        fraction,
        ranks,
        capacity_bytes,
        max_used_bytes: max_used,
        peak_rss_bytes: peak_rss_bytes(),
        epochs,
    })
}

/// Waits until every rank of the side has reached epoch `epoch` (a file per rank and epoch in
/// `dir`), so the node's ranks start each epoch together as a job's do.
async fn barrier(dir: &std::path::Path, epoch: u64, local: usize, ranks: usize) -> Result<()> {
    std::fs::write(dir.join(format!("{epoch}-{local}")), b"")?;
    let deadline = Instant::now() + Duration::from_secs(600);
    while (0..ranks).any(|r| !dir.join(format!("{epoch}-{r}")).exists()) {
        if Instant::now() > deadline {
            bail!("the other ranks did not reach epoch {epoch}");
        }
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    Ok(())
}

/// One side's result from its ranks' processes: epoch time is the slowest rank's, bytes and
/// counts add up, stall shares average.
pub(super) fn merge(mut parts: Vec<SideResult>) -> Result<SideResult> {
    let Some(mut out) = parts.pop() else { bail!("a side without results") };
    let n = parts.len() as f64 + 1.0;
    for e in &mut out.epochs {
        e.stall_share /= n;
    }
    for p in parts {
        out.max_used_bytes = out.max_used_bytes.max(p.max_used_bytes);
        out.peak_rss_bytes += p.peak_rss_bytes;
        for (e, q) in out.epochs.iter_mut().zip(p.epochs) {
            e.seconds = e.seconds.max(q.seconds);
            e.stall_share += q.stall_share / n;
            e.planned_hits += q.planned_hits;
            e.slow_bytes += q.slow_bytes;
            e.accesses += q.accesses;
            e.hits += q.hits;
            e.reuse_hits += q.reuse_hits;
            e.late_prefetches += q.late_prefetches;
            e.prefetched_bytes += q.prefetched_bytes;
            e.prefetched_unused_bytes += q.prefetched_unused_bytes;
        }
    }
    Ok(out)
}
