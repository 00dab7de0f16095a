//! `ringtier gen` and `ringtier bench read` against an S3 dataset on an s3s-fs server on
//! loopback: the dataset uploaded by `gen --dir s3://...`, read back by the concurrency sweep,
//! and clear errors for a missing bucket and an empty prefix.

use std::process::Command;

use ringtier_testkit::s3::{S3sFsServer, ACCESS_KEY, SECRET_KEY};

fn ringtier() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ringtier"));
    c.env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_REGION", "us-east-1")
        .env_remove("AWS_ENDPOINT_URL")
        .env_remove("AWS_ENDPOINT")
        .env_remove("AWS_SESSION_TOKEN");
    c
}

fn run(c: &mut Command) -> (bool, String) {
    let out = c.output().expect("run ringtier");
    let text = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[test]
fn bench_read_sweeps_depths_over_an_s3_dataset_uploaded_by_gen() {
    let dir = tempfile::Builder::new().prefix("cli-s3ds").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    std::fs::create_dir_all(dir.path().join("s3")).expect("server dir");
    let server = S3sFsServer::start(&dir.path().join("s3")).expect("s3s-fs");
    server.create_bucket("bkt").expect("bucket");
    let url = format!("s3://bkt/ds?endpoint={}", server.endpoint());
    let (ok, out) =
        run(ringtier().args(["gen", "--files", "40", "--median", "20K", "--max-size", "64K", "--dir", &url]));
    assert!(ok, "{out}");
    assert!(out.contains("uploaded 40 objects"), "{out}");
    // The objects as the server stores them (files).
    let stored: u64 = walk(&dir.path().join("s3").join("bkt").join("ds"));
    assert_eq!(stored, 40, "{out}");

    let json = dir.path().join("read.json");
    let (ok, out) = run(ringtier()
        .args(["bench", "read", "--dir", &url, "--depths", "1,4,16", "--repeats", "2", "--json"])
        .arg(&json));
    assert!(ok, "{out}");
    assert!(out.contains("40 objects") && out.contains("vs depth 1"), "{out}");
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
    assert_eq!(r["schema"], "ringtier.bench.read.s3/1");
    assert_eq!(r["dataset"]["objects"], 40);
    let bytes = r["dataset"]["bytes"].as_u64().expect("bytes");
    assert!(bytes > 40 * 1000, "{bytes}");
    let points = r["points"].as_array().expect("points");
    assert_eq!(points.iter().map(|p| p["depth"].as_u64().unwrap_or(0)).collect::<Vec<_>>(), [1, 4, 16]);
    for p in points {
        let runs = p["runs"].as_array().expect("runs");
        assert_eq!(runs.len(), 2);
        for run in runs {
            assert_eq!(run["bytes"].as_u64(), Some(bytes), "every pass reads every byte");
        }
        assert!(p["mb_per_sec"]["median"].as_f64().unwrap_or(0.0) > 0.0);
        assert!(p["speedup_vs_depth_1"]["median"].as_f64().unwrap_or(0.0) > 0.0);
    }
}

#[test]
fn bench_read_of_a_missing_bucket_or_an_empty_prefix_is_a_clear_error() {
    let dir = tempfile::Builder::new().prefix("cli-s3err").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let server = S3sFsServer::start(dir.path()).expect("s3s-fs");
    server.create_bucket("bkt").expect("bucket");
    let missing = format!("s3://no-such-bucket/ds?endpoint={}", server.endpoint());
    let (ok, out) = run(ringtier().args(["bench", "read", "--dir", &missing, "--depths", "1", "--repeats", "1"]));
    assert!(!ok && out.contains("no-such-bucket"), "{out}");
    let empty = format!("s3://bkt/nothing-here?endpoint={}", server.endpoint());
    let (ok, out) = run(ringtier().args(["bench", "read", "--dir", &empty, "--depths", "1", "--repeats", "1"]));
    assert!(!ok && out.contains("holds no objects"), "{out}");
    let (ok, out) = run(ringtier().args(["bench", "read", "--dir", &empty, "--format", "tfrecord"]));
    assert!(!ok && out.contains("an S3 dataset is read as objects"), "{out}");
}

fn walk(p: &std::path::Path) -> u64 {
    std::fs::read_dir(p)
        .map(|rd| {
            rd.flatten()
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                .map(|e| if e.path().is_dir() { walk(&e.path()) } else { 1 })
                .sum()
        })
        .unwrap_or(0)
}

#[test]
fn ckpt_with_an_s3_tier_named_by_url_saves_drains_lists_and_restores() {
    // The endpoint from AWS_ENDPOINT_URL (not the URL), credentials from AWS_* variables.
    let dir = tempfile::Builder::new().prefix("cli-s3ckpt").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    std::fs::create_dir_all(dir.path().join("s3")).expect("server dir");
    let server = S3sFsServer::start(&dir.path().join("s3")).expect("s3s-fs");
    server.create_bucket("bkt").expect("bucket");
    let mut data = vec![0u8; 12 << 20]; // two parts of 8 MiB
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for b in data.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let model = dir.path().join("model.bin");
    std::fs::write(&model, &data).expect("model");
    let fast = dir.path().join("fast");
    let tiers = format!("{},s3://bkt/ck", fast.display());
    let ckpt = |args: &[&str]| {
        let mut c = ringtier();
        c.env("AWS_ENDPOINT_URL", server.endpoint()).args(["ckpt", "--tiers", &tiers]).args(args);
        c
    };
    let part = format!("model={}", model.display());
    let (ok, out) = run(&mut ckpt(&["save", "--step", "7", "--part", &part]));
    assert!(ok, "{out}");
    let (ok, out) = run(&mut ckpt(&["ls"]));
    assert!(ok && out.contains('7') && out.contains("fast, slow"), "{out}");
    assert!(walk(&dir.path().join("s3").join("bkt").join("ck")) >= 2, "the part and the manifest on S3");
    std::fs::remove_dir_all(&fast).expect("drop the fast copy");
    let restored = dir.path().join("restored");
    let (ok, out) = run(ckpt(&["restore", "--out"]).arg(&restored));
    assert!(ok, "{out}");
    assert!(std::fs::read(restored.join("model")).expect("restored part") == data, "restored from S3 differs");
    // Wrong credentials: a clear error naming the bucket, at once.
    let (ok, out) = run(ckpt(&["drain"]).env("AWS_SECRET_ACCESS_KEY", "wrong"));
    assert!(!ok && out.contains("bkt") && out.contains("credentials"), "{out}");
}

fn boto3_or_skip() -> bool {
    let ok = Command::new("python3").args(["-c", "import boto3"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipped: python3 has no boto3 (pip install boto3)");
    }
    ok
}

#[test]
fn bench_s3_drain_runs_every_variant_and_boto3_on_the_same_part() {
    if !boto3_or_skip() {
        return;
    }
    // The s3s-fs server `bench s3` runs, next to the binary.
    ringtier_testkit::bins::path(ringtier_testkit::bins::S3_SERVER);
    let dir = tempfile::Builder::new().prefix("cli-s3drain").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let json = dir.path().join("drain.json");
    let (ok, out) = run(ringtier()
        .args(["bench", "s3", "drain", "--size", "12M", "--part-size", "5M", "--repeats", "1"])
        .args(["--concurrency", "2", "--unsigned-payload", "--work"])
        .arg(dir.path().join("work"))
        .arg("--json")
        .arg(&json)
        .current_dir(env!("CARGO_MANIFEST_DIR").to_string() + "/../.."));
    assert!(ok, "{out}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
    let clients: Vec<&str> = v["runs"].as_array().expect("runs").iter().filter_map(|r| r["client"].as_str()).collect();
    for c in [
        "ringtier drain (part checksums, default)",
        "ringtier drain (read-back, signed)",
        "ringtier drain (read-back, unsigned)",
        "ringtier drain (unsigned, no check)",
        "boto3 upload_file",
    ] {
        assert!(clients.contains(&c), "{c} missing: {clients:?}");
    }
    for r in v["runs"].as_array().expect("runs") {
        assert_eq!(r["bytes"].as_u64(), Some(12 << 20), "{r}");
    }
    assert_eq!(v["config"]["server_checks_part_checksums"], true);
    assert!(v["bandwidth_ratio"].as_f64().is_some_and(f64::is_finite), "{v}");
    // Each measured upload is dropped from the server's directory afterwards.
    assert!(walk(&dir.path().join("work").join("s3").join("bench").join("boto3")) == 0, "{out}");
}

#[test]
fn bench_read_with_a_per_request_latency_sweeps_a_local_dataset_through_the_throttled_layer() {
    let dir = tempfile::Builder::new().prefix("cli-thr").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let ds = dir.path().join("ds");
    let (ok, out) =
        run(ringtier().args(["gen", "--files", "40", "--median", "20K", "--max-size", "64K", "--dir"]).arg(&ds));
    assert!(ok, "{out}");
    let json = dir.path().join("thr.json");
    let (ok, out) = run(ringtier()
        .args(["bench", "read", "--latency-ms", "2", "--depths", "1,8", "--repeats", "1", "--dir"])
        .arg(&ds)
        .arg("--json")
        .arg(&json));
    assert!(ok, "{out}");
    assert!(out.contains("files +2 ms/request"), "{out}");
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
    assert_eq!(r["storage"]["latency_ms"], 2.0);
    assert_eq!(r["dataset"]["objects"], 40);
    let bytes = r["dataset"]["bytes"].as_u64().expect("bytes");
    let points = r["points"].as_array().expect("points");
    assert_eq!(points.len(), 2);
    for p in points {
        assert_eq!(p["runs"][0]["bytes"].as_u64(), Some(bytes), "every pass reads every byte");
    }
    // One request in flight pays the 2 ms 40 times.
    assert!(points[0]["runs"][0]["seconds"].as_f64().is_some_and(|s| s >= 0.08), "{r}");
    let (ok, out) = run(ringtier().args(["bench", "read", "--latency-ms=-1", "--dir"]).arg(&ds));
    assert!(!ok && out.contains("--latency-ms"), "{out}");
}
