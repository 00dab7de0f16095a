//! The CPU staging path on real files through the io_uring tier, and clear errors.

use std::sync::Arc;

use ringtier_core::{ErrorKind, Tier};
use ringtier_stage::{PinnedPool, Pinning, Stager, Target};
use ringtier_uring::{UringConfig, UringTier, UringTierOptions};

fn files(n: usize) -> (tempfile::TempDir, Vec<(String, Vec<u8>)>) {
    let dir = tempfile::Builder::new().prefix("stage").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let mut out = Vec::new();
    for i in 0..n {
        let data: Vec<u8> = (0..10_000 + i * 333).map(|j| ((i * 7 + j) % 251) as u8).collect();
        let key = format!("f{i}");
        std::fs::write(dir.path().join(&key), &data).expect("write");
        out.push((key, data));
    }
    (dir, out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_stage_into_host_memory_through_a_registered_pinned_pool() {
    let (dir, data) = files(24);
    let pinned = PinnedPool::new(64 << 10, 16, Target::Host).expect("pinned pool");
    assert_eq!(pinned.pinning(), Pinning::Mlock, "root can lock 1 MiB");
    let options = UringTierOptions::default().with_pool(pinned.pool().clone());
    let uring = UringTier::with_options(dir.path(), UringConfig::default(), options).expect("tier");
    let tier: Arc<dyn Tier> = Arc::new(uring.clone());
    let stager = Stager::new(tier, pinned.clone(), Target::Host).expect("stager");
    // Two batches of 8 in flight at once (double buffering), then a third.
    let req = |r: std::ops::Range<usize>| -> Vec<(String, usize)> {
        data[r].iter().map(|(k, d)| (k.clone(), d.len())).collect()
    };
    let a = stager.stage(&req(0..8)).await.expect("stage a");
    let b = stager.stage(&req(8..16)).await.expect("stage b");
    let staged_a = a.wait().await.expect("a");
    let c = stager.stage(&req(16..24)).await.expect("stage c");
    for (i, s) in
        staged_a.iter().chain(b.wait().await.expect("b").iter()).chain(c.wait().await.expect("c").iter()).enumerate()
    {
        assert_eq!(s.as_host_slice().expect("host target"), data[i].1.as_slice(), "sample {i}");
    }
    assert_eq!(pinned.pool().in_use(), 0, "pinned buffers recycled after their copies");
    assert!(uring.stats().fixed_buffer_reads >= 24, "read straight into registered pinned buffers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_clear_error() {
    let (dir, data) = files(4);
    let pinned = PinnedPool::new(4096, 2, Target::Host).expect("pool");
    let tier: Arc<dyn Tier> = Arc::new(UringTier::new(dir.path(), UringConfig::default()).expect("tier"));
    let stager = Stager::new(Arc::clone(&tier), pinned.clone(), Target::Host).expect("stager");
    let too_many: Vec<(String, usize)> = data.iter().map(|(k, _)| (k.clone(), 100)).collect();
    let err = stager.stage(&too_many).await.expect_err("batch larger than the pool");
    assert!(err.to_string().contains("larger than the pinned pool"), "{err}");
    let err = stager.stage(&[(data[0].0.clone(), data[0].1.len())]).await.expect_err("sample larger than a buffer");
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    let err = stager.stage(&[("missing".to_string(), 10)]).await.expect_err("missing file");
    assert_eq!(err.kind(), ErrorKind::NotFound);
    // No GPU here: a CUDA target is an error from the API (no feature, or no driver), never a panic.
    let err = Stager::new(tier, pinned, Target::Cuda(0)).expect_err("no CUDA");
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    let err = PinnedPool::new(4096, 2, Target::Cuda(3)).expect_err("no CUDA");
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(PinnedPool::new(0, 2, Target::Host).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_batches_give_their_buffers_back_once_copied() {
    let (dir, data) = files(16);
    let pinned = PinnedPool::new(64 << 10, 8, Target::Host).expect("pinned pool");
    let options = UringTierOptions::default().with_pool(pinned.pool().clone());
    let tier: Arc<dyn Tier> =
        Arc::new(UringTier::with_options(dir.path(), UringConfig::default(), options).expect("tier"));
    let stager = Stager::new(tier, pinned.clone(), Target::Host).expect("stager");
    let req = |r: std::ops::Range<usize>| -> Vec<(String, usize)> {
        data[r].iter().map(|(k, d)| (k.clone(), d.len())).collect()
    };
    // Dropped unwaited, and a wait dropped after one poll: neither hands buffers back early
    // nor loses them.
    drop(stager.stage(&req(0..8)).await.expect("stage"));
    let b = stager.stage(&req(8..16)).await.expect("stage");
    let _ = tokio::time::timeout(std::time::Duration::ZERO, b.wait()).await;
    let t = std::time::Instant::now();
    while pinned.pool().in_use() > 0 && t.elapsed() < std::time::Duration::from_secs(10) {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    assert_eq!(pinned.pool().in_use(), 0, "every pinned buffer came back");
    // The whole pool is usable again.
    let staged = stager.stage(&req(0..8)).await.expect("stage").wait().await.expect("wait");
    for (i, s) in staged.iter().enumerate() {
        assert_eq!(s.as_host_slice().expect("host target"), data[i].1.as_slice(), "sample {i}");
    }
}
