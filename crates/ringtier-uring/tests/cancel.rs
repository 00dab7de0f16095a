//! Futures dropped at random points while the queue is full: nothing may land in the wrong file.
//!
//! Many writers stream distinct byte patterns into objects on ext4 through a small queue depth;
//! about a third of their `write_at` futures are dropped (after one poll, or by a tiny timeout),
//! after which the writer is either dropped at once or rewrites the range with its final bytes;
//! some `commit` futures are dropped too. Meanwhile plain threads open, write and close files
//! (so freed descriptor numbers are reused at once) and readers drop `read_batch` futures and
//! `UringFile`s (registered files included). Afterwards every file on disk holds exactly its own
//! bytes or does not exist.
//!
//! `RINGTIER_SEED=N` replays one seed; `RINGTIER_CANCEL_ROUNDS=N` runs N seeds per
//! configuration (default 2).

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use ringtier_core::{AlignedBuf, ReadBatch, Tier};
use ringtier_testkit::pattern;
use ringtier_testkit::SeededRng as Rng;
use ringtier_uring::{UringConfig, UringTier};

/// Polls `fut` once or runs it under a tiny timeout, then drops it if it is not done.
async fn maybe_cancel<F: Future>(rng: &mut Rng, fut: F) -> Option<F::Output> {
    if rng.chance(50) {
        let mut fut = pin!(fut);
        std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await.ok()
    } else {
        tokio::time::timeout(Duration::from_micros(rng.below(300)), fut).await.ok()
    }
}

trait PollExt<T> {
    fn ok(self) -> Option<T>;
}

impl<T> PollExt<T> for Poll<T> {
    fn ok(self) -> Option<T> {
        match self {
            Poll::Ready(v) => Some(v),
            Poll::Pending => None,
        }
    }
}

fn buf_with(data: &[u8]) -> AlignedBuf {
    let mut b = AlignedBuf::new(data.len().next_multiple_of(4096).max(4096), 4096).expect("buffer");
    b.fill_from(data).expect("fill");
    b
}

#[derive(Debug)]
enum Outcome {
    /// `commit` returned Ok: the object holds exactly these bytes.
    Committed(Vec<u8>),
    /// The writer was dropped before commit: the object must not exist.
    Absent,
    /// The commit future was dropped: the object is absent or holds exactly these bytes.
    Maybe(Vec<u8>),
}

const CHUNK: usize = 64 << 10;

async fn writer(tier: UringTier, seed: u64, i: u64) -> (String, Outcome) {
    let mut rng = Rng::new(seed ^ (i << 20));
    let key = format!("obj/w{i:03}");
    let mut w = tier.create(&key).await.expect("create");
    let chunks = 1 + rng.below(4) as usize;
    let tail = 1 + rng.below(CHUNK as u64) as usize;
    let mut content = Vec::new();
    for k in 0..chunks {
        let len = if k + 1 == chunks { tail } else { CHUNK };
        let offset = (k * CHUNK) as u64;
        let final_bytes = pattern(seed.wrapping_mul(1_000_003) ^ (i << 8) ^ k as u64, len);
        if rng.chance(35) {
            // A decoy write that is dropped mid-flight: its bytes are not the object's.
            let decoy = pattern(!seed ^ (i << 8) ^ k as u64, len);
            if maybe_cancel(&mut rng, w.write_at(offset, buf_with(&decoy))).await.is_none() && rng.chance(50) {
                drop(w);
                return (key, Outcome::Absent);
            }
        }
        let (res, _) = w.write_at(offset, buf_with(&final_bytes)).await;
        res.expect("write");
        content.extend_from_slice(&final_bytes);
    }
    if rng.chance(15) {
        match maybe_cancel(&mut rng, w.commit()).await {
            Some(res) => {
                res.expect("commit");
                (key, Outcome::Committed(content))
            }
            None => (key, Outcome::Maybe(content)),
        }
    } else {
        w.commit().await.expect("commit");
        (key, Outcome::Committed(content))
    }
}

/// Opens, writes and closes plain files as fast as it can: the descriptor numbers freed by
/// dropped writers and files get reused at once.
fn churn(dir: &Path, thread: u64, stop: &AtomicBool) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut written = Vec::new();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) && n < 2000 {
        let path = dir.join(format!("plain-{thread}-{n}"));
        let data = pattern((thread << 32) | n, 4096 + (n as usize % 3) * 1000);
        std::fs::write(&path, &data).expect("plain write");
        written.push((path, data));
        n += 1;
    }
    written
}

/// Reads committed `r*` files with dropped batches and dropped `UringFile`s; every read that
/// completes must return its own file's bytes.
async fn reader(tier: UringTier, seed: u64, files: Arc<Vec<(String, Vec<u8>)>>) {
    let mut rng = Rng::new(seed ^ 0xfeed);
    for _ in 0..40 {
        let (key, data) = &files[rng.below(files.len() as u64) as usize];
        if rng.chance(50) {
            let mut batch = ReadBatch::new();
            for _ in 0..4 {
                batch.push(
                    key,
                    0,
                    data.len() + 1,
                    AlignedBuf::new(data.len().next_multiple_of(4096) + 4096, 4096).expect("buf"),
                );
            }
            if let Some(mut done) = maybe_cancel(&mut rng, tier.read_batch(batch)).await {
                for (_, _, res, buf) in done.drain() {
                    let n = res.expect("read");
                    assert_eq!(&buf.expect("buffer back").as_slice()[..n], &data[..], "seed {seed}: {key}");
                }
            }
        } else {
            let file = tier.open_file(key).await.expect("open_file");
            let mut batch = ReadBatch::new();
            batch.push_range(
                0,
                data.len(),
                AlignedBuf::new(data.len().next_multiple_of(4096) + 4096, 4096).expect("buf"),
            );
            let fut = file.read_batch(batch);
            let got = maybe_cancel(&mut rng, fut).await;
            drop(file);
            if let Some(mut done) = got {
                for (_, _, res, buf) in done.drain() {
                    let n = res.expect("read");
                    assert_eq!(&buf.expect("buffer back").as_slice()[..n], &data[..], "seed {seed}: {key}");
                }
            }
        }
    }
}

async fn round(seed: u64, config: UringConfig, writers: u64) {
    let dir = tempfile::Builder::new().prefix("cancel").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let plain = dir.path().join("plain");
    std::fs::create_dir_all(&plain).expect("mkdir");
    let root = dir.path().join("root");
    let tier = UringTier::with_options(
        &root,
        config.clone(),
        ringtier_uring::UringTierOptions::default().with_create_root(true),
    )
    .expect("tier");
    // Files the readers read.
    let mut files = Vec::new();
    for k in 0..8u64 {
        let data = pattern(seed ^ (k << 40), 3000 + k as usize * 5000);
        let key = format!("r{k}");
        std::fs::write(root.join(&key), &data).expect("write r");
        files.push((key, data));
    }
    let files = Arc::new(files);

    let stop = Arc::new(AtomicBool::new(false));
    let churners: Vec<_> = (0..2u64)
        .map(|t| {
            let (plain, stop) = (plain.clone(), Arc::clone(&stop));
            std::thread::spawn(move || churn(&plain, t, &stop))
        })
        .collect();
    let mut tasks = Vec::new();
    for i in 0..writers {
        tasks.push(tokio::spawn(writer(tier.clone(), seed, i)));
    }
    let readers: Vec<_> =
        (0..2u64).map(|r| tokio::spawn(reader(tier.clone(), seed ^ (r << 50), Arc::clone(&files)))).collect();
    let mut outcomes = BTreeMap::new();
    for t in tasks {
        let (key, outcome) = t.await.expect("writer task");
        outcomes.insert(key, outcome);
    }
    for r in readers {
        r.await.expect("reader task");
    }
    stop.store(true, Ordering::Relaxed);
    let mut plain_files = Vec::new();
    for c in churners {
        plain_files.extend(c.join().expect("churn thread"));
    }
    // Dropping the tier waits for everything still queued or in flight.
    drop(tier);

    let replay = format!("replay with RINGTIER_SEED={seed} (config {config:?})");
    for (path, data) in &plain_files {
        let got = std::fs::read(path).expect("read plain");
        assert!(got == *data, "{}: a plain file holds bytes that are not its own; {replay}", path.display());
    }
    for (key, outcome) in &outcomes {
        let got = std::fs::read(root.join(key)).ok();
        match (outcome, got) {
            (Outcome::Committed(want), Some(got)) => {
                assert!(got == *want, "{key}: committed object holds other bytes; {replay}")
            }
            (Outcome::Committed(_), None) => panic!("{key}: committed object missing; {replay}"),
            (Outcome::Absent, Some(_)) => panic!("{key}: object of a dropped writer exists; {replay}"),
            (Outcome::Absent, None) | (Outcome::Maybe(_), None) => {}
            (Outcome::Maybe(want), Some(got)) => {
                assert!(got == *want, "{key}: object of a dropped commit holds other bytes; {replay}")
            }
        }
    }
    for (key, data) in files.iter() {
        assert_eq!(std::fs::read(root.join(key)).expect("read r"), *data, "{key}; {replay}");
    }
    let staged: Vec<_> = std::fs::read_dir(root.join(".ringtier-staging"))
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(staged.is_empty(), "staged files left behind: {staged:?}; {replay}");
}

fn seeds() -> Vec<u64> {
    if let Some(s) = std::env::var("RINGTIER_SEED").ok().and_then(|s| s.parse().ok()) {
        return vec![s];
    }
    let rounds = std::env::var("RINGTIER_CANCEL_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(2u64);
    (1..=rounds).collect()
}

fn run(config: UringConfig) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    for seed in seeds() {
        eprintln!("seed {seed}, {config:?}");
        rt.block_on(round(seed, config.clone(), 48));
    }
}

#[test]
fn dropped_futures_never_write_elsewhere_at_depth_1() {
    run(UringConfig::default().with_queue_depth(1));
}

#[test]
fn dropped_futures_never_write_elsewhere_at_depth_4_with_registered_files() {
    run(UringConfig::default().with_queue_depth(4).with_rings(2).with_register_files(true));
}

#[test]
fn dropped_futures_never_write_elsewhere_at_default_depth() {
    run(UringConfig::default());
}
