//! Datasets as real jobs meet them: a bad entry in the directory (left out and named, or an
//! error naming it), sizes the listing did not stat (learned from the reads, files larger than
//! a buffer included), on both engines.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use ringtier_core::{ErrorKind, ListOptions, PosixConfig, PosixTier, Tier};
use ringtier_dataset::Dataset;
use ringtier_loader::{Loader, LoaderConfig, SampleData};
use ringtier_testkit::pattern;
use ringtier_uring::{UringConfig, UringTier, UringTierOptions};

/// `n` files of 1 byte to 20 KB and a few of 100-300 KB, under 4 class directories.
fn files(dir: &Path, n: usize) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for i in 0..n {
        let size = if i % 50 == 7 { 100_000 + i * 997 } else { 1 + (i * 7919) % 20_000 };
        let key = format!("c{}/{i:05}.bin", i % 4);
        let data = pattern(i as u64, size);
        let p = dir.join(&key);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(&p, &data).expect("write");
        out.insert(key, data);
    }
    out
}

fn tiers(root: &Path) -> Vec<Arc<dyn Tier>> {
    let uring =
        UringTier::with_options(root, UringConfig::default(), UringTierOptions::default().with_follow_links(true))
            .expect("uring");
    let posix = PosixTier::new(PosixConfig::new(root).with_follow_links(true)).expect("posix");
    vec![Arc::new(uring), Arc::new(posix)]
}

async fn read_epoch(loader: &Loader) -> (BTreeMap<String, Vec<u8>>, Vec<String>) {
    let mut e = loader.epoch(0, 0).expect("epoch");
    let (mut got, mut skipped) = (BTreeMap::new(), Vec::new());
    let keys = loader_keys(loader);
    while let Some(b) = e.next().await {
        let b = b.expect("batch");
        skipped.extend(b.skipped);
        for (i, s) in b.indices.iter().zip(b.samples) {
            let SampleData::Raw(buf) = s else { panic!("raw") };
            got.insert(keys[*i as usize].clone(), buf.as_slice().to_vec());
        }
    }
    (got, skipped)
}

fn loader_keys(loader: &Loader) -> Vec<String> {
    loader.dataset().iter().map(|s| s.key.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dangling_link_is_left_out_and_named_or_fails_the_listing() {
    let dir = tempfile::Builder::new().prefix("bad-entry").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let root = dir.path().join("root");
    let want = files(&root, 60);
    std::os::unix::fs::symlink(dir.path().join("gone.bin"), root.join("c1/dead.bin")).expect("dangling link");
    for tier in tiers(&root) {
        let err = Dataset::from_dir(Arc::clone(&tier), &root).await.expect_err("strict");
        assert_eq!((err.kind(), err.key()), (ErrorKind::NotFound, Some("c1/dead.bin")), "{err}");
        let lenient = ListOptions::default().with_skip_bad(true);
        let ds = Dataset::from_dir_with(Arc::clone(&tier), &root, lenient).await.expect("lenient");
        assert_eq!(ds.len(), want.len());
        assert_eq!(ds.skipped().len(), 1);
        assert_eq!(ds.skipped()[0].key, "c1/dead.bin");
        let line = Dataset::skipped_summary(ds.skipped(), "root");
        assert!(line.contains("c1/dead.bin (broken symbolic link"), "{line}");
        let loader = Loader::new(ds, LoaderConfig::default().with_batch_size(16)).expect("loader");
        let (got, skipped) = read_epoch(&loader).await;
        assert!(skipped.is_empty(), "{skipped:?}");
        assert_eq!(got, want, "{}", tier.name());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sizes_not_stated_are_learned_from_the_reads() {
    let dir = tempfile::Builder::new().prefix("no-stat").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let want = files(dir.path(), 300);
    for tier in tiers(dir.path()) {
        let options = ListOptions::default().with_skip_bad(true).with_stat_files(false);
        let ds = Dataset::from_dir_with(Arc::clone(&tier), dir.path(), options).await.expect("dataset");
        assert!(!ds.sizes_known());
        assert!(ds.max_size() > 0, "the buffers are sized from an estimate");
        // Buffers of 8 KiB: the larger files take several reads each.
        for read_size in [0, 8192] {
            let cfg = LoaderConfig::default().with_batch_size(32).with_read_size(read_size);
            let loader = Loader::new(ds.clone(), cfg).expect("loader");
            let (got, skipped) = read_epoch(&loader).await;
            assert!(skipped.is_empty(), "{skipped:?}");
            assert_eq!(got.len(), want.len());
            assert!(got == want, "{}: read_size {read_size}: every file whole", tier.name());
            assert_eq!(loader.buffer_pool().in_use(), 0);
        }
    }
}
