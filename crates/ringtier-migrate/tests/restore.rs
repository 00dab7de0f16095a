//! Streamed restore: into caller buffers, closures and files; single parts and ranges; bounded
//! reads in flight; per-part fallback to slower copies; bad arguments failing before any I/O.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use ringtier_core::{AlignedBuf, Capabilities, ErrorKind, MemoryTier, ObjectMeta, ObjectWriter, Tier};
use ringtier_migrate::{
    BufferSink, CheckpointStore, FnSink, Part, RestoreEvent, RestoreOptions, StoreConfig, TierSink,
};
use ringtier_testkit::pattern;
use ringtier_uring::{UringConfig, UringTier, UringTierOptions};

fn mem(name: &str) -> Arc<dyn Tier> {
    Arc::new(MemoryTier::new().named(name))
}

fn uring(dir: &std::path::Path, name: &str) -> Arc<dyn Tier> {
    let options = UringTierOptions::default().with_name(name.to_string()).with_create_root(true);
    Arc::new(UringTier::with_options(dir, UringConfig::default(), options).expect("uring tier"))
}

/// Parts of assorted sizes: chunk-sized, odd, empty, one byte, several chunks.
fn parts() -> Vec<(String, Vec<u8>)> {
    [("a", 3 << 20), ("b", 1_234_567), ("empty", 0), ("one", 1), ("c", (5 << 20) + 4095)]
        .iter()
        .enumerate()
        .map(|(i, (n, len))| (n.to_string(), pattern(i as u64 + 7, *len)))
        .collect()
}

async fn save_all(store: &CheckpointStore, step: u64, data: &[(String, Vec<u8>)]) {
    store.save(step, data.iter().map(|(n, d)| Part::bytes(n.clone(), d)).collect()).await.expect("save");
}

fn key(step: u64, what: &str) -> String {
    format!("ckpt/{step:020}/{what}")
}

/// Small chunks and a few reads in flight, so that reads span part boundaries.
fn small() -> RestoreOptions {
    RestoreOptions::default().with_chunk_bytes(256 << 10).with_depth(5)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restores_into_buffers_closures_and_single_parts() {
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tmp");
    // Metered, as the CLI's tiers are: the layer forwards the opened-file read path.
    let fast: Arc<dyn Tier> = Arc::new(ringtier_core::layers::Metered::new(uring(&tmp.path().join("fast"), "fast")));
    let store = CheckpointStore::open(vec![fast], StoreConfig::default()).await.expect("open");
    let data = parts();
    save_all(&store, 1, &data).await;

    // Into caller buffers (a model's tensors, a pinned pool's slices).
    let mut dst: Vec<Vec<u8>> = data.iter().map(|(_, d)| vec![0xAB; d.len()]).collect();
    let buffers = data.iter().zip(dst.iter_mut()).map(|((n, _), b)| (n.clone(), b.as_mut_slice())).collect();
    let mut sink = BufferSink::new(buffers);
    let report = store.restore(1, &mut sink, &small()).await.expect("restore");
    drop(sink);
    for ((n, d), b) in data.iter().zip(&dst) {
        assert!(d == b, "part {n} differs");
    }
    assert_eq!(report.bytes, data.iter().map(|(_, d)| d.len() as u64).sum::<u64>());
    assert_eq!(report.sources.len(), data.len());
    assert!(report.fallbacks.is_empty());
    assert_eq!(report.tier_summary(), "fast");

    // Into a closure: events in order, every part begun and finished once, bytes contiguous.
    let events = Mutex::new(Vec::new());
    let mut got: Vec<(String, Vec<u8>)> = Vec::new();
    let mut sink = FnSink(|ev: RestoreEvent<'_>| {
        match ev {
            RestoreEvent::Begin(p) => {
                events.lock().expect("lock").push(format!("begin {}", p.name));
                got.push((p.name.clone(), Vec::new()));
            }
            RestoreEvent::Data { part, offset, bytes } => {
                let (n, v) = got.last_mut().expect("begun");
                assert_eq!(n, &part.name);
                assert_eq!(offset, v.len() as u64, "contiguous");
                v.extend_from_slice(bytes);
            }
            RestoreEvent::Finish(p) => events.lock().expect("lock").push(format!("finish {}", p.name)),
            RestoreEvent::Discard(p) => panic!("nothing to discard: {}", p.name),
        }
        Ok(())
    });
    store.restore(1, &mut sink, &small()).await.expect("restore");
    assert_eq!(got, data);
    let want: Vec<String> = data.iter().flat_map(|(n, _)| [format!("begin {n}"), format!("finish {n}")]).collect();
    assert_eq!(*events.lock().expect("lock"), want);

    // Some parts only, in save order whatever order they are asked in.
    let mut names = Vec::new();
    let mut sink = FnSink(|ev: RestoreEvent<'_>| {
        if let RestoreEvent::Finish(p) = ev {
            names.push(p.name.clone());
        }
        Ok(())
    });
    let opts = small().with_parts(Some(vec!["c".to_string(), "a".to_string()]));
    store.restore(1, &mut sink, &opts).await.expect("restore two");
    assert_eq!(names, ["a", "c"]);

    // One part, and ranges of one (a rank's shard), across chunk boundaries and at the ends.
    assert_eq!(store.read_part(1, "b").await.expect("part"), data[1].1);
    assert_eq!(store.read_part(1, "empty").await.expect("empty part"), Vec::<u8>::new());
    let c = &data[4].1;
    for (off, len) in [(0, 10), (1 << 20, 1 << 20), ((1 << 20) - 3, 7), (c.len() as u64 - 5, 5), (17, 0)] {
        let mut buf = vec![0u8; len];
        store.read_part_range(1, "c", off, &mut buf).await.expect("range");
        assert!(buf == c[off as usize..off as usize + len], "range {off}+{len}");
    }
    // The convenience load holds everything in memory.
    let r = store.load(1).await.expect("load");
    assert_eq!(r.parts, data);
    assert_eq!(r.tier, "fast");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_fail_before_any_read() {
    let fast = mem("fast");
    let store = CheckpointStore::open(vec![Arc::clone(&fast)], StoreConfig::default()).await.expect("open");
    let data = parts();
    save_all(&store, 1, &data).await;

    let mut wrong = vec![0u8; 10];
    let err = store.load_into(1, vec![("a".into(), wrong.as_mut_slice())]).await.expect_err("wrong size");
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.to_string().contains("holds 10 bytes") && err.to_string().contains("\"a\""), "{err}");

    let mut buf = vec![0u8; 4];
    let err = store.load_into(1, vec![("nope".into(), buf.as_mut_slice())]).await.expect_err("unknown part");
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(err.to_string().contains("no part \"nope\"") && err.to_string().contains("a, b, empty"), "{err}");

    let err = store.load(99).await.expect_err("missing step");
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(err.to_string().contains("checkpoint 99"), "{err}");

    let mut buf = vec![0u8; 8];
    let err = store.read_part_range(1, "one", 0, &mut buf).await.expect_err("past the end");
    assert_eq!(err.kind(), ErrorKind::OutOfRange);
    let err = store.read_part_range(1, "b", u64::MAX - 2, &mut buf).await.expect_err("overflow");
    assert_eq!(err.kind(), ErrorKind::OutOfRange);

    // A sink whose destination cannot take the part: the restore stops with its error.
    let ro: Arc<dyn Tier> = Arc::new(ringtier_testkit::layers::FaultInjecting::new(
        mem("dest"),
        vec![ringtier_testkit::layers::FaultRule {
            op: ringtier_testkit::layers::FaultOp::Metadata,
            fault: ringtier_testkit::layers::Fault::Eio,
            trigger: ringtier_testkit::layers::Trigger::FromOp(1),
        }],
        1,
    ));
    let mut sink = TierSink::new(Arc::clone(&ro), None);
    let err = store.restore(1, &mut sink, &small()).await.expect_err("unwritable destination");
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    assert!(sink.written().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_part_mid_restore_is_read_again_from_the_slow_copy() {
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tmp");
    let fast = uring(&tmp.path().join("fast"), "fast");
    let slow = uring(&tmp.path().join("slow"), "slow");
    let cfg = StoreConfig::default().with_keep_last(5);
    let store = CheckpointStore::open(vec![Arc::clone(&fast), Arc::clone(&slow)], cfg).await.expect("open");
    let data = parts();
    save_all(&store, 1, &data).await;
    save_all(&store, 2, &data).await;
    store.drain().await.expect("drain");

    // Step 1: part c corrupted 3 MiB in (after several chunks were delivered); part b truncated.
    let path = |step, p: &str| tmp.path().join("fast").join(key(step, &format!("parts/{p}")));
    let mut c = std::fs::read(path(1, "c")).expect("read");
    c[3 << 20] ^= 0x40;
    std::fs::write(path(1, "c"), &c).expect("write");
    let b = std::fs::OpenOptions::new().write(true).open(path(1, "b")).expect("open");
    b.set_len(500_000).expect("truncate");
    let mut discarded = Vec::new();
    let mut got: Vec<(String, Vec<u8>)> = Vec::new();
    let mut sink = FnSink(|ev: RestoreEvent<'_>| {
        match ev {
            RestoreEvent::Begin(p) => got.push((p.name.clone(), Vec::new())),
            RestoreEvent::Data { bytes, .. } => got.last_mut().expect("begun").1.extend_from_slice(bytes),
            RestoreEvent::Finish(_) => {}
            RestoreEvent::Discard(p) => {
                discarded.push(p.name.clone());
                got.pop();
            }
        }
        Ok(())
    });
    let report = store.restore(1, &mut sink, &small()).await.expect("falls back");
    assert_eq!(got, data, "every part whole and right");
    assert_eq!(discarded, ["b", "c"]);
    let from: Vec<(&str, &str)> = report.sources.iter().map(|(p, t)| (p.as_str(), t.as_str())).collect();
    assert_eq!(from, [("a", "fast"), ("b", "slow"), ("empty", "fast"), ("one", "fast"), ("c", "slow")]);
    assert_eq!(report.fallbacks.len(), 2, "{:?}", report.fallbacks);
    assert!(
        report.fallbacks[0].contains("\"b\"") && report.fallbacks[0].contains("truncated"),
        "{:?}",
        report.fallbacks
    );
    assert!(
        report.fallbacks[1].contains("\"c\"") && report.fallbacks[1].contains("checksum"),
        "{:?}",
        report.fallbacks
    );

    // Step 2: the fast copy's part file is gone altogether.
    std::fs::remove_file(path(2, "a")).expect("remove");
    let r = store.load(2).await.expect("falls back");
    assert_eq!(r.parts, data);
    assert_eq!(r.tier, "slow, fast");

    // Into files: the CLI's `restore --out`. No good copy of a part: no file under its name.
    let out = uring(&tmp.path().join("out"), "out");
    let mut sink = TierSink::new(Arc::clone(&out), Some("restored".into()));
    store.restore(1, &mut sink, &small()).await.expect("restore to files");
    assert_eq!(sink.written().len(), data.len());
    for (n, d) in &data {
        assert!(std::fs::read(tmp.path().join("out/restored").join(n)).expect("file") == *d, "{n}");
    }
    let slow_c = tmp.path().join("slow").join(key(1, "parts/c"));
    let mut bad = std::fs::read(&slow_c).expect("read");
    bad[10] ^= 1;
    std::fs::write(&slow_c, &bad).expect("write");
    let mut sink = TierSink::new(Arc::clone(&out), Some("again".into()));
    let err = store.restore(1, &mut sink, &small()).await.expect_err("no good copy of c");
    assert_eq!(err.kind(), ErrorKind::Corrupt);
    assert!(err.to_string().contains("\"fast\"") && err.to_string().contains("\"slow\""), "{err}");
    let names: Vec<String> = out.list("again/").await.expect("list").into_iter().map(|m| m.key).collect();
    assert!(!names.iter().any(|k| k.ends_with("/c")), "no file looks complete: {names:?}");
}

/// Counts reads in flight through it (and delays each a little, so that they overlap).
#[derive(Debug)]
struct InFlightCounter {
    inner: Arc<dyn Tier>,
    now: AtomicUsize,
    max: AtomicUsize,
}

#[async_trait]
impl Tier for InFlightCounter {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn stat(&self, key: &str) -> ringtier_core::Result<ObjectMeta> {
        self.inner.stat(key).await
    }
    async fn list(&self, prefix: &str) -> ringtier_core::Result<Vec<ObjectMeta>> {
        self.inner.list(prefix).await
    }
    async fn delete(&self, key: &str) -> ringtier_core::Result<()> {
        self.inner.delete(key).await
    }
    async fn read_at(
        &self,
        key: &str,
        offset: u64,
        len: usize,
        buf: AlignedBuf,
    ) -> (ringtier_core::Result<usize>, AlignedBuf) {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        let out = self.inner.read_at(key, offset, len, buf).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        out
    }
    async fn create(&self, key: &str) -> ringtier_core::Result<Box<dyn ObjectWriter>> {
        self.inner.create(key).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_in_flight_are_many_and_bounded_by_the_depth() {
    let counter = Arc::new(InFlightCounter { inner: mem("fast"), now: AtomicUsize::new(0), max: AtomicUsize::new(0) });
    let tier: Arc<dyn Tier> = Arc::clone(&counter) as Arc<dyn Tier>;
    let store = CheckpointStore::open(vec![tier], StoreConfig::default()).await.expect("open");
    let data = parts();
    save_all(&store, 1, &data).await;
    for depth in [1, 3, 8] {
        counter.max.store(0, Ordering::SeqCst);
        let mut total = 0u64;
        let mut sink = FnSink(|ev: RestoreEvent<'_>| {
            if let RestoreEvent::Data { bytes, .. } = ev {
                total += bytes.len() as u64;
            }
            Ok(())
        });
        let opts = RestoreOptions::default().with_chunk_bytes(256 << 10).with_depth(depth);
        store.restore(1, &mut sink, &opts).await.expect("restore");
        assert_eq!(total, data.iter().map(|(_, d)| d.len() as u64).sum::<u64>());
        let max = counter.max.load(Ordering::SeqCst);
        assert!(max <= depth, "depth {depth}: {max} reads in flight");
        assert!(max == depth, "depth {depth}: only {max} reads were ever in flight at once");
    }
}
