//! A store that heals: bad copies replaced from intact ones, steps with no intact copy
//! quarantined and passed over (never a wedge), steps deleted, one save of a step at a time,
//! and a directory fsync that fails after the rename never reported committed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ringtier_core::fs::FsFailPoints;
use ringtier_core::layers::{Throttle, Throttled};
use ringtier_core::{ops, ErrorKind, MemoryTier, PosixConfig, PosixTier, Tier};
use ringtier_migrate::{CheckpointStore, Part, StoreConfig};
use ringtier_testkit::pattern;

fn mem(name: &str) -> Arc<dyn Tier> {
    Arc::new(MemoryTier::new().named(name))
}

fn data(step: u64) -> Vec<u8> {
    pattern(step, 200_000 + step as usize)
}

async fn save(store: &CheckpointStore, step: u64) -> ringtier_core::Result<ringtier_migrate::SaveReport> {
    store.save(step, vec![Part::bytes("a", &data(step))]).await
}

fn key(step: u64, what: &str) -> String {
    format!("ckpt/{step:020}/{what}")
}

fn cfg() -> StoreConfig {
    StoreConfig::default().with_chunk_bytes(64 << 10).with_keep_last(10)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_fast_copy_is_replaced_from_the_intact_slow_one() {
    let (fast, slow) = (mem("fast"), mem("slow"));
    let store = CheckpointStore::open(vec![Arc::clone(&fast), Arc::clone(&slow)], cfg()).await.expect("open");
    save(&store, 1).await.expect("save");
    store.drain().await.expect("drain");
    drop(store);
    // A value of the fast manifest changes (a size one byte smaller): its own checksum says so.
    let m = String::from_utf8(ops::get(fast.as_ref(), &key(1, "MANIFEST.json")).await.expect("get")).expect("utf8");
    let size = data(1).len();
    let damaged = m.replace(&format!("\"size\": {size}"), &format!("\"size\": {}", size - 1));
    assert_ne!(m, damaged);
    ops::put(fast.as_ref(), &key(1, "MANIFEST.json"), damaged.as_bytes(), 4096).await.expect("put");
    let store = CheckpointStore::open(vec![Arc::clone(&fast), Arc::clone(&slow)], cfg()).await.expect("reopen");
    // Replaced in the background: the fast copy comes back whole.
    let since = Instant::now();
    loop {
        let fast_copy = ops::get(fast.as_ref(), &key(1, "MANIFEST.json")).await;
        if fast_copy.as_deref().is_ok_and(|b| b == m.as_bytes()) {
            break;
        }
        assert!(since.elapsed() < Duration::from_secs(20), "the bad fast copy was not replaced");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = store.load(1).await.expect("load");
    assert_eq!(r.tier, "fast");
    assert!(r.fallbacks.is_empty(), "{:?}", r.fallbacks);
    assert_eq!(r.parts[0].1, data(1));
    assert!(store.quarantined().await.expect("quarantined").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_with_no_intact_copy_is_quarantined_and_passed_over() {
    let (fast, slow) = (mem("fast"), mem("slow"));
    let store = CheckpointStore::open(vec![Arc::clone(&fast), Arc::clone(&slow)], cfg()).await.expect("open");
    save(&store, 1).await.expect("save");
    store.drain().await.expect("drain");
    // Step 2 only on the fast tier (its drain never ran): a store over the fast tier alone.
    drop(store);
    let alone = CheckpointStore::open(vec![Arc::clone(&fast)], cfg()).await.expect("fast alone");
    save(&alone, 2).await.expect("save 2");
    save(&alone, 3).await.expect("save 3");
    drop(alone);
    // Step 3: a torn manifest; step 2: a flipped byte in its part.
    ops::put(fast.as_ref(), &key(3, "MANIFEST.json"), b"{\"format\": \"ringtier-chec", 4096).await.expect("torn");
    let mut part = ops::get(fast.as_ref(), &key(2, "parts/a")).await.expect("get");
    part[777] ^= 1;
    ops::put(fast.as_ref(), &key(2, "parts/a"), &part, 1 << 20).await.expect("flip");
    // A read-only look (no recovery yet): the latest intact step is 1, and the skipped ones
    // are named.
    let ro = CheckpointStore::open_read_only(vec![Arc::clone(&fast), Arc::clone(&slow)], cfg()).await.expect("ro");
    let r = ro.load_latest().await.expect("load_latest").expect("a checkpoint");
    assert_eq!(r.step, 1);
    let skipped: Vec<u64> = r.skipped.iter().map(|(s, _)| *s).collect();
    assert_eq!(skipped, [3, 2], "{:?}", r.skipped);
    assert!(r.skipped[0].1.contains("not JSON") && r.skipped[1].1.contains("checksum mismatch"), "{:?}", r.skipped);
    drop(ro);
    // Recovery quarantines step 3 (its manifest), the drain step 2 (its part): the drain
    // succeeds and a later step drains through.
    let store = CheckpointStore::open(vec![Arc::clone(&fast), Arc::clone(&slow)], cfg()).await.expect("reopen");
    store.drain().await.expect("the drain is not wedged");
    let q: Vec<(u64, String)> = store.quarantined().await.expect("q").into_iter().map(|q| (q.step, q.tier)).collect();
    assert_eq!(q, [(2, "fast".to_string()), (3, "fast".to_string())]);
    let since_open: Vec<u64> = store.quarantined_since_open().into_iter().map(|(s, _)| s).collect();
    assert_eq!(since_open, [2, 3]);
    let listed: Vec<u64> = store.list().await.expect("list").iter().map(|c| c.step).collect();
    assert_eq!(listed, [1]);
    save(&store, 4).await.expect("save 4");
    store.drain().await.expect("drain 4");
    assert!(store.list().await.expect("list").iter().any(|c| c.step == 4 && c.tiers.contains(&"slow".to_string())));
    // A quarantined step cannot be saved over; deleted, it can.
    let err = save(&store, 2).await.expect_err("quarantined");
    assert_eq!(err.kind(), ErrorKind::AlreadyExists);
    assert!(err.to_string().contains("quarantined"), "{err}");
    store.delete(2).await.expect("delete 2");
    save(&store, 2).await.expect("save 2 again");
    assert_eq!(store.load(2).await.expect("load 2").parts[0].1, data(2));
    // Quarantine survives a reopen; the markers are not listed as checkpoints.
    drop(store);
    let store = CheckpointStore::open(vec![Arc::clone(&fast), Arc::clone(&slow)], cfg()).await.expect("reopen");
    let q: Vec<u64> = store.quarantined().await.expect("q").into_iter().map(|q| q.step).collect();
    assert_eq!(q, [3]);
    assert_eq!(store.load_latest().await.expect("latest").expect("some").step, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_removes_every_copy_and_missing_steps_are_not_found() {
    let (fast, slow) = (mem("fast"), mem("slow"));
    let store = CheckpointStore::open(vec![Arc::clone(&fast), Arc::clone(&slow)], cfg()).await.expect("open");
    for step in 1..=3 {
        save(&store, step).await.expect("save");
    }
    store.drain().await.expect("drain");
    store.delete(2).await.expect("delete");
    let listed: Vec<u64> = store.list().await.expect("list").iter().map(|c| c.step).collect();
    assert_eq!(listed, [1, 3]);
    for t in [&fast, &slow] {
        assert!(t.list(&format!("ckpt/{:020}/", 2)).await.expect("list").is_empty(), "{}", t.name());
    }
    assert_eq!(store.delete(2).await.expect_err("gone").kind(), ErrorKind::NotFound);
    // A step deleted while its drain runs: the drain drops what it copied.
    save(&store, 5).await.expect("save 5");
    store.delete(5).await.expect("delete while draining");
    store.drain().await.expect("drain");
    assert!(slow.list(&format!("ckpt/{:020}/", 5)).await.expect("list").is_empty());
    let ro = CheckpointStore::open_read_only(vec![Arc::clone(&fast), Arc::clone(&slow)], cfg()).await.expect("ro");
    assert_eq!(ro.delete(1).await.expect_err("read-only").kind(), ErrorKind::Unsupported);
}

/// The step directories a file tier holds under `ckpt/`.
fn step_dirs(root: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root.join("ckpt"))
        .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_and_deleted_steps_leave_no_directories_behind() {
    let base = tempfile::Builder::new().prefix("stepdirs").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let (fast_root, slow_root) = (base.path().join("fast"), base.path().join("slow"));
    let tier = |root: &std::path::Path, name: &str| -> Arc<dyn Tier> {
        let c = PosixConfig::new(root).with_create(true).with_name(name.into());
        Arc::new(PosixTier::new(c).expect("tier"))
    };
    let (fast, slow) = (tier(&fast_root, "fast"), tier(&slow_root, "slow"));
    let store = CheckpointStore::open(vec![fast, slow], cfg().with_keep_last(1)).await.expect("open");
    for step in 1..=4 {
        save(&store, step).await.expect("save");
        store.drain().await.expect("drain");
    }
    let dir = |s: u64| format!("{s:020}");
    // Evicted from the fast tier (keep_last 1): only the newest step's directory is left.
    assert_eq!(step_dirs(&fast_root), [dir(4)]);
    assert_eq!(step_dirs(&slow_root), [dir(1), dir(2), dir(3), dir(4)]);
    store.delete(2).await.expect("delete");
    store.delete(4).await.expect("delete");
    assert!(step_dirs(&fast_root).is_empty(), "{:?}", step_dirs(&fast_root));
    assert_eq!(step_dirs(&slow_root), [dir(1), dir(3)]);
    // An empty directory of another's inside a step directory goes with it; a step directory
    // holding an empty one of its own too.
    std::fs::create_dir_all(slow_root.join("ckpt").join(dir(3)).join("parts/extra/more")).expect("mkdir");
    store.delete(3).await.expect("delete");
    assert_eq!(step_dirs(&slow_root), [dir(1)]);
    assert_eq!(store.list().await.expect("list").iter().map(|c| c.step).collect::<Vec<_>>(), [1]);
    // A step saved again after its directory went.
    save(&store, 2).await.expect("save 2 again");
    assert_eq!(store.load(2).await.expect("load").parts[0].1, data(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_save_of_a_step_in_progress_is_refused() {
    // A fast tier with latency: a save takes long enough to overlap.
    let fast: Arc<dyn Tier> =
        Arc::new(Throttled::new(mem("fast"), Throttle::bandwidth(50 << 20).with_latency(Duration::from_millis(20))));
    let store = CheckpointStore::open(vec![fast, mem("slow")], cfg()).await.expect("open");
    let (a, b) = (data(7), pattern(99, 1000));
    let (r1, r2) = tokio::join!(store.save(7, vec![Part::bytes("a", &a)]), async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        store.save(7, vec![Part::bytes("a", &b)]).await
    });
    r1.expect("the first save");
    let err = r2.expect_err("the second save of the same step");
    assert_eq!(err.kind(), ErrorKind::Busy, "{err}");
    assert!(err.to_string().contains("already being saved"), "{err}");
    assert_eq!(store.load(7).await.expect("load").parts[0].1, a);
    // Once done, saving it again is AlreadyExists, and other steps save meanwhile.
    assert_eq!(store.save(7, vec![Part::bytes("a", &b)]).await.expect_err("exists").kind(), ErrorKind::AlreadyExists);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_directory_fsync_after_the_rename_is_never_committed() {
    let base = tempfile::Builder::new().prefix("dirsync").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let fail = Arc::new(FsFailPoints::new());
    let open_tiers = |fail: Option<Arc<FsFailPoints>>| -> Vec<Arc<dyn Tier>> {
        let fast = PosixConfig::new(base.path().join("fast")).with_create(true).with_name("fast".into());
        let slow = PosixConfig::new(base.path().join("slow"))
            .with_create(true)
            .with_name("slow".into())
            .with_fail_points(fail);
        vec![Arc::new(PosixTier::new(fast).expect("fast")), Arc::new(PosixTier::new(slow).expect("slow"))]
    };
    let cfg = cfg().with_keep_last(0);
    // Once: retried, committed.
    let store = CheckpointStore::open(open_tiers(Some(Arc::clone(&fail))), cfg.clone()).await.expect("open");
    fail.fail_dir_fsync_after_rename("MANIFEST.json", 1, libc::EIO);
    save(&store, 1).await.expect("save 1");
    store.drain().await.expect("a failure retried once");
    assert_eq!(fail.fired(), 1);
    let slow_manifest = base.path().join("slow").join(key(1, "MANIFEST.json"));
    assert!(slow_manifest.exists());
    // Twice: the slow manifest is un-published, the drain fails, the fast copy stays.
    fail.fail_dir_fsync_after_rename("MANIFEST.json", 2, libc::EIO);
    save(&store, 2).await.expect("save 2");
    let err = store.drain().await.expect_err("the drain of step 2 fails");
    assert!(err.to_string().contains("un-published"), "{err}");
    assert_eq!(fail.fired(), 3);
    assert!(!base.path().join("slow").join(key(2, "MANIFEST.json")).exists(), "un-published");
    assert!(base.path().join("fast").join(key(2, "MANIFEST.json")).exists(), "the fast copy is kept");
    let staged = base.path().join("slow/.ringtier-staging");
    assert_eq!(std::fs::read_dir(&staged).map(|d| d.count()).unwrap_or(0), 0, "nothing left staged");
    drop(store);
    // Reopened: step 2 drains, then the fast copy goes.
    let store = CheckpointStore::open(open_tiers(None), cfg).await.expect("reopen");
    store.drain().await.expect("drain after reopen");
    assert!(base.path().join("slow").join(key(2, "MANIFEST.json")).exists());
    let r = store.load(2).await.expect("load 2");
    assert_eq!((r.tier.as_str(), &r.parts[0].1), ("slow", &data(2)));
}
