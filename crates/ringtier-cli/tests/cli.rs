//! The `ringtier` binary end to end: the demo on a small generated dataset, its JSON report,
//! and clear errors on bad input.

use std::process::Command;

fn ringtier() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ringtier"))
}

#[test]
fn demo_reads_every_tier_and_writes_a_report() {
    let dir = tempfile::Builder::new().prefix("cli").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let json = dir.path().join("report.json");
    let out = ringtier()
        .args(["--files", "60", "--repeats", "2", "--threads", "2", "--depth", "4", "--dir"])
        .arg(dir.path().join("ds"))
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run ringtier");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    for engine in ["memory", "posix-threads", "uring-direct", "uring-buffered"] {
        assert!(stdout.contains(engine), "table lists {engine}: {stdout}");
    }
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
    assert_eq!(report["schema"], "ringtier.bench.tiers/1");
    assert_eq!(report["dataset"]["files"], 60);
    let points = report["points"].as_array().expect("points");
    assert_eq!(points.len(), 4);
    for p in points {
        let runs = p["runs"].as_array().expect("runs");
        assert_eq!(runs.len(), 2);
        for r in runs {
            assert_eq!(r["bytes"], report["dataset"]["bytes"], "every pass read every byte");
        }
        assert!(p["mb_per_sec"]["median"].as_f64().expect("median") > 0.0);
    }
    // The generated files are removed afterwards unless --keep is given.
    let left = walk_files(&dir.path().join("ds"));
    assert_eq!(left, 0, "dataset files removed");
}

fn walk_files(p: &std::path::Path) -> usize {
    let Ok(rd) = std::fs::read_dir(p) else {
        return 0;
    };
    rd.flatten().map(|e| if e.path().is_dir() { walk_files(&e.path()) } else { 1 }).sum()
}

#[test]
fn bad_input_is_a_clear_error() {
    let cases: &[(&[&str], &str)] = &[
        (&["--files", "0"], "--files must be at least 1"),
        (&["--median", "2M", "--max-size", "1M"], "--median"),
        (&["bench", "tiers", "--threads", "0"], "at least 1"),
        (
            &["bench", "randread", "--file", "/nonexistent-dir/x", "--bs", "1000"],
            "--bs must be a positive multiple of 4096",
        ),
        (&["bench", "randread", "--file", "/proc/nope/x", "--size", "4096"], "/proc/nope"),
        (&["bench", "randread", "--file", "x", "--direct", "sometimes"], "unknown direct-I/O policy"),
    ];
    for (args, want) in cases {
        let out = ringtier().args(*args).output().expect("run ringtier");
        assert!(!out.status.success(), "{args:?} should fail");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(want), "{args:?}: expected {want:?} in {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    }
}

#[test]
fn randread_reads_a_file_direct() {
    let dir = tempfile::Builder::new().prefix("cli-rr").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let json = dir.path().join("rr.json");
    let out = ringtier()
        .args([
            "bench",
            "randread",
            "--size",
            "8M",
            "--bs",
            "64k",
            "--depth",
            "8",
            "--runtime",
            "0.3",
            "--repeats",
            "2",
        ])
        .arg("--file")
        .arg(dir.path().join("f.bin"))
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run ringtier");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
    assert_eq!(v["direct"], true);
    assert_eq!(v["filesystem"], "ext4");
    assert_eq!(v["runs"].as_array().map(Vec::len), Some(2));
    assert!(v["uring_stats"]["reads_direct"].as_u64().expect("reads") > 0);
    assert!(v["uring_stats"]["fixed_buffer_reads"].as_u64().expect("fixed") > 0);
}
