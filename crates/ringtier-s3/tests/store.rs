//! The checkpoint store's burst buffer draining to S3 (s3s-fs on loopback): parts uploaded in
//! parallel and checked after upload, the manifest last; restore from S3 once the fast copy is
//! gone; recovery on open aborting the uploads of a killed drain and re-queuing the checkpoint;
//! an S3 outage during the drain losing no acknowledged checkpoint.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ringtier_core::{AlignedBuf, PosixConfig, PosixTier, Tier};
use ringtier_migrate::{CheckpointStore, Part, StoreConfig};
use ringtier_s3::{S3Tier, MIN_PART_SIZE};
use ringtier_testkit::pattern;
use ringtier_testkit::s3::{forget_live_uploads, test_config, Fault, FaultProxy, S3sFsServer};

const PART: usize = MIN_PART_SIZE;

fn s3s_uploads(root: &std::path::Path) -> usize {
    std::fs::read_dir(root)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.starts_with(".upload-") && n.ends_with(".json")
                })
                .count()
        })
        .unwrap_or(0)
}

struct Setup {
    fast_dir: tempfile::TempDir,
    s3_dir: tempfile::TempDir,
    server: S3sFsServer,
}

impl Setup {
    fn new() -> Self {
        let s3_dir = tempfile::tempdir().expect("tempdir");
        let server = S3sFsServer::start(s3_dir.path()).expect("s3s-fs");
        Setup { fast_dir: tempfile::tempdir().expect("tempdir"), s3_dir, server }
    }

    fn fast(&self) -> Arc<dyn Tier> {
        Arc::new(PosixTier::new(PosixConfig::new(self.fast_dir.path()).with_name("fast".into())).expect("fast tier"))
    }

    async fn slow_at(&self, endpoint: &str) -> Arc<dyn Tier> {
        let cfg = test_config(endpoint, "ckpt", "run").with_part_size(PART).named("s3");
        let tier = S3Tier::new(cfg).expect("s3 tier");
        tier.create_bucket().await.expect("bucket");
        Arc::new(tier)
    }

    async fn slow(&self) -> Arc<dyn Tier> {
        self.slow_at(&self.server.endpoint()).await
    }
}

fn cfg() -> StoreConfig {
    StoreConfig::default().with_prefix("ck".into()).with_keep_last(1).with_retries(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drains_to_s3_and_restores_from_it_when_the_fast_copy_is_gone() {
    let s = Setup::new();
    let big = pattern(1, 3 * PART + 17); // a multipart part
    let small = pattern(2, 1000);
    let slow = s.slow().await;
    {
        let store = CheckpointStore::open(vec![s.fast(), Arc::clone(&slow)], cfg()).await.expect("open");
        for step in 1..=2u64 {
            store.save(step, vec![Part::bytes("model", &big), Part::bytes("opt", &small)]).await.expect("save");
        }
        store.drain().await.expect("drain to S3");
        let list = store.list().await.expect("list");
        assert!(list.iter().all(|c| c.tiers.contains(&"s3".to_string())), "{list:?}");
    }
    let keys: Vec<String> = slow.list("ck/").await.expect("list").into_iter().map(|m| m.key).collect();
    assert!(keys.iter().any(|k| k.ends_with("MANIFEST.json")), "{keys:?}");
    assert_eq!(s3s_uploads(s.s3_dir.path()), 0, "no upload left");

    // The fast copy is gone (a new node, a wiped NVMe): everything comes from S3.
    for entry in std::fs::read_dir(s.fast_dir.path()).expect("dir") {
        let p = entry.expect("entry").path();
        if p.is_dir() {
            std::fs::remove_dir_all(&p).expect("wipe");
        } else {
            std::fs::remove_file(&p).expect("wipe");
        }
    }
    let store = CheckpointStore::open(vec![s.fast(), slow], cfg()).await.expect("reopen");
    let back = store.read_part(2, "model").await.expect("restore from S3");
    assert!(back == big, "restored part differs");
    assert_eq!(store.read_part(1, "opt").await.expect("restore"), small);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_drain_is_cleaned_up_and_requeued_on_open() {
    let s = Setup::new();
    let data = pattern(3, 2 * PART + 5);
    let slow = s.slow().await;
    {
        // The drain never gets to S3: the store sees only the fast tier...
        let store = CheckpointStore::open(vec![s.fast()], cfg()).await.expect("open fast only");
        store.save(7, vec![Part::bytes("model", &data)]).await.expect("save");
    }
    // ...and a drain killed mid-upload left a multipart upload of the part behind.
    let mut w = slow.create("ck/00000000000000000007/parts/model").await.expect("create");
    let mut b = AlignedBuf::new(2 * PART, 1).expect("buf");
    b.fill_from(&data[..2 * PART]).expect("fill");
    w.write_at(0, b).await.0.expect("parts");
    std::mem::forget(w);
    forget_live_uploads();
    assert_eq!(s3s_uploads(s.s3_dir.path()), 1);

    let store = CheckpointStore::open(vec![s.fast(), Arc::clone(&slow)], cfg()).await.expect("open with S3");
    assert_eq!(s3s_uploads(s.s3_dir.path()), 0, "open aborted the leftover upload");
    store.drain().await.expect("re-queued checkpoint drained");
    let list = store.list().await.expect("list");
    assert_eq!(list.len(), 1);
    assert!(list[0].tiers.contains(&"s3".to_string()), "{list:?}");
    assert!(store.read_part(7, "model").await.expect("read") == data);
    assert_eq!(s3s_uploads(s.s3_dir.path()), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_outage_during_the_drain_loses_no_checkpoint() {
    let s = Setup::new();
    let upstream: SocketAddr = s.server.endpoint().trim_start_matches("http://").parse().expect("addr");
    let proxy = FaultProxy::start(upstream).expect("proxy");
    let slow = s.slow_at(&proxy.endpoint()).await;
    let data = pattern(4, 2 * PART + 9);
    {
        let store = CheckpointStore::open(vec![s.fast(), Arc::clone(&slow)], cfg()).await.expect("open");
        // Every part upload refused for good (a 403-like permanent error): the save is
        // acknowledged from the fast tier, the drain fails, nothing is complete on S3.
        proxy.fail_matching("partNumber=", Fault::Status(400));
        store.save(1, vec![Part::bytes("model", &data)]).await.expect("save acknowledged");
        let e = store.drain().await.expect_err("drain fails");
        assert!(e.to_string().contains("step 1"), "{e}");
        let list = store.list().await.expect("list");
        assert_eq!(list.len(), 1, "{list:?}");
        assert!(!list[0].tiers.contains(&"s3".to_string()), "listed on S3 though incomplete: {list:?}");
        assert!(store.read_part(1, "model").await.expect("fast copy kept") == data);
    }
    assert!(slow.list("ck/").await.expect("list").iter().all(|m| !m.key.ends_with("MANIFEST.json")));
    // S3 answers again: the next open re-queues the checkpoint and drains it.
    proxy.clear();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let store = CheckpointStore::open(vec![s.fast(), slow], cfg()).await.expect("reopen");
    store.drain().await.expect("drain after the outage");
    let list = store.list().await.expect("list");
    assert!(list[0].tiers.contains(&"s3".to_string()), "{list:?}");
    assert_eq!(s3s_uploads(s.s3_dir.path()), 0, "no orphaned upload");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dataset_on_s3_sharded_over_two_ranks_reads_each_object_once() {
    use ringtier_dataset::Dataset;
    use ringtier_loader::{Loader, LoaderConfig};
    let s = Setup::new();
    let tier = S3Tier::new(test_config(&s.server.endpoint(), "data", "ds")).expect("tier");
    tier.create_bucket().await.expect("bucket");
    let mut objects = Vec::new();
    for i in 0..50u64 {
        let key = format!("img/{i:04}.bin");
        let data = pattern(100 + i, 1000 + (i as usize) * 977);
        tier.put_object(&key, data.clone().into()).await.expect("put");
        objects.push((key, data));
    }
    let tier: Arc<dyn Tier> = Arc::new(tier);
    let keys: Vec<String> = tier.list("img/").await.expect("list").into_iter().map(|m| m.key).collect();
    assert_eq!(keys.len(), 50);
    let mut seen = std::collections::HashMap::new();
    for rank in 0..2 {
        let ds = Dataset::from_keys(Arc::clone(&tier), keys.clone()).await.expect("dataset on S3");
        let cfg = LoaderConfig::default().with_batch_size(8).with_rank(rank).with_world(2).with_seed(3);
        let loader = Loader::new(ds, cfg).expect("loader");
        let mut epoch = loader.epoch(0, 0).expect("epoch");
        while let Some(batch) = epoch.next().await {
            let batch = batch.expect("batch");
            for (idx, sample) in batch.indices.iter().zip(&batch.samples) {
                let (key, data) = &objects[*idx as usize];
                assert!(sample.as_slice() == data.as_slice(), "rank {rank}: {key} differs");
                *seen.entry(key.clone()).or_insert(0) += 1;
            }
        }
    }
    assert_eq!(seen.len(), 50, "every object read");
    assert!(seen.values().all(|&n| n == 1), "each object read exactly once per epoch: {seen:?}");
}

/// Until `cond` holds (polled every 5 ms), at most `secs` seconds.
fn wait_until(secs: u64, cond: impl Fn() -> bool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while !cond() {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_killed_mid_drain_loses_nothing_and_leaves_no_upload() {
    let s3_dir = tempfile::tempdir().expect("tempdir");
    let fast_dir = tempfile::tempdir().expect("tempdir");
    let fast = || -> Arc<dyn Tier> {
        Arc::new(PosixTier::new(PosixConfig::new(fast_dir.path()).with_name("fast".into())).expect("fast tier"))
    };
    let data = pattern(11, 6 * PART + 3);
    // Round 1: the server is killed once the drain's multipart upload has begun and comes
    // back within the retry deadline: the drain goes on and completes.
    // Round 2: it is killed the same way and stays down past the deadline: the drain fails,
    // the checkpoint stays acknowledged on the fast tier and is not listed on S3; the next
    // open (server back) aborts what was left and drains it.
    for (round, deadline, down) in [(1u64, 30u64, 1500u64), (2, 2, 0)] {
        let mut server = Some(S3sFsServer::start(s3_dir.path()).expect("s3s-fs"));
        let port = server.as_ref().map(|s| s.port()).expect("port");
        let endpoint = format!("http://127.0.0.1:{port}");
        let slow = || -> Arc<dyn Tier> {
            let cfg = test_config(&endpoint, "ckpt", "run")
                .with_part_size(PART)
                .with_upload_concurrency(2)
                .with_retry_deadline(Duration::from_secs(deadline))
                .with_request_timeout(Duration::from_secs(2))
                .named("s3");
            Arc::new(S3Tier::new(cfg).expect("s3 tier"))
        };
        if round == 1 {
            S3Tier::new(test_config(&endpoint, "ckpt", "run")).expect("tier").create_bucket().await.expect("bucket");
        }
        {
            let store = CheckpointStore::open(vec![fast()], cfg()).await.expect("open fast only");
            store.save(round, vec![Part::bytes("model", &data)]).await.expect("save acknowledged");
        }
        let root = s3_dir.path().to_path_buf();
        let Some(running) = server.take() else { unreachable!() };
        let killer = std::thread::spawn(move || {
            // Once the upload and its marker exist (a kill between the two leaves an upload
            // that only ListMultipartUploads finds, which s3s-fs lacks: see docs/S3.md).
            let markers = root.join("ckpt/run/.ringtier-uploads");
            let begun = || s3s_uploads(&root) > 0 && std::fs::read_dir(&markers).is_ok_and(|mut d| d.next().is_some());
            assert!(wait_until(60, begun), "round {round}: the upload never began");
            running.kill();
            if down > 0 {
                std::thread::sleep(Duration::from_millis(down));
                Some(S3sFsServer::start_on(&root, port).expect("restart"))
            } else {
                None
            }
        });
        let store = CheckpointStore::open(vec![fast(), slow()], cfg()).await.expect("open with S3");
        let drained = store.drain().await;
        server = killer.join().expect("killer thread");
        let on_s3 = |list: &[ringtier_migrate::CheckpointInfo]| {
            list.iter().any(|c| c.step == round && c.tiers.contains(&"s3".to_string()))
        };
        if round == 1 {
            drained.expect("the drain rides out the restart");
            assert!(on_s3(&store.list().await.expect("list")), "round 1 drained");
        } else {
            let e = drained.expect_err("the server stays down past the deadline");
            assert!(e.to_string().contains(&format!("step {round}")), "{e}");
            // With S3 down, the store goes on from the fast tier: the step is listed there
            // (S3 left out with a warning, not listed as holding it), and it reads whole
            // without asking S3 at all.
            let list = store.list().await.expect("list with S3 down");
            let here = list.iter().find(|c| c.step == round).expect("listed from the fast tier");
            assert_eq!(here.tiers, ["fast"], "{list:?}");
            assert_eq!(store.latest().await.expect("latest with S3 down"), Some(round));
            assert!(store.read_part(round, "model").await.expect("the fast copy is kept") == data);
            let verified = store.verify(round).await.expect("verify reports per tier");
            assert!(verified.iter().any(|(t, r)| t == "fast" && r.is_ok()), "{verified:?}");
            assert!(verified.iter().any(|(t, r)| t == "s3" && r.is_err()), "{verified:?}");
            drop(store);
            server = Some(S3sFsServer::start_on(s3_dir.path(), port).expect("restart"));
            let store = CheckpointStore::open(vec![fast(), slow()], cfg()).await.expect("reopen");
            store.drain().await.expect("drained once the server is back");
            assert!(on_s3(&store.list().await.expect("list")), "round 2 drained after reopen");
        }
        assert_eq!(s3s_uploads(s3_dir.path()), 0, "round {round}: no orphaned upload");
        // What S3 holds is the checkpoint, whole: read it from S3 alone.
        // Read-only: the store of this round may still be open, holding the prefix's lease.
        let only_s3 = CheckpointStore::open_read_only(vec![slow()], cfg()).await.expect("open S3 only");
        assert!(only_s3.read_part(round, "model").await.expect("read from S3") == data, "round {round}");
        drop(server);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_bucket_or_wrong_credentials_lose_no_checkpoint() {
    let s = Setup::new();
    let data = pattern(12, 1000);
    {
        let store = CheckpointStore::open(vec![s.fast()], cfg()).await.expect("open fast only");
        store.save(3, vec![Part::bytes("model", &data)]).await.expect("save");
    }
    let endpoint = s.server.endpoint();
    S3Tier::new(test_config(&endpoint, "ckpt", "run")).expect("tier").create_bucket().await.expect("bucket");
    for (what, cfg_s3) in [
        ("no-such-bucket", test_config(&endpoint, "no-such-bucket", "run")),
        ("credentials", test_config(&endpoint, "ckpt", "run").with_credentials("ringtier-test", "wrong-secret")),
    ] {
        let slow: Arc<dyn Tier> = Arc::new(S3Tier::new(cfg_s3.named("s3")).expect("tier"));
        let e = match CheckpointStore::open(vec![s.fast(), slow], cfg()).await {
            Err(e) => e,
            Ok(store) => store.drain().await.expect_err("nothing can be drained"),
        };
        let msg = format!("{e:#}");
        assert!(msg.contains(what) || msg.to_lowercase().contains("credentials"), "{what}: {msg}");
        // The checkpoint is still there and whole on the fast tier.
        let store = CheckpointStore::open(vec![s.fast()], cfg()).await.expect("reopen fast only");
        assert_eq!(store.read_part(3, "model").await.expect("kept"), data, "{what}");
    }
    assert_eq!(s3s_uploads(s.s3_dir.path()), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_damaged_on_the_way_never_commits_a_drain() {
    // One part's body damaged between the drain and the server. A server that checks part
    // checksums refuses it and the tier sends it again: the drain succeeds, with the right
    // bytes. A server that does not (s3s-fs alone): the probe finds that out, the read-back
    // catches the damage, the drain fails with the checkpoint not on S3 (no manifest), and
    // the next open re-queues it and drains it whole.
    for part_checks in [true, false] {
        let s3_dir = tempfile::tempdir().expect("tempdir");
        let fast_dir = tempfile::tempdir().expect("tempdir");
        let server = S3sFsServer::start_with(s3_dir.path(), 0, Duration::ZERO, part_checks).expect("s3s-fs");
        let upstream: SocketAddr = server.endpoint().trim_start_matches("http://").parse().expect("addr");
        let proxy = FaultProxy::start(upstream).expect("proxy");
        let tier = S3Tier::new(test_config(&proxy.endpoint(), "ckpt", "run").with_part_size(PART).named("s3"))
            .expect("s3 tier");
        tier.create_bucket().await.expect("bucket");
        let slow: Arc<dyn Tier> = Arc::new(tier);
        let fast = || -> Arc<dyn Tier> {
            Arc::new(PosixTier::new(PosixConfig::new(fast_dir.path()).with_name("fast".into())).expect("fast tier"))
        };
        let manifest_on_s3 =
            |keys: Vec<ringtier_core::ObjectMeta>| keys.iter().any(|m| m.key.ends_with("MANIFEST.json"));
        let data = pattern(20, 3 * PART + 11);
        let store = CheckpointStore::open(vec![fast(), Arc::clone(&slow)], cfg()).await.expect("open");
        proxy.fail_matching_n("partNumber=2&", Fault::CorruptBody, 1);
        store.save(1, vec![Part::bytes("model", &data)]).await.expect("save acknowledged");
        let drained = store.drain().await;
        assert_eq!(proxy.faults(), 1, "checks {part_checks}");
        if part_checks {
            drained.expect("the damaged part refused and sent again");
            drop(store);
        } else {
            let e = drained.expect_err("the damage caught by the read-back");
            assert!(
                e.to_string().contains("step 1") && e.to_string().contains("does not hold what was written"),
                "{e}"
            );
            assert!(!manifest_on_s3(slow.list("ck/").await.expect("list")), "committed on S3 though damaged");
            let list = store.list().await.expect("list");
            assert!(!list[0].tiers.contains(&"s3".to_string()), "{list:?}");
            assert!(store.read_part(1, "model").await.expect("fast copy kept") == data);
            drop(store);
            let store = CheckpointStore::open(vec![fast(), Arc::clone(&slow)], cfg()).await.expect("reopen");
            store.drain().await.expect("drained on the next open");
        }
        assert!(manifest_on_s3(slow.list("ck/").await.expect("list")));
        std::fs::remove_dir_all(fast_dir.path().join("ck")).expect("drop the fast copy");
        let store = CheckpointStore::open(vec![fast(), Arc::clone(&slow)], cfg()).await.expect("reopen");
        assert!(store.read_part(1, "model").await.expect("from S3") == data, "checks {part_checks}: bytes differ");
        assert_eq!(s3s_uploads(s3_dir.path()), 0, "no upload left");
    }
}
