//! Behaviour of the layers beyond the conformance suite: faults fire when and how they are
//! told (reproducibly), the metered layer counts what happened, the throttle paces.

use std::sync::Arc;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use ringtier_core::conformance::{buffer_for, pattern};
use ringtier_core::layers::{Fault, FaultInjecting, FaultOp, FaultRule, Metered, Throttle, Throttled, Trigger};
use ringtier_core::{ops, AlignedBuf, ErrorKind, MemoryTier, ReadBatch, Tier};

fn faulty(rules: Vec<FaultRule>, seed: u64) -> (Arc<dyn Tier>, FaultInjecting) {
    let inner: Arc<dyn Tier> = Arc::new(MemoryTier::new());
    let layer = FaultInjecting::new(Arc::clone(&inner), rules, seed);
    (inner, layer)
}

#[tokio::test]
async fn eio_at_the_nth_read_only() {
    let (inner, t) = faulty(vec![FaultRule { op: FaultOp::Read, fault: Fault::Eio, trigger: Trigger::AtOp(2) }], 1);
    ops::put(inner.as_ref(), "k", b"0123456789", 4096).await.expect("put");
    let mut kinds = Vec::new();
    for _ in 0..3 {
        let (res, _) = t.read_at("k", 0, 10, buffer_for(&t, 0, 10)).await;
        kinds.push(res.map_err(|e| (e.kind(), e.os_code(), e.is_temporary())));
    }
    assert_eq!(kinds, [Ok(10), Err((ErrorKind::Io, Some(libc::EIO), false)), Ok(10)]);
    assert_eq!(t.injected(), 1);
}

#[tokio::test]
async fn enospc_on_write_leaves_the_previous_object_intact() {
    let (inner, t) =
        faulty(vec![FaultRule { op: FaultOp::Write, fault: Fault::Enospc, trigger: Trigger::FromOp(4) }], 1);
    // The first object takes three 4 KiB writes; the fourth write on hits a full disk.
    ops::put(&t, "ckpt", &pattern(1, 10_000), 4096).await.expect("first write fits");
    let err = ops::put(&t, "ckpt", &pattern(2, 10_000), 4096).await.expect_err("disk full");
    assert_eq!(err.kind(), ErrorKind::NoSpace, "{err}");
    assert!(!err.is_temporary());
    assert_eq!(ops::get(inner.as_ref(), "ckpt").await.expect("old copy"), pattern(1, 10_000));
}

#[tokio::test]
async fn eagain_is_temporary() {
    let (_inner, t) =
        faulty(vec![FaultRule { op: FaultOp::Metadata, fault: Fault::Eagain, trigger: Trigger::AtOp(1) }], 1);
    let err = t.list("").await.expect_err("injected");
    assert!(err.is_temporary(), "{err}");
    assert!(t.list("").await.is_ok(), "second try succeeds");
}

#[tokio::test]
async fn short_read_returns_part_and_read_exact_loops() {
    let (inner, t) =
        faulty(vec![FaultRule { op: FaultOp::Read, fault: Fault::ShortRead, trigger: Trigger::FromOp(1) }], 1);
    let data = pattern(3, 5000);
    ops::put(inner.as_ref(), "k", &data, 4096).await.expect("put");
    let (res, buf) = t.read_at("k", 0, 5000, buffer_for(&t, 0, 5000)).await;
    assert_eq!(res.expect("short read"), 2500);
    assert_eq!(buf.as_slice(), &data[..2500]);
    assert_eq!(ops::read_exact_at(&t, "k", 0, 5000).await.expect("loops"), data);
}

#[tokio::test]
async fn torn_write_lands_half_and_commit_is_never_reached() {
    let (inner, t) =
        faulty(vec![FaultRule { op: FaultOp::Write, fault: Fault::TornWrite, trigger: Trigger::AtOp(1) }], 1);
    let mut w = t.create("k").await.expect("create");
    let mut buf = AlignedBuf::new(8192, 4096).expect("buf");
    buf.fill_from(&pattern(4, 8192)).expect("fill");
    let (res, buf) = w.write_at(0, buf).await;
    assert_eq!(res.expect_err("torn").kind(), ErrorKind::Io);
    assert_eq!(buf.len(), 8192, "the caller's buffer window is restored");
    w.abort().await.expect("abort");
    assert_eq!(inner.stat("k").await.expect_err("never committed").kind(), ErrorKind::NotFound);
}

#[tokio::test]
async fn commit_failure_discards_the_staged_object() {
    let (inner, t) = faulty(vec![FaultRule { op: FaultOp::Commit, fault: Fault::Eio, trigger: Trigger::AtOp(1) }], 1);
    assert!(ops::put(&t, "k", b"data", 4096).await.is_err());
    assert!(inner.list("").await.expect("list").is_empty());
    ops::put(&t, "k", b"data", 4096).await.expect("second commit succeeds");
}

#[tokio::test]
async fn probability_faults_are_reproducible_from_the_seed() {
    async fn run(seed: u64) -> Vec<bool> {
        let (inner, t) =
            faulty(vec![FaultRule { op: FaultOp::Read, fault: Fault::Eio, trigger: Trigger::Probability(0.3) }], seed);
        ops::put(inner.as_ref(), "k", b"x", 4096).await.expect("put");
        let mut out = Vec::new();
        for _ in 0..200 {
            let (res, _) = t.read_at("k", 0, 1, buffer_for(&t, 0, 1)).await;
            out.push(res.is_err());
        }
        out
    }
    let a = run(7).await;
    assert_eq!(a, run(7).await, "same seed, same faults");
    assert_ne!(a, run(8).await, "another seed, other faults");
    let rate = a.iter().filter(|&&e| e).count() as f64 / a.len() as f64;
    assert!((0.15..0.45).contains(&rate), "about 30% fail: {rate}");
}

#[tokio::test]
async fn batch_requests_each_see_faults() {
    let (inner, t) = faulty(vec![FaultRule { op: FaultOp::Read, fault: Fault::Eio, trigger: Trigger::AtOp(2) }], 1);
    ops::put(inner.as_ref(), "a", b"aaaa", 4096).await.expect("put");
    let mut batch = ReadBatch::new();
    for _ in 0..3 {
        batch.push("a", 0, 4, buffer_for(&t, 0, 4));
    }
    let batch = t.read_batch(batch).await;
    let ok: Vec<bool> = batch.iter().map(|(_, e)| matches!(e.result(), Some(Ok(4)))).collect();
    assert_eq!(ok, [true, false, true]);
}

#[tokio::test]
async fn metered_counts_operations_bytes_and_errors() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let tier = metrics::with_local_recorder(&recorder, || Metered::new(Arc::new(MemoryTier::new().named("mem"))));
    ops::put(&tier, "a", &pattern(1, 10_000), 4096).await.expect("put");
    ops::get(&tier, "a").await.expect("get");
    let _ = tier.stat("missing").await;
    let mut batch = ReadBatch::new();
    batch.push("a", 0, 100, buffer_for(&tier, 0, 100));
    batch.push("nope", 0, 100, buffer_for(&tier, 0, 100));
    let _ = tier.read_batch(batch).await;

    let snap = snapshotter.snapshot().into_vec();
    let value = |name: &str, labels: &[(&str, &str)]| -> Option<u64> {
        snap.iter().find_map(|(ck, _, _, v)| {
            let key = ck.key();
            let all = labels.iter().all(|(k, want)| key.labels().any(|l| l.key() == *k && l.value() == *want));
            match v {
                DebugValue::Counter(c) if key.name() == name && all => Some(*c),
                _ => None,
            }
        })
    };
    let ops_total = "ringtier_tier_operations_total";
    assert_eq!(value("ringtier_tier_bytes_total", &[("tier", "mem"), ("op", "write")]), Some(10_000));
    assert_eq!(value("ringtier_tier_bytes_total", &[("tier", "mem"), ("op", "read")]), Some(10_100));
    assert_eq!(value(ops_total, &[("op", "write"), ("result", "ok")]), Some(3));
    assert_eq!(value(ops_total, &[("op", "commit"), ("result", "ok")]), Some(1));
    assert_eq!(value(ops_total, &[("op", "stat"), ("result", "error")]), Some(1));
    assert_eq!(value(ops_total, &[("op", "read"), ("result", "error")]), Some(1));
    let has_hist = snap.iter().any(|(ck, _, _, v)| {
        ck.key().name() == "ringtier_tier_operation_duration_seconds"
            && matches!(v, DebugValue::Histogram(h) if !h.is_empty())
    });
    assert!(has_hist, "latency histogram recorded");
    for (ck, ..) in &snap {
        for l in ck.key().labels() {
            assert!(!l.value().contains('a') || l.key() != "key", "no key label");
            assert!(["tier", "op", "result"].contains(&l.key()), "bounded labels only: {}", l.key());
        }
    }
}

#[tokio::test(start_paused = true)]
async fn throttle_paces_reads_to_the_configured_rate() {
    // Paused tokio time: the waits are computed, not slept, so the test is not timing-based.
    let inner: Arc<dyn Tier> = Arc::new(MemoryTier::new());
    ops::put(inner.as_ref(), "k", &pattern(1, 1 << 20), 1 << 20).await.expect("put");
    let t = Throttled::new(
        Arc::clone(&inner),
        Throttle { burst_bytes: Some(1), ..Throttle::bandwidth(10 << 20) }.with_latency(Duration::from_millis(2)),
    );
    let start = tokio::time::Instant::now();
    for _ in 0..10 {
        let (res, _) = t.read_at("k", 0, 1 << 20, buffer_for(&t, 0, 1 << 20)).await;
        res.expect("read");
    }
    let elapsed = start.elapsed();
    // 10 MiB at 10 MiB/s is one second, plus 2 ms of latency per read.
    assert!(elapsed >= Duration::from_millis(990) && elapsed <= Duration::from_millis(1100), "{elapsed:?}");
}
