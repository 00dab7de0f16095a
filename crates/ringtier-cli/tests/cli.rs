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
        .args(["demo", "--files", "60", "--repeats", "2", "--threads", "2", "--depth", "4", "--dir"])
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
    assert_eq!(report["schema"], "ringtier.bench.read/1");
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
        (&["demo", "--files", "0"], "--files must be at least 1"),
        (&["demo", "--median", "2M", "--max-size", "1M"], "--median"),
        (&["bench", "read", "--dir", "/nonexistent-dataset"], "/nonexistent-dataset"),
        (&["gen", "--dir", "/proc/ringtier-cannot-create"], "/proc/ringtier-cannot-create"),
        (&["gen", "--dir", "x", "--sigma", "9"], "--sigma"),
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

fn gen(dir: &std::path::Path, files: &str) {
    let out = ringtier()
        .args(["gen", "--preset", "caltech101", "--files", files, "--classes", "4", "--dir"])
        .arg(dir)
        .output()
        .expect("run ringtier gen");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

fn bench_read(dir: &std::path::Path, extra: &[&str]) -> std::process::Output {
    ringtier()
        .args(["bench", "read", "--repeats", "1", "--concurrency", "1,4", "--engines", "posix-threads,uring-direct"])
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .output()
        .expect("run ringtier bench read")
}

#[test]
fn gen_then_bench_read_writes_json_and_plot() {
    let dir = tempfile::Builder::new().prefix("cli-read").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let ds = dir.path().join("ds");
    gen(&ds, "200");
    let manifest = std::fs::read_to_string(ds.join(".ringtier-manifest.tsv")).expect("manifest");
    assert_eq!(manifest.lines().filter(|l| !l.starts_with('#')).count(), 200);
    let (json, svg) = (dir.path().join("r.json"), dir.path().join("r.svg"));
    let out = bench_read(
        &ds,
        &["--verify", "--rings", "1,2", "--json", json.to_str().expect("utf8"), "--plot", svg.to_str().expect("utf8")],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
    assert_eq!(v["schema"], "ringtier.bench.read/1");
    assert_eq!(v["dataset"]["files"], 200);
    assert_eq!(v["dataset"]["checksums"], true);
    // posix at 1 and 4 threads; uring-direct at depth 1 and 4 with 1 and 2 rings.
    let points = v["points"].as_array().expect("points");
    assert_eq!(points.len(), 6);
    for p in points {
        assert!(
            p["latency_p99_ms"]["median"].as_f64().expect("p99")
                >= p["latency_p50_ms"]["median"].as_f64().expect("p50")
        );
        assert_eq!(p["runs"][0]["files"], 200);
        if p["concurrency"] == 1 {
            assert_eq!(p["speedup_vs_concurrency_1"]["median"], 1.0);
        }
    }
    let plot = std::fs::read_to_string(&svg).expect("svg");
    assert!(plot.starts_with("<svg") && plot.contains("uring-direct"), "an SVG plot with a legend");
}

#[test]
fn bad_datasets_fail_clearly_or_skip_and_count() {
    let dir = tempfile::Builder::new().prefix("cli-bad").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let ds = dir.path().join("ds");
    gen(&ds, "40");
    let manifest = std::fs::read_to_string(ds.join(".ringtier-manifest.tsv")).expect("manifest");
    let keys: Vec<&str> =
        manifest.lines().filter(|l| !l.starts_with('#')).map(|l| l.split('\t').next().unwrap_or("")).collect();
    // One file vanishes, one shrinks, one is corrupted in place (same size).
    std::fs::remove_file(ds.join(keys[3])).expect("rm");
    let shrink = ds.join(keys[5]);
    let data = std::fs::read(&shrink).expect("read");
    std::fs::write(&shrink, &data[..data.len() / 2]).expect("shrink");
    let flip = ds.join(keys[7]);
    let mut data = std::fs::read(&flip).expect("read");
    data[0] ^= 0xFF;
    std::fs::write(&flip, &data).expect("flip");

    let out = bench_read(&ds, &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(keys[3]) || err.contains(keys[5]), "names the file: {err}");
    assert!(err.contains("--on-error skip"), "suggests the way on: {err}");

    let json = dir.path().join("skip.json");
    let out = bench_read(&ds, &["--on-error", "skip", "--verify", "--json", json.to_str().expect("utf8")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
    for p in v["points"].as_array().expect("points") {
        let run = &p["runs"][0];
        assert_eq!(run["skipped"], 3, "{p}");
        assert_eq!(run["files"], 37);
        let errors = run["errors"].to_string();
        assert!(errors.contains("size mismatch") && errors.contains("checksum mismatch"), "{errors}");
    }

    // A corrupt manifest and an empty directory.
    std::fs::write(ds.join(".ringtier-manifest.tsv"), "# ringtier-manifest v1\nonly-one-field\n").expect("write");
    let out = bench_read(&ds, &[]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("corrupt manifest, line 2"));
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    let out = bench_read(&empty, &[]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("holds no regular files"));
}

#[test]
fn bench_train_on_files_that_are_not_jpegs_says_so_instead_of_zero_images_per_second() {
    let dir = tempfile::Builder::new().prefix("cli-train").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let ds = dir.path().join("ds");
    gen(&ds, "40");
    let train = |extra: &[&str]| {
        ringtier()
            .args(["bench", "train", "--batch", "8", "--repeats", "1", "--compute-ms", "0", "--dir"])
            .arg(&ds)
            .args(extra)
            .output()
            .expect("run ringtier bench train")
    };
    let out = train(&[]);
    assert!(!out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("skipped as undecodable") && err.contains("--no-decode"), "{err}");
    let out = train(&["--no-decode"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn gen_and_bench_read_record_shards() {
    let dir = tempfile::Builder::new().prefix("cli-rec").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    // (format, shard extension, a byte to damage: in a record's data / in a tar header)
    for (format, ext, damage) in [("tfrecord", ".tfrecord", 700), ("wds", ".tar", 100)] {
        let ds = dir.path().join(format);
        let out = ringtier()
            .args(["gen", "--preset", "small", "--files", "300", "--shards", "3", "--format", format, "--dir"])
            .arg(&ds)
            .output()
            .expect("run ringtier gen");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let shards: Vec<_> = std::fs::read_dir(&ds)
            .expect("ls")
            .filter_map(|e| e.ok()?.file_name().to_str().map(str::to_string))
            .filter(|n| n.ends_with(ext))
            .collect();
        assert_eq!(shards.len(), 3, "{shards:?}");
        let json = dir.path().join(format!("{format}.json"));
        let out = ringtier()
            .args(["bench", "read", "--repeats", "2", "--depths", "4", "--read-size", "256k", "--format", format])
            .arg("--dir")
            .arg(&ds)
            .arg("--json")
            .arg(&json)
            .output()
            .expect("run ringtier bench read");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
        assert_eq!(v["schema"], "ringtier.bench.records/1");
        for run in v["ringtier"]["runs"].as_array().expect("runs") {
            assert_eq!(run["records"], 300, "{run}");
            assert_eq!(run["skipped"], 0);
        }
        assert!(v["ratio_to_cat"]["median"].as_f64().expect("ratio") > 0.0);
        // Indexes, then every record in one random order through them.
        let out =
            ringtier().args(["index", "--format", format, "--dir"]).arg(&ds).output().expect("run ringtier index");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        for sh in &shards {
            let idx = std::fs::read_to_string(ds.join(format!("{sh}.idx"))).expect("index written");
            assert_eq!(idx.lines().count(), 100, "{sh}: one line per record");
        }
        let out = ringtier()
            .args(["bench", "read", "--repeats", "1", "--depths", "8", "--format", format, "--record-order", "global"])
            .arg("--dir")
            .arg(&ds)
            .arg("--json")
            .arg(&json)
            .output()
            .expect("run ringtier bench read");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
        assert_eq!((v["order"].as_str(), v["ringtier"]["runs"][0]["records"].as_u64()), (Some("global"), Some(300)));
        // A damaged shard: named with its byte offset.
        let first = ds.join(&shards[0]);
        let mut bytes = std::fs::read(&first).expect("read");
        bytes[damage] ^= 0xff;
        std::fs::write(&first, &bytes).expect("write");
        let out = ringtier()
            .args(["bench", "read", "--repeats", "1", "--depths", "4", "--format", format, "--dir"])
            .arg(&ds)
            .output()
            .expect("run ringtier bench read");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(&shards[0]) && err.contains("byte offset"), "{err}");
    }
}

#[test]
fn bench_read_follows_linked_class_folders_and_files_and_reports_loops() {
    // An ImageFolder-style directory whose class folders and files are symbolic links to
    // another directory: read through the links, as torchvision does.
    let dir = tempfile::Builder::new().prefix("cli-links").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let (disk2, ds) = (dir.path().join("disk2"), dir.path().join("ds"));
    std::fs::create_dir_all(disk2.join("cat")).expect("mkdir");
    std::fs::create_dir_all(ds.join("dog")).expect("mkdir");
    let mut total = 0;
    for i in 0..5 {
        let data = vec![i as u8; 1000 + i * 4096];
        total += data.len();
        std::fs::write(disk2.join(format!("cat/{i}.jpg")), &data).expect("write");
        std::fs::write(disk2.join(format!("{i}.jpg")), &data).expect("write");
        std::os::unix::fs::symlink(disk2.join(format!("{i}.jpg")), ds.join(format!("dog/{i}.jpg"))).expect("link");
    }
    std::os::unix::fs::symlink(disk2.join("cat"), ds.join("cat")).expect("link");
    let json = dir.path().join("r.json");
    let out = bench_read(&ds, &["--json", json.to_str().expect("utf8")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
    assert_eq!(v["dataset"]["files"], 10);
    for p in v["points"].as_array().expect("points") {
        assert_eq!(p["runs"][0]["bytes"], 2 * total, "{p}");
    }
    // A link back up the tree is a loop, named.
    std::os::unix::fs::symlink(&ds, disk2.join("cat/up")).expect("link");
    let out = bench_read(&ds, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("symbolic link loop") && err.contains("cat/up"), "{err}");
}

/// A directory on tmpfs (`/dev/shm`), or `None` (the test is skipped, saying why) where
/// there is none.
fn tmpfs_dir(prefix: &str) -> Option<tempfile::TempDir> {
    let shm = std::path::Path::new("/dev/shm");
    let is_tmpfs = Command::new("stat")
        .args(["-f", "-c", "%T", "/dev/shm"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "tmpfs");
    if !shm.is_dir() || !is_tmpfs {
        eprintln!("skipped: no tmpfs at /dev/shm");
        return None;
    }
    Some(tempfile::Builder::new().prefix(prefix).tempdir_in(shm).expect("tempdir in /dev/shm"))
}

fn paper_report(out: &std::path::Path) -> String {
    let report = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    for want in ["## 1. Read micro-benchmark", "## 2. AlexNet mini-app", "## 3. Burst buffer", "2.3x", "2.6x"] {
        assert!(report.contains(want), "report has {want:?}: {report}");
    }
    for f in ["read.json", "read.svg", "train-read.json", "train-decode.json", "ckpt.json"] {
        assert!(out.join(f).is_file(), "{f} written");
    }
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    assert!(report.contains(&format!("Machine: {cpus} CPUs")), "the core count measured: {report}");
    assert!(report.contains(&format!("({cpus} CPUs here)")), "{report}");
    assert!(!report.contains("NaN"), "{report}");
    report
}

#[test]
fn paper_with_tmpdir_on_tmpfs_generates_its_data_where_direct_io_works() {
    // The default run where /tmp is tmpfs (Fedora, Arch, Debian 13): the work directory goes to
    // the current directory (ext4 here), and the read experiment keeps O_DIRECT.
    let Some(tmp) = tmpfs_dir("ringtier-cli-tmpdir") else { return };
    let dir = tempfile::Builder::new().prefix("cli-paper").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let out = dir.path().join("report");
    // Tiny sizes: this tests the command, not the figures.
    let run = ringtier()
        .args(["--repeats", "1", "--tiny", "--out"])
        .arg(&out)
        .env("TMPDIR", tmp.path())
        .current_dir(dir.path())
        .output()
        .expect("run ringtier");
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let report = paper_report(&out);
    assert!(report.contains("(tmpfs) has no direct I/O, so the data is generated in"), "{report}");
    assert!(report.contains("io_uring (uring-direct)"), "{report}");
    assert!(report.contains("on ext4, read cold"), "{report}");
    assert!(report.contains("fast tier: a ext4 directory (raw O_DIRECT write"), "{report}");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("read_dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("ringtier-paper-"))
        .collect();
    assert!(left.is_empty(), "the work directory is removed after: {left:?}");
    assert_eq!(std::fs::read_dir(tmp.path()).expect("read_dir").count(), 0, "nothing written to TMPDIR");
}

#[test]
fn paper_on_a_work_directory_without_direct_io_reads_buffered_and_says_so() {
    let Some(work) = tmpfs_dir("ringtier-cli-work") else { return };
    let dir = tempfile::Builder::new().prefix("cli-paper").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let out = dir.path().join("report");
    let run = ringtier()
        .args(["paper", "--repeats", "1", "--tiny", "--out"])
        .arg(&out)
        .arg("--work")
        .arg(work.path())
        .output()
        .expect("run ringtier");
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let report = paper_report(&out);
    assert!(
        report.contains("(tmpfs) has no direct I/O, so the io_uring engine reads through the page cache"),
        "{report}"
    );
    assert!(report.contains("io_uring (uring-buffered) with one thread"), "{report}");
    assert!(report.contains("on tmpfs, read cold"), "{report}");
    assert!(report.contains("fast tier: a tmpfs directory"), "{report}");
    let read: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("read.json")).expect("json")).expect("parse");
    let engines: std::collections::BTreeSet<&str> =
        read["points"].as_array().expect("points").iter().filter_map(|p| p["engine"].as_str()).collect();
    assert_eq!(engines, ["posix-threads", "uring-buffered"].into_iter().collect());
    assert!(!work.path().join("imagenet").exists(), "generated data removed");
}

#[test]
fn a_user_error_is_one_clear_line_even_with_rust_backtrace_set() {
    let cases: &[(&[&str], &str)] = &[
        (&["bench", "read", "--dir", "/nonexistent-dataset"], "dataset directory /nonexistent-dataset"),
        (&["ckpt", "--tiers", "/proc/ringtier-no/a", "ls"], "/proc/ringtier-no/a"),
    ];
    for (args, want) in cases {
        let out = ringtier()
            .args(*args)
            .env("RUST_BACKTRACE", "1")
            .env("RUST_LIB_BACKTRACE", "1")
            .output()
            .expect("run ringtier");
        assert_eq!(out.status.code(), Some(1), "{args:?}: exit status {:?}", out.status);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{args:?}: one line, no stack dump: {stderr}");
        assert!(lines[0].starts_with("error: ") && lines[0].contains(want), "{args:?}: {stderr}");
        assert!(lines[0].contains("No such file or directory"), "the cause on the same line: {stderr}");
    }
}

#[test]
fn bench_read_on_tmpfs_skips_what_the_file_system_cannot_serve() {
    let Some(dir) = tmpfs_dir("ringtier-cli-read") else { return };
    let ds = dir.path().join("ds");
    gen(&ds, "40");
    let json = dir.path().join("r.json");
    // The default engines (posix-threads, uring-direct, uring-buffered).
    let out = ringtier()
        .args(["bench", "read", "--repeats", "1", "--concurrency", "1,2", "--dir"])
        .arg(&ds)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run ringtier bench read");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
    assert_eq!(v["storage"]["filesystem"], "tmpfs");
    let ran: std::collections::BTreeSet<&str> =
        v["points"].as_array().expect("points").iter().filter_map(|p| p["engine"].as_str()).collect();
    let skipped: Vec<&str> =
        v["skipped_engines"].as_array().expect("skipped_engines").iter().filter_map(|s| s["engine"].as_str()).collect();
    assert_eq!(skipped, ["uring-direct"], "tmpfs has no direct I/O here: {v}");
    assert!(v["skipped_engines"][0]["reason"].as_str().expect("reason").contains("no direct I/O"));
    assert_eq!(ran, ["posix-threads", "uring-buffered"].into_iter().collect(), "the others ran");
    assert!(stdout.contains("uring-direct    skipped: "), "the table says which: {stdout}");
    for p in v["points"].as_array().expect("points") {
        assert_eq!(p["runs"][0]["files"], 40, "{p}");
    }
    // Only engines the file system cannot serve: a clear error, not a stack dump.
    let out = ringtier()
        .args(["bench", "read", "--repeats", "1", "--engines", "uring-direct", "--dir"])
        .arg(&ds)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no engine can read") && err.contains("uring-buffered"), "{err}");
    assert!(!err.contains("backtrace"), "{err}");
}

#[test]
fn bench_stage_stages_to_host_memory_and_refuses_cuda_without_the_feature() {
    let dir = tempfile::Builder::new().prefix("cli-stage").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let ds = dir.path().join("ds");
    gen(&ds, "100");
    let json = dir.path().join("s.json");
    let out = ringtier()
        .args(["bench", "stage", "--batch", "16", "--repeats", "1", "--dir"])
        .arg(&ds)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
    assert_eq!(v["schema"], "ringtier.bench.stage/1");
    assert_eq!(v["pinning"], "Mlock");
    for mode in ["raw-read", "pipelined", "pinned-no-overlap", "pageable-copy"] {
        assert!(v["mb_per_sec"][mode]["summary"]["median"].as_f64().expect("median") > 0.0, "{mode}");
    }
    let out = ringtier().args(["bench", "stage", "--target", "cuda:0", "--dir"]).arg(&ds).output().expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cuda") && !err.contains("panicked"), "{err}");
}

/// Whether `python3` has boto3 (the S3 benchmarks' baseline); where it has not, a test that
/// needs it is skipped with a message, unless `RINGTIER_REQUIRE_MOTO=1` (CI installs both).
fn boto3_or_skip() -> bool {
    let ok = Command::new("python3").args(["-c", "import boto3"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("RINGTIER_REQUIRE_MOTO").map_or(true, |v| v != "1"),
            "python3 has no boto3 though RINGTIER_REQUIRE_MOTO=1"
        );
        eprintln!("skipped: python3 has no boto3 (pip install boto3)");
    }
    ok
}

#[test]
fn bench_s3_read_sweeps_s3_boto3_and_a_throttled_file_tier_on_the_same_objects() {
    if !boto3_or_skip() {
        return;
    }
    // The s3s-fs server `bench s3` runs, next to the binary.
    ringtier_testkit::bins::path(ringtier_testkit::bins::S3_SERVER);
    let dir = tempfile::Builder::new().prefix("cli-s3read").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let json = dir.path().join("read.json");
    let run = ringtier()
        .args(["bench", "s3", "read", "--objects", "24", "--object-size", "20K", "--repeats", "1"])
        .args(["--depths", "1,8", "--threads", "1,8", "--latency-ms", "2", "--work"])
        .arg(dir.path().join("work"))
        .arg("--json")
        .arg(&json)
        .current_dir(env!("CARGO_MANIFEST_DIR").to_string() + "/../..")
        .output()
        .expect("run ringtier");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}{}", String::from_utf8_lossy(&run.stderr));
    assert!(stdout.contains("throttled file tier: depth 1 -> 8"), "{stdout}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
    let runs = v["runs"].as_array().expect("runs");
    // 2 settings x (S3 tier, throttled files, boto3 pool), each reading every byte.
    assert_eq!(runs.len(), 6, "{v}");
    for r in runs {
        assert_eq!(r["bytes"].as_u64(), Some(24 * 20 * 1024), "every object read whole: {r}");
        assert!(r["seconds"].as_f64().is_some_and(|s| s > 0.0) && r["cpu_seconds"].as_f64().is_some(), "{r}");
    }
    // 2 ms per request, one request in flight: at least 24 x 2 ms.
    let files_1 = runs
        .iter()
        .find(|r| r["client"].as_str().is_some_and(|c| c.starts_with("ringtier files")) && r["setting"] == 1);
    assert!(files_1.and_then(|r| r["seconds"].as_f64()).is_some_and(|s| s >= 0.048), "{v}");
    assert!(v["bandwidth_ratio"].as_f64().is_some_and(f64::is_finite), "{v}");
}

#[test]
fn paper_remote_without_boto3_fails_at_once_saying_what_it_needs() {
    // A python3 that cannot import boto3 (a stand-in script): the run stops before any
    // experiment, with the fix in the message.
    let dir = tempfile::Builder::new().prefix("cli-noboto").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).expect("mkdir");
    let py = bin.join("python3");
    std::fs::write(&py, "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'boto3'\" >&2\nexit 1\n")
        .expect("script");
    std::fs::set_permissions(&py, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let out = dir.path().join("report");
    let run = ringtier()
        .args(["paper", "--tiny", "--repeats", "1", "--remote", "--out"])
        .arg(&out)
        .env("PATH", path)
        .output()
        .expect("run ringtier");
    assert_eq!(run.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("needs boto3") && stderr.contains("pip install boto3"), "{stderr}");
    assert!(!stderr.contains("== 1/"), "no experiment ran: {stderr}");
}

/// A stand-in `python3` that cannot import TensorFlow, in a directory to put first on PATH.
fn python_without_tensorflow(dir: &std::path::Path) -> std::path::PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("mkdir");
    let py = bin.join("python3");
    std::fs::write(&py, "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'tensorflow'\" >&2\nexit 1\n")
        .expect("script");
    std::fs::set_permissions(&py, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    py
}

/// `ringtier paper --tiny --repeats 1 ARGS --python PY --out OUT`, run to the end.
fn paper_with_python(args: &[&str], py: &std::ffi::OsStr, out: &std::path::Path) -> std::process::Output {
    ringtier()
        .args(["paper", "--tiny", "--repeats", "1"])
        .args(args)
        .arg("--python")
        .arg(py)
        .arg("--out")
        .arg(out)
        .output()
        .expect("run ringtier")
}

#[test]
fn paper_without_tensorflow_says_why_its_section_did_not_run_or_fails_at_once_when_asked() {
    let dir = tempfile::Builder::new().prefix("cli-notf").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let py = python_without_tensorflow(dir.path());
    // `on`: refused before any experiment, saying what to do.
    let out = dir.path().join("report-on");
    let run = paper_with_python(&["--tensorflow", "on"], py.as_os_str(), &out);
    assert_eq!(run.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("--tensorflow on") && stderr.contains("No module named 'tensorflow'"), "{stderr}");
    assert!(stderr.contains("pip install tensorflow-cpu"), "{stderr}");
    assert!(!stderr.contains("== 1/"), "no experiment ran: {stderr}");
    assert!(!out.exists(), "a refused run leaves no report directory");
    // `auto` (the default): the paper runs, and its last section says why TensorFlow's did not.
    let out = dir.path().join("report-auto");
    let run = paper_with_python(&[], py.as_os_str(), &out);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let report = paper_report(&out);
    assert!(report.contains("## 4. The experiments inside TensorFlow"), "{report}");
    assert!(report.contains("Not run: ") && report.contains("No module named 'tensorflow'"), "{report}");
    assert!(!out.join("tf-read.json").exists());
}

/// The paper's experiments inside TensorFlow, for real: only where `RINGTIER_TF_PYTHON` names
/// a Python with TensorFlow and this build of ringtier (CI sets it in its TensorFlow stage).
#[test]
fn paper_inside_tensorflow_runs_the_three_experiments() {
    let Some(py) = std::env::var_os("RINGTIER_TF_PYTHON") else {
        eprintln!("skipped: RINGTIER_TF_PYTHON is not set");
        return;
    };
    let dir = tempfile::Builder::new().prefix("cli-tf").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let out = dir.path().join("report");
    let run = paper_with_python(&["--tensorflow", "on"], &py, &out);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let report = paper_report(&out);
    assert!(report.contains("## 4. The experiments inside TensorFlow"), "{report}");
    assert!(report.contains("128 of the paper's files"), "{report}");
    assert!(report.contains("| ringtier prefetch off |") && report.contains("burst buffer blocks"), "{report}");
    for f in ["tf-read.json", "tf-miniapp.json", "tf-ckpt.json"] {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join(f)).expect(f)).expect("parse");
        assert!(v["sides"].as_object().is_some_and(|s| s.len() >= 3), "{f}: {v}");
    }
}
