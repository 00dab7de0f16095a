//! The loader over real files through the io_uring tier: batches, exactly-once sharding,
//! resume, decode, bad samples, bad settings.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use ringtier_core::{ErrorKind, Tier};
use ringtier_dataset::manifest::{checksum, Manifest, ManifestEntry};
use ringtier_dataset::{Dataset, OnBadSample};
use ringtier_decode::DecodeConfig;
use ringtier_loader::{Loader, LoaderConfig, SampleData};
use ringtier_uring::{UringConfig, UringTier};

fn jpeg(seed: u32, w: u16, h: u16) -> Vec<u8> {
    let pixels: Vec<u8> = (0..w as u32 * h as u32 * 3).map(|i| ((i * 7 + seed * 13) % 251) as u8).collect();
    let mut out = Vec::new();
    jpeg_encoder::Encoder::new(&mut out, 80).encode(&pixels, w, h, jpeg_encoder::ColorType::Rgb).expect("encode");
    out
}

/// `n` small JPEGs and a manifest.
fn dataset_dir(n: usize) -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix("loader").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let mut entries = Vec::new();
    for i in 0..n {
        let key = format!("c{}/img{i:04}.jpg", i % 3);
        let data = jpeg(i as u32, 40 + (i % 7) as u16 * 8, 30 + (i % 5) as u16 * 6);
        let p = dir.path().join(&key);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(&p, &data).expect("write");
        entries.push(ManifestEntry { key, size: data.len() as u64, crc32c: checksum(&data) });
    }
    Manifest { entries }.store(dir.path()).expect("manifest");
    dir
}

async fn dataset(dir: &Path) -> Dataset {
    let tier: Arc<dyn Tier> = Arc::new(UringTier::new(dir, UringConfig::default()).expect("tier"));
    Dataset::from_dir(tier, dir).await.expect("dataset")
}

async fn epoch_indices(loader: &Loader, epoch: u64, position: usize) -> Vec<u32> {
    let mut e = loader.epoch(epoch, position).expect("epoch");
    let mut out = Vec::new();
    while let Some(b) = e.next().await {
        out.extend(b.expect("batch").indices);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_decode_and_cover_the_epoch_once() {
    let dir = dataset_dir(50);
    let cfg = LoaderConfig::default().with_batch_size(8).with_decode(DecodeConfig::default()).with_seed(3);
    let loader = Loader::new(dataset(dir.path()).await, cfg).expect("loader");
    let mut e = loader.epoch(0, 0).expect("epoch");
    let mut seen = Vec::new();
    let mut sizes = Vec::new();
    while let Some(b) = e.next().await {
        let b = b.expect("batch");
        assert!(b.skipped.is_empty());
        for s in &b.samples {
            assert!(matches!(s, SampleData::Decoded(_)));
            sizes.push(s.as_slice().len());
        }
        seen.extend(b.indices);
    }
    assert_eq!(sizes.len(), 50);
    assert!(sizes.iter().all(|&n| n == 224 * 224 * 3));
    let unique: BTreeSet<u32> = seen.iter().copied().collect();
    assert_eq!(unique.len(), 50, "each sample once");
    let st = e.stats();
    assert_eq!((st.batches, st.samples, st.skipped), (7, 50, 0));
    assert!(st.decode_seconds > 0.0 && st.read_seconds > 0.0);
    // Deterministic per epoch, different across epochs.
    assert_eq!(epoch_indices(&loader, 0, 0).await, seen);
    assert_ne!(epoch_indices(&loader, 1, 0).await, seen);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranks_shard_exactly_once_and_resume_gives_the_rest() {
    let dir = dataset_dir(31);
    let mut all = Vec::new();
    for rank in 0..3 {
        let cfg = LoaderConfig::default().with_batch_size(4).with_rank(rank).with_world(3).with_seed(9);
        let loader = Loader::new(dataset(dir.path()).await, cfg).expect("loader");
        let full = epoch_indices(&loader, 2, 0).await;
        assert_eq!(full.len(), loader.samples_per_epoch());
        // Resume after two batches: exactly the remaining samples.
        assert_eq!(epoch_indices(&loader, 2, 8).await, &full[8..]);
        let err = loader.epoch(2, full.len() + 1).expect_err("past the end");
        assert_eq!(err.kind(), ErrorKind::OutOfRange);
        all.extend(full);
    }
    all.sort_unstable();
    assert_eq!(all, (0..31).collect::<Vec<u32>>());
}

/// The first error of epoch 0 (a loader that must fail).
async fn first_error(loader: &Loader) -> ringtier_core::Error {
    let mut e = loader.epoch(0, 0).expect("epoch");
    while let Some(b) = e.next().await {
        if let Err(err) = b {
            return err;
        }
    }
    panic!("an error for the bad sample");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_samples_are_skipped_and_counted_or_fail() {
    let dir = dataset_dir(20);
    let m = Manifest::load(dir.path()).expect("manifest");
    // A missing file, and a file of the right size that is not a JPEG.
    std::fs::remove_file(dir.path().join(&m.entries[2].key)).expect("rm");
    let junk = vec![0x55u8; m.entries[5].size as usize];
    std::fs::write(dir.path().join(&m.entries[5].key), &junk).expect("junk");
    let cfg = LoaderConfig::default().with_batch_size(5).with_decode(DecodeConfig::default());
    let loader = Loader::new(dataset(dir.path()).await, cfg.clone()).expect("loader");
    let mut e = loader.epoch(0, 0).expect("epoch");
    let mut skipped = Vec::new();
    while let Some(b) = e.next().await {
        skipped.extend(b.expect("batch").skipped);
    }
    assert_eq!(e.stats().skipped, 2);
    assert_eq!(e.stats().samples, 18);
    assert!(skipped.iter().any(|s| s.contains(&m.entries[2].key) && s.contains("not_found")), "{skipped:?}");
    assert!(skipped.iter().any(|s| s.contains(&m.entries[5].key) && s.contains("JPEG")), "{skipped:?}");

    let loader = Loader::new(dataset(dir.path()).await, cfg.with_on_bad(OnBadSample::Fail)).expect("loader");
    let err = first_error(&loader).await;
    assert!(err.to_string().contains(".jpg"), "names the sample: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_sample_fails_with_its_own_kind() {
    // Under OnBadSample::Fail a file gone since the listing is NotFound (not Corrupt), and a
    // file that does not decode is Corrupt; both name the sample.
    for (case, want) in [("gone", ErrorKind::NotFound), ("junk", ErrorKind::Corrupt)] {
        let dir = dataset_dir(6);
        let m = Manifest::load(dir.path()).expect("manifest");
        let key = m.entries[3].key.clone();
        if case == "gone" {
            std::fs::remove_file(dir.path().join(&key)).expect("rm");
        } else {
            std::fs::write(dir.path().join(&key), vec![0x55u8; m.entries[3].size as usize]).expect("junk");
        }
        let cfg = LoaderConfig::default()
            .with_batch_size(2)
            .with_decode(DecodeConfig::default())
            .with_on_bad(OnBadSample::Fail);
        let loader = Loader::new(dataset(dir.path()).await, cfg).expect("loader");
        let err = first_error(&loader).await;
        assert_eq!(err.kind(), want, "{case}: {err}");
        assert!(err.to_string().contains(&key), "{case} names the sample: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_prefetch_the_consumer_waits_for_every_read() {
    let dir = dataset_dir(24);
    let cfg = LoaderConfig::default().with_batch_size(6).with_prefetch(0);
    let loader = Loader::new(dataset(dir.path()).await, cfg).expect("loader");
    let mut e = loader.epoch(0, 0).expect("epoch");
    while let Some(b) = e.next().await {
        b.expect("batch");
    }
    let st = e.stats();
    assert_eq!(st.batches, 4);
    assert!(st.stall_seconds >= st.read_seconds, "stall includes every read: {st:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_settings_are_clear_errors() {
    let dir = dataset_dir(5);
    let ds = dataset(dir.path()).await;
    let bad = [
        LoaderConfig::default().with_batch_size(0),
        LoaderConfig::default().with_world(0),
        LoaderConfig::default().with_rank(2).with_world(2),
        LoaderConfig::default().with_batch_size(8).with_drop_last(true),
    ];
    for cfg in bad {
        let err = Loader::new(ds.clone(), cfg.clone()).expect_err("bad settings");
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{cfg:?}: {err}");
    }
    // A batch larger than the dataset without drop_last: one short batch.
    let loader = Loader::new(ds, LoaderConfig::default().with_batch_size(8)).expect("loader");
    assert_eq!(epoch_indices(&loader, 0, 0).await.len(), 5);
}

#[test]
fn a_synchronous_loop_iterates_an_epoch() {
    let dir = dataset_dir(20);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
    let loader = rt.block_on(async {
        Loader::new(dataset(dir.path()).await, LoaderConfig::default().with_batch_size(6)).expect("loader")
    });
    let epoch = {
        let _guard = rt.enter();
        loader.epoch(0, 0).expect("epoch")
    };
    let mut it = epoch.into_iter_blocking(rt.handle().clone());
    let sizes: Vec<usize> = it.by_ref().map(|b| b.expect("batch").samples.len()).collect();
    assert_eq!(sizes, [6, 6, 6, 2]);
    assert_eq!(it.stats().samples, 20);
}
