//! The checkpoint store on memory and real file tiers: durability, drain, eviction, fallbacks,
//! recovery and injected faults.

use std::sync::Arc;
use std::time::Duration;

use ringtier_core::layers::{Throttle, Throttled};
use ringtier_core::{ops, ErrorKind, MemoryTier, Tier};
use ringtier_migrate::{CheckpointStore, OnFull, Part, StoreConfig};
use ringtier_testkit::layers::{Fault, FaultInjecting, FaultOp, FaultRule, Trigger};
use ringtier_testkit::pattern;
use ringtier_uring::{UringConfig, UringTier, UringTierOptions};

fn mem(name: &str) -> Arc<dyn Tier> {
    Arc::new(MemoryTier::new().named(name))
}

fn parts_of(step: u64) -> Vec<(String, Vec<u8>)> {
    vec![
        ("model".to_string(), pattern(step * 3, 300_000 + step as usize)),
        ("optimizer".to_string(), pattern(step * 3 + 1, 200_001)),
        ("meta".to_string(), format!("{{\"step\": {step}}}").into_bytes()),
    ]
}

async fn save(store: &CheckpointStore, step: u64) -> ringtier_core::Result<ringtier_migrate::SaveReport> {
    let data = parts_of(step);
    store.save(step, data.iter().map(|(n, d)| Part::bytes(n.clone(), d)).collect()).await
}

fn small_chunks() -> StoreConfig {
    StoreConfig::default().with_chunk_bytes(64 << 10)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn save_drain_evict_and_restore() {
    let (fast, slow) = (mem("fast"), mem("slow"));
    let cfg = small_chunks().with_keep_last(1);
    let store = CheckpointStore::open(vec![Arc::clone(&fast), Arc::clone(&slow)], cfg).await.expect("open");
    for step in [10, 20, 30] {
        let r = save(&store, step).await.expect("save");
        assert_eq!(r.tier, "fast");
        assert!(!r.wrote_through);
    }
    store.drain().await.expect("drain");
    assert_eq!(store.drain_backlog_bytes(), 0);
    let list = store.list().await.expect("list");
    let where_: Vec<(u64, Vec<String>)> = list.iter().map(|c| (c.step, c.tiers.clone())).collect();
    assert_eq!(
        where_,
        [
            (10, vec!["slow".to_string()]),
            (20, vec!["slow".to_string()]),
            (30, vec!["fast".to_string(), "slow".to_string()])
        ],
        "keep_last 1 on the fast tier, everything on the slow one"
    );
    assert_eq!(store.latest().await.expect("latest"), Some(30));
    for step in [10, 20, 30] {
        let r = store.load(step).await.expect("load");
        assert_eq!(r.parts, parts_of(step));
        assert!(r.fallbacks.is_empty());
        assert_eq!(r.tier, if step == 30 { "fast" } else { "slow" });
    }
    let err = store.load(99).await.expect_err("missing");
    assert_eq!(err.kind(), ErrorKind::NotFound);
    let stats = store.drain_stats();
    let bytes: u64 = [10, 20, 30].iter().map(|s| parts_of(*s).iter().map(|(_, d)| d.len() as u64).sum::<u64>()).sum();
    assert_eq!((stats.checkpoints, stats.bytes), (3, bytes), "{stats:?}");
    assert!(stats.paused_seconds <= stats.busy_seconds, "{stats:?}");
    let rate = stats.copy_bytes_per_sec().expect("a copy rate after draining");
    assert!(rate >= bytes as f64 / stats.busy_seconds, "pauses are excluded: {stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_parts_and_bad_parts() {
    let store = CheckpointStore::open(vec![mem("fast"), mem("slow")], small_chunks()).await.expect("open");
    let big = pattern(9, 1_000_003);
    store
        .save(1, vec![Part::reader("weights", std::io::Cursor::new(big.clone()), Some(big.len() as u64))])
        .await
        .expect("streamed save");
    assert_eq!(store.load(1).await.expect("load").parts, [("weights".to_string(), big)]);
    for bad in ["a/b", "..", "MANIFEST.json", "", "x\0"] {
        let err = store.save(2, vec![Part::bytes(bad, b"x")]).await.expect_err(bad);
        assert_eq!(err.kind(), ErrorKind::InvalidKey, "{bad}: {err}");
    }
    let err = store.save(2, vec![Part::bytes("a", b"x"), Part::bytes("a", b"y")]).await.expect_err("dup");
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    let err = store.save(1, vec![Part::bytes("a", b"x")]).await.expect_err("same step");
    assert_eq!(err.kind(), ErrorKind::AlreadyExists);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_copies_fall_back_to_slower_ones() {
    let (fast, slow) = (mem("fast"), mem("slow"));
    let cfg = small_chunks().with_keep_last(10);
    let store = CheckpointStore::open(vec![Arc::clone(&fast), Arc::clone(&slow)], cfg).await.expect("open");
    for step in 1..=4 {
        save(&store, step).await.expect("save");
    }
    store.drain().await.expect("drain");
    let key = |step: u64, what: &str| format!("ckpt/{step:020}/{what}");
    // 1: a flipped byte; 2: a truncated part; 3: a corrupt manifest; 4: an unknown version.
    let mut model = ops::get(fast.as_ref(), &key(1, "parts/model")).await.expect("get");
    model[1000] ^= 1;
    ops::put(fast.as_ref(), &key(1, "parts/model"), &model, 1 << 20).await.expect("put");
    let opt = ops::get(fast.as_ref(), &key(2, "parts/optimizer")).await.expect("get");
    ops::put(fast.as_ref(), &key(2, "parts/optimizer"), &opt[..opt.len() / 2], 1 << 20).await.expect("put");
    ops::put(fast.as_ref(), &key(3, "MANIFEST.json"), b"{ not json", 4096).await.expect("put");
    let m = String::from_utf8(ops::get(fast.as_ref(), &key(4, "MANIFEST.json")).await.expect("get")).expect("utf8");
    ops::put(fast.as_ref(), &key(4, "MANIFEST.json"), m.replace("\"version\": 2", "\"version\": 7").as_bytes(), 4096)
        .await
        .expect("put");
    for (step, why) in [(1, "checksum mismatch"), (2, "truncated"), (3, "not JSON"), (4, "unknown version 7")] {
        let r = store.load(step).await.expect("falls back");
        // A bad part is read from the slower copy, the good parts still from the fast one; a
        // bad manifest sends every part to the slower copy.
        let expect = match step {
            1 => "slow, fast", // the model, the first part, from the slow copy
            2 => "fast, slow", // the optimizer, the second
            _ => "slow",
        };
        assert_eq!(r.tier, expect, "step {step}");
        assert_eq!(r.parts, parts_of(step));
        assert!(r.fallbacks.len() == 1 && r.fallbacks[0].contains(why), "step {step}: {:?}", r.fallbacks);
        assert!(r.fallbacks[0].contains("fast"), "names the tier");
        let v = store.verify(step).await.expect("verify");
        assert!(v[0].1.is_err() && v[1].1.is_ok(), "step {step}: {v:?}");
    }
    // With no good copy left, the error names every reason.
    ops::put(slow.as_ref(), &key(1, "parts/model"), &model, 1 << 20).await.expect("put");
    let err = store.load(1).await.expect_err("both corrupt");
    assert_eq!(err.kind(), ErrorKind::Corrupt);
    assert!(err.to_string().contains("\"fast\"") && err.to_string().contains("\"slow\""), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_removes_partials_and_requeues_undrained() {
    let (fast, slow) = (mem("fast"), mem("slow"));
    // A store over the fast tier alone stands in for a process that died before draining.
    let alone = CheckpointStore::open(vec![Arc::clone(&fast)], small_chunks()).await.expect("open");
    save(&alone, 5).await.expect("save");
    save(&alone, 6).await.expect("save");
    drop(alone);
    // A torn save: parts without a manifest.
    ops::put(fast.as_ref(), "ckpt/00000000000000000007/parts/model", b"half", 4096).await.expect("put");
    // Read-only opens never recover: that partial may be another process's save in progress.
    let ro = CheckpointStore::open_read_only(vec![Arc::clone(&fast), Arc::clone(&slow)], small_chunks())
        .await
        .expect("read-only");
    assert_eq!(ro.list().await.expect("list").iter().map(|c| c.step).collect::<Vec<_>>(), [5, 6]);
    assert_eq!(fast.list("ckpt/00000000000000000007/").await.expect("list").len(), 1, "partial left alone");
    drop(ro);
    let store = CheckpointStore::open(vec![Arc::clone(&fast), Arc::clone(&slow)], small_chunks().with_keep_last(1))
        .await
        .expect("open recovers");
    assert!(fast.list("ckpt/00000000000000000007/").await.expect("list").is_empty(), "partial removed");
    store.drain().await.expect("the drain resumes");
    let steps: Vec<(u64, usize)> = store.list().await.expect("list").iter().map(|c| (c.step, c.tiers.len())).collect();
    assert_eq!(steps, [(5, 1), (6, 2)]);
    assert_eq!(store.load(5).await.expect("load").parts, parts_of(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_faults_are_retried_or_reported_and_lose_nothing() {
    let fast_inner = mem("fast");
    let rules = vec![
        FaultRule { op: FaultOp::Write, fault: Fault::Eagain, trigger: Trigger::AtOp(2) },
        FaultRule { op: FaultOp::Write, fault: Fault::Eio, trigger: Trigger::AtOp(40) },
    ];
    let fast: Arc<dyn Tier> = Arc::new(FaultInjecting::new(Arc::clone(&fast_inner), rules, 1));
    let store = CheckpointStore::open(vec![fast, mem("slow")], small_chunks()).await.expect("open");
    save(&store, 1).await.expect("a temporary EAGAIN is retried");
    let mut step = 2;
    let err = loop {
        match save(&store, step).await {
            Ok(_) => step += 1,
            Err(e) => break e,
        }
    };
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    assert!(err.to_string().contains("injected"), "{err}");
    assert!(store.list().await.expect("list").iter().all(|c| c.step < step), "the failed step is not listed");
    for s in 1..step {
        assert_eq!(store.load(s).await.expect("earlier checkpoints intact").parts, parts_of(s));
    }
    store.drain().await.expect("drain");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_fast_tier_writes_through_or_waits() {
    // Real ENOSPC from the fast tier: write through to the slow one.
    let full: Arc<dyn Tier> = Arc::new(MemoryTier::with_capacity(100_000).named("tiny"));
    let cfg = small_chunks().with_on_full(OnFull::WriteThrough);
    let store = CheckpointStore::open(vec![full, mem("slow")], cfg).await.expect("open");
    let r = save(&store, 1).await.expect("written through");
    assert!(r.wrote_through && r.tier == "slow", "{r:?}");
    assert_eq!(store.load(1).await.expect("load").parts, parts_of(1));

    // With Wait and nothing to drain, ENOSPC is reported, not hidden.
    let full: Arc<dyn Tier> = Arc::new(MemoryTier::with_capacity(100_000).named("tiny"));
    let store = CheckpointStore::open(vec![full, mem("slow")], small_chunks()).await.expect("open");
    let err = save(&store, 1).await.expect_err("cannot fit");
    assert_eq!(err.kind(), ErrorKind::NoSpace, "{err}");

    // A capacity bound of about two checkpoints, with Wait: every save succeeds, the fast tier
    // never holds more than the bound, nothing is dropped.
    let (fast, slow) = (mem("fast"), mem("slow"));
    let throttled: Arc<dyn Tier> = Arc::new(Throttled::new(Arc::clone(&slow), Throttle::bandwidth(50 << 20)));
    let cfg = small_chunks().with_fast_capacity_bytes(1_100_000).with_keep_last(100);
    let store = CheckpointStore::open(vec![Arc::clone(&fast), throttled], cfg).await.expect("open");
    for step in 1..=6 {
        let r = save(&store, step).await.expect("waits for room");
        assert_eq!(r.tier, "fast");
        let used: u64 = fast.list("").await.expect("list").iter().map(|m| m.size).sum();
        assert!(used <= 1_100_000 + 4096, "fast tier over its bound: {used}");
    }
    store.drain().await.expect("drain");
    assert_eq!(store.list().await.expect("list").len(), 6);
    for step in 1..=6 {
        assert_eq!(store.load(step).await.expect("load").parts, parts_of(step));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_buffer_on_real_directories_with_direct_io() {
    let base = tempfile::Builder::new().prefix("ckpt").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let open = |name: &str| -> Arc<dyn Tier> {
        let options = UringTierOptions::default().with_name(name.to_string()).with_create_root(true);
        Arc::new(UringTier::with_options(base.path().join(name), UringConfig::default(), options).expect("tier"))
    };
    let store = CheckpointStore::open(vec![open("fast"), open("slow")], StoreConfig::default()).await.expect("open");
    let weights = pattern(1, (6 << 20) + 123);
    let r = store.save(100, vec![Part::bytes("weights", &weights), Part::bytes("meta", b"{}")]).await.expect("save");
    assert_eq!(r.bytes, weights.len() as u64 + 2);
    // Durable and visible on disk the moment save returns.
    let on_disk = std::fs::read(base.path().join("fast/ckpt/00000000000000000100/parts/weights")).expect("file");
    assert!(on_disk == weights);
    assert!(base.path().join("fast/ckpt/00000000000000000100/MANIFEST.json").exists());
    store.drain().await.expect("drain");
    assert!(base.path().join("slow/ckpt/00000000000000000100/MANIFEST.json").exists());
    // A second store over the same directories is refused while this one is open (its drain,
    // eviction and recovery would race), naming the holder.
    let e = CheckpointStore::open(vec![open("fast"), open("slow")], StoreConfig::default()).await.expect_err("busy");
    assert_eq!(e.kind(), ErrorKind::Busy, "{e}");
    assert!(e.to_string().contains(&format!("pid {}", std::process::id())), "{e}");
    let other = StoreConfig::default().with_prefix("other".into());
    drop(CheckpointStore::open(vec![open("fast"), open("slow")], other).await.expect("another prefix"));
    // Read-only, next to the open store: lists and loads, never saves.
    let ro = CheckpointStore::open_read_only(vec![open("fast"), open("slow")], StoreConfig::default())
        .await
        .expect("read-only next to a writer");
    assert_eq!(ro.latest().await.expect("latest"), Some(100));
    assert_eq!(ro.load(100).await.expect("load").parts[0].1, weights);
    let e = ro.save(101, vec![Part::bytes("w", b"x")]).await.expect_err("read-only save");
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    drop(ro);
    // Reopening finds it; nothing left to drain.
    drop(store);
    let store = CheckpointStore::open(vec![open("fast"), open("slow")], StoreConfig::default()).await.expect("reopen");
    assert_eq!(store.drain_backlog_bytes(), 0);
    assert_eq!(store.load(100).await.expect("load").parts[0].1, weights);
}

#[tokio::test(start_paused = true)]
async fn the_drain_respects_its_bandwidth_cap() {
    let cfg = StoreConfig::default().with_drain_bytes_per_sec(1 << 20).with_chunk_bytes(64 << 10);
    let store = CheckpointStore::open(vec![mem("fast"), mem("slow")], cfg).await.expect("open");
    let data = pattern(2, 4 << 20);
    store.save(1, vec![Part::bytes("w", &data)]).await.expect("save");
    let start = tokio::time::Instant::now();
    store.drain().await.expect("drain");
    let took = start.elapsed();
    // 4 MiB at 1 MiB/s, less the one-chunk burst: just under four seconds of (paused) time.
    assert!(took >= Duration::from_millis(3800) && took <= Duration::from_millis(4300), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_latest_resumes_from_the_newest_and_says_none_when_empty() {
    let store = CheckpointStore::open(vec![mem("fast"), mem("slow")], small_chunks()).await.expect("open");
    assert!(store.load_latest().await.expect("empty store").is_none());
    for step in [5, 7] {
        save(&store, step).await.expect("save");
    }
    let r = store.load_latest().await.expect("load latest").expect("a checkpoint");
    assert_eq!((r.step, r.parts), (7, parts_of(7)));
}
