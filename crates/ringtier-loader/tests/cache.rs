//! The cache in front of a slow tier: read-through, capacity, the only copy, the loader's
//! policies end to end on a throttled tier, bad settings.

use std::sync::Arc;
use std::time::Duration;

use ringtier_cache::{CacheConfig, CacheLevel, CachePolicy, CachedTier};
use ringtier_core::layers::{Throttle, Throttled};
use ringtier_core::{ops, AlignedBuf, ErrorKind, MemoryTier, Tier};
use ringtier_dataset::Dataset;
use ringtier_loader::{Loader, LoaderConfig};
use ringtier_testkit::pattern;

async fn filled(n: usize, size: impl Fn(usize) -> usize) -> (Arc<MemoryTier>, Vec<(String, Vec<u8>)>) {
    let tier = Arc::new(MemoryTier::new());
    let mut objects = Vec::new();
    for i in 0..n {
        let key = format!("s/{i:05}");
        let data = pattern(i as u64 + 1, size(i));
        ops::put(tier.as_ref(), &key, &data, 1 << 20).await.expect("put");
        objects.push((key, data));
    }
    (tier, objects)
}

async fn read(tier: &dyn Tier, key: &str, offset: u64, len: usize) -> Vec<u8> {
    let buf = AlignedBuf::new(len + 8192, 4096).expect("buf");
    let (res, buf) = tier.read_at(key, offset, len, buf).await;
    let n = res.expect("read");
    buf.as_slice()[..n].to_vec()
}

fn check_capacity(c: &CachedTier) {
    for l in &c.stats().levels {
        assert!(l.used_bytes <= l.capacity_bytes, "level {} holds {} of {}", l.name, l.used_bytes, l.capacity_bytes);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_through_lru_in_memory_and_a_directory_keeps_every_byte_and_the_only_copy() {
    let (backing, objects) = filled(60, |i| 3000 + i * 101).await;
    let dir = tempfile::tempdir().expect("dir");
    let cfg = CacheConfig::new(CachePolicy::Lru, vec![CacheLevel::memory(40_000), CacheLevel::dir(dir.path(), 60_000)]);
    let cache = CachedTier::new(backing.clone(), cfg).expect("cache");
    // A working set of 15 objects (56 KB) read round after round: more than memory holds, so
    // LRU finds each in the directory, where memory's least recently used went.
    for round in 0..4 {
        for (key, data) in objects.iter().take(15) {
            // Whole-object reads (one byte more, as the loader asks) and a range in the middle.
            assert_eq!(&read(&cache, key, 0, data.len() + 1).await, data, "round {round} {key}");
            assert_eq!(read(&cache, key, 100, 50).await, data[100..150], "round {round} {key}");
            check_capacity(&cache);
            tokio::time::sleep(Duration::from_millis(5)).await; // admissions run in the background
        }
        // Objects read once in between: memory's working set changes.
        for (key, data) in objects.iter().skip(20 + round * 3).take(3) {
            assert_eq!(&read(&cache, key, 0, data.len() + 1).await, data, "round {round} {key}");
        }
    }
    // Everything once: the directory evicts too.
    for (key, data) in &objects {
        assert_eq!(&read(&cache, key, 0, data.len() + 1).await, data);
        tokio::time::sleep(Duration::from_millis(2)).await;
        check_capacity(&cache);
    }
    let st = cache.stats();
    assert!(st.levels[0].reuse_hits > 0 && st.levels[1].reuse_hits > 0, "{st:?}");
    assert!(st.evictions > 0, "the working set is larger than the cache: {st:?}");
    check_capacity(&cache);
    // Evictions dropped copies only: every object is still on the slow tier, whole.
    for (key, data) in &objects {
        assert_eq!(&ops::get(backing.as_ref(), key).await.expect("backing"), data);
    }
    // A rewrite through the cache reaches the slow tier and the stale copy is not served.
    let (key, _) = &objects[55];
    ops::put(&cache, key, b"new contents", 4096).await.expect("rewrite");
    assert_eq!(read(&cache, key, 0, 100).await, b"new contents");
    assert_eq!(ops::get(backing.as_ref(), key).await.expect("backing"), b"new contents");
    cache.delete(key).await.expect("delete");
    assert_eq!(backing.stat(key).await.expect_err("deleted").kind(), ErrorKind::NotFound);
    // The cache directory is the cache's own, and goes with it.
    let inside = std::fs::read_dir(dir.path()).expect("ls").count();
    assert_eq!(inside, 1, "one directory of this cache");
    drop(cache);
    // (Background admissions hold the cache until they finish.)
    for _ in 0..200 {
        if std::fs::read_dir(dir.path()).expect("ls").count() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 0, "removed with the cache");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_object_is_cached_whole_from_ranged_reads() {
    let (backing, objects) = filled(2, |i| 1_000_000 + i * 7).await;
    let cfg = CacheConfig::new(CachePolicy::Static, vec![CacheLevel::memory(4 << 20)]).with_range_bytes(64 << 10);
    let cache = CachedTier::new(backing.clone(), cfg).expect("cache");
    let (key, data) = &objects[1];
    // A piece in the middle: the object is fetched whole in 64 KiB ranges, in the background
    // (its room is reserved at once).
    assert_eq!(read(&cache, key, 300_000, 70_000).await, data[300_000..370_000]);
    for _ in 0..100 {
        if cache.stats().levels[0].used_bytes == data.len() as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(cache.stats().levels[0].used_bytes, data.len() as u64);
    // Now every piece is a hit and right.
    let before = cache.stats();
    let mut whole = Vec::new();
    for off in (0..data.len()).step_by(256 << 10) {
        whole.extend(read(&cache, key, off as u64, 256 << 10).await);
    }
    assert_eq!(&whole, data);
    let d = cache.stats().since(&before);
    // One access (offset 0), served from memory: at once, or after waiting for the copy still
    // on its way in (a late fetch counts as a miss that did not go to the slow tier).
    assert_eq!(d.reuse_hits() + d.late_prefetches, 1, "{d:?}");
    assert_eq!(d.misses, d.late_prefetches, "nothing read from the slow tier: {d:?}");
    assert_eq!(d.hit_bytes, data.len() as u64);
}

/// Runs `epochs` epochs of a loader with `cache` on a throttled tier, checking every sample's
/// bytes and the capacity after every batch. Returns the stats.
async fn run_loader(
    backing: Arc<dyn Tier>,
    objects: &[(String, Vec<u8>)],
    cache: CacheConfig,
    rank: usize,
    world: usize,
    epochs: u64,
) -> ringtier_cache::CacheStats {
    let ds = Dataset::from_keys(backing, objects.iter().map(|(k, _)| k.clone())).await.expect("dataset");
    let cfg =
        LoaderConfig::default().with_batch_size(16).with_seed(9).with_rank(rank).with_world(world).with_cache(cache);
    let loader = Loader::new(ds, cfg).expect("loader");
    let cached = loader.cache().expect("cache").clone();
    for e in 0..epochs {
        let mut epoch = loader.epoch(e, 0).expect("epoch");
        let mut n = 0;
        while let Some(batch) = epoch.next().await {
            let batch = batch.expect("batch");
            assert!(batch.skipped.is_empty(), "{:?}", batch.skipped);
            for (i, s) in batch.indices.iter().zip(&batch.samples) {
                assert!(s.as_slice() == objects[*i as usize].1.as_slice(), "sample {i} differs");
            }
            n += batch.samples.len();
            check_capacity(&cached);
            tokio::time::sleep(Duration::from_millis(2)).await; // the training step
        }
        assert_eq!(n, loader.samples_per_epoch());
    }
    cached.stats()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loader_policies_on_a_slow_tier_hit_what_they_should() {
    let (mem, objects) = filled(400, |i| 2000 + (i % 7) * 300).await;
    let slow: Arc<dyn Tier> = Arc::new(Throttled::new(
        mem,
        Throttle { read_bytes_per_sec: Some(200 << 20), latency: Duration::from_millis(2), ..Throttle::bandwidth(1) },
    ));
    let total: u64 = objects.iter().map(|(_, d)| d.len() as u64).sum();
    let cap = total / 4;
    let level = || vec![CacheLevel::memory(cap)];
    let none = run_loader(slow.clone(), &objects, CacheConfig::new(CachePolicy::None, vec![]), 0, 1, 2).await;
    assert_eq!((none.hits(), none.misses), (0, 800));
    let lru = run_loader(slow.clone(), &objects, CacheConfig::new(CachePolicy::Lru, level()), 0, 1, 2).await;
    let stat = run_loader(slow.clone(), &objects, CacheConfig::new(CachePolicy::Static, level()), 0, 1, 2).await;
    let cv = run_loader(slow.clone(), &objects, CacheConfig::new(CachePolicy::Clairvoyant, level()), 0, 1, 2).await;
    // Static keeps about a quarter of the bytes: about c of epoch 1's reads (binomial noise).
    let static_ratio = stat.hits() as f64 / 400.0;
    assert!((0.15..0.35).contains(&static_ratio), "static {stat:?}");
    // LRU: about c²/2 of epoch 1.
    assert!(lru.hits() < stat.hits(), "lru {lru:?} static {stat:?}");
    // Clairvoyant, one reader: every sample is read once an epoch, so no policy keeps more
    // than c of epoch 1's reads (every reuse is pending at the epoch boundary); Belady reaches
    // that bound as static does (within the noise of which samples fit in the bytes). Its
    // prefetcher fills the room that is free (epoch 0) ahead of the reads.
    assert!(cv.reuse_hits() as f64 >= 0.9 * stat.reuse_hits() as f64, "clairvoyant {cv:?} static {stat:?}");
    assert!(cv.reuse_hits() as f64 <= 0.35 * 400.0, "above the bound c: {cv:?}");
    assert!(cv.prefetched > 0 && cv.levels[0].prefetch_hits > 0, "{cv:?}");
    assert!(cv.mean_prefetch_lead_seconds() > 0.0);
    // What the cache read from the slow tier: every read it did not serve, and its own fetches.
    assert_eq!(none.slow_tier_bytes(), 2 * total, "{none:?}");
    assert!(stat.slow_tier_bytes() < none.slow_tier_bytes() && cv.slow_tier_bytes() < none.slow_tier_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clairvoyant_per_rank_without_coordination() {
    // Four ranks, each its own cache of 10% of the dataset and its own shard (a different
    // quarter every epoch): each computes its future from the seed. Every rank reads every one
    // of its samples right, and its hits (Belady on its own future, no staged budget) are at
    // least 1.8x what a static cache of the same size gets.
    let (mem, objects) = filled(800, |_| 1000).await;
    let slow: Arc<dyn Tier> = mem;
    let cap = 80_000;
    for rank in 0..4 {
        let cv = CacheConfig::new(CachePolicy::Clairvoyant, vec![CacheLevel::memory(cap)]);
        let cv = run_loader(slow.clone(), &objects, cv, rank, 4, 3).await;
        let st = CacheConfig::new(CachePolicy::Static, vec![CacheLevel::memory(cap)]);
        let st = run_loader(slow.clone(), &objects, st, rank, 4, 3).await;
        assert_eq!(cv.accesses(), 600);
        // Served by the cache: at once, or after waiting for a prefetch on its way (timing).
        let served = cv.hits() + cv.late_prefetches;
        assert!(served as f64 >= 1.8 * st.hits() as f64, "rank {rank}: clairvoyant {cv:?} static {st:?}");
        assert!(cv.unused_evicted <= cv.prefetched, "{cv:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_settings_are_clear_errors() {
    let (backing, objects) = filled(4, |_| 100).await;
    let e = CachedTier::new(backing.clone(), CacheConfig::new(CachePolicy::Lru, vec![CacheLevel::memory(0)]))
        .expect_err("budget 0");
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(e.to_string().contains("capacity of 0 bytes"), "{e}");
    let e = CachedTier::new(backing.clone(), CacheConfig::new(CachePolicy::Static, vec![])).expect_err("no level");
    assert!(e.to_string().contains("at least one cache level"), "{e}");
    let e = CachedTier::new(backing.clone(), CacheConfig::new(CachePolicy::Clairvoyant, vec![CacheLevel::memory(10)]))
        .expect_err("clairvoyant without a future");
    assert!(e.to_string().contains("future"), "{e}");
    let e = CacheConfig::new(CachePolicy::Clairvoyant, vec![CacheLevel::memory(100)])
        .with_prefetch_bytes(100)
        .validate()
        .expect_err("budget takes it all");
    assert!(e.to_string().contains("no room"), "{e}");
    // A cache directory that cannot be made or written: under a regular file, and on a
    // read-only file system (root ignores permission bits, not those).
    let file = tempfile::NamedTempFile::new().expect("file");
    for dir in [file.path().join("cache"), std::path::PathBuf::from("/proc/ringtier-cache")] {
        let cfg = CacheConfig::new(CachePolicy::Lru, vec![CacheLevel::dir(&dir, 1 << 20)]);
        let e = CachedTier::new(backing.clone(), cfg).expect_err("unwritable");
        assert!(e.to_string().contains("cache directory"), "{e}");
        // Through the loader: the same error when it is made, nothing read.
        let ds = Dataset::from_keys(backing.clone(), objects.iter().map(|(k, _)| k.clone())).await.expect("dataset");
        let cfg = LoaderConfig::default()
            .with_batch_size(2)
            .with_cache(CacheConfig::new(CachePolicy::Clairvoyant, vec![CacheLevel::dir(&dir, 1 << 20)]));
        let e = Loader::new(ds, cfg).expect_err("unwritable");
        assert!(e.to_string().contains("cache directory"), "{e}");
    }
    assert_eq!("belady".parse::<CachePolicy>().expect_err("unknown").kind(), ErrorKind::InvalidInput);
}
