//! `ringtier bench decode` end to end on a small generated JPEG set: every chain decodes every
//! file, the JSON has the summary, the split point materializes every sample, bad input fails
//! clearly; with Pillow available (`RINGTIER_PYTHON`, as `.ci/run` sets) the baseline runs too.

use std::path::Path;
use std::process::Command;

fn ringtier() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ringtier"));
    c.current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."));
    c
}

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("cli-decode").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir")
}

#[test]
fn bench_decode_runs_every_chain_and_the_split_point() {
    let dir = tempdir();
    let data = dir.path().join("caltech");
    let out = ringtier()
        .args(["gen", "--preset", "caltech101", "--format", "jpeg", "--files", "24", "--classes", "3", "--dir"])
        .arg(&data)
        .output()
        .expect("gen");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json = dir.path().join("d.json");
    let python = std::env::var("RINGTIER_PYTHON").ok();
    let mut cmd = ringtier();
    cmd.args(["bench", "decode", "--files", "24", "--repeats", "1", "--threads", "1,2", "--size", "64"])
        .args(["--split", "--split-repeats", "1", "--split-size", "80", "--dir"])
        .arg(&data)
        .arg("--split-dir")
        .arg(dir.path())
        .arg("--json")
        .arg(&json);
    match &python {
        // The CI venv has Pillow (not numpy): the chains the script runs without numpy.
        Some(p) => cmd.args(["--python", p, "--chains", "resize,center,rrc-flip"]),
        None => cmd.args(["--no-pillow"]),
    };
    let out = cmd.output().expect("bench decode");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).expect("json")).expect("parse");
    assert_eq!(v["schema"], "ringtier.bench.decode/1");
    let rows = v["summary"].as_array().expect("summary");
    let chains = if python.is_some() { 3 } else { 4 };
    let engines = if python.is_some() { 3 } else { 2 };
    assert_eq!(rows.len(), chains * engines, "{rows:?}");
    for r in rows {
        assert_eq!(r["errors"], 0, "{r}");
        assert!(r["images_per_sec"]["median"].as_f64().expect("rate") > 0.0, "{r}");
    }
    if python.is_some() {
        assert!(rows.iter().any(|r| r["engine"] == "pillow x1"));
        assert!(rows.iter().any(|r| r["per_core_ratio_vs_pillow"]["median"].as_f64().is_some_and(|x| x > 0.0)));
    }
    // The split point: three epochs, the materialized copy complete (24 samples of 80x80x3).
    let split = &v["split"];
    assert_eq!(split["summary"].as_array().map(Vec::len), Some(3));
    assert_eq!(split["storage"][0]["materialized_bytes"], 24 * 80 * 80 * 3);
    for e in split["epochs"].as_array().expect("epochs") {
        assert_eq!((e["samples"].as_u64(), e["skipped"].as_u64()), (Some(24), Some(0)), "{e}");
    }
    // The copies are removed after the run.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("ls")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("ringtier-materialized-"))
        .collect();
    assert!(left.is_empty());

    let bad = ringtier()
        .args(["bench", "decode", "--no-pillow", "--chains", "sharpen", "--dir"])
        .arg(&data)
        .output()
        .expect("run");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown chain"), "{}", String::from_utf8_lossy(&bad.stderr));
    let none = ringtier()
        .args(["bench", "decode", "--no-pillow", "--dir"])
        .arg(dir.path().join("missing"))
        .output()
        .expect("run");
    assert!(!none.status.success());
    assert!(String::from_utf8_lossy(&none.stderr).contains("manifest"), "{}", String::from_utf8_lossy(&none.stderr));
}
