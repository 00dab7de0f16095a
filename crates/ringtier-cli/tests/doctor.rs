//! `ringtier doctor`: one line per finding and a verdict, exit 0, JSON that parses; an ext4
//! directory (the build's own temp dir) and tmpfs (`/dev/shm`: not durable) as paths; and the
//! same run with io_uring refused by a seccomp filter (`ringtier-no-uring`), where the report
//! says so and names the thread pool as the engine `auto` uses.

use std::path::Path;
use std::process::{Command, Output};

use ringtier_testkit::bins;

const TOPICS: [&str; 8] = ["kernel", "io_uring", "opcodes", "memlock", "path", "thp", "cuda", "decoder"];

fn doctor(no_uring: Option<&str>, args: &[&str]) -> Output {
    let bin = env!("CARGO_BIN_EXE_ringtier");
    let mut cmd = match no_uring {
        Some(errno) => {
            let mut c = Command::new(bins::path(bins::NO_URING));
            c.args(["--errno", errno, "--", bin]);
            c
        }
        None => Command::new(bin),
    };
    let out = cmd.arg("doctor").args(args).env_remove("RINGTIER_LOG").output().expect("run ringtier doctor");
    assert!(
        out.status.success(),
        "{no_uring:?} doctor {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The lines of a text report, each checked: `STATUS TOPIC TEXT` then one verdict.
fn lines(out: &Output) -> Vec<String> {
    let stdout = String::from_utf8(out.stdout.clone()).expect("utf-8");
    let lines: Vec<String> = stdout.lines().map(str::to_string).collect();
    let (verdict, findings) = lines.split_last().expect("a report");
    assert!(verdict.starts_with("verdict: "), "{stdout}");
    assert!(!findings.is_empty(), "{stdout}");
    for l in findings {
        let mut words = l.split_whitespace();
        let (status, topic) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        assert!(["ok", "note", "warn"].contains(&status), "status of {l:?}");
        assert!(TOPICS.contains(&topic), "topic of {l:?}");
        assert!(words.next().is_some(), "text of {l:?}");
    }
    lines
}

fn path_line<'a>(lines: &'a [String], p: &str) -> &'a str {
    let found: Vec<&String> = lines.iter().filter(|l| l.contains(" path ") && l.contains(&format!("{p}: "))).collect();
    assert_eq!(found.len(), 1, "one line for {p}: {lines:#?}");
    found[0]
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[test]
fn doctor_reports_ext4_and_tmpfs_and_parses_as_json() {
    let dir = tempfile::Builder::new().prefix("doctor").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let ext4 = s(dir.path());
    let shm = "/dev/shm";
    let out = doctor(None, &[ext4, shm]);
    let lines = lines(&out);

    // Every topic once, the paths once each (and no default path when paths are given).
    for topic in ["kernel", "io_uring", "memlock", "thp", "cuda", "decoder"] {
        let n = lines.iter().filter(|l| l.split_whitespace().nth(1) == Some(topic)).count();
        assert_eq!(n, 1, "{topic}: {lines:#?}");
    }
    assert_eq!(lines.iter().filter(|l| l.split_whitespace().nth(1) == Some("path")).count(), 2, "{lines:#?}");

    let on_disk = path_line(&lines, ext4);
    assert!(on_disk.contains("writable") && on_disk.contains(" free of "), "{on_disk}");
    // The build directory is on a real file system: durable (CI's is ext4, with O_DIRECT).
    assert!(!on_disk.contains("not durable"), "{on_disk}");
    if on_disk.contains("ext4") {
        assert!(on_disk.contains("O_DIRECT (alignment: memory "), "{on_disk}");
    }
    let in_memory = path_line(&lines, shm);
    assert!(in_memory.contains("tmpfs") && in_memory.contains("not durable"), "{in_memory}");
    assert!(in_memory.contains("lost at reboot"), "{in_memory}");
    assert!(in_memory.starts_with("note") || in_memory.starts_with("warn"), "{in_memory}");

    // The verdict names the engine `auto` uses: io_uring where this process may set up a ring.
    let verdict = lines.last().expect("verdict");
    let uring = lines.iter().find(|l| l.split_whitespace().nth(1) == Some("io_uring")).expect("io_uring line");
    if uring.starts_with("ok") {
        assert!(verdict.contains("engine auto uses io_uring"), "{verdict}");
        let ops = lines.iter().find(|l| l.split_whitespace().nth(1) == Some("opcodes")).expect("opcodes line");
        assert!(ops.contains("set-up flags") && ops.contains("READ"), "{ops}");
    } else {
        assert!(verdict.contains("engine auto uses the thread pool"), "{verdict}");
    }

    // --json: the same findings, the verdict and the measured values.
    let json = doctor(None, &["--json", ext4, shm]);
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).expect("doctor --json parses");
    let findings = report["findings"].as_array().expect("findings");
    assert_eq!(findings.len(), lines.len() - 1, "{report}");
    for (f, line) in findings.iter().zip(&lines) {
        let text = f["text"].as_str().expect("text");
        assert!(line.ends_with(text), "{line} vs {f}");
        assert!(line.starts_with(f["status"].as_str().expect("status")), "{line} vs {f}");
    }
    assert_eq!(report["verdict"]["text"].as_str().map(|t| format!("verdict: {t}")).as_deref(), Some(verdict.as_str()));
    let paths = report["facts"]["paths"].as_array().expect("facts.paths");
    assert_eq!(paths.len(), 2, "{report}");
    assert_eq!(paths[0]["path"], ext4);
    assert_eq!(paths[0]["durable"], true);
    assert_eq!(paths[0]["writable"], true);
    assert!(paths[0]["free_bytes"].as_u64().is_some_and(|b| b > 0), "{}", paths[0]);
    assert_eq!(paths[1]["fs_type"], "tmpfs");
    assert_eq!(paths[1]["durable"], false);
    assert!(report["facts"]["memlock"].is_object(), "{report}");
    assert!(["zune-jpeg", "libjpeg-turbo"].contains(&report["facts"]["jpeg_decoder"].as_str().unwrap_or("")));
}

#[test]
fn doctor_without_paths_looks_at_the_current_and_the_temp_directory() {
    let dir = tempfile::Builder::new().prefix("doctor-cwd").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let bin = env!("CARGO_BIN_EXE_ringtier");
    let out = Command::new(bin).arg("doctor").current_dir(dir.path()).env("TMPDIR", "/dev/shm").output().expect("run");
    assert!(out.status.success());
    let lines = lines(&out);
    path_line(&lines, ".");
    assert!(path_line(&lines, "/dev/shm").contains("not durable"), "{lines:#?}");
}

#[test]
fn doctor_reports_io_uring_refused_and_the_thread_pool() {
    let dir =
        tempfile::Builder::new().prefix("doctor-no-uring").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let out = doctor(Some("eperm"), &[s(dir.path())]);
    let lines = lines(&out);
    let uring = lines.iter().find(|l| l.split_whitespace().nth(1) == Some("io_uring")).expect("io_uring line");
    assert!(uring.starts_with("warn") && uring.contains("refused") && uring.contains("EPERM"), "{uring}");
    assert!(uring.contains("seccomp"), "names the likely cause and the way out: {uring}");
    assert!(!lines.iter().any(|l| l.split_whitespace().nth(1) == Some("opcodes")), "{lines:#?}");
    let verdict = lines.last().expect("verdict");
    assert!(verdict.contains("engine auto uses the thread pool") && verdict.contains("EPERM"), "{verdict}");
    // The rest of the report is unaffected.
    assert!(path_line(&lines, s(dir.path())).contains("writable"), "{lines:#?}");

    let json = doctor(Some("enosys"), &["--json", s(dir.path())]);
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).expect("doctor --json parses");
    assert_eq!(report["verdict"]["auto_engine"], "thread pool", "{report}");
    assert_eq!(report["facts"]["io_uring"]["available"], false, "{report}");
    assert_eq!(report["facts"]["io_uring"]["reason"], "unsupported", "{report}");
}
