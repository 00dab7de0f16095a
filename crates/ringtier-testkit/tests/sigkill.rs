//! The burst buffer survives SIGKILL at any point: the crash child (the kit's binary
//! `ringtier-crash-child`) saves and drains checkpoints until it is killed at a random moment;
//! after reopening, every checkpoint whose save returned is restorable and byte-identical,
//! nothing torn is listed, and the drain resumes. 50 seeded iterations (RINGTIER_CRASH_ITERS
//! for more).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use ringtier_core::Tier;
use ringtier_migrate::{CheckpointStore, StoreConfig};
use ringtier_testkit::crash_child::{part_contents, second_part_size};
use ringtier_uring::{UringConfig, UringTier, UringTierOptions};

fn tier(dir: &std::path::Path, name: &str) -> Arc<dyn Tier> {
    let options = UringTierOptions::default().with_name(name.to_string()).with_create_root(true);
    Arc::new(UringTier::with_options(dir, UringConfig::default(), options).expect("tier"))
}

#[test]
fn sigkill_at_random_points_loses_no_saved_checkpoint() {
    let iters: u64 = std::env::var("RINGTIER_CRASH_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(50);
    let base = tempfile::Builder::new().prefix("crash").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let (fast, slow) = (base.path().join("fast"), base.path().join("slow"));
    let size = 150_000;
    let mut saved = std::collections::BTreeSet::new();
    let mut rng = 0x5EED_u64;
    for iter in 0..iters {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let delay = Duration::from_millis(20 + rng % 180);
        let mut child = Command::new(env!("CARGO_BIN_EXE_ringtier-crash-child"))
            .arg("--fast")
            .arg(&fast)
            .arg("--slow")
            .arg(&slow)
            .args(["--slow-bytes-per-sec", &(30u64 << 20).to_string(), "--size", &size.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start child");
        std::thread::sleep(delay);
        let _ = child.kill(); // SIGKILL
        let out = child.stdout.take().expect("stdout");
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(step) = line.strip_prefix("saved ").and_then(|s| s.parse::<u64>().ok()) {
                saved.insert(step);
            }
        }
        let _ = child.wait();

        // A runtime per iteration: dropping it stops this process's drain before the next child
        // starts (a store is used by one process at a time).
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
        rt.block_on(async {
            let store = CheckpointStore::open(
                vec![tier(&fast, "fast"), tier(&slow, "slow")],
                StoreConfig::default().with_keep_last(1),
            )
            .await
            .unwrap_or_else(|e| panic!("iteration {iter}: reopen failed: {e}"));
            // No staged file of the killed child outlives the reopen (this process's own drain
            // may be staging files already: those carry its pid).
            let mine = format!("{}-", std::process::id());
            for root in [&fast, &slow] {
                let staging = root.join(ringtier_core::fs::STAGING_DIR);
                let left: Vec<String> = std::fs::read_dir(&staging)
                    .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
                    .unwrap_or_default();
                let left: Vec<&String> = left.iter().filter(|n| !n.starts_with(&mine)).collect();
                assert!(
                    left.is_empty(),
                    "iteration {iter}: staged files outlived recovery in {}: {left:?}",
                    root.display()
                );
            }
            let listed: Vec<u64> = store.list().await.expect("list").iter().map(|c| c.step).collect();
            for step in &saved {
                assert!(listed.contains(step), "iteration {iter}: saved step {step} is not listed ({listed:?})");
            }
            // Every listed checkpoint (saved or committed just before the kill) is whole.
            for &step in &listed {
                let r = store.load(step).await.unwrap_or_else(|e| panic!("iteration {iter}: step {step}: {e}"));
                assert_eq!(r.parts.len(), 2, "iteration {iter}: step {step}");
                assert!(r.parts[0].1 == part_contents(step, 0, size), "iteration {iter}: step {step} part a differs");
                assert!(
                    r.parts[1].1 == part_contents(step, 1, second_part_size(size)),
                    "iteration {iter}: step {step} part b differs"
                );
            }
            // The drain resumes: everything reaches the slow tier.
            if iter % 10 == 9 || iter + 1 == iters {
                store.drain().await.unwrap_or_else(|e| panic!("iteration {iter}: drain: {e}"));
                let all_slow = store.list().await.expect("list").iter().all(|c| c.tiers.contains(&"slow".to_string()));
                assert!(all_slow, "iteration {iter}: drained copies on the slow tier");
            }
        });
        drop(rt);
    }
    assert!(saved.len() as u64 >= iters / 4, "the child saved too little to test anything: {}", saved.len());
    eprintln!("{iters} kills, {} checkpoints saved and verified", saved.len());
}
