//! The node cache shared across processes ([`CachedTier::for_node_dir`]): independent
//! instances (one per rank, each with its own plan, as separate processes have) share one
//! directory; a hostile directory gives misses, never wrong bytes or a crash.

use std::path::Path;
use std::sync::Arc;

use ringtier_cache::{CacheConfig, CacheLevel, CachePolicy, CachedTier};
use ringtier_core::buf::AlignedBuf;
use ringtier_core::{PosixConfig, PosixTier, Tier};
use ringtier_dataset::{Dataset, Sampler};

const SIZE: usize = 4096;

fn content(i: usize) -> Vec<u8> {
    (0..SIZE).map(|b| (b as u64 * 31 + i as u64 * 7919) as u8).collect()
}

async fn dataset(root: &Path, n: usize) -> Dataset {
    std::fs::create_dir_all(root).expect("mkdir");
    for i in 0..n {
        std::fs::write(root.join(format!("s{i:05}")), content(i)).expect("write sample");
    }
    let tier: Arc<dyn Tier> = Arc::new(PosixTier::new(PosixConfig::new(root)).expect("tier"));
    Dataset::from_keys(tier, (0..n).map(|i| format!("s{i:05}"))).await.expect("dataset")
}

/// Reads rank `local`'s samples of `epoch` through `cache`, checking every byte; returns the
/// slow-tier bytes of the epoch.
async fn read_epoch(cache: &CachedTier, sampler: &Sampler, local: usize, epoch: u64) -> u64 {
    let before = cache.stats();
    cache.begin_rank_epoch(local, epoch, 0).expect("begin epoch");
    for id in sampler.epoch(epoch) {
        let buf = AlignedBuf::new(SIZE, 4096).expect("buf");
        let (res, buf) = cache.read_at(&format!("s{id:05}"), 0, SIZE, buf).await;
        assert_eq!(res.expect("read"), SIZE);
        assert_eq!(buf.as_slice(), &content(id as usize)[..], "sample {id}: wrong bytes");
        tokio::task::yield_now().await;
    }
    cache.stats().since(&before).slow_tier_bytes()
}

/// The samples held in the slot files of `dir` (from their headers), checking each file's size.
fn held(dir: &Path) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("read dir").flatten() {
        let name = e.file_name().into_string().expect("utf-8");
        if name.starts_with("slot-") && !name.ends_with(".lock") {
            let b = std::fs::read(e.path()).expect("slot file");
            if b.len() == 48 && &b[..8] == b"RTNODEX1" {
                continue; // the end of a run
            }
            assert_eq!(b.len(), 48 + SIZE, "{name}");
            out.push(u32::from_le_bytes([b[16], b[17], b[18], b[19]]));
        }
    }
    out
}

/// Runs `ranks` independent instances (each its own planner, as separate processes) over one
/// node directory for `epochs`, ranks in step per epoch; returns slow-tier bytes per epoch.
async fn run_node(
    ds: &Dataset,
    dir: &Path,
    policy: CachePolicy,
    ranks: usize,
    world: usize,
    epochs: u64,
    cap: u64,
) -> Vec<u64> {
    let samplers: Vec<Sampler> =
        (0..ranks).map(|r| Sampler::new(ds.len(), 11, r, world, true).expect("sampler")).collect();
    let caches: Vec<CachedTier> = (0..ranks)
        .map(|r| {
            let cfg = CacheConfig::new(policy, vec![CacheLevel::dir(dir, cap)]).with_prefetch_depth(32);
            CachedTier::for_node_dir(ds, samplers.clone(), r, cfg).expect("node cache")
        })
        .collect();
    let mut per_epoch = Vec::new();
    for e in 0..epochs {
        let mut tasks = tokio::task::JoinSet::new();
        for (r, c) in caches.iter().enumerate() {
            let (c, s) = (c.clone(), samplers[r]);
            tasks.spawn(async move { read_epoch(&c, &s, r, e).await });
        }
        let mut bytes = 0;
        while let Some(b) = tasks.join_next().await {
            bytes += b.expect("rank task");
        }
        for c in &caches {
            c.settle(std::time::Duration::from_millis(200)).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await; // background writes land
        per_epoch.push(bytes);
        if policy == CachePolicy::None {
            continue;
        }
        let root = caches[0].node_dir().expect("node dir").to_path_buf();
        let (slots, _) = caches[0].node_dir_usage().expect("usage");
        assert!(slots <= cap + 48 * (cap / SIZE as u64), "epoch {e}: {slots} bytes of copies over {cap}");
        // One copy per sample once the background writes of the epoch have landed (a rank
        // running ahead of another may see two for a moment: the older run's copy goes when
        // its slot's next run is written).
        let mut dups = usize::MAX;
        for _ in 0..100 {
            let mut ids = held(&root);
            let n = ids.len();
            ids.sort_unstable();
            ids.dedup();
            dups = n - ids.len();
            if dups == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(dups, 0, "{policy} epoch {e}: two copies of one sample");
    }
    if let Some(stats) = caches[0].node_dir_stats() {
        assert_eq!(stats.bad_files, 0, "{policy}: {stats:?}");
    }
    per_epoch
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ranks_share_one_copy_per_sample_and_read_less_of_the_slow_tier() {
    let tmp = tempfile::tempdir().expect("tmp");
    let ds = dataset(&tmp.path().join("data"), 800).await;
    let cap = (200 * SIZE) as u64;
    // 4 ranks of a 16-rank job sharing one node directory, and the same ranks without a cache.
    let none: u64 = run_node(&ds, &tmp.path().join("n"), CachePolicy::None, 4, 16, 3, cap).await[1..].iter().sum();
    for policy in [CachePolicy::Static, CachePolicy::Lru, CachePolicy::Clairvoyant] {
        let dir = tmp.path().join(policy.as_str());
        let bytes: u64 = run_node(&ds, &dir, policy, 4, 16, 3, cap).await[1..].iter().sum();
        assert!(bytes <= none, "{policy}: {bytes} vs none {none}");
        if policy == CachePolicy::Clairvoyant {
            // Belady on the union keeps what the node reads next: well below no cache.
            assert!((bytes as f64) < 0.8 * none as f64, "clairvoyant {bytes} vs none {none}");
        }
        // Local rank 0's drop removes the plan's directory, once the last of its work in flight
        // (a prefetch's write on the blocking pool holds the cache) has landed.
        let mut left = Vec::new();
        for _ in 0..250 {
            left = std::fs::read_dir(&dir).expect("dir").flatten().map(|e| e.path()).collect();
            if left.is_empty() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert!(left.is_empty(), "{policy}: {left:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_directory_gives_misses_never_wrong_bytes() {
    let tmp = tempfile::tempdir().expect("tmp");
    let ds = dataset(&tmp.path().join("data"), 64).await;
    let outside = tmp.path().join("outside");
    std::fs::write(&outside, vec![0xAB; 48 + SIZE]).expect("outside");
    let dir = tmp.path().join("node");
    let samplers = vec![Sampler::new(64, 3, 0, 1, true).expect("sampler")];
    let cfg = CacheConfig::new(CachePolicy::Static, vec![CacheLevel::dir(&dir, (16 * SIZE) as u64)]);
    let cache = CachedTier::for_node_dir(&ds, samplers.clone(), 0, cfg.clone()).expect("cache");
    let root = cache.node_dir().expect("root").to_path_buf();
    // Static keeps the first 16 samples read, in slots 0..16: plant something in each.
    let slot = |k: u32| root.join(format!("slot-{k:08}"));
    std::os::unix::fs::symlink(&outside, slot(0)).expect("symlink");
    std::fs::write(slot(1), vec![7u8; 100]).expect("short file");
    std::fs::write(slot(2), vec![0u8; 48 + SIZE]).expect("garbage of the right length");
    std::fs::create_dir(slot(3)).expect("a directory");
    std::os::unix::fs::symlink(&outside, root.join("slot-00000004.lock")).expect("lock symlink");
    let mut torn = b"RTNODE01".to_vec();
    torn.resize(48 + SIZE / 2, 1);
    std::fs::write(slot(5), torn).expect("torn");
    // A dead rank's temporary file.
    std::fs::write(root.join(".tmp-4000000000-3"), b"half a copy").expect("tmp file");
    // A second instance (a restarted rank) cleans it at open.
    let again = CachedTier::for_node_dir(&ds, samplers.clone(), 0, cfg).expect("cache");
    assert!(!root.join(".tmp-4000000000-3").exists(), "a crashed rank's temp file stays");
    let s = samplers[0];
    read_epoch(&cache, &s, 0, 0).await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    // Epoch 1: every byte still right; the planted files were misses, rewritten where the
    // protocol may (a link is replaced, never followed; the outside file is untouched).
    read_epoch(&cache, &s, 0, 1).await;
    assert_eq!(std::fs::read(&outside).expect("outside"), vec![0xAB; 48 + SIZE]);
    assert!(std::fs::symlink_metadata(slot(0)).expect("slot 0").is_file(), "the link was replaced by a copy");
    let st = cache.node_dir_stats().expect("stats");
    assert!(st.bad_files >= 3, "{st:?}");
    assert!(
        cache.stats().hits() > 0,
        "{st:?} {:?} {:?}",
        cache.stats(),
        std::fs::read_dir(&root).map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
    );
    drop(again);
}
