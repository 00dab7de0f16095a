//! The read hot path allocates nothing per request: a counting global allocator shows that
//! a batch of 512 reads allocates no more than a batch of 16 (a few allocations per batch,
//! none per request), both for many small files and for ranges of one open file.
//!
//! One test in its own binary, so no other test allocates while it counts.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use ringtier_core::{BufferPool, PoolConfig, ReadBatch, Tier};
use ringtier_testkit::pattern;
use ringtier_uring::{UringConfig, UringTier, UringTierOptions};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn read_hot_path_allocates_nothing_per_request() {
    let dir = tempfile::Builder::new().prefix("alloc").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    const N: usize = 512;
    let keys: Vec<String> = (0..N).map(|i| format!("c{}/f{i:04}", i % 4)).collect();
    for (i, k) in keys.iter().enumerate() {
        let p = dir.path().join(k);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, pattern(i as u64, 3000 + i)).expect("write");
    }
    std::fs::write(dir.path().join("big"), pattern(1, 8 << 20)).expect("write");
    let pool = BufferPool::new(PoolConfig::new(16 << 10, N, 4096)).expect("pool");
    let options = UringTierOptions::default().with_pool(pool.clone());
    let tier = UringTier::with_options(dir.path(), UringConfig::default(), options).expect("tier");
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");

    rt.block_on(async {
        let file = tier.open_file("big").await.expect("open");
        let mut batch = ReadBatch::with_capacity(N, N * 16);

        // Counts allocations of one batch of `n` key reads (buffers come from the pool).
        let keyed = |n: usize, mut batch: ReadBatch| {
            let tier = tier.clone();
            let pool = pool.clone();
            let keys = &keys;
            async move {
                let before = ALLOCS.load(Ordering::SeqCst);
                for k in keys.iter().take(n) {
                    batch.push(k, 0, 3000, pool.try_acquire().expect("buffer"));
                }
                let mut batch = tier.read_batch(batch).await;
                let ok = batch.iter().filter(|(_, e)| matches!(e.result(), Some(Ok(3000)))).count();
                batch.clear();
                (ALLOCS.load(Ordering::SeqCst) - before, ok, batch)
            }
        };
        // Warm up: grow every reusable vector to its steady-state size.
        let (_, ok, b) = keyed(N, std::mem::take(&mut batch)).await;
        assert_eq!(ok, N);
        let (small, ok16, b) = keyed(16, b).await;
        let (large, ok512, b) = keyed(N, b).await;
        assert_eq!((ok16, ok512), (16, N));
        assert!(large <= small + 2, "512 key reads allocated {large} times, 16 reads {small}: per-request allocation");
        assert!(small <= 12, "a batch allocates only a few times: {small}");
        batch = b;

        let ranged = |n: usize, mut batch: ReadBatch| {
            let pool = pool.clone();
            let file = &file;
            async move {
                let before = ALLOCS.load(Ordering::SeqCst);
                for i in 0..n as u64 {
                    batch.push_range((i * 7919 % 512) * (16 << 10), 16 << 10, pool.try_acquire().expect("buffer"));
                }
                let mut batch = file.read_batch(batch).await;
                let ok = batch.iter().filter(|(_, e)| matches!(e.result(), Some(Ok(16384)))).count();
                batch.clear();
                (ALLOCS.load(Ordering::SeqCst) - before, ok, batch)
            }
        };
        let (_, _, b) = ranged(N, batch).await;
        let (small, ok16, b) = ranged(16, b).await;
        let (large, ok512, _b) = ranged(N, b).await;
        assert_eq!((ok16, ok512), (16, N));
        assert!(large <= small + 2, "512 range reads allocated {large} times, 16 reads {small}");
        assert!(small <= 12, "a batch allocates only a few times: {small}");
        eprintln!("allocations per batch of file ranges: {small} (16 requests), {large} (512 requests)");
    });
}
