//! The loader's read-through cache in front of the S3 tier (s3s-fs on loopback): bytes right,
//! repeated reads served locally, large objects cached from ranged reads, capacity kept, the
//! bucket untouched by evictions.

use std::sync::Arc;
use std::time::Duration;

use ringtier_cache::{CacheConfig, CacheLevel, CachePolicy, CachedTier};
use ringtier_core::{AlignedBuf, Tier};
use ringtier_dataset::Dataset;
use ringtier_loader::{Loader, LoaderConfig};
use ringtier_s3::S3Tier;
use ringtier_testkit::pattern;
use ringtier_testkit::s3::{test_config, S3sFsServer};

async fn bucket(
    server: &S3sFsServer,
    n: usize,
    size: impl Fn(usize) -> usize,
) -> (Arc<dyn Tier>, Vec<(String, Vec<u8>)>) {
    let tier = S3Tier::new(test_config(&server.endpoint(), "data", "ds")).expect("tier");
    tier.create_bucket().await.expect("bucket");
    let mut objects = Vec::new();
    for i in 0..n {
        let key = format!("obj/{i:04}.bin");
        let data = pattern(7 + i as u64, size(i));
        tier.put_object(&key, data.clone().into()).await.expect("put");
        objects.push((key, data));
    }
    (Arc::new(tier), objects)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dataset_on_s3_through_a_local_cache() {
    let s3_dir = tempfile::tempdir().expect("tempdir");
    let server = S3sFsServer::start(s3_dir.path()).expect("s3s-fs");
    let (s3, objects) = bucket(&server, 40, |i| 2000 + i * 333).await;
    let total: u64 = objects.iter().map(|(_, d)| d.len() as u64).sum();
    let cache_dir = tempfile::tempdir().expect("cache dir");
    for policy in [CachePolicy::Lru, CachePolicy::Static, CachePolicy::Clairvoyant] {
        let ds = Dataset::from_keys(Arc::clone(&s3), objects.iter().map(|(k, _)| k.clone())).await.expect("dataset");
        // Half the dataset in a local directory level.
        let cache = CacheConfig::new(policy, vec![CacheLevel::dir(cache_dir.path(), total / 2)]);
        let cfg = LoaderConfig::default().with_batch_size(8).with_seed(4).with_cache(cache);
        let loader = Loader::new(ds, cfg).expect("loader");
        let cached = loader.cache().expect("cache").clone();
        for e in 0..3 {
            let mut epoch = loader.epoch(e, 0).expect("epoch");
            while let Some(batch) = epoch.next().await {
                let batch = batch.expect("batch");
                for (i, s) in batch.indices.iter().zip(&batch.samples) {
                    assert!(s.as_slice() == objects[*i as usize].1.as_slice(), "{policy}: sample {i} differs");
                }
                for l in cached.stats().levels {
                    assert!(l.used_bytes <= l.capacity_bytes, "{policy}: {l:?}");
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let st = cached.stats();
        assert_eq!(st.accesses(), 120, "{policy}: {st:?}");
        assert!(st.hits() > 0, "{policy}: repeated epochs hit the local copy: {st:?}");
        assert!(st.miss_bytes < 3 * total, "{policy}: {st:?}");
    }
    // The bucket still has every object, whole: the cache only dropped its own copies.
    for (key, data) in &objects {
        assert_eq!(s3.stat(key).await.expect("stat").size, data.len() as u64);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_object_on_s3_is_cached_from_range_gets() {
    let s3_dir = tempfile::tempdir().expect("tempdir");
    let server = S3sFsServer::start(s3_dir.path()).expect("s3s-fs");
    let (s3, objects) = bucket(&server, 1, |_| 3 << 20).await;
    let (key, data) = &objects[0];
    let cfg = CacheConfig::new(CachePolicy::Lru, vec![CacheLevel::memory(8 << 20)]).with_range_bytes(512 << 10);
    let cache = CachedTier::new(Arc::clone(&s3), cfg).expect("cache");
    let read = |off: u64, len: usize| {
        let cache = cache.clone();
        async move {
            let (res, buf) = cache.read_at(key, off, len, AlignedBuf::new(len + 4096, 4096).expect("buf")).await;
            let n = res.expect("read");
            buf.as_slice()[..n].to_vec()
        }
    };
    assert_eq!(read(1 << 20, 4096).await, data[1 << 20..(1 << 20) + 4096]);
    let mut whole = Vec::new();
    for off in (0..data.len()).step_by(1 << 20) {
        whole.extend(read(off as u64, 1 << 20).await);
    }
    assert_eq!(&whole, data);
    let st = cache.stats();
    assert_eq!(st.levels[0].used_bytes, data.len() as u64, "{st:?}");
    // The ranged reads after the first were served locally (or waited for the copy on its way).
    assert!(st.hit_bytes >= 2 << 20, "{st:?}");
}
