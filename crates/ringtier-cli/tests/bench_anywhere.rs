//! Benchmarks run wherever the binary runs from (their helper scripts are built in), and
//! re-runs with the same work directory start clean: each test runs the binary in a temp dir
//! outside the repository.

use std::path::Path;
use std::process::{Command, Output};

fn ringtier(cwd: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ringtier"));
    c.current_dir(cwd).env_remove("RUST_BACKTRACE");
    c
}

fn text(o: &Output) -> String {
    format!("{}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn has_python_module(m: &str) -> bool {
    Command::new("python3").args(["-c", &format!("import {m}")]).output().is_ok_and(|o| o.status.success())
}

#[test]
fn bench_s3_read_runs_outside_the_repository_and_twice_with_the_same_work_dir() {
    if !has_python_module("boto3") {
        assert!(
            std::env::var("RINGTIER_REQUIRE_MOTO").map_or(true, |v| v != "1"),
            "python3 has no boto3 though RINGTIER_REQUIRE_MOTO=1"
        );
        eprintln!("skipped: python3 has no boto3 (pip install boto3)");
        return;
    }
    // The s3s-fs server `bench s3` runs, next to the binary.
    ringtier_testkit::bins::path(ringtier_testkit::bins::S3_SERVER);
    let cwd = tempfile::Builder::new().prefix("cli-anywhere").tempdir().expect("tempdir");
    assert!(!cwd.path().join("bench").exists());
    let work = cwd.path().join("work");
    for run in 1..=2 {
        let json = cwd.path().join(format!("read-{run}.json"));
        let out = ringtier(cwd.path())
            .args(["bench", "s3", "read", "--objects", "6", "--object-size", "8K", "--repeats", "1"])
            .args(["--depths", "2", "--threads", "2", "--latency-ms", "0", "--work"])
            .arg(&work)
            .arg("--json")
            .arg(&json)
            .output()
            .expect("run ringtier");
        assert!(out.status.success(), "run {run}: {}", text(&out));
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
        assert_eq!(v["schema"], "ringtier.bench.s3.read/1");
        assert!(["drop_caches", "posix_fadvise(DONTNEED)"].contains(&v["cold"].as_str().unwrap_or("")), "{v}");
        assert_eq!(v["runs"].as_array().map(Vec::len), Some(3), "{v}");
    }
    // The boto3 script was written into the work directory, not looked for in the repository.
    assert!(work.join("boto3_baseline.py").is_file());
}

#[test]
fn bench_decode_finds_its_pillow_script_outside_the_repository() {
    let cwd = tempfile::Builder::new().prefix("cli-anywhere").tempdir().expect("tempdir");
    let ds = cwd.path().join("jpegs");
    let out = ringtier(cwd.path())
        .args(["gen", "--preset", "caltech101", "--files", "6", "--format", "jpeg", "--dir"])
        .arg(&ds)
        .output()
        .expect("run ringtier gen");
    assert!(out.status.success(), "{}", text(&out));
    let out = ringtier(cwd.path())
        .args(["bench", "decode", "--files", "4", "--repeats", "1", "--chains", "resize", "--threads", "1", "--dir"])
        .arg(&ds)
        .output()
        .expect("run ringtier bench decode");
    let all = text(&out);
    assert!(!all.contains("not found"), "the script is built in: {all}");
    if has_python_module("PIL") {
        assert!(out.status.success(), "{all}");
        assert!(all.contains("pillow x1"), "{all}");
    } else {
        // The built-in script ran, and Python said what it lacks.
        assert!(!out.status.success() && all.contains("decode_vs_pillow.py") && all.contains("PIL"), "{all}");
    }
}

#[test]
fn bench_s3_without_the_test_kits_server_says_how_to_build_it() {
    // The binary alone (a hard link in a directory of its own), no server next to it or on
    // the PATH: a clear error naming the build command, before any work.
    let dir = tempfile::Builder::new().prefix("cli-noserver").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let alone = dir.path().join("ringtier");
    std::fs::hard_link(env!("CARGO_BIN_EXE_ringtier"), &alone)
        .or_else(|_| std::fs::copy(env!("CARGO_BIN_EXE_ringtier"), &alone).map(|_| ()))
        .expect("the binary alone");
    let out = Command::new(&alone)
        .current_dir(dir.path())
        .env("PATH", "/usr/bin:/bin")
        .args(["bench", "s3", "read", "--objects", "2", "--object-size", "4K", "--repeats", "1", "--work"])
        .arg(dir.path().join("work"))
        .output()
        .expect("run ringtier");
    let text = text(&out);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("cargo build --release -p ringtier-testkit --bin ringtier-s3-server"), "{text}");
}
