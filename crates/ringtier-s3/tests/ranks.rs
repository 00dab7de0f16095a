//! Two processes (ranks of one world of two) shard one dataset on S3 (s3s-fs on loopback):
//! over each of two epochs, every object is read exactly once by one of them, bytes checked.
//!
//! The test runs itself twice more as child processes (the same test binary, this test only,
//! with `RINGTIER_S3_RANK` set): each child is one rank with its own loader, S3 tier and
//! connections, as under `torchrun`; the parent serves S3 and checks what the two report.

use std::collections::HashMap;
use std::process::Command;
use std::sync::Arc;

use ringtier_core::Tier;
use ringtier_dataset::Dataset;
use ringtier_loader::{Loader, LoaderConfig};
use ringtier_s3::S3Tier;
use ringtier_testkit::pattern;
use ringtier_testkit::s3::{test_config, S3sFsServer};

const OBJECTS: u64 = 60;
const EPOCHS: u64 = 2;
const TEST: &str = "two_processes_shard_one_s3_dataset_each_object_once_per_epoch";

fn object(i: u64) -> (String, Vec<u8>) {
    (format!("img/{i:04}.bin"), pattern(100 + i, 1000 + (i as usize) * 977))
}

/// One rank, in a child process: reads its shard of every epoch, checks each sample's bytes,
/// writes `EPOCH KEY` per sample to the file `out`.
async fn run_rank(endpoint: &str, rank: usize, out: &str) {
    let tier: Arc<dyn Tier> = Arc::new(S3Tier::open(test_config(endpoint, "data", "ds")).await.expect("S3 tier"));
    let keys: Vec<String> = tier.list("img/").await.expect("list").into_iter().map(|m| m.key).collect();
    assert_eq!(keys.len() as u64, OBJECTS, "rank {rank} lists the dataset");
    let ds = Dataset::from_keys(Arc::clone(&tier), keys.clone()).await.expect("dataset on S3");
    let cfg = LoaderConfig::default().with_batch_size(7).with_rank(rank).with_world(2).with_seed(3);
    let loader = Loader::new(ds, cfg).expect("loader");
    let mut lines = String::new();
    for e in 0..EPOCHS {
        let mut epoch = loader.epoch(e, 0).expect("epoch");
        while let Some(batch) = epoch.next().await {
            let batch = batch.expect("batch");
            for (idx, sample) in batch.indices.iter().zip(&batch.samples) {
                let key = &keys[*idx as usize];
                let i: u64 = key.trim_start_matches("img/").trim_end_matches(".bin").parse().expect("index");
                assert!(sample.as_slice() == object(i).1.as_slice(), "rank {rank}: {key} differs");
                lines.push_str(&format!("{e} {key}\n"));
            }
        }
    }
    std::fs::write(out, lines).expect("write the rank's record");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_shard_one_s3_dataset_each_object_once_per_epoch() {
    if let Ok(rank) = std::env::var("RINGTIER_S3_RANK") {
        let endpoint = std::env::var("RINGTIER_S3_ENDPOINT").expect("endpoint");
        let out = std::env::var("RINGTIER_S3_OUT").expect("out");
        run_rank(&endpoint, rank.parse().expect("rank"), &out).await;
        return;
    }
    let s3_dir = tempfile::tempdir().expect("tempdir");
    let server = S3sFsServer::start(s3_dir.path()).expect("s3s-fs");
    let tier = S3Tier::new(test_config(&server.endpoint(), "data", "ds")).expect("tier");
    tier.create_bucket().await.expect("bucket");
    for i in 0..OBJECTS {
        let (key, data) = object(i);
        tier.put_object(&key, data.into()).await.expect("put");
    }
    let out_dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("test binary");
    let children: Vec<_> = (0..2)
        .map(|rank| {
            let out = out_dir.path().join(format!("rank{rank}.txt"));
            let child = Command::new(&exe)
                .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
                .env("RINGTIER_S3_RANK", rank.to_string())
                .env("RINGTIER_S3_ENDPOINT", server.endpoint())
                .env("RINGTIER_S3_OUT", &out)
                .spawn()
                .expect("start a rank");
            (rank, child, out)
        })
        .collect();
    let mut pids = Vec::new();
    let mut seen: HashMap<(u64, String), Vec<usize>> = HashMap::new();
    for (rank, mut child, out) in children {
        pids.push(child.id());
        let status = child.wait().expect("wait for a rank");
        assert!(status.success(), "rank {rank} failed: {status}");
        let text = std::fs::read_to_string(&out).expect("the rank's record");
        assert!(!text.is_empty(), "rank {rank} read nothing");
        for line in text.lines() {
            let (e, key) = line.split_once(' ').expect("EPOCH KEY");
            seen.entry((e.parse().expect("epoch"), key.to_string())).or_default().push(rank);
        }
    }
    assert_ne!(pids[0], pids[1], "two processes");
    for e in 0..EPOCHS {
        for i in 0..OBJECTS {
            let key = object(i).0;
            let by = seen.get(&(e, key.clone())).cloned().unwrap_or_default();
            assert_eq!(by.len(), 1, "epoch {e}: {key} read {} times (by ranks {by:?})", by.len());
        }
    }
    assert_eq!(seen.len() as u64, EPOCHS * OBJECTS, "nothing read that is not in the dataset");
    let per_rank = |r: usize| seen.values().filter(|v| v[0] == r).count() as u64;
    assert_eq!(per_rank(0) + per_rank(1), EPOCHS * OBJECTS);
    assert!(per_rank(0) > 0 && per_rank(1) > 0, "both ranks read a shard");
}
