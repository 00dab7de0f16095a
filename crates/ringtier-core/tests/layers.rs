//! Behaviour of the layers beyond the conformance suite: faults fire when and how they are
//! told (reproducibly), the metered layer counts what happened, the throttle paces.

use std::sync::Arc;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use ringtier_core::layers::{Metered, Throttle, Throttled};
use ringtier_core::{ops, AlignedBuf, ErrorKind, MemoryTier, ReadBatch, Tier};
use ringtier_testkit::conformance::buffer_for;
use ringtier_testkit::layers::{Fault, FaultInjecting, FaultOp, FaultRule, Trigger};
use ringtier_testkit::pattern;

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

// ---- Power cuts -------------------------------------------------------------------------

mod power_cut {
    use std::sync::Arc;
    use std::time::Duration;

    use ringtier_core::layers::{Throttle, Throttled};
    use ringtier_core::{ops, AlignedBuf, ErrorKind, MemoryTier, Tier};
    use ringtier_testkit::layers::{Durability, PowerCut, PowerCutTier};
    use ringtier_testkit::pattern;

    fn machine(durability: Durability, seed: u64) -> (Arc<MemoryTier>, PowerCutTier) {
        let mem = Arc::new(MemoryTier::new().named("disk"));
        let tier = PowerCutTier::new(Arc::clone(&mem) as Arc<dyn Tier>, durability, seed);
        (mem, tier)
    }

    async fn content(t: &dyn Tier, key: &str) -> Option<Vec<u8>> {
        match ops::get(t, key).await {
            Ok(d) => Some(d),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => panic!("reading {key}: {e}"),
        }
    }

    fn buf(data: &[u8]) -> AlignedBuf {
        let mut b = AlignedBuf::new(data.len().max(1), 1).expect("buf");
        b.fill_from(data).expect("fill");
        b
    }

    #[tokio::test]
    async fn acknowledged_commits_survive_and_staged_data_does_not() {
        let (mem, t) = machine(Durability::Synced, 1);
        let power = t.power();
        ops::put(&t, "a", &pattern(1, 5000), 1024).await.expect("put a");
        ops::put(&t, "b", &pattern(2, 100), 1024).await.expect("put b");
        t.delete("b").await.expect("delete b");
        let mut staged = t.create("c").await.expect("create c");
        let (res, _) = staged.write_at(0, buf(&pattern(3, 300))).await;
        res.expect("staged write");

        power.cut();
        assert!(power.is_down());
        let err = t.stat("a").await.expect_err("down");
        assert_eq!((err.kind(), err.os_code(), err.is_temporary()), (ErrorKind::Io, Some(libc::EIO), false));
        let (res, _) = staged.write_at(300, buf(b"x")).await;
        assert!(res.is_err(), "a writer of the dead process fails");
        assert!(staged.commit().await.is_err(), "and cannot commit");

        let report = power.reboot().await.expect("reboot");
        assert_eq!(report.kept + report.lost, 0, "nothing was uncertain: {report:?}");
        assert!(t.stat("a").await.is_err(), "handles from before the reboot keep failing");
        let t2 = t.reopen();
        assert_eq!(content(&t2, "a").await, Some(pattern(1, 5000)));
        assert_eq!(content(&t2, "b").await, None, "an acknowledged delete is durable");
        assert_eq!(content(&t2, "c").await, None, "staged data is gone");
        assert_eq!(content(mem.as_ref(), "a").await, Some(pattern(1, 5000)));
        ops::put(&t2, "d", b"after", 16).await.expect("the new boot works");
        assert_eq!(power.stats().reboots, 1);
        assert_eq!(power.stats().cuts, 1);
    }

    #[tokio::test]
    async fn a_volatile_tier_loses_everything_changed_through_it() {
        let mem = Arc::new(MemoryTier::new());
        ops::put(mem.as_ref(), "old", b"was there before", 64).await.expect("seed");
        let t = PowerCutTier::new(Arc::clone(&mem) as Arc<dyn Tier>, Durability::Volatile, 3);
        assert!(!t.capabilities().durable);
        ops::put(&t, "new", b"acknowledged", 64).await.expect("put");
        ops::put(&t, "old", b"overwritten", 64).await.expect("overwrite");
        t.power().reboot().await.expect("reboot");
        let t2 = t.reopen();
        assert_eq!(content(&t2, "new").await, None);
        assert_eq!(content(&t2, "old").await, Some(b"was there before".to_vec()));
        // Still volatile after a reboot.
        t2.delete("old").await.expect("delete");
        t2.power().reboot().await.expect("reboot again");
        assert_eq!(content(&t2.reopen(), "old").await, Some(b"was there before".to_vec()));
    }

    /// A commit the countdown cuts fails; whether it happened is the seed's choice, the same
    /// every time for one seed, and both outcomes occur.
    #[tokio::test]
    async fn a_cut_during_a_commit_keeps_the_old_or_the_new_object_by_seed() {
        async fn run(seed: u64) -> Option<Vec<u8>> {
            let (_mem, t) = machine(Durability::Synced, seed);
            ops::put(&t, "k", &pattern(1, 3000), 1000).await.expect("first version");
            // create, three writes, commit: the fifth mutating operation is the commit.
            t.power().cut_after(5);
            let err = ops::put(&t, "k", &pattern(2, 3000), 1000).await.expect_err("cut during commit");
            assert_eq!(err.kind(), ErrorKind::Io, "{err}");
            assert!(t.power().is_down());
            let report = t.power().reboot().await.expect("reboot");
            assert_eq!(report.kept + report.lost, 1, "{report:?}");
            content(&t.reopen(), "k").await
        }
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..16 {
            let got = run(seed).await;
            assert_eq!(got, run(seed).await, "seed {seed} replays");
            let got = got.expect("a committed key never disappears");
            assert!(got == pattern(1, 3000) || got == pattern(2, 3000), "seed {seed}: a torn object");
            seen.insert(got == pattern(2, 3000));
        }
        assert_eq!(seen.len(), 2, "both outcomes happen over 16 seeds");
    }

    #[tokio::test]
    async fn a_cut_during_a_write_loses_the_staged_object_only() {
        let (_mem, t) = machine(Durability::Synced, 9);
        ops::put(&t, "k", &pattern(1, 3000), 1000).await.expect("first version");
        t.power().cut_after(3); // create, write, *write*
        assert!(ops::put(&t, "k", &pattern(2, 3000), 1000).await.is_err());
        let report = t.power().reboot().await.expect("reboot");
        assert_eq!(report.kept + report.lost, 0);
        assert_eq!(content(&t.reopen(), "k").await, Some(pattern(1, 3000)));
    }

    #[tokio::test]
    async fn an_interrupted_delete_happened_or_not() {
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..16 {
            let (_mem, t) = machine(Durability::Synced, seed);
            ops::put(&t, "k", b"v", 16).await.expect("put");
            t.power().cut_after(1);
            assert!(t.delete("k").await.is_err());
            t.power().reboot().await.expect("reboot");
            seen.insert(content(&t.reopen(), "k").await.is_some());
        }
        assert_eq!(seen.len(), 2, "both outcomes happen over 16 seeds");
    }

    #[tokio::test]
    async fn one_supply_cuts_every_disk_and_counts_their_operations_together() {
        let power = PowerCut::new(5);
        let fast = power.attach(Arc::new(MemoryTier::new().named("fast")), Durability::Synced);
        let slow = power.attach(Arc::new(MemoryTier::new().named("slow")), Durability::Synced);
        ops::put(&fast, "a", b"1", 16).await.expect("fast put");
        power.cut_after(4); // create, write and commit on slow, then create on fast
        ops::put(&slow, "a", b"1", 16).await.expect("slow put");
        assert!(fast.create("b").await.is_err(), "the fourth mutating operation is cut");
        assert!(slow.stat("a").await.is_err(), "both disks are down");
        power.reboot().await.expect("reboot");
        assert_eq!(content(&fast.reopen(), "a").await, Some(b"1".to_vec()));
        assert_eq!(content(&slow.reopen(), "a").await, Some(b"1".to_vec()));
        assert_eq!(power.stats().mutations, 7);
    }

    /// The reboot waits for an operation still inside the wrapped tier, which then fails and
    /// is decided by the seed: never half applied after the reboot's restore.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_operation_in_progress_at_the_cut_fails_and_the_reboot_waits_for_it() {
        let slow: Arc<dyn Tier> = Arc::new(Throttled::new(
            Arc::new(MemoryTier::new()),
            Throttle::bandwidth(1 << 30).with_latency(Duration::from_millis(100)),
        ));
        let t = Arc::new(PowerCutTier::new(slow, Durability::Synced, 11));
        let t2 = Arc::clone(&t);
        let put = tokio::spawn(async move { ops::put(t2.as_ref(), "k", b"value", 16).await });
        // 100 ms each: create, write, the commit's look at the old object (stat), the commit
        // itself, under way at 350 ms.
        tokio::time::sleep(Duration::from_millis(350)).await;
        t.power().cut();
        let report = t.power().reboot().await.expect("reboot");
        let res = put.await.expect("join");
        assert_eq!(res.expect_err("acknowledged nothing").kind(), ErrorKind::Io);
        assert_eq!(report.kept + report.lost, 1, "the commit was in progress: {report:?}");
        let now = content(&t.reopen(), "k").await;
        assert_eq!(now.is_some(), report.kept == 1, "the inner tier matches the choice");
    }

    /// A commit whose future is dropped may or may not have happened: the next cut decides.
    #[tokio::test]
    async fn a_dropped_commit_is_uncertain_until_the_cut() {
        let slow: Arc<dyn Tier> = Arc::new(Throttled::new(
            Arc::new(MemoryTier::new()),
            Throttle::bandwidth(1 << 30).with_latency(Duration::from_millis(50)),
        ));
        let t = PowerCutTier::new(slow, Durability::Synced, 2);
        let mut w = t.create("k").await.expect("create");
        let (res, _) = w.write_at(0, buf(b"v")).await;
        res.expect("write");
        // 50 ms for the commit's look at the old object (stat), then 50 ms in the commit.
        let timed_out = tokio::time::timeout(Duration::from_millis(75), w.commit()).await;
        assert!(timed_out.is_err(), "the commit was dropped in flight");
        let report = t.power().reboot().await.expect("reboot");
        assert_eq!(report.kept + report.lost, 1, "{report:?}");
    }

    /// A tier that acknowledges before its data is durable loses acknowledged commits on some
    /// seeds: the mode the checkpoint tests use to show they catch lost data.
    #[tokio::test]
    async fn an_unsynced_tier_loses_acknowledged_commits_on_some_seeds() {
        let mut lost = 0;
        for seed in 0..16 {
            let (_mem, t) = machine(Durability::Unsynced, seed);
            ops::put(&t, "k", b"acknowledged", 64).await.expect("put");
            t.power().reboot().await.expect("reboot");
            lost += content(&t.reopen(), "k").await.is_none() as u32;
        }
        assert!((1..16).contains(&lost), "some but not all lost: {lost}");
    }
}
