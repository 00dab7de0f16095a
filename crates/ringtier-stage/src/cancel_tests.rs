//! Cancellation and copy failures on the staging path: batches and futures dropped at random
//! seeded points while many batches with distinct byte patterns are staged, copies that
//! cannot start part-way through a batch, and everything dropped at once.
//!
//! The host copy engine is slowed down (a pause between 16 KiB chunks) so that copies are
//! still running when handles are dropped, and a scribbler keeps taking every free pinned
//! buffer and overwriting it. A buffer released while its copy is queued or running is then
//! caught two ways: the scribbler finds it in the hooks' set of sources being read, and the
//! copy's destination differs from the source as it was when the copy started.
//!
//! With feature `cuda` and a device present, the same schedules run against `cuda:0` (the
//! destinations are read back from the device after each batch's event).
//!
//! Seeds: `RINGTIER_STAGE_SEED` (first seed, default 1) and `RINGTIER_STAGE_RUNS` (how many,
//! default 8): a failure prints its seed, and
//! `RINGTIER_STAGE_SEED=<seed> RINGTIER_STAGE_RUNS=1 cargo test -p ringtier-stage --lib cancel_tests`
//! replays it.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use ringtier_core::MemoryTier;

use super::*;
use ringtier_testkit::SeededRng as Rng;

const DEFAULT_RUNS: u64 = 8;

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(v.trim().parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a number")))
}

/// The seeds to run: `RINGTIER_STAGE_SEED..+RINGTIER_STAGE_RUNS`.
fn seeds() -> std::ops::Range<u64> {
    let first = env_u64("RINGTIER_STAGE_SEED").unwrap_or(1);
    first..first + env_u64("RINGTIER_STAGE_RUNS").unwrap_or(DEFAULT_RUNS)
}

/// Object `i`'s bytes: a pattern no other object shares.
fn pattern(i: usize, len: usize) -> Vec<u8> {
    let mut r = Rng::new(0xA5A5_0000 ^ (i as u64) << 20);
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&r.next_u64().to_le_bytes());
    }
    v.truncate(len);
    v
}

/// The targets to run against: the host, and `cuda:0` where a device is present.
fn targets() -> Vec<Target> {
    #[allow(unused_mut)]
    let mut t = vec![Target::Host];
    #[cfg(feature = "cuda")]
    match PinnedPool::new(4096, 1, Target::Cuda(0)) {
        Ok(_) => t.push(Target::Cuda(0)),
        Err(e) => eprintln!("CUDA path not exercised here: {e}"),
    }
    t
}

/// A stager over a memory tier of distinct objects, with a slow host copy engine.
struct Rig {
    stager: Stager,
    pool: PinnedPool,
    hooks: Arc<Hooks>,
    objects: Vec<(String, Vec<u8>)>,
}

impl Rig {
    async fn new(target: Target, pool: PinnedPool, objects: usize, max_len: usize, seed: u64) -> Rig {
        let tier = MemoryTier::new();
        let mut r = Rng::new(seed ^ 0x000B_1EC7);
        let mut out = Vec::with_capacity(objects);
        for i in 0..objects {
            let len = 1 + r.below(max_len as u64) as usize;
            let key = format!("obj-{i}");
            let data = pattern(i, len);
            ringtier_core::ops::put(&tier, &key, &data, 1 << 20).await.expect("put");
            out.push((key, data));
        }
        let hooks = Arc::new(Hooks::default());
        let stager = Stager::with_hooks(Arc::new(tier), pool.clone(), target, Arc::clone(&hooks)).expect("stager");
        Rig { stager, pool, hooks, objects: out }
    }

    fn requests(&self, which: &[usize]) -> Vec<(String, usize)> {
        which.iter().map(|&i| (self.objects[i].0.clone(), self.objects[i].1.len())).collect()
    }

    /// `n` distinct objects.
    fn pick(&self, r: &mut Rng, n: usize) -> Vec<usize> {
        let mut v: Vec<usize> = Vec::with_capacity(n);
        while v.len() < n.min(self.objects.len()) {
            let i = r.below(self.objects.len() as u64) as usize;
            if !v.contains(&i) {
                v.push(i);
            }
        }
        v
    }

    /// Takes every free pinned buffer, checks that no queued or running copy reads it, and
    /// overwrites it. Returns how many were being read (0 unless a buffer came back early).
    fn scribble(&self) -> usize {
        let mut taken = Vec::new();
        while let Some(b) = self.pool.pool().try_acquire() {
            taken.push(b);
        }
        let mut early = 0;
        for b in &mut taken {
            if self.hooks.is_read(b.as_ptr() as usize, b.capacity()) {
                early += 1;
            }
            b.capacity_mut().fill(0xEE);
        }
        early
    }

    /// Waits (up to 20 s) until every pinned buffer is back in the pool.
    async fn settle(&self) -> bool {
        let t = Instant::now();
        while self.pool.pool().in_use() > 0 && t.elapsed() < Duration::from_secs(20) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        self.pool.pool().in_use() == 0
    }
}

/// The bytes of a staged sample.
fn staged_bytes(s: &Staged) -> Vec<u8> {
    match s {
        Staged::Host(h) => h.as_slice().to_vec(),
        #[cfg(feature = "cuda")]
        Staged::Device(d) => d.stream().memcpy_dtov(d).expect("read back from the device"),
    }
}

/// Polls `f` once, then drops it.
async fn poll_once<F: Future>(f: F) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    std::future::poll_fn(|cx| {
        Poll::Ready(match f.as_mut().poll(cx) {
            Poll::Ready(v) => Some(v),
            Poll::Pending => None,
        })
    })
    .await
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_time().build().expect("runtime")
}

/// Geometry per target: host copies are slowed down by the hooks; a device copies fast, so
/// its buffers are larger.
fn geometry(target: Target) -> (usize, usize) {
    match target {
        Target::Host => (64 << 10, 24),
        Target::Cuda(_) => (4 << 20, 24),
    }
}

#[derive(Debug, Default)]
struct Tally {
    waited: AtomicUsize,
    dropped: AtomicUsize,
    injected: AtomicUsize,
    early: AtomicUsize,
    wrong: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Tally {
    fn wrong(&self, what: String) {
        self.wrong.lock().unwrap_or_else(|p| p.into_inner()).push(what);
    }

    /// An error is fine only if one of the injected fail points caused it.
    fn check_err(&self, what: &str, e: &Error) {
        if e.to_string().contains("injected") {
            self.injected.fetch_add(1, Ordering::SeqCst);
        } else {
            self.wrong(format!("{what}: unexpected error {e}"));
        }
    }
}

/// One seeded schedule: 4 tasks staging and dropping concurrently, a scribbler, then checks.
/// Returns the orphaned batches (completed after their handle was dropped).
fn drop_schedule(target: Target, seed: u64) -> usize {
    eprintln!(
        "staging drop schedule: target {target:?}, seed {seed} (replay: RINGTIER_STAGE_SEED={seed} \
         RINGTIER_STAGE_RUNS=1 cargo test -p ringtier-stage --lib cancel_tests)"
    );
    let rt = runtime();
    rt.block_on(async move {
        let (buf_size, count) = geometry(target);
        let pool = PinnedPool::new(buf_size, count, target).expect("pinned pool");
        let rig = Arc::new(Rig::new(target, pool, 32, buf_size, seed).await);
        rig.hooks.chunk_delay_ns.store(20_000, Ordering::SeqCst);
        let tally = Arc::new(Tally::default());
        let stop = Arc::new(AtomicBool::new(false));
        let scribbler = {
            let (rig, tally, stop) = (Arc::clone(&rig), Arc::clone(&tally), Arc::clone(&stop));
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    tally.early.fetch_add(rig.scribble(), Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_micros(50)).await;
                }
            })
        };
        let mut tasks = Vec::new();
        for task in 0..4u64 {
            let (rig, tally) = (Arc::clone(&rig), Arc::clone(&tally));
            tasks.push(tokio::spawn(async move {
                let mut r = Rng::new(seed.wrapping_mul(1_000_003) ^ task);
                for step in 0..25 {
                    let n = 1 + r.below(4) as usize;
                    let which = rig.pick(&mut r, n);
                    let req = rig.requests(&which);
                    let what = format!("seed {seed} task {task} step {step}");
                    let verify = |staged: &[Staged]| {
                        for (s, &i) in staged.iter().zip(&which) {
                            if staged_bytes(s) != rig.objects[i].1 {
                                tally.wrong(format!("{what}: staged bytes of obj-{i} differ from the object"));
                            }
                        }
                    };
                    // 6 (the host copy thread failing) has no device counterpart.
                    let actions: &[u64] =
                        if target == Target::Host { &[0, 1, 2, 3, 4, 5, 6, 7] } else { &[0, 1, 2, 3, 4, 5, 7] };
                    let action = actions[r.below(actions.len() as u64) as usize];
                    if action == 5 {
                        // A copy that cannot start, somewhere in the next copies.
                        rig.hooks.fail_start_in.store(1 + r.below(n as u64) as usize, Ordering::SeqCst);
                    }
                    if action == 6 {
                        // The copy engine fails part-way (host).
                        rig.hooks.fail_copy_in.store(1 + r.below(n as u64) as usize, Ordering::SeqCst);
                    }
                    match action {
                        // Stage, then drop the future after one poll.
                        3 => match poll_once(rig.stager.stage(&req)).await {
                            Some(Err(e)) => tally.check_err(&what, &e),
                            Some(Ok(b)) => drop(b),
                            None => {}
                        },
                        // Stage under a tiny timeout.
                        4 => {
                            let d = Duration::from_micros(r.below(200));
                            match tokio::time::timeout(d, rig.stager.stage(&req)).await {
                                Ok(Err(e)) => tally.check_err(&what, &e),
                                Ok(Ok(b)) => drop(b),
                                Err(_) => {}
                            }
                        }
                        _ => {
                            let batch = match rig.stager.stage(&req).await {
                                Ok(b) => b,
                                Err(e) => {
                                    tally.check_err(&what, &e);
                                    continue;
                                }
                            };
                            match action {
                                // Dropped at once, or after a moment.
                                1 => drop(batch),
                                2 => {
                                    tokio::time::sleep(Duration::from_micros(r.below(300))).await;
                                    drop(batch);
                                }
                                // The wait, polled once then dropped.
                                7 => {
                                    if let Some(res) = poll_once(batch.wait()).await {
                                        match res {
                                            Ok(s) => verify(&s),
                                            Err(e) => tally.check_err(&what, &e),
                                        }
                                    }
                                }
                                // The wait under a tiny timeout.
                                0 => {
                                    let d = Duration::from_micros(r.below(400));
                                    match tokio::time::timeout(d, batch.wait()).await {
                                        Ok(Ok(s)) => verify(&s),
                                        Ok(Err(e)) => tally.check_err(&what, &e),
                                        Err(_) => {}
                                    }
                                }
                                // Waited to the end.
                                _ => match batch.wait().await {
                                    Ok(s) => {
                                        verify(&s);
                                        tally.waited.fetch_add(1, Ordering::SeqCst);
                                    }
                                    Err(e) => tally.check_err(&what, &e),
                                },
                            }
                            if matches!(action, 0..=2 | 7) {
                                tally.dropped.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                    }
                    tally.early.fetch_add(rig.scribble(), Ordering::SeqCst);
                }
            }));
        }
        for t in tasks {
            t.await.expect("task");
        }
        stop.store(true, Ordering::SeqCst);
        scribbler.await.expect("scribbler");
        let settled = rig.settle().await;
        let h = &rig.hooks;
        let ctx = format!("target {target:?} seed {seed}");
        let wrong = tally.wrong.lock().unwrap_or_else(|p| p.into_inner()).clone();
        assert!(wrong.is_empty(), "{ctx}: {wrong:#?}");
        assert_eq!(tally.early.load(Ordering::SeqCst), 0, "{ctx}: pinned buffers came back while being copied");
        assert_eq!(h.mismatches.load(Ordering::SeqCst), 0, "{ctx}: copies read a reused buffer");
        assert!(settled, "{ctx}: {} pinned buffers never came back", rig.pool.pool().in_use());
        assert_eq!(h.reading(), 0, "{ctx}: copies still reading after the pool settled");
        assert!(h.verified.load(Ordering::SeqCst) > 0, "{ctx}: no copy was verified");
        assert!(
            tally.waited.load(Ordering::SeqCst) > 0 && tally.dropped.load(Ordering::SeqCst) > 0,
            "{ctx}: {tally:?}"
        );
        h.orphans.load(Ordering::SeqCst)
    })
}

#[test]
fn dropped_batches_and_futures_never_release_a_pinned_buffer_early() {
    for target in targets() {
        let mut orphans = 0;
        for seed in seeds() {
            orphans += drop_schedule(target, seed);
        }
        eprintln!("target {target:?}: {orphans} batches completed after their handle was dropped");
        // Where the copies are slow enough, some handles went while their copies ran.
        if target == Target::Host {
            assert!(orphans > 0, "no batch was dropped while its copies ran: the schedule tests nothing");
        }
    }
}

#[test]
fn a_copy_that_cannot_start_releases_only_the_buffers_never_started() {
    for target in targets() {
        let rt = runtime();
        rt.block_on(async {
            let (buf_size, count) = geometry(target);
            let n = 6;
            for k in 0..n {
                let pool = PinnedPool::new(buf_size, count, target).expect("pinned pool");
                let rig = Rig::new(target, pool, n, buf_size, k as u64).await;
                // 10 ms a 16 KiB chunk: a started copy runs for at least 10 ms on the host path,
                // far longer than the checks below take.
                rig.hooks.chunk_delay_ns.store(10_000_000, Ordering::SeqCst);
                rig.hooks.fail_start_in.store(k + 1, Ordering::SeqCst);
                let all: Vec<usize> = (0..n).collect();
                let err = rig.stager.stage(&rig.requests(&all)).await.expect_err("copy k cannot start");
                let held = rig.pool.pool().in_use();
                let early = rig.scribble();
                let msg = err.to_string();
                assert!(msg.contains(&format!("copy {} of {n}", k + 1)) && msg.contains("injected"), "{msg}");
                assert_eq!(err.key(), Some(rig.objects[k].0.as_str()), "{msg}");
                if target == Target::Host {
                    // The k started copies are still running: exactly their buffers are held,
                    // the n - k others are back.
                    assert_eq!(held, k, "{target:?} k={k}: buffers held right after the error");
                    assert_eq!(rig.hooks.reading(), k, "{target:?} k={k}");
                } else {
                    assert!(held <= k, "{target:?} k={k}: {held} buffers held, only {k} copies started");
                }
                assert_eq!(early, 0, "{target:?} k={k}: a buffer being copied was back in the pool");
                assert!(rig.settle().await, "{target:?} k={k}: buffers never came back");
                assert_eq!(rig.hooks.mismatches.load(Ordering::SeqCst), 0, "{target:?} k={k}");
                assert_eq!(rig.hooks.verified.load(Ordering::SeqCst), k, "{target:?} k={k}: started copies");
                // The stager still works afterwards.
                let staged = rig.stager.stage(&rig.requests(&all)).await.expect("stage").wait().await.expect("wait");
                for (s, i) in staged.iter().zip(&all) {
                    assert_eq!(staged_bytes(s), rig.objects[*i].1, "{target:?} k={k}: obj-{i}");
                }
            }
        });
    }
}

#[test]
fn a_copy_engine_failure_part_way_is_reported_and_skips_the_rest() {
    let rt = runtime();
    rt.block_on(async {
        let n = 6;
        for k in 0..n {
            let pool = PinnedPool::new(64 << 10, 8, Target::Host).expect("pinned pool");
            let rig = Rig::new(Target::Host, pool, n, 64 << 10, k as u64).await;
            rig.hooks.chunk_delay_ns.store(500_000, Ordering::SeqCst);
            rig.hooks.fail_copy_in.store(k + 1, Ordering::SeqCst);
            let all: Vec<usize> = (0..n).collect();
            let batch = rig.stager.stage(&rig.requests(&all)).await.expect("copies start");
            let err = batch.wait().await.expect_err("the engine fails at copy k");
            let msg = err.to_string();
            assert!(msg.contains(&format!("copy {} (obj-{k})", k + 1)) && msg.contains("injected"), "{msg}");
            assert_eq!(err.key(), Some(rig.objects[k].0.as_str()));
            // Every buffer is back once the wait returned: copies before k finished, the rest
            // never started.
            assert_eq!(rig.pool.pool().in_use(), 0, "k={k}");
            assert_eq!(rig.hooks.verified.load(Ordering::SeqCst), k, "k={k}: copies that ran");
            assert_eq!(rig.hooks.mismatches.load(Ordering::SeqCst), 0, "k={k}");
            assert_eq!(rig.hooks.reading(), 0, "k={k}");
        }
    });
}

#[test]
fn everything_dropped_while_copies_run_releases_the_slab_after_them() {
    for target in targets() {
        let rt = runtime();
        rt.block_on(async {
            let (buf_size, count) = geometry(target);
            let released = Arc::new(AtomicUsize::new(0));
            let reading_at_release = Arc::new(AtomicUsize::new(usize::MAX));
            let hooks_slot: Arc<std::sync::Mutex<Option<Arc<Hooks>>>> = Arc::default();
            let pool = {
                let (released, at, slot) =
                    (Arc::clone(&released), Arc::clone(&reading_at_release), Arc::clone(&hooks_slot));
                PinnedPool::build(buf_size, count, target, move || {
                    let h = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
                    at.store(h.map_or(usize::MAX, |h| h.reading()), Ordering::SeqCst);
                    released.fetch_add(1, Ordering::SeqCst);
                })
                .expect("pinned pool")
            };
            let rig = Rig::new(target, pool, 12, buf_size, 7).await;
            *hooks_slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&rig.hooks));
            rig.hooks.chunk_delay_ns.store(2_000_000, Ordering::SeqCst);
            let mut batches = Vec::new();
            for chunk in [0..4, 4..8, 8..12] {
                let which: Vec<usize> = chunk.collect();
                batches.push(rig.stager.stage(&rig.requests(&which)).await.expect("stage"));
            }
            let Rig { stager, pool, hooks, objects: _ } = rig;
            if target == Target::Host {
                assert!(hooks.reading() > 0, "copies are running when everything is dropped");
            }
            drop(batches);
            drop(pool);
            assert_eq!(released.load(Ordering::SeqCst), 0, "the stager still holds the pool");
            drop(stager);
            assert_eq!(released.load(Ordering::SeqCst), 1, "the slab is released once, when the copies are done");
            assert_eq!(reading_at_release.load(Ordering::SeqCst), 0, "no copy was reading when the slab went");
            assert_eq!(hooks.mismatches.load(Ordering::SeqCst), 0);
            assert_eq!(hooks.verified.load(Ordering::SeqCst), 12);
        });
    }
}

#[test]
fn copy_bandwidth_cancelled_mid_copy_leaks_nothing() {
    for target in targets() {
        let rt = runtime();
        rt.block_on(async {
            let pool = PinnedPool::new(64 << 10, 8, target).expect("pinned pool");
            let rig = Rig::new(target, pool, 1, 4096, 3).await;
            rig.hooks.chunk_delay_ns.store(50_000, Ordering::SeqCst);
            for seed in seeds() {
                let mut r = Rng::new(seed);
                let d = Duration::from_micros(r.below(3_000));
                let res = tokio::time::timeout(d, rig.stager.copy_bandwidth(2)).await;
                assert!(rig.settle().await, "seed {seed}: buffers never came back after a {d:?} timeout");
                if let Ok(res) = res {
                    res.expect("copy bandwidth");
                }
            }
            assert_eq!(rig.hooks.mismatches.load(Ordering::SeqCst), 0);
            assert_eq!(rig.hooks.reading(), 0);
            let (staged, reference) = rig.stager.copy_bandwidth(1).await.expect("copy bandwidth");
            assert!(staged > 0.0 && reference > 0.0);
        });
    }
}
