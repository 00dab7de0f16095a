//! A fast tier that is physically full: a small tmpfs mount (no capacity configured: the file
//! system's own free space is the bound) and injected ENOSPC. Both on-full policies; nothing
//! acknowledged is lost and no partial checkpoint is left on any tier.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ringtier_core::{ErrorKind, MemoryTier, PosixConfig, PosixTier, Tier};
use ringtier_migrate::{CheckpointStore, OnFull, Part, StoreConfig};
use ringtier_testkit::layers::{Fault, FaultInjecting, FaultOp, FaultRule, Trigger};
use ringtier_testkit::pattern;
use ringtier_testkit::SmallTmpfs;

fn posix(dir: &Path, name: &str) -> Arc<dyn Tier> {
    let cfg = PosixConfig::new(dir).with_create(true).with_threads(2).with_name(name.into());
    Arc::new(PosixTier::new(cfg).expect("posix tier"))
}

/// Regular files under `dir`, lock files aside: what a save left behind (staging included).
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if !e.file_name().to_string_lossy().starts_with(".ringtier-lock") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn cfg(on_full: OnFull, keep_last: usize) -> StoreConfig {
    StoreConfig::default().with_on_full(on_full).with_keep_last(keep_last).with_chunk_bytes(1 << 20)
}

/// How a test hands a checkpoint's bytes to the store.
#[derive(Debug, Clone, Copy)]
enum Given {
    /// A buffer: its size is known before writing.
    Bytes,
    /// A seekable stream without a size hint: the tier fills up part-way.
    SeekableNoHint,
}

fn parts<'a>(given: Given, model: &'a [u8]) -> Vec<Part<'a>> {
    let meta: &'static [u8] = b"{\"format\": \"test\"}";
    match given {
        Given::Bytes => vec![Part::bytes("model", model), Part::bytes("meta", meta)],
        Given::SeekableNoHint => {
            vec![Part::seekable("model", Cursor::new(model), None), Part::seekable("meta", Cursor::new(meta), None)]
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_physically_full_fast_tier_writes_through() {
    let Some(fs) = SmallTmpfs::mount("16m", Path::new(env!("CARGO_TARGET_TMPDIR"))) else { return };
    let slow_dir = tempfile::Builder::new().prefix("slow").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    // 24 MB onto a 16 MiB fast tier with no capacity configured (the 150 MB onto 100 MB case).
    let model = pattern(1, 24_000_000);
    for (step, given) in [(1, Given::Bytes), (2, Given::SeekableNoHint)] {
        let tiers = vec![posix(fs.path(), "fast"), posix(slow_dir.path(), "slow")];
        let store = CheckpointStore::open(tiers, cfg(OnFull::WriteThrough, 2)).await.expect("open");
        let r = store.save(step, parts(given, &model)).await.expect("the slow tier can hold it");
        assert!(r.wrote_through, "{given:?}: {r:?}");
        assert_eq!(r.tier, "slow", "{given:?}");
        assert_eq!(files_under(fs.path()), Vec::<PathBuf>::new(), "{given:?}: nothing left on the fast tier");
        let back = store.load(step).await.expect("load");
        assert_eq!(back.tier, "slow");
        assert!(back.parts[0].1 == model, "{given:?}: the bytes saved");
        assert_eq!(store.list().await.expect("list").last().map(|c| c.tiers.clone()), Some(vec!["slow".to_string()]));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_physically_full_fast_tier_with_wait_fails_clearly_when_nothing_can_drain() {
    let Some(fs) = SmallTmpfs::mount("16m", Path::new(env!("CARGO_TARGET_TMPDIR"))) else { return };
    let slow_dir = tempfile::Builder::new().prefix("slow").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let model = pattern(2, 24_000_000);
    let tiers = vec![posix(fs.path(), "fast"), posix(slow_dir.path(), "slow")];
    let store = CheckpointStore::open(tiers, cfg(OnFull::Wait, 2)).await.expect("open");
    // Known size: refused before a byte is written, saying why.
    let e = store.save(1, parts(Given::Bytes, &model)).await.expect_err("never fits");
    assert_eq!(e.kind(), ErrorKind::NoSpace, "{e}");
    assert!(e.to_string().contains("larger than tier \"fast\"") && e.to_string().contains("write-through"), "{e}");
    // Unknown size: the tier fills up part-way; nothing is pending to drain.
    let e = store.save(2, parts(Given::SeekableNoHint, &model)).await.expect_err("nothing to drain");
    assert_eq!(e.kind(), ErrorKind::NoSpace, "{e}");
    assert!(e.to_string().contains("nothing is left to drain"), "{e}");
    // A plain stream cannot be rewound: the same clear error, also with write-through.
    drop(store);
    let tiers = vec![posix(fs.path(), "fast"), posix(slow_dir.path(), "slow")];
    let store = CheckpointStore::open(tiers, cfg(OnFull::WriteThrough, 2)).await.expect("open");
    let e = store.save(3, vec![Part::reader("model", Cursor::new(&model[..]), None)]).await.expect_err("stream");
    assert_eq!(e.kind(), ErrorKind::NoSpace, "{e}");
    assert!(e.to_string().contains("Part::seekable"), "{e}");
    // No partial checkpoint anywhere; the fast tier is empty again.
    assert_eq!(files_under(fs.path()), Vec::<PathBuf>::new());
    assert_eq!(files_under(slow_dir.path()), Vec::<PathBuf>::new());
    assert!(store.list().await.expect("list").is_empty());
    let free = store.tiers()[0].space().await.expect("space").expect("known");
    assert!(free.free_bytes > 15 << 20, "the partial copies were freed: {free:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_physically_full_fast_tier_with_wait_saves_once_eviction_makes_room() {
    let Some(fs) = SmallTmpfs::mount("16m", Path::new(env!("CARGO_TARGET_TMPDIR"))) else { return };
    for given in [Given::Bytes, Given::SeekableNoHint] {
        let slow_dir =
            tempfile::Builder::new().prefix("slow").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
        // keep_last 10: only the lack of room evicts. 6 MB checkpoints: two fit in 16 MiB.
        let tiers = vec![posix(fs.path(), "fast"), posix(slow_dir.path(), "slow")];
        let store = CheckpointStore::open(tiers, cfg(OnFull::Wait, 10)).await.expect("open");
        let models: Vec<Vec<u8>> = (1..=5).map(|s| pattern(10 + s, 6_000_000)).collect();
        for (i, model) in models.iter().enumerate() {
            let step = i as u64 + 1;
            let r = store.save(step, parts(given, model)).await.expect("waits for room");
            assert!(!r.wrote_through && r.tier == "fast", "{given:?} step {step}: {r:?}");
        }
        store.drain().await.expect("drain");
        let list = store.list().await.expect("list");
        assert_eq!(list.len(), 5, "{given:?}: {list:?}");
        assert!(list[0].tiers == ["slow"], "{given:?}: the oldest was evicted to make room: {list:?}");
        assert!(list.iter().all(|c| c.tiers.contains(&"slow".to_string())), "{list:?}");
        for (i, model) in models.iter().enumerate() {
            let back = store.load(i as u64 + 1).await.expect("load");
            assert!(back.parts[0].1 == *model, "{given:?}: step {} intact", i + 1);
        }
        drop(store);
        std::fs::remove_dir_all(fs.path().join("ckpt")).expect("clean the fast tier");
    }
}

fn enospc_on_write(at: u64) -> Vec<FaultRule> {
    vec![FaultRule { op: FaultOp::Write, fault: Fault::Enospc, trigger: Trigger::AtOp(at) }]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_enospc_mid_save_applies_the_on_full_policy() {
    let model = pattern(3, 3_000_000);
    // Write-through: the staged copy is aborted, the checkpoint goes to the slow tier whole.
    let fast_mem = Arc::new(MemoryTier::new().named("fast"));
    let fast: Arc<dyn Tier> = Arc::new(FaultInjecting::new(fast_mem.clone(), enospc_on_write(2), 1));
    let slow: Arc<dyn Tier> = Arc::new(MemoryTier::new().named("slow"));
    let store = CheckpointStore::open(vec![fast, slow], cfg(OnFull::WriteThrough, 2)).await.expect("open");
    let r = store.save(1, parts(Given::Bytes, &model)).await.expect("written through");
    assert!(r.wrote_through && r.tier == "slow", "{r:?}");
    assert!(fast_mem.list("").await.expect("list").is_empty(), "no partial checkpoint on the fast tier");
    assert!(store.load(1).await.expect("load").parts[0].1 == model);

    // Wait, with a drained checkpoint on the fast tier: it is evicted and the save retried there.
    let fast_mem = Arc::new(MemoryTier::new().named("fast"));
    // The first save writes 3 chunks of the model and 1 of meta, then the manifest through
    // ops::put (1 more): ENOSPC on the second save's second write.
    let fast: Arc<dyn Tier> = Arc::new(FaultInjecting::new(fast_mem.clone(), enospc_on_write(7), 1));
    let slow: Arc<dyn Tier> = Arc::new(MemoryTier::new().named("slow"));
    let store = CheckpointStore::open(vec![fast, slow], cfg(OnFull::Wait, 10)).await.expect("open");
    store.save(1, parts(Given::SeekableNoHint, &model)).await.expect("first");
    store.drain().await.expect("drain");
    let model2 = pattern(4, 3_000_000);
    let r = store.save(2, parts(Given::SeekableNoHint, &model2)).await.expect("retried after eviction");
    assert!(!r.wrote_through && r.tier == "fast", "{r:?}");
    let list = store.list().await.expect("list");
    assert_eq!(list[0].tiers, ["slow"], "step 1 was evicted from the fast tier: {list:?}");
    assert_eq!(list[1].tiers[0], "fast");
    assert!(store.load(1).await.expect("load").parts[0].1 == model);
    assert!(store.load(2).await.expect("load").parts[0].1 == model2);

    // Wait with nothing to drain or evict: a clear NoSpace error, nothing left behind.
    let fast_mem = Arc::new(MemoryTier::new().named("fast"));
    let fast: Arc<dyn Tier> = Arc::new(FaultInjecting::new(fast_mem.clone(), enospc_on_write(2), 1));
    let store = CheckpointStore::open(vec![fast, Arc::new(MemoryTier::new().named("slow"))], cfg(OnFull::Wait, 2))
        .await
        .expect("open");
    let e = store.save(1, parts(Given::Bytes, &model)).await.expect_err("nothing to drain");
    assert_eq!(e.kind(), ErrorKind::NoSpace, "{e}");
    assert!(e.to_string().contains("nothing is left to drain"), "{e}");
    assert!(fast_mem.list("").await.expect("list").is_empty());
    assert!(store.list().await.expect("list").is_empty());
}

/// Collects what `tracing` writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_store_whose_slowest_tier_is_not_durable_warns_once() {
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let warnings = |log: &Captured| {
        let text = String::from_utf8_lossy(&log.0.lock().unwrap_or_else(|p| p.into_inner())).to_string();
        text.matches("is not durable").count()
    };
    rt.block_on(async {
        let disk = tempfile::Builder::new().prefix("durable").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tmp");
        let on_disk = vec![posix(&disk.path().join("a"), "fast"), posix(&disk.path().join("b"), "slow-disk")];
        drop(CheckpointStore::open(on_disk, StoreConfig::default()).await.expect("open"));
        assert_eq!(warnings(&log), 0, "a slowest tier on disk is durable");
        for _ in 0..2 {
            let tiers: Vec<Arc<dyn Tier>> =
                vec![Arc::new(MemoryTier::new().named("m0")), Arc::new(MemoryTier::new().named("volatile-slow"))];
            drop(CheckpointStore::open(tiers, StoreConfig::default()).await.expect("open"));
        }
    });
    assert_eq!(warnings(&log), 1, "warned once: {}", String::from_utf8_lossy(&log.0.lock().expect("log")));
}
