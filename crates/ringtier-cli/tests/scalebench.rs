//! `ringtier bench scale` end to end on a small set (2,000 files of 1-3 KB in 20 class
//! directories, `--make`): 1 and 2 rank processes, the listing cache on and off, `--verify`
//! with the bytes compared with the disk; the report's rows and the exactly-once verdict. Cold
//! passes evict only the set's own files (`RINGTIER_COLD=fadvise`): a test never drops the
//! machine's page cache. A file the loader cannot list (a name that is not UTF-8) is caught as
//! missing, and the run fails.

use std::path::Path;
use std::process::{Command, Output};

fn scale(dir: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ringtier"))
        .args(["bench", "scale", "--dir"])
        .arg(dir)
        .args(["--repeats", "1"])
        .args(extra)
        .env("RINGTIER_COLD", "fadvise")
        .env_remove("RINGTIER_ENGINE_THREADS")
        .output()
        .expect("run ringtier")
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).expect("report")).expect("parse report")
}

#[test]
fn bench_scale_reads_every_file_exactly_once_from_one_and_two_ranks() {
    let tmp = tempfile::tempdir().expect("dir");
    let data = tmp.path().join("data");
    let report = tmp.path().join("scale.json");
    let md = tmp.path().join("scale.md");
    let out = scale(
        &data,
        &[
            "--make=2000",
            "--classes=20",
            "--ranks=1,2",
            "--listings=cached,dirents",
            "--verify",
            "--verify-bytes",
            "--json",
            report.to_str().expect("utf-8"),
            "--md",
            md.to_str().expect("utf-8"),
        ],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r = json(&report);
    assert_eq!(r["schema"], "ringtier.bench.scale/1");
    assert_eq!(r["files"], 2000);
    // Every pass cold, by evicting the set's files.
    let colds = r["cold"].as_array().expect("cold");
    assert_eq!(colds.len(), 4, "2 rank counts x 2 listings x 1 repeat");
    assert!(colds.iter().all(|c| c == "posix_fadvise(DONTNEED)"), "{colds:?}");
    let rows = r["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 4);
    for row in rows {
        let ranks = row["ranks"].as_u64().expect("ranks");
        assert_eq!(row["samples"], 2000, "{row}");
        assert_eq!(row["from_cache"], row["listing"] == "cached", "{row}");
        let threads = row["engine_threads"].as_array().expect("threads");
        assert_eq!(threads.len() as u64, ranks);
        assert!(threads.iter().all(|t| (1..=2).contains(&t.as_u64().expect("n"))), "{row}");
        for k in ["first_batch_s", "samples_per_s", "cpu_s_per_1000", "peak_rss_mib_per_rank"] {
            let v = row[k]["median"].as_f64().expect(k);
            assert!(v > 0.0 && v.is_finite(), "{k}: {row}");
        }
        assert!(row["first_batch_s"]["median"].as_f64() <= row["epoch_s"]["median"].as_f64(), "{row}");
    }
    // Each pass: every rank a process of its own, the node's samples split between them.
    for p in r["passes"].as_array().expect("passes") {
        let per_rank = p["per_rank"].as_array().expect("per rank");
        assert_eq!(per_rank.len() as u64, p["ranks"].as_u64().expect("ranks"));
        assert_eq!(per_rank.iter().map(|x| x["samples"].as_u64().expect("n")).sum::<u64>(), 2000);
        assert!(per_rank.iter().all(|x| x["listed"] == 2000), "{p}");
    }
    let verify = r["verify"].as_array().expect("verify");
    assert_eq!(verify.len(), 2);
    for (v, ranks) in verify.iter().zip([1u64, 2]) {
        assert_eq!(v["ranks"], ranks);
        let res = &v["result"];
        assert_eq!(res["ok"], true, "{v}");
        assert_eq!(res["samples"], 2000);
        assert_eq!(res["distinct"], 2000);
        assert_eq!(res["expected"], 2000);
        assert_eq!(res["read_twice"], 0);
        assert_eq!(res["missing"], 0);
        assert_eq!(res["bytes_checked"], true);
        assert_eq!(res["bytes_wrong"], 0);
        let per_rank: Vec<u64> =
            v["samples_per_rank"].as_array().expect("per rank").iter().map(|n| n.as_u64().expect("n")).collect();
        assert_eq!(per_rank, if ranks == 1 { vec![2000] } else { vec![1000, 1000] });
    }
    let table = std::fs::read_to_string(&md).expect("md");
    assert!(table.contains("| 2 | cached |"), "{table}");
    assert!(table.contains("exactly once, 2 ranks"), "{table}");
}

#[test]
fn bench_scale_fails_when_a_file_was_not_read() {
    use std::os::unix::ffi::OsStrExt as _;
    let tmp = tempfile::tempdir().expect("dir");
    let data = tmp.path().join("data");
    let report = tmp.path().join("scale.json");
    let made = scale(&data, &["--make=300", "--classes=3", "--ranks=1", "--listings=dirents", "--warm"]);
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    // A name that is not UTF-8 is no key: the loader leaves it out (named in a warning), the
    // parent's walk of the directory does not.
    std::fs::write(data.join("c0000").join(std::ffi::OsStr::from_bytes(b"bad-\xff.bin")), b"x").expect("write");
    let out = scale(
        &data,
        &["--ranks=1", "--listings=dirents", "--warm", "--verify", "--json", report.to_str().expect("utf-8")],
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("exactly once failed"), "{stderr}");
    let r = json(&report);
    assert_eq!(r["cold"][0], "warm");
    let res = &r["verify"][0]["result"];
    assert_eq!(res["ok"], false);
    assert_eq!(res["missing"], 1);
    assert_eq!(res["distinct"], 300);
    assert_eq!(res["expected"], 301);
}

#[test]
fn bench_scale_bad_arguments() {
    let tmp = tempfile::tempdir().expect("dir");
    std::fs::write(tmp.path().join("x"), b"x").expect("write");
    let out = scale(tmp.path(), &["--make=10"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not empty"), "{out:?}");
    let out = scale(tmp.path(), &["--verify-bytes"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--verify-bytes needs --verify"), "{out:?}");
    let out = scale(tmp.path(), &["--ranks=0"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--ranks must be"), "{out:?}");
}
