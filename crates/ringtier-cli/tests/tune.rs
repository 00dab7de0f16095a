//! `ringtier tune` end to end against a fake sysfs tree (no root needed): block settings are
//! changed for a configuration and put back at the end and after Ctrl-C (SIGINT to the
//! child while it holds a changed setting); an unknown knob is a clear error; the report
//! records the kernel, the device and every block setting; a preset runs at tiny scale.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn ringtier() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ringtier"))
}

/// A fake sysfs whose `dev/block/MAJ:MIN` is the device of `data`; `None` when `data` has no
/// block device (tmpfs), with the reason printed.
fn fake_sysfs(data: &Path, sys: &Path) -> Option<PathBuf> {
    let dev = std::fs::metadata(data).expect("stat").dev();
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    if major == 0 {
        eprintln!("skipped: {} has no block device (major 0)", data.display());
        return None;
    }
    let disk = sys.join("devices/virtual/block/vdfake");
    std::fs::create_dir_all(disk.join("queue")).expect("mkdir");
    for (k, v) in [
        ("scheduler", "none [mq-deadline]\n"),
        ("nomerges", "0\n"),
        ("read_ahead_kb", "128\n"),
        ("nr_requests", "256\n"),
    ] {
        std::fs::write(disk.join("queue").join(k), v).expect("write");
    }
    std::fs::create_dir_all(sys.join("dev/block")).expect("mkdir");
    std::os::unix::fs::symlink(&disk, sys.join(format!("dev/block/{major}:{minor}"))).expect("link");
    Some(disk.join("queue"))
}

fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let t = tempfile::Builder::new().prefix("tune-cli").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let (data, sys) = (t.path().join("data"), t.path().join("sys"));
    std::fs::create_dir_all(&data).expect("mkdir");
    (t, data, sys)
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).expect("read").trim().to_string()
}

#[test]
fn block_settings_are_restored_after_ctrl_c() {
    let (t, data, sys) = dirs();
    let Some(queue) = fake_sysfs(&data, &sys) else { return };
    let space = t.path().join("space.toml");
    std::fs::write(&space, "[uring]\ndepth = [4]\n[block]\nnomerges = [2]\nscheduler = [\"none\"]\n").expect("write");
    let mut child = ringtier()
        .args(["tune", "--files", "40", "--repeats", "1", "--no-trace", "--no-fio", "--hold-after-apply-ms", "60000"])
        .arg("--dir")
        .arg(&data)
        .arg("--space")
        .arg(&space)
        .arg("--sysfs")
        .arg(&sys)
        .arg("--out")
        .arg(t.path().join("out"))
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let mut seen = Vec::new();
    loop {
        let line = lines.next().expect("the child held a changed setting").expect("line");
        seen.push(line.clone());
        if line.contains("block settings applied, holding") {
            break;
        }
    }
    let changed = (read(&queue.join("nomerges")), read(&queue.join("scheduler")));
    assert!(changed.0 == "2" || changed.1 == "none", "a setting is changed while held: {changed:?}\n{seen:?}");
    let status = Command::new("kill").args(["-INT", &child.id().to_string()]).status().expect("kill");
    assert!(status.success());
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let code = child.wait().expect("wait");
    assert_eq!(code.code(), Some(130), "exits 128 + SIGINT after restoring: {rest:?}");
    assert!(rest.iter().any(|l| l.contains("restored")), "{rest:?}");
    assert_eq!(read(&queue.join("nomerges")), "0");
    assert_eq!(read(&queue.join("scheduler")), "mq-deadline");
    assert!(!data.join("ringtier-tune-data").exists() || std::fs::read_dir(data.join("ringtier-tune-data")).is_ok());
}

#[test]
fn a_sweep_restores_settings_records_the_machine_and_runs_a_tiny_preset() {
    let (t, data, sys) = dirs();
    let Some(queue) = fake_sysfs(&data, &sys) else { return };
    let out = t.path().join("out");
    let sweep = || {
        ringtier()
            .args(["tune", "--files", "60", "--repeats", "1", "--no-fio"])
            .args(["--knob", "depth=4,16", "--knob", "read_ahead_kb=512", "--knob", "defer_taskrun=true"])
            .args(["--preset", "cosmoflow", "--preset-files", "6", "--max-accelerators", "2"])
            .arg("--space")
            .arg(t.path().join("none.toml"))
            .arg("--dir")
            .arg(&data)
            .arg("--sysfs")
            .arg(&sys)
            .arg("--out")
            .arg(&out)
            .output()
            .expect("run")
    };
    // --space names a file that does not exist: a clear error first.
    let run = sweep();
    assert!(!run.status.success());
    assert!(String::from_utf8_lossy(&run.stderr).contains("none.toml"), "{}", String::from_utf8_lossy(&run.stderr));
    std::fs::write(t.path().join("none.toml"), "sweep = \"one-at-a-time\"\n").expect("write");
    let run = sweep();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert_eq!(read(&queue.join("read_ahead_kb")), "128", "restored at the end");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("tune.json")).expect("json")).expect("parse");
    assert_eq!(report["schema"], "ringtier.tune/1");
    let labels: Vec<&str> =
        report["points"].as_array().expect("points").iter().filter_map(|p| p["label"].as_str()).collect();
    // The baseline, then knob by knob (in name order).
    assert_eq!(labels, ["defaults", "defer_taskrun=true", "depth=4", "depth=16", "read_ahead_kb=512"]);
    for p in report["points"].as_array().expect("points") {
        assert!(p["mb_per_sec"]["median"].as_f64().expect("bw") > 0.0, "{p}");
        assert!(p["latency_p999_ms"]["median"].as_f64().is_some(), "{p}");
    }
    assert!(!report["pareto_front"].as_array().expect("front").is_empty());
    assert!(report["best"]["bench_read"].as_str().expect("cmd").starts_with("ringtier bench read --dir "));
    assert_eq!(report["block_settings_before"]["read_ahead_kb"], "128");
    assert!(!report["machine"]["kernel"].as_str().expect("kernel").is_empty());
    assert!(report["machine"]["io_uring"]["opcodes"].as_array().is_some());
    assert_eq!(report["presets"][0]["preset"]["name"], "cosmoflow");
    assert!(!report["presets"][0]["runs"].as_array().expect("runs").is_empty());
    for f in ["tune.md", "pareto.svg", "latency-cdf.svg"] {
        assert!(out.join(f).exists(), "{f}");
    }
    // The generated data is gone.
    assert!(!data.join("ringtier-tune-data").exists());
}

#[test]
fn an_unknown_knob_is_a_clear_error() {
    let (t, data, _) = dirs();
    let out = ringtier()
        .args(["tune", "--knob", "queue_dpeth=4", "--dir"])
        .arg(&data)
        .arg("--out")
        .arg(t.path().join("out"))
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("unknown knob `queue_dpeth`") && e.contains("depth, rings"), "{e}");
}

#[test]
fn the_loader_and_checkpoint_workloads_run_end_to_end() {
    let (t, data, _) = dirs();
    std::fs::write(t.path().join("none.toml"), "sweep = \"one-at-a-time\"\n").expect("write");
    for (workload, extra) in [
        ("loader", &["--files", "40", "--loader-batch", "8"][..]),
        ("ckpt", &["--ckpt-size", "3M", "--ckpt-parts", "3"]),
    ] {
        let out = t.path().join(workload);
        let run = ringtier()
            .args(["tune", "--workload", workload, "--repeats", "2", "--no-block", "--knob", "depth=4,16"])
            .args(extra)
            .arg("--space")
            .arg(t.path().join("none.toml"))
            .arg("--dir")
            .arg(&data)
            .arg("--out")
            .arg(&out)
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(run.status.success(), "{workload}: {stderr}");
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("tune.json")).expect("json")).expect("parse");
        assert_eq!(report["workload"], workload);
        let points = report["points"].as_array().expect("points");
        let labels: Vec<&str> = points.iter().filter_map(|p| p["label"].as_str()).collect();
        assert_eq!(labels, ["defaults", "depth=4", "depth=16"]);
        for p in points {
            assert!(p["mb_per_sec"]["median"].as_f64().expect("bw") > 0.0, "{p}");
            assert!(p["iops"]["median"].as_f64().expect("iops") > 0.0, "{p}");
            assert!(p["cpu_seconds_per_gib"]["median"].as_f64().expect("cpu") > 0.0, "{p}");
            assert!(p["mb_per_sec_vs_defaults"]["median"].as_f64().expect("ratio") > 0.0, "{p}");
            match workload {
                // The loader's latency is each batch's wait.
                "loader" => assert!(p["latency_p99_ms"]["median"].as_f64().expect("p99") > 0.0, "{p}"),
                // A checkpoint has none; save and restore are columns of their own.
                _ => {
                    assert!(p["latency_p99_ms"]["median"].is_null(), "{p}");
                    assert!(p["extra"]["save MB/s"]["median"].as_f64().expect("save") > 0.0, "{p}");
                    assert!(p["extra"]["restore MB/s"]["median"].as_f64().expect("restore") > 0.0, "{p}");
                }
            }
        }
        let notes = report["notes"].as_array().expect("notes");
        assert!(notes.iter().any(|n| n.as_str().is_some_and(|n| n.contains("read workload only"))), "{notes:?}");
        assert!(report["fio"].as_array().expect("fio").is_empty() && report["trace"].as_array().expect("t").is_empty());
        assert!(std::fs::read_to_string(out.join("tune.md")).expect("md").contains(&format!("Workload `{}", {
            let mut w = workload.to_string();
            w[..1].make_ascii_uppercase();
            w
        })));
        // Generated data and the checkpoint store are gone.
        assert!(!data.join("ringtier-tune-data").exists() && !data.join("ringtier-tune-ckpt").exists());
    }
}
