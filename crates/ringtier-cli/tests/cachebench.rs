//! `ringtier bench cache` end to end on a tiny dataset: every policy, 1 and 2 ranks (a node's
//! loaders sharing one node cache), the report's rows, hit ratios and slow-tier bytes where the
//! policies put them, capacity kept; bad arguments fail clearly.

use std::process::Command;

/// The run: 200 samples of 4 KiB, 16 reads in flight per rank (a budget well under the dataset,
/// or a whole epoch would be requested at once and LRU would look like static).
fn bench(dir: &std::path::Path, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ringtier"))
        .args(["bench", "cache", "--samples", "200", "--sample-bytes", "4096", "--batch", "8"])
        .args(["--step-ms", "0.5", "--latency-ms", "2", "--bandwidth-mbs", "200", "--epochs", "2"])
        .args(["--repeats", "1", "--ranks", "1,2", "--fractions", "0.25", "--in-flight", "16"])
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .output()
        .expect("run ringtier")
}

#[test]
fn bench_cache_reports_every_policy_and_rank_count() {
    let dir = tempfile::tempdir().expect("dir");
    let json = dir.path().join("cache.json");
    let out = bench(dir.path(), &["--json", json.to_str().expect("utf-8")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("| 0.25 | 2 | clairvoyant |"), "{stdout}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).expect("json")).expect("parse");
    let rows = report["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 8, "4 policies x 2 rank counts");
    let row = |policy: &str, ranks: u64| {
        rows.iter().find(|r| r["policy"] == policy && r["ranks"] == ranks).expect("row").clone()
    };
    let hit = |policy: &str, ranks: u64| row(policy, ranks)["warm_hit_ratio"]["median"].as_f64().expect("ratio");
    let slow_mb = |policy: &str, ranks: u64| row(policy, ranks)["warm_slow_mb"]["median"].as_f64().expect("MB");
    assert_eq!(hit("none", 1), 0.0);
    // One reader, epoch 1: static keeps c of the reads, LRU less, within sampling noise.
    assert!((hit("static", 1) - 0.25).abs() < 0.1, "{}", hit("static", 1));
    assert!(hit("lru", 1) < hit("static", 1));
    // Slow-tier bytes per warm epoch: none reads the whole dataset (200 x 4096), a cache of c
    // saves up to c of it, never more.
    for ranks in [1, 2] {
        assert!((slow_mb("none", ranks) - 0.8192).abs() < 1e-6, "{}", slow_mb("none", ranks));
        for policy in ["lru", "static", "clairvoyant"] {
            let mb = slow_mb(policy, ranks);
            assert!((0.8192 * 0.75 - 1e-6..=0.8192 + 1e-6).contains(&mb), "{policy} x{ranks}: {mb}");
        }
    }
    // No cache ever held more than its capacity.
    let runs = report["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 8);
    for r in runs {
        let r = &r["result"];
        assert!(r["max_used_bytes"].as_u64() <= r["capacity_bytes"].as_u64(), "{r}");
    }
}

#[test]
fn bench_cache_bad_arguments() {
    let dir = tempfile::tempdir().expect("dir");
    let out = bench(dir.path(), &["--policies", "belady"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown cache policy"), "{out:?}");
    let out = bench(dir.path(), &["--fractions", "0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("fractions must be in (0, 1]"), "{out:?}");
}
