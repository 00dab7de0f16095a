//! One cache for the ranks of a node (`CachedTier::for_node`): several loaders read through
//! one cache object at once; one copy of a sample per node, the capacity never passed, every
//! byte right, a copy brought in by one rank served to another, and Belady on the union of
//! the node's ranks beating static where the node reads a different part of the dataset each
//! epoch.

use std::sync::Arc;
use std::time::Duration;

use ringtier_cache::{CacheConfig, CacheLevel, CachePolicy, CacheStats, CachedTier};
use ringtier_core::layers::{Throttle, Throttled};
use ringtier_core::{ops, MemoryTier, Tier};
use ringtier_dataset::{Dataset, Sampler};
use ringtier_loader::{Loader, LoaderConfig};
use ringtier_testkit::pattern;

async fn filled(n: usize, size: usize) -> (Arc<MemoryTier>, Vec<(String, Vec<u8>)>) {
    let tier = Arc::new(MemoryTier::new());
    let mut objects = Vec::new();
    for i in 0..n {
        let key = format!("s/{i:05}");
        let data = pattern(i as u64 + 1, size);
        ops::put(tier.as_ref(), &key, &data, 1 << 20).await.expect("put");
        objects.push((key, data));
    }
    (tier, objects)
}

fn check_capacity(c: &CachedTier) {
    for l in &c.stats().levels {
        assert!(l.used_bytes <= l.capacity_bytes, "level {} holds {} of {}", l.name, l.used_bytes, l.capacity_bytes);
    }
}

/// Runs the first `local` ranks of a job of `world` through one node cache, all at once, for
/// `epochs` epochs (each starts on every rank together). Checks every sample's bytes and the
/// capacity after every batch; returns the cache's stats per epoch.
async fn run_node(
    slow: Arc<dyn Tier>,
    objects: &[(String, Vec<u8>)],
    cfg: CacheConfig,
    local: usize,
    world: usize,
    epochs: u64,
) -> (CachedTier, Vec<CacheStats>) {
    let ds = Dataset::from_keys(slow, objects.iter().map(|(k, _)| k.clone())).await.expect("dataset");
    let samplers: Vec<Sampler> =
        (0..local).map(|r| Sampler::new(objects.len(), 9, r, world, true).expect("sampler")).collect();
    let cache = CachedTier::for_node(&ds, samplers, cfg).expect("node cache");
    let loaders: Vec<Arc<Loader>> = (0..local)
        .map(|r| {
            let cfg = LoaderConfig::default()
                .with_batch_size(8)
                .with_seed(9)
                .with_rank(r)
                .with_world(world)
                .with_node_cache(cache.clone(), r);
            Arc::new(Loader::new(ds.clone(), cfg).expect("loader"))
        })
        .collect();
    let objects: Arc<Vec<Vec<u8>>> = Arc::new(objects.iter().map(|(_, d)| d.clone()).collect());
    let mut per_epoch = Vec::new();
    for e in 0..epochs {
        let before = cache.stats();
        let mut ranks = tokio::task::JoinSet::new();
        for (r, loader) in loaders.iter().enumerate() {
            let (loader, cache, objects) = (Arc::clone(loader), cache.clone(), Arc::clone(&objects));
            ranks.spawn(async move {
                let mut epoch = loader.epoch(e, 0).expect("epoch");
                let mut n = 0;
                while let Some(batch) = epoch.next().await {
                    let batch = batch.expect("batch");
                    assert!(batch.skipped.is_empty(), "{:?}", batch.skipped);
                    for (i, s) in batch.indices.iter().zip(&batch.samples) {
                        assert!(s.as_slice() == objects[*i as usize].as_slice(), "rank {r}: sample {i} differs");
                    }
                    n += batch.samples.len();
                    check_capacity(&cache);
                    tokio::time::sleep(Duration::from_millis(1)).await; // the training step
                }
                assert_eq!(n, loader.samples_per_epoch());
            });
        }
        while let Some(r) = ranks.join_next().await {
            r.expect("a rank");
        }
        // Admissions finish in the background: let them land before the epoch's totals.
        tokio::time::sleep(Duration::from_millis(50)).await;
        per_epoch.push(cache.stats().since(&before));
    }
    (cache, per_epoch)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_ranks_share_one_copy_per_sample_within_capacity() {
    // 4 ranks = the whole job, one node cache of 20% of 400 samples, memory for 5% and a
    // directory for 15%. Each rank's shard changes every epoch, so most samples a rank finds
    // cached were brought in by another rank.
    let (mem, objects) = filled(400, 1000).await;
    let slow: Arc<dyn Tier> = mem;
    let total = 400_000u64;
    for policy in [CachePolicy::Static, CachePolicy::Lru, CachePolicy::Clairvoyant] {
        let dir = tempfile::tempdir().expect("dir");
        let cfg = CacheConfig::new(policy, vec![CacheLevel::memory(20_000), CacheLevel::dir(dir.path(), 60_000)]);
        let (cache, epochs) = run_node(slow.clone(), &objects, cfg, 4, 4, 3).await;
        // One copy per sample: the bytes the directory level counts are the files in it, one
        // per sample, and no sample is in both levels.
        let files: Vec<std::fs::DirEntry> = std::fs::read_dir(dir.path())
            .expect("ls")
            .flat_map(|d| std::fs::read_dir(d.expect("entry").path()).expect("ls cache").map(|f| f.expect("file")))
            .collect();
        let on_disk: u64 =
            files.iter().map(|f| f.metadata().expect("stat")).filter(std::fs::Metadata::is_file).map(|m| m.len()).sum();
        let st = cache.stats();
        assert_eq!(on_disk, st.levels[1].used_bytes, "{policy}: files vs the level's bytes");
        let held = st.levels[0].used_bytes + st.levels[1].used_bytes;
        assert!(held <= 80_000, "{policy}: {held}");
        for (e, d) in epochs.iter().enumerate() {
            // Every read was served once, from the cache or the slow tier.
            assert_eq!(d.accesses(), 400, "{policy} epoch {e}: {d:?}");
            assert_eq!(d.hit_bytes + d.miss_bytes, total, "{policy} epoch {e}: {d:?}");
        }
        if policy == CachePolicy::Static {
            // Static's copies are read once an epoch by whichever rank has them in its shard:
            // every copy the node holds is a hit in a warm epoch, whichever rank brought it in.
            for d in &epochs[1..] {
                assert_eq!(d.reuse_hits(), 80, "{d:?}");
                assert_eq!(d.slow_tier_bytes(), total - 80_000, "{d:?}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn belady_on_the_union_of_a_nodes_ranks_beats_static_when_the_node_reads_part_of_the_data() {
    // The first node (4 ranks) of a 16-rank job, a node cache of 10% of 800 samples: the node
    // reads a different quarter of the dataset every epoch. Static hits about c of those
    // reads; Belady on the node's union keeps the copies the node reads next, of all 4 ranks.
    let (mem, objects) = filled(800, 1000).await;
    let slow: Arc<dyn Tier> = Arc::new(Throttled::new(
        mem,
        Throttle { read_bytes_per_sec: Some(100 << 20), latency: Duration::from_millis(1), ..Throttle::bandwidth(1) },
    ));
    let level = || vec![CacheLevel::memory(80_000)];
    let (_, st) = run_node(slow.clone(), &objects, CacheConfig::new(CachePolicy::Static, level()), 4, 16, 4).await;
    let (cache, cv) =
        run_node(slow.clone(), &objects, CacheConfig::new(CachePolicy::Clairvoyant, level()), 4, 16, 4).await;
    check_capacity(&cache);
    let warm = |v: &[CacheStats], f: fn(&CacheStats) -> u64| v[1..].iter().map(f).sum::<u64>();
    let (cv_hits, st_hits) = (warm(&cv, CacheStats::reuse_hits), warm(&st, CacheStats::reuse_hits));
    assert!(cv_hits as f64 >= 1.8 * st_hits as f64, "clairvoyant {cv_hits} vs static {st_hits}: {cv:?}");
    let (cv_bytes, st_bytes) = (warm(&cv, CacheStats::slow_tier_bytes), warm(&st, CacheStats::slow_tier_bytes));
    assert!(
        (cv_bytes as f64) < 0.9 * st_bytes as f64,
        "slow-tier bytes: clairvoyant {cv_bytes} vs static {st_bytes}: {cv:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cache_checks_its_ranks() {
    let (mem, objects) = filled(8, 100).await;
    let ds = Dataset::from_keys(mem, objects.iter().map(|(k, _)| k.clone())).await.expect("dataset");
    let cfg = CacheConfig::new(CachePolicy::Clairvoyant, vec![CacheLevel::memory(400)]);
    let e = CachedTier::for_node(&ds, vec![], cfg.clone()).expect_err("no rank");
    assert!(e.to_string().contains("at least one rank"), "{e}");
    let samplers = vec![Sampler::new(8, 1, 0, 2, true).expect("s"), Sampler::new(8, 1, 1, 2, true).expect("s")];
    let cache = CachedTier::for_node(&ds, samplers, cfg).expect("cache");
    let e = cache.begin_rank_epoch(2, 0, 0).expect_err("rank index 2 of 2");
    assert!(e.to_string().contains("not one of the cache's 2 ranks"), "{e}");
    let e = cache.begin_rank_epoch(1, 0, 5).expect_err("past the shard");
    assert!(e.to_string().contains("past the end"), "{e}");
    cache.begin_rank_epoch(1, 0, 2).expect("resume mid-epoch");
    // A loader takes a cache or a node cache.
    let cfg = LoaderConfig::default()
        .with_batch_size(2)
        .with_world(2)
        .with_seed(1)
        .with_cache(CacheConfig::new(CachePolicy::Static, vec![CacheLevel::memory(400)]))
        .with_node_cache(cache.clone(), 0);
    let e = Loader::new(ds.clone(), cfg).expect_err("both");
    assert!(e.to_string().contains("not both"), "{e}");
}
