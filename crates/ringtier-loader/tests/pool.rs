//! The loader reads into the io_uring tier's registered buffer pool when the tier has one of
//! the right shape, and allocates its own otherwise.

use std::sync::Arc;

use ringtier_core::{BufferPool, PoolConfig, Tier};
use ringtier_dataset::Dataset;
use ringtier_loader::{Loader, LoaderConfig};
use ringtier_testkit::pattern;
use ringtier_uring::{UringConfig, UringTier, UringTierOptions};

fn files(n: usize) -> (tempfile::TempDir, Vec<Vec<u8>>) {
    let dir = tempfile::Builder::new().prefix("pool").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let data: Vec<Vec<u8>> = (0..n).map(|i| pattern(i as u64, 1000 + i * 977)).collect();
    for (i, d) in data.iter().enumerate() {
        std::fs::write(dir.path().join(format!("s{i:03}")), d).expect("write");
    }
    (dir, data)
}

async fn read_epoch(loader: &Loader, data: &[Vec<u8>]) {
    let mut e = loader.epoch(0, 0).expect("epoch");
    let mut n = 0;
    while let Some(b) = e.next().await {
        let b = b.expect("batch");
        for (i, s) in b.indices.iter().zip(&b.samples) {
            assert_eq!(s.as_slice(), &data[*i as usize][..], "sample {i}");
            n += 1;
        }
    }
    assert_eq!(n, data.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loader_reads_into_the_tiers_registered_pool() {
    let (dir, data) = files(40);
    let cfg = LoaderConfig::default().with_batch_size(4).with_prefetch(2);
    let max = data.iter().map(Vec::len).max().unwrap_or(0) as u64;
    let pool = BufferPool::new(Loader::pool_config(max, 4096, &cfg)).expect("pool");
    let uring = Arc::new(
        UringTier::with_options(dir.path(), UringConfig::default(), UringTierOptions::default().with_pool(pool))
            .expect("tier"),
    );
    let tier: Arc<dyn Tier> = uring.clone();
    let loader = Loader::new(Dataset::from_dir(tier, dir.path()).await.expect("dataset"), cfg).expect("loader");
    assert!(loader.uses_tier_pool(), "one pool, the tier's");
    read_epoch(&loader, &data).await;
    let stats = uring.stats();
    if stats.register_fallbacks == 0 {
        assert!(stats.fixed_buffer_reads >= data.len() as u64, "{stats:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_too_small_for_the_loader_is_not_used() {
    let (dir, data) = files(12);
    let cfg = LoaderConfig::default().with_batch_size(4).with_prefetch(2);
    let small = BufferPool::new(PoolConfig::new(4096, 2, 4096)).expect("pool");
    let tier: Arc<dyn Tier> = Arc::new(
        UringTier::with_options(dir.path(), UringConfig::default(), UringTierOptions::default().with_pool(small))
            .expect("tier"),
    );
    let loader = Loader::new(Dataset::from_dir(tier, dir.path()).await.expect("dataset"), cfg).expect("loader");
    assert!(!loader.uses_tier_pool());
    read_epoch(&loader, &data).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_larger_than_a_pooled_buffer_are_read_in_pieces_through_io_uring() {
    // Samples of up to ~300 KiB with a 16 KiB read size: the pool is sized by the read size,
    // not by the largest file, and the large samples come back whole and intact.
    let dir = tempfile::Builder::new().prefix("pieces").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let sizes = [0usize, 1, 4096, 16 * 1024, 16 * 1024 + 1, 100_003, 300_000, 7];
    let data: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| pattern(i as u64, n)).collect();
    for (i, d) in data.iter().enumerate() {
        std::fs::write(dir.path().join(format!("s{i:03}")), d).expect("write");
    }
    let cfg = LoaderConfig::default().with_batch_size(3).with_prefetch(1).with_read_size(16 * 1024);
    let max = data.iter().map(Vec::len).max().unwrap_or(0) as u64;
    let want = Loader::pool_config(max, 4096, &cfg);
    assert_eq!(want.buf_size, 16 * 1024 + 4096 + 4096, "the pool follows the read size, not the largest file");
    let pool = BufferPool::new(want).expect("pool");
    let uring = Arc::new(
        UringTier::with_options(dir.path(), UringConfig::default(), UringTierOptions::default().with_pool(pool))
            .expect("tier"),
    );
    let tier: Arc<dyn Tier> = uring.clone();
    let loader = Loader::new(Dataset::from_dir(tier, dir.path()).await.expect("dataset"), cfg).expect("loader");
    assert!(loader.uses_tier_pool());
    assert_eq!(loader.pool_bytes(), (1 + 2) * 3 * (16 * 1024 + 8192));
    read_epoch(&loader, &data).await;
}
