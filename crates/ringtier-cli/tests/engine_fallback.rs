//! Every CLI command that opens a tier works where io_uring is refused (engine `auto`: the
//! thread pool, one warning naming why), `--engine uring` fails naming the cause and the way
//! out, and checkpoints written with io_uring restore with the thread pool.
//!
//! Refused two ways: a seccomp filter in the child (`ringtier-no-uring`, EPERM as containers'
//! default profiles, ENOSYS as gVisor), always; and the system-wide sysctl
//! `kernel.io_uring_disabled=2`, which `.ci/run` sets (as root) around `cargo test --test
//! engine_fallback -- sysctl` alone and restores after (`RINGTIER_TEST_SYSCTL=1`).

use std::path::Path;
use std::process::{Command, Output};

use ringtier_testkit::bins;

/// How io_uring is refused to the command.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    /// `ringtier-no-uring --errno ...`.
    Seccomp(&'static str),
    /// The sysctl, set by the caller of the test.
    Sysctl,
}

fn ringtier(refusal: Option<Refusal>) -> Command {
    let bin = env!("CARGO_BIN_EXE_ringtier");
    match refusal {
        Some(Refusal::Seccomp(errno)) => {
            let mut c = Command::new(bins::path(bins::NO_URING));
            c.args(["--errno", errno, "--", bin]);
            c
        }
        Some(Refusal::Sysctl) | None => Command::new(bin),
    }
}

fn run(refusal: Option<Refusal>, args: &[&str]) -> Output {
    let out = ringtier(refusal).args(args).env_remove("RINGTIER_LOG").output().expect("run ringtier");
    assert!(
        out.status.success(),
        "{refusal:?} ringtier {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn fallback_warnings(out: &Output) -> usize {
    String::from_utf8_lossy(&out.stderr).matches("ringtier uses its thread-pool engine instead").count()
}

fn everything_works_without_io_uring(refusal: Refusal, why: &str) {
    let dir = tempfile::Builder::new().prefix("no-uring").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let (ds, fast, slow, out_dir) =
        (dir.path().join("ds"), dir.path().join("fast"), dir.path().join("slow"), dir.path().join("out"));
    let r = Some(refusal);
    run(r, &["gen", "--preset", "caltech101", "--files", "120", "--classes", "4", "--dir", s(&ds)]);

    // Record shards: generated and indexed through the thread pool.
    let tf = dir.path().join("tf");
    run(
        r,
        &["gen", "--preset", "caltech101", "--files", "60", "--format", "tfrecord", "--shards", "2", "--dir", s(&tf)],
    );
    let out = run(r, &["index", "--dir", s(&tf), "--format", "tfrecord"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("indexed 60 records"), "{out:?}");
    let idx = std::fs::read_dir(&tf)
        .expect("tf")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "idx"))
        .count();
    assert_eq!(idx, 2, "one SHARD.idx per shard");

    // bench read: the thread pool alone, the io_uring engines skipped with the reason.
    let json = dir.path().join("read.json");
    let out = run(r, &["bench", "read", "--repeats", "1", "--concurrency", "1,2", "--dir", s(&ds), "--json", s(&json)]);
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
    let skipped = report["skipped_engines"].as_array().expect("skipped_engines");
    assert!(!skipped.is_empty(), "{report}");
    for e in skipped {
        assert!(e["reason"].as_str().is_some_and(|r| r.contains(why)), "{e}");
    }
    let points = report["points"].as_array().expect("points");
    assert!(!points.is_empty() && points.iter().all(|p| p["engine"] == "posix-threads"), "{points:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("skipped") && stdout.contains(why), "the table says why: {stdout}");

    // ckpt: save (drained), ls, restore byte for byte, verify, drain; one warning per process.
    let part = dir.path().join("weights.bin");
    let data: Vec<u8> = (0..3_000_017u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(&part, &data).expect("part");
    let tiers = format!("{},{}", s(&fast), s(&slow));
    let part_arg = format!("w={}", s(&part));
    let out = run(r, &["ckpt", "--tiers", &tiers, "save", "--step", "1", "--part", &part_arg]);
    assert_eq!(fallback_warnings(&out), 1, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains(why), "the warning names why");
    run(r, &["ckpt", "--tiers", &tiers, "save", "--step", "2", "--part", &part_arg, "--no-drain"]);
    let ls = run(r, &["ckpt", "--tiers", &tiers, "ls"]);
    assert!(String::from_utf8_lossy(&ls.stdout).contains("fast, slow"), "{}", String::from_utf8_lossy(&ls.stdout));
    run(r, &["ckpt", "--tiers", &tiers, "restore", "--out", s(&out_dir)]);
    assert!(std::fs::read(out_dir.join("w")).expect("restored") == data, "restored bytes differ");
    run(r, &["ckpt", "--tiers", &tiers, "verify"]);
    run(r, &["ckpt", "--tiers", &tiers, "drain"]);

    // The format is the engine's no more: io_uring (no refusal) reads what the thread pool
    // wrote, and the thread pool restores what io_uring writes. (Under the sysctl nothing in
    // this machine has io_uring: the filters' runs check it.)
    if matches!(refusal, Refusal::Seccomp(_)) {
        cross_engine(r, dir.path(), &tiers, &part_arg, &data);
    }

    // --engine uring: an error naming the cause and the way out.
    let out = ringtier(r).args(["ckpt", "--tiers", &tiers, "--engine", "uring", "ls"]).output().expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("engine \"uring\"") && err.contains(why) && err.contains("\"auto\""), "{err}");
    // --engine posix: no warning.
    let out = run(r, &["ckpt", "--tiers", &tiers, "--engine", "posix", "ls"]);
    assert_eq!(fallback_warnings(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));

    // The experiments take --engine too: `uring` asked for where it is refused is an error
    // before any work, naming why.
    let report = dir.path().join("report");
    let out = ringtier(r)
        .args(["paper", "--tiny", "--repeats", "1", "--engine", "uring", "--out", s(&report)])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--engine uring") && err.contains(why), "{err}");
    let ck = dir.path().join("bench-ckpt");
    let out = ringtier(r)
        .args(["bench", "ckpt", "--dir", s(&ck), "--size", "1M", "--count", "1", "--ratios", "1"])
        .args(["--repeats", "1", "--compute", "0", "--no-restore", "--engine", "uring"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("engine \"uring\"") && err.contains(why), "{err}");
}

/// `--engine posix` on the paper: the thread pool alone, said in the report and in each
/// experiment's JSON (the mini-app's and the burst buffer's tiers opened with it).
#[test]
fn paper_on_the_thread_pool_when_asked() {
    let dir = tempfile::Builder::new().prefix("paper-posix").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let (out, work) = (dir.path().join("out"), dir.path().join("work"));
    let o =
        run(None, &["paper", "--tiny", "--repeats", "1", "--engine", "posix", "--out", s(&out), "--work", s(&work)]);
    assert_eq!(fallback_warnings(&o), 0);
    let md = std::fs::read_to_string(out.join("report.md")).expect("report");
    assert!(md.contains("left out by --engine posix") && md.contains("`--engine posix`"), "{md}");
    let json = |name: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(out.join(name)).expect(name)).expect("parse")
    };
    let read = json("read.json");
    let points = read["points"].as_array().expect("points");
    assert!(!points.is_empty() && points.iter().all(|p| p["engine"] == "posix-threads"), "{points:?}");
    for name in ["train-read.json", "train-decode.json", "ckpt.json"] {
        assert_eq!(json(name)["config"]["engine"], "posix", "{name}");
    }
}

fn cross_engine(r: Option<Refusal>, dir: &Path, tiers: &str, part_arg: &str, data: &[u8]) {
    let out2 = dir.join("out2");
    run(None, &["ckpt", "--tiers", tiers, "--engine", "uring", "restore", "--step", "2", "--out", s(&out2)]);
    assert!(std::fs::read(out2.join("w")).expect("restored") == data);
    run(None, &["ckpt", "--tiers", tiers, "--engine", "uring", "save", "--step", "3", "--part", part_arg]);
    let out3 = dir.join("out3");
    run(r, &["ckpt", "--tiers", tiers, "restore", "--step", "3", "--out", s(&out3)]);
    assert!(std::fs::read(out3.join("w")).expect("restored") == data);
}

#[test]
fn seccomp_eperm() {
    everything_works_without_io_uring(Refusal::Seccomp("eperm"), "EPERM");
}

#[test]
fn seccomp_enosys() {
    everything_works_without_io_uring(Refusal::Seccomp("enosys"), "ENOSYS");
}

/// Under `kernel.io_uring_disabled=2`, set by `.ci/run` around this test alone
/// (`RINGTIER_TEST_SYSCTL=1`); elsewhere it says why it did not run.
#[test]
fn sysctl_disabled() {
    let value = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled").unwrap_or_default();
    if value.trim() != "2" {
        assert!(
            std::env::var_os("RINGTIER_TEST_SYSCTL").is_none(),
            "RINGTIER_TEST_SYSCTL is set but kernel.io_uring_disabled is {value:?}, not 2"
        );
        eprintln!("sysctl_disabled: kernel.io_uring_disabled is not 2; run by .ci/run with it set");
        return;
    }
    everything_works_without_io_uring(Refusal::Sysctl, "kernel.io_uring_disabled=2");
}

/// As an ordinary user with `ulimit -l 64` (KiB, a common container default): registered
/// buffers fall back, rings are retried smaller and then the thread pool takes over; every
/// command works. Needs root to become `nobody` (`setpriv`) under `prlimit`; says why it
/// did not run otherwise.
#[test]
fn small_memlock_as_an_ordinary_user() {
    // Root: the effective uid in /proc/self/status.
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|l| l.split_whitespace().nth(1));
    let tools = ["prlimit", "setpriv"].iter().all(|t| Command::new(t).arg("--version").output().is_ok());
    if euid != Some("0") || !tools {
        eprintln!("small_memlock_as_an_ordinary_user: needs root and util-linux's prlimit and setpriv");
        return;
    }
    let dir = tempfile::Builder::new().prefix("memlock").tempdir_in(std::env::temp_dir()).expect("tempdir");
    let root = dir.path();
    let mode = |p: &Path, m: u32| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).expect("chmod");
    };
    mode(root, 0o777);
    let bin = root.join("ringtier");
    std::fs::copy(env!("CARGO_BIN_EXE_ringtier"), &bin).expect("copy the binary where nobody can run it");
    mode(&bin, 0o755);
    let as_nobody = |args: &[&str]| -> Output {
        let out = Command::new("prlimit")
            .args(["--memlock=65536:65536", "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
            .arg(&bin)
            .args(args)
            .env_remove("RINGTIER_LOG")
            .output()
            .expect("run");
        assert!(
            out.status.success(),
            "ringtier {args:?} as nobody, memlock 64 KiB: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    let (ds, f, sl, out) = (root.join("ds"), root.join("f"), root.join("s"), root.join("out"));
    as_nobody(&["gen", "--preset", "caltech101", "--files", "100", "--classes", "4", "--dir", s(&ds)]);
    let read = as_nobody(&["bench", "read", "--repeats", "1", "--concurrency", "1,64,256", "--warm", "--dir", s(&ds)]);
    let table = String::from_utf8_lossy(&read.stdout);
    assert!(table.contains("posix-threads"), "{table}");
    let part = root.join("p.bin");
    let data: Vec<u8> = (0..5_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
    std::fs::write(&part, &data).expect("part");
    mode(&part, 0o644);
    let tiers = format!("{},{}", s(&f), s(&sl));
    let part_arg = format!("w={}", s(&part));
    for step in ["1", "2", "3"] {
        as_nobody(&["ckpt", "--tiers", &tiers, "save", "--step", step, "--part", &part_arg]);
    }
    as_nobody(&["ckpt", "--tiers", &tiers, "ls"]);
    as_nobody(&["ckpt", "--tiers", &tiers, "restore", "--out", s(&out)]);
    assert!(std::fs::read(out.join("w")).expect("restored") == data);
    as_nobody(&["ckpt", "--tiers", &tiers, "verify"]);
    as_nobody(&["ckpt", "--tiers", &tiers, "drain"]);
}
