//! Registered buffers with a memlock limit too low: the tier falls back to plain buffers,
//! says so once, counts it, and reads correctly. Its own binary: it lowers RLIMIT_MEMLOCK
//! and drops CAP_IPC_LOCK (which root has) for the process.

use ringtier_core::{ops, BufferPool, PoolConfig, ReadBatch, Tier};
use ringtier_testkit::pattern;
use ringtier_uring::{UringConfig, UringTier, UringTierOptions};

#[test]
fn low_memlock_falls_back_to_plain_buffers() {
    caps::drop(None, caps::CapSet::Effective, caps::Capability::CAP_IPC_LOCK).expect("drop CAP_IPC_LOCK");
    let lim = libc::rlimit { rlim_cur: 64 << 10, rlim_max: 64 << 10 };
    // SAFETY: setrlimit with a valid rlimit struct; lowering a limit needs no privilege.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) }, 0);

    let dir = tempfile::Builder::new().prefix("memlock").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    std::fs::write(dir.path().join("x"), pattern(5, 1 << 20)).expect("write");
    let pool = BufferPool::new(PoolConfig::new(1 << 20, 16, 4096)).expect("pool");
    let options = UringTierOptions::default().with_pool(pool.clone());
    let tier = UringTier::with_options(dir.path(), UringConfig::default(), options).expect("tier still opens");
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    rt.block_on(async {
        let mut batch = ReadBatch::new();
        batch.push("x", 0, 1 << 20, pool.acquire().await);
        let batch = tier.read_batch(batch).await;
        let (_, e) = batch.iter().next().expect("one");
        assert_eq!(*e.result().expect("done").as_ref().expect("read"), 1 << 20);
        assert_eq!(e.buf().expect("buf").as_slice(), pattern(5, 1 << 20));
        assert_eq!(ops::get(&tier, "x").await.expect("get"), pattern(5, 1 << 20));
    });
    let s = tier.stats();
    assert_eq!(s.register_fallbacks, 1, "one fallback, for the one ring: {s:?}");
    assert_eq!(s.fixed_buffer_reads, 0, "{s:?}");
}
