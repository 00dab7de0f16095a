//! Loader futures and iterators dropped at random points, on the io_uring tier on ext4 with a
//! small queue depth, while plain threads open, write and close files (so freed descriptor
//! numbers are reused at once).
//!
//! `Epoch::next` futures are dropped after one poll or by a tiny timeout (with prefetch 0 that
//! cancels the batch read itself), epochs are dropped with their prefetch reading ahead, and
//! blocking iterators are dropped part-way, some reading into the tier's registered buffer
//! pool. Every batch that is delivered holds exactly each sample's bytes; afterwards the
//! dataset and the plain files hold exactly theirs.
//!
//! `RINGTIER_SEED=N` replays one seed; `RINGTIER_CANCEL_ROUNDS=N` runs N seeds per
//! configuration (default 2).

use std::future::Future;
use std::path::PathBuf;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use ringtier_core::{BufferPool, Tier};
use ringtier_dataset::manifest::{checksum, Manifest, ManifestEntry};
use ringtier_dataset::{Dataset, OnBadSample};
use ringtier_loader::{Loader, LoaderConfig};
use ringtier_testkit::SeededRng as Rng;
use ringtier_uring::{UringConfig, UringTier, UringTierOptions};

/// Polls `fut` once or runs it under a tiny timeout, dropping it if it is not done (`None`).
async fn cancel_soon<F: Future>(rng: &mut Rng, fut: F) -> Option<F::Output> {
    if rng.chance(40) {
        let mut fut = pin!(fut);
        match std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await {
            Poll::Ready(v) => Some(v),
            Poll::Pending => None,
        }
    } else {
        tokio::time::timeout(Duration::from_micros(rng.below(2000)), fut).await.ok()
    }
}

const FILES: usize = 160;

/// Sample `i`'s bytes: 1 byte to ~48 KB, a pattern no other sample shares.
fn sample(seed: u64, i: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed.wrapping_mul(31) ^ i as u64);
    let len = 1 + rng.below(48_000) as usize;
    let tag = rng.next_u64();
    (0..len as u64).map(|j| ((j.wrapping_mul(0x9E37_79B9) ^ tag) >> 13) as u8 ^ (j >> 9) as u8).collect()
}

fn key(i: usize) -> String {
    format!("d{}/s{i:04}.bin", i % 4)
}

fn dataset_dir(seed: u64) -> tempfile::TempDir {
    let dir =
        tempfile::Builder::new().prefix("loader-cancel").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let mut entries = Vec::new();
    for i in 0..FILES {
        let data = sample(seed, i);
        let p = dir.path().join(key(i));
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(&p, &data).expect("write");
        entries.push(ManifestEntry { key: key(i), size: data.len() as u64, crc32c: checksum(&data) });
    }
    Manifest { entries }.store(dir.path()).expect("manifest");
    dir
}

/// Plain threads creating, writing, reading back and removing files, so that descriptor
/// numbers freed by the tier are reused at once; counts files that did not hold their bytes.
fn churn(dir: PathBuf, id: u64, stop: Arc<AtomicBool>, bad: Arc<AtomicU64>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let path = dir.join(format!("churn-{id}-{n}"));
            let data: Vec<u8> = (0..2048 + (n % 5) * 3000).map(|j| (j ^ (id << 4) ^ n) as u8).collect();
            if std::fs::write(&path, &data).is_ok() {
                if std::fs::read(&path).ok().as_deref() != Some(data.as_slice()) {
                    bad.fetch_add(1, Ordering::Relaxed);
                }
                let _ = std::fs::remove_file(&path);
            }
            n += 1;
        }
        n
    })
}

#[derive(Debug, Default)]
struct Counts {
    batches: u64,
    samples: u64,
    cancelled: u64,
    dropped_epochs: u64,
}

/// Checks one delivered batch against the dataset; the error names the first wrong sample.
fn check_batch(seed: u64, b: &ringtier_loader::Batch) -> Result<(), String> {
    if !b.skipped.is_empty() {
        return Err(format!("batch {} skipped samples: {:?}", b.index, b.skipped));
    }
    for (&i, s) in b.indices.iter().zip(&b.samples) {
        if s.as_slice() != sample(seed, i as usize).as_slice() {
            return Err(format!("batch {}: sample {} ({}) holds other bytes", b.index, i, key(i as usize)));
        }
    }
    Ok(())
}

async fn run(seed: u64, queue_depth: u32, registered_pool: bool, prefetch: usize) -> Result<Counts, String> {
    let dir = dataset_dir(seed);
    let churn_dir = tempfile::Builder::new().prefix("churn").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let mut rng = Rng::new(seed ^ u64::from(queue_depth) << 40 ^ (prefetch as u64) << 48);
    let cfg = LoaderConfig::default()
        .with_batch_size(4 + rng.below(12) as usize)
        .with_prefetch(prefetch)
        .with_seed(seed)
        .with_on_bad(OnBadSample::Fail);
    let max = (0..FILES).map(|i| sample(seed, i).len() as u64).max().unwrap_or(1);
    let config = UringConfig::default().with_queue_depth(queue_depth).with_register_buffers(registered_pool);
    let mut options = UringTierOptions::default();
    if registered_pool {
        options.pool = Some(BufferPool::new(Loader::pool_config(max, 4096, &cfg)).map_err(|e| e.to_string())?);
    }
    let tier: Arc<dyn Tier> =
        Arc::new(UringTier::with_options(dir.path(), config, options).map_err(|e| format!("tier: {e}"))?);
    let dataset = Dataset::from_dir(tier, dir.path()).await.map_err(|e| format!("dataset: {e}"))?;
    let loader = Arc::new(Loader::new(dataset, cfg).map_err(|e| format!("loader: {e}"))?);
    if registered_pool && !loader.uses_tier_pool() {
        return Err("the loader does not read into the tier's registered pool".into());
    }
    let stop = Arc::new(AtomicBool::new(false));
    let bad = Arc::new(AtomicU64::new(0));
    let churners: Vec<_> =
        (0..2).map(|i| churn(churn_dir.path().to_path_buf(), i, Arc::clone(&stop), Arc::clone(&bad))).collect();
    let mut counts = Counts::default();
    let per_epoch = loader.samples_per_epoch();
    let result: Result<(), String> = async {
        for epoch in 0..10u64 {
            let position = if rng.chance(30) { rng.below(per_epoch as u64) as usize } else { 0 };
            let mut e = loader.epoch(epoch, position).map_err(|e| format!("epoch {epoch}: {e}"))?;
            let stop_after = rng.below(40);
            if rng.chance(25) {
                // A synchronous training loop that stops part-way.
                let rt = tokio::runtime::Handle::current();
                let take = stop_after as usize;
                let checked = tokio::task::spawn_blocking(move || -> Result<u64, String> {
                    let mut n = 0;
                    for b in e.into_iter_blocking(rt).take(take) {
                        let b = b.map_err(|e| format!("blocking batch: {e}"))?;
                        check_batch(seed, &b)?;
                        n += 1;
                    }
                    Ok(n)
                })
                .await
                .map_err(|e| format!("blocking iterator thread: {e}"))??;
                counts.batches += checked;
                counts.dropped_epochs += 1;
                continue;
            }
            let mut asked = 0;
            loop {
                if asked == stop_after {
                    counts.dropped_epochs += 1;
                    break; // dropped with its prefetch reading ahead
                }
                asked += 1;
                let item = if rng.chance(35) {
                    match cancel_soon(&mut rng, e.next()).await {
                        Some(item) => item,
                        None => {
                            counts.cancelled += 1;
                            continue;
                        }
                    }
                } else {
                    e.next().await
                };
                match item {
                    None => break,
                    Some(Ok(b)) => {
                        check_batch(seed, &b)?;
                        counts.batches += 1;
                        counts.samples += b.samples.len() as u64;
                    }
                    Some(Err(err)) => return Err(format!("epoch {epoch}: {err}")),
                }
            }
        }
        Ok(())
    }
    .await;
    stop.store(true, Ordering::Relaxed);
    for h in churners {
        h.join().map_err(|_| "churn thread panicked".to_string())?;
    }
    result?;
    let bad = bad.load(Ordering::Relaxed);
    if bad > 0 {
        return Err(format!("{bad} plain files did not hold their own bytes"));
    }
    for i in 0..FILES {
        if std::fs::read(dir.path().join(key(i))).ok() != Some(sample(seed, i)) {
            return Err(format!("dataset file {} changed", key(i)));
        }
    }
    Ok(counts)
}

fn seeds() -> Vec<u64> {
    if let Ok(s) = std::env::var("RINGTIER_SEED") {
        return vec![s.trim().parse().expect("RINGTIER_SEED is a number")];
    }
    let rounds: u64 = std::env::var("RINGTIER_CANCEL_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(2);
    (1..=rounds).collect()
}

#[test]
fn dropped_loader_futures_deliver_only_exact_samples() {
    let mut failures = Vec::new();
    // (queue depth, registered pool, prefetch)
    for (qd, registered, prefetch) in [(1, false, 0), (2, true, 2), (4, false, 1), (1, true, 0)] {
        for seed in seeds() {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
            let started = std::time::Instant::now();
            match rt.block_on(run(seed, qd, registered, prefetch)) {
                Ok(c) => eprintln!(
                    "seed {seed}, queue depth {qd}, registered pool {registered}, prefetch {prefetch}: {c:?} ({:.1} s)",
                    started.elapsed().as_secs_f64()
                ),
                Err(e) => {
                    eprintln!(
                        "seed {seed}, queue depth {qd}, registered pool {registered}, prefetch {prefetch}: FAILED: {e}\n\
                         replay: RINGTIER_SEED={seed}"
                    );
                    failures.push((seed, qd, registered, prefetch));
                }
            }
        }
    }
    assert!(failures.is_empty(), "failing (seed, queue depth, registered, prefetch): {failures:?}");
}
