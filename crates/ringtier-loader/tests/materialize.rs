//! The split point: decode + resize stored once in a tier, later epochs read it back and run
//! only the random steps; keyed by the manifest and the size.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringtier_core::Tier;
use ringtier_dataset::manifest::{checksum, Manifest, ManifestEntry};
use ringtier_dataset::Dataset;
use ringtier_decode::{Crop, DecodeConfig, Layout, Normalize};
use ringtier_loader::{materialized_prefix, Loader, LoaderConfig, Materialize};
use ringtier_uring::{UringConfig, UringTier};

fn jpeg(seed: u32, w: u16, h: u16) -> Vec<u8> {
    let pixels: Vec<u8> = (0..w as u32 * h as u32 * 3)
        .map(|i| ((i % (w as u32 * 3)) * 3 + (i / (w as u32 * 3)) * 2 + seed * 13) as u8)
        .collect();
    let mut out = Vec::new();
    jpeg_encoder::Encoder::new(&mut out, 85).encode(&pixels, w, h, jpeg_encoder::ColorType::Rgb).expect("encode");
    out
}

fn tempdir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(prefix).tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir")
}

fn dataset_dir(n: usize) -> tempfile::TempDir {
    let dir = tempdir("mat-data");
    let mut entries = Vec::new();
    for i in 0..n {
        let key = format!("img{i:04}.jpg");
        let data = jpeg(i as u32, 90 + (i % 5) as u16 * 20, 70 + (i % 3) as u16 * 30);
        std::fs::write(dir.path().join(&key), &data).expect("write");
        entries.push(ManifestEntry { key, size: data.len() as u64, crc32c: checksum(&data) });
    }
    Manifest { entries }.store(dir.path()).expect("manifest");
    dir
}

async fn dataset(dir: &Path) -> Dataset {
    let tier: Arc<dyn Tier> = Arc::new(UringTier::new(dir, UringConfig::default()).expect("tier"));
    Dataset::from_dir(tier, dir).await.expect("dataset")
}

async fn epoch(loader: &Loader, e: u64) -> (BTreeMap<u32, Vec<u8>>, u64) {
    let mut ep = loader.epoch(e, 0).expect("epoch");
    let mut out = BTreeMap::new();
    while let Some(b) = ep.next().await {
        let b = b.expect("batch");
        for (i, s) in b.indices.iter().zip(&b.samples) {
            out.insert(*i, s.as_slice().to_vec());
        }
    }
    (out, ep.stats().skipped)
}

async fn stored(tier: &dyn Tier, prefix: &str, n: usize) -> Vec<ringtier_core::ObjectMeta> {
    let start = Instant::now();
    loop {
        let l = tier.list(prefix).await.expect("list");
        if l.len() >= n || start.elapsed() > Duration::from_secs(20) {
            return l;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn later_epochs_read_the_stored_samples_and_run_only_the_random_steps() {
    let n = 24;
    let dir = dataset_dir(n);
    let store_dir = tempdir("mat-store");
    let store: Arc<dyn Tier> = Arc::new(UringTier::new(store_dir.path(), UringConfig::default()).expect("tier"));
    let decode = DecodeConfig::default()
        .with_size(48)
        .with_crop(Crop::RANDOM_RESIZED)
        .with_flip(true)
        .with_layout(Layout::Chw)
        .with_normalize(Normalize::IMAGENET);
    let cfg = LoaderConfig::default()
        .with_batch_size(5)
        .with_decode(decode)
        .with_materialize(Materialize::new(Arc::clone(&store)).with_size(64));
    let ds = dataset(dir.path()).await;
    let prefix = materialized_prefix(&ds, 64);
    let loader = Loader::new(ds, cfg.clone()).expect("loader");

    // Epoch 0 decodes every JPEG and stores it, 64x64x3 bytes each.
    let (first, skipped) = epoch(&loader, 0).await;
    assert_eq!((first.len(), skipped), (n, 0));
    assert!(first.values().all(|v| v.len() == 48 * 48 * 3 * 4));
    // Written by the time the epoch ends (a process may exit right after its last batch, as a
    // DataLoader worker does): no waiting here.
    let objs = store.list(&prefix).await.expect("list");
    assert_eq!(objs.len(), n, "every sample stored under {prefix} when the epoch ends");
    assert!(objs.iter().all(|o| o.size == 64 * 64 * 3));

    // With the JPEGs destroyed, the same epoch comes back identical from the store alone.
    let m = Manifest::load(dir.path()).expect("manifest");
    let originals: Vec<Vec<u8>> =
        m.entries.iter().map(|e| std::fs::read(dir.path().join(&e.key)).expect("read")).collect();
    for e in &m.entries {
        std::fs::write(dir.path().join(&e.key), vec![0x55u8; e.size as usize]).expect("junk");
    }
    let (again, skipped) = epoch(&loader, 0).await;
    assert_eq!(skipped, 0, "served from the store");
    assert_eq!(again, first, "same seed and epoch: the same crops and flips");
    // Another epoch draws other crops from the same stored pixels.
    let (other, _) = epoch(&loader, 1).await;
    assert_eq!(other.len(), n);
    assert_ne!(other, first);

    // A stored sample of the wrong size is a miss: decoded from its JPEG (junk now: skipped)
    // rather than read wrong.
    let victim = store_dir.path().join(format!("{prefix}/{:08}.rgb", 3));
    std::fs::write(&victim, [1u8, 2, 3]).expect("truncate");
    let (_, skipped) = epoch(&loader, 0).await;
    assert_eq!(skipped, 1);

    // A changed dataset (one JPEG rewritten, manifest updated) gets another prefix: nothing
    // stale is read.
    for (e, data) in m.entries.iter().zip(&originals) {
        std::fs::write(dir.path().join(&e.key), data).expect("restore");
    }
    let mut m2 = m.clone();
    let data = jpeg(999, 100, 80);
    std::fs::write(dir.path().join(&m2.entries[0].key), &data).expect("rewrite");
    m2.entries[0].size = data.len() as u64;
    m2.entries[0].crc32c = checksum(&data);
    m2.store(dir.path()).expect("manifest");
    let ds2 = dataset(dir.path()).await;
    assert_ne!(materialized_prefix(&ds2, 64), prefix);
    assert_ne!(materialized_prefix(&dataset(dir.path()).await, 96), materialized_prefix(&ds2, 64));

    // Without decode there is nothing to materialize.
    let raw = LoaderConfig::default().with_materialize(Materialize::new(store));
    let err = Loader::new(ds2, raw).expect_err("materialize without decode");
    assert_eq!(err.kind(), ringtier_core::ErrorKind::InvalidInput);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deterministic_crop_is_stored_as_itself_under_its_own_key() {
    let n = 6;
    let dir = dataset_dir(n);
    let store_dir = tempdir("mat-crop");
    let store: Arc<dyn Tier> = Arc::new(UringTier::new(store_dir.path(), UringConfig::default()).expect("tier"));
    // A random crop frozen into the store would be the same every epoch: refused.
    let random = Crop::RandomResized { scale: (0.08, 1.0), ratio: (0.75, 4.0 / 3.0) };
    let err = Materialize::new(Arc::clone(&store)).with_crop(random).expect_err("a random crop is not stored");
    assert_eq!(err.kind(), ringtier_core::ErrorKind::InvalidInput);

    let crop = Crop::Center { resize: 40 };
    let ds = dataset(dir.path()).await;
    let prefix = ringtier_loader::materialized_prefix_cropped(&ds, 32, crop);
    assert_ne!(prefix, materialized_prefix(&ds, 32), "the crop is part of the key");
    assert_eq!(ringtier_loader::materialized_prefix_cropped(&ds, 32, Crop::Resize), materialized_prefix(&ds, 32));

    // Stored: the center crop itself; read back: exactly the online center crop's pixels.
    let online = DecodeConfig::default().with_size(32).with_crop(crop).with_threads(1);
    let want = epoch(
        &Loader::new(ds.clone(), LoaderConfig::default().with_batch_size(4).with_decode(online)).expect("loader"),
        0,
    )
    .await
    .0;
    let m = Materialize::new(Arc::clone(&store)).with_size(32).with_crop(crop).expect("crop");
    let cfg = LoaderConfig::default()
        .with_batch_size(4)
        .with_decode(DecodeConfig::default().with_size(32).with_threads(1))
        .with_materialize(m);
    let loader = Loader::new(ds.clone(), cfg).expect("loader");
    assert_eq!(epoch(&loader, 0).await.0, want, "the storing epoch yields the crop");
    let held = stored(store.as_ref(), &prefix, n).await;
    assert_eq!(held.len(), n);
    assert!(held.iter().all(|o| o.size == 32 * 32 * 3));
    assert_eq!(epoch(&loader, 1).await.0, want, "later epochs read it back unchanged");
}
