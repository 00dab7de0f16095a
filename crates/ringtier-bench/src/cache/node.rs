//! One side of `bench cache` in its own process: the node's ranks as loaders over one
//! throttled, counted slow tier, with one cache for the node or one per rank; every epoch
//! starts on all ranks together and ends when the slowest is done.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ringtier_core::layers::{Throttle, Throttled};
use ringtier_core::{PosixConfig, PosixTier, Tier};
use ringtier_loader::{
    CacheConfig, CacheLevel, CachePolicy, CacheStats, CachedTier, Dataset, Loader, LoaderConfig, Sampler,
};

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
    let result = rt.block_on(run(a, policy, fraction, ranks, &dir))?;
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
) -> Result<SideResult> {
    let files: Arc<dyn Tier> = Arc::new(PosixTier::new(PosixConfig::new(dir.join("cache-dataset")))?);
    let throttle = Throttle {
        read_bytes_per_sec: Some((a.bandwidth_mbs * 1e6) as u64),
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
    let caches: Vec<(CachedTier, usize)> = match a.scope {
        CacheScope::Node => {
            let mut cfg = cache_config(a, policy, capacity, dir);
            cfg.prefetch_depth = a.in_flight * ranks;
            let c = CachedTier::for_node(&ds, samplers.clone(), cfg)?;
            (0..ranks).map(|r| (c.clone(), r)).collect()
        }
        CacheScope::Rank => {
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
    for (r, (cache, _)) in caches.iter().enumerate() {
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
    let used = |cs: &[&CachedTier]| -> u64 { cs.iter().flat_map(|c| c.stats().levels).map(|l| l.used_bytes).sum() };
    let step = Duration::from_secs_f64(a.step_ms / 1000.0);
    let mut epochs = Vec::new();
    let mut max_used = 0u64;
    for e in 0..a.epochs {
        let before = stats(&distinct);
        let t = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for (r, loader) in loaders.iter().enumerate() {
            let (cache, local) = caches[r].clone();
            let loader = Arc::clone(loader);
            let all: Vec<CachedTier> = distinct.iter().map(|c| (*c).clone()).collect();
            tasks.spawn(async move {
                cache.begin_rank_epoch(local, e, 0)?;
                let mut epoch = loader.epoch(e, 0)?;
                let mut max_used = 0u64;
                while let Some(batch) = epoch.next().await {
                    let batch = batch?;
                    if !batch.skipped.is_empty() {
                        bail!("samples skipped: {:?}", batch.skipped);
                    }
                    max_used = max_used.max(all.iter().flat_map(|c| c.stats().levels).map(|l| l.used_bytes).sum());
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
            stall_share: stall / ranks as f64,
            slow_bytes: sum(&|s| s.slow_tier_bytes()),
            accesses: sum(&|s| s.accesses()),
            hits: sum(&|s| s.hits()),
            reuse_hits: sum(&|s| s.reuse_hits()),
            late_prefetches: sum(&|s| s.late_prefetches),
            prefetched_bytes: sum(&|s| s.prefetched_bytes),
            prefetched_unused_bytes: sum(&|s| s.unused_evicted_bytes),
        });
    }
    let capacity_bytes = if policy == CachePolicy::None { 0 } else { capacity };
    if max_used > capacity_bytes {
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
