//! The file tiers' durability order, checked from the system calls a real checkpoint save,
//! drain and eviction issue (`docs/CHECKPOINTS.md`, "Durability order").
//!
//! A child process (this test binary, re-run as the ignored test `traced_child`) saves two
//! checkpoints on real directories (ext4 under `CARGO_TARGET_TMPDIR`), drains them to a second
//! tier and evicts them from the first, and marks each acknowledgement with a failed `openat`
//! of a marker path. The parent records the child's calls:
//!
//! * under `strace -f -y` (file descriptors shown with their paths), on the posix and the
//!   io_uring tier, and checks: each committed object's data fsync before its rename (posix:
//!   the io_uring tier syncs through the ring, where strace cannot see), its directory's fsync
//!   after the rename, every part durable before the manifest's rename, the manifest durable
//!   before `save` (or `drain`) returns, new directories fsynced into their parents before
//!   anything is renamed into them, and an eviction's manifest removal durable before any
//!   part is removed;
//! * under `perf trace` with the io_uring tracepoints (where perf may read them: root, tracefs
//!   mounted), on the io_uring tier, and checks that every rename follows a completed
//!   `IORING_OP_FSYNC` of each file written through the ring since the previous rename.
//!
//! The strace checks run twice: once with every step saved, once with step 2 committed from
//! files the child wrote under the fast tier (`commit_files`: adopted, their data fsynced by a
//! system call on either tier before their rename into the step).
//!
//! Either check prints why it skipped where its tool is missing or not permitted.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use ringtier_core::{PosixConfig, PosixTier, Tier};
use ringtier_migrate::{CheckpointStore, Part, StoreConfig};
use ringtier_uring::{DirectIoPolicy, UringConfig, UringTier, UringTierOptions};

const CHILD_ENV: &str = "RINGTIER_DURABILITY_CHILD";
/// Set to 1: the traced child commits step 2 from files it first writes under the fast tier
/// (`CheckpointStore::commit_files`, the files adopted) instead of saving it.
const COMMIT_FILES_ENV: &str = "RINGTIER_DURABILITY_COMMIT_FILES";
/// The step the child commits from files when asked to.
const FILES_STEP: u64 = 2;
const MARKER: &str = "ringtier-durability-marker";
/// Parts the traced child's saves write at once, where set (default: all of them).
const LANES_ENV: &str = "RINGTIER_DURABILITY_SAVE_PARALLELISM";
/// Parts of every checkpoint: several 64 KiB chunks with an unaligned tail, an empty part,
/// a small one.
const PARTS: [(&str, usize); 3] = [("weights", 200_123), ("empty", 0), ("meta", 5_000)];
const STEPS: [u64; 2] = [1, 2];

fn part_bytes(step: u64, i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (j as u64).wrapping_mul(2_654_435_761).wrapping_add(step * 7 + i as u64) as u8).collect()
}

/// A marker the parent finds in the trace: a failed open of `DIR/MARKER-what`.
fn mark(dir: &Path, what: &str) {
    let _ = std::fs::File::open(dir.join(format!("{MARKER}-{what}")));
}

fn open_tier(kind: &str, dir: &Path, name: &str) -> Arc<dyn Tier> {
    match kind {
        "posix" => Arc::new(
            PosixTier::new(PosixConfig::new(dir).with_create(true).with_name(name.into()).with_threads(2))
                .expect("posix tier"),
        ),
        "uring" => {
            let options = UringTierOptions::default().with_name(name.to_string()).with_create_root(true);
            let config = UringConfig::default().with_direct_io(DirectIoPolicy::Auto).with_queue_depth(4);
            Arc::new(UringTier::with_options(dir, config, options).expect("uring tier"))
        }
        other => panic!("unknown tier kind {other}"),
    }
}

/// The traced child: `RINGTIER_DURABILITY_CHILD=KIND;BASE;TIERS` saves every step on
/// `BASE/fast` (and, with two tiers, drains to `BASE/slow`, evicting everything drained).
#[test]
#[ignore = "the traced child of the durability-order tests, which start it themselves"]
fn traced_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        // Run with --include-ignored: nothing to trace without the parent's environment.
        eprintln!("traced_child runs only as the child of the durability-order tests ({CHILD_ENV} unset)");
        return;
    };
    let mut it = spec.split(';');
    let (kind, base, tiers) = match (it.next(), it.next(), it.next()) {
        (Some(k), Some(b), Some(t)) => (k.to_string(), PathBuf::from(b), t.parse::<usize>().expect("tier count")),
        _ => panic!("bad {CHILD_ENV}={spec}"),
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        let mut t = vec![open_tier(&kind, &base.join("fast"), "fast")];
        if tiers == 2 {
            t.push(open_tier(&kind, &base.join("slow"), "slow"));
        }
        let mut cfg = StoreConfig::default().with_chunk_bytes(64 << 10).with_keep_last(0);
        // Every part at once, so that the strace checks see concurrent commits (a directory
        // created by one part while another renames into it); the perf check asks for one at
        // a time (it pairs each rename with the ring fsyncs since the previous one).
        let lanes = std::env::var(LANES_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(PARTS.len());
        cfg = cfg.with_save_parallelism(lanes);
        let store = CheckpointStore::open(t, cfg).await.expect("open");
        let commit_files = std::env::var(COMMIT_FILES_ENV).is_ok_and(|v| v == "1");
        for step in STEPS {
            let data: Vec<Vec<u8>> = PARTS.iter().enumerate().map(|(i, (_, n))| part_bytes(step, i, *n)).collect();
            if commit_files && step == FILES_STEP {
                let incoming = base.join("fast/incoming");
                std::fs::create_dir_all(&incoming).expect("mkdir");
                for ((name, _), d) in PARTS.iter().zip(&data) {
                    std::fs::write(incoming.join(name), d).expect("write a file to commit");
                }
                let names: Vec<String> = PARTS.iter().map(|(n, _)| n.to_string()).collect();
                let r = store.commit_files(step, "incoming", &names).await.expect("commit_files");
                assert_eq!(r.adopted_bytes, r.bytes, "every file adopted");
            } else {
                let parts = PARTS.iter().zip(&data).map(|((name, _), d)| Part::bytes(*name, d)).collect();
                store.save(step, parts).await.expect("save");
            }
            mark(&base, &format!("saved-{step}"));
            if tiers == 1 {
                continue;
            }
            // One save at a time in the trace: the drain copies it before the next save.
            store.drain().await.expect("drain");
            mark(&base, &format!("drained-{step}"));
        }
    });
}

fn base_dir(prefix: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix(prefix).tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let fs = ringtier_core::fs::fs_type_name(dir.path());
    if fs != "ext4" {
        eprintln!("note: {} is on {fs}, not ext4", dir.path().display());
    }
    dir
}

fn child_command(program: &str, kind: &str, base: &Path, tiers: usize) -> Command {
    let mut cmd = Command::new(program);
    cmd.env(CHILD_ENV, format!("{kind};{};{tiers}", base.display()));
    cmd
}

/// Runs the traced child (the tracer's command `cmd`, writing `trace`) and returns the trace.
fn run_traced(mut cmd: Command, trace: &Path) -> String {
    child_args(&mut cmd);
    let out = cmd.output().expect("tracer");
    assert!(
        out.status.success(),
        "traced child failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(trace).expect("trace")
}

fn child_args(cmd: &mut Command) {
    let exe = std::env::current_exe().expect("test binary");
    cmd.arg(exe).args(["--exact", "traced_child", "--ignored", "--nocapture", "--test-threads=1"]);
}

// ---- strace ---------------------------------------------------------------------------------

/// One completed system call of the child, with the positions of its start and end in the
/// trace (a call another thread interrupts starts on one line and ends on a later one).
#[derive(Debug, Clone)]
struct Call {
    name: String,
    args: String,
    ret: i64,
    start: usize,
    end: usize,
}

impl Call {
    /// The paths among the arguments, each name relative to a directory descriptor (`*at`
    /// calls: `5</root/dir>, "name"`) joined to the path strace shows for that descriptor
    /// (`-y`), in order.
    fn resolved_paths(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut dir: Option<String> = None;
        for tok in self.args.split(", ") {
            let tok = tok.trim();
            if let Some(q) = tok.strip_prefix('"') {
                let name = q.split('"').next().unwrap_or_default();
                let full = match dir.take() {
                    Some(d) if !name.starts_with('/') => {
                        if name == "." {
                            d
                        } else {
                            format!("{d}/{name}")
                        }
                    }
                    _ => name.to_string(),
                };
                out.push(full);
            } else if let (Some(a), Some(b)) = (tok.find('<'), tok.rfind('>')) {
                dir = Some(tok[a + 1..b].trim_end_matches(" (deleted)").to_string());
            } else {
                dir = None;
            }
        }
        out
    }

    /// The path strace shows for the first argument's descriptor (`-y`): `3</a/b>`.
    fn fd_path(&self) -> Option<String> {
        let open = self.args.find('<')?;
        let close = self.args[open..].find('>')? + open;
        Some(self.args[open + 1..close].trim_end_matches(" (deleted)").to_string())
    }
}

fn parse_strace(text: &str) -> Vec<Call> {
    let mut calls = Vec::new();
    let mut pending: std::collections::HashMap<u32, (String, String, usize)> = std::collections::HashMap::new();
    for (idx, line) in text.lines().enumerate() {
        let line = line.trim();
        let Some((pid, rest)) = line.split_once(char::is_whitespace) else { continue };
        let Ok(pid) = pid.parse::<u32>() else { continue };
        let rest = rest.trim_start();
        let ret_of = |s: &str| -> Option<(String, i64)> {
            // `...) = 0`, or after a resumed call `)             = 0` (strace pads it).
            let (body, ret) = s.rsplit_once(" = ")?;
            let body = body.trim_end().strip_suffix(')')?;
            let ret = ret.split_whitespace().next()?;
            let ret = if ret == "?" { -1 } else { ret.parse::<i64>().ok()? };
            Some((body.to_string(), ret))
        };
        if let Some(resumed) = rest.strip_prefix("<... ") {
            let Some((name, tail)) = resumed.split_once(" resumed>") else { continue };
            let Some((pname, args, start)) = pending.remove(&pid) else { continue };
            if pname != name {
                continue;
            }
            if let Some((tail, ret)) = ret_of(&format!("{tail} ")) {
                calls.push(Call { name: pname, args: format!("{args}{tail}"), ret, start, end: idx });
            }
        } else if let Some(head) = rest.strip_suffix(" <unfinished ...>") {
            if let Some((name, args)) = head.split_once('(') {
                pending.insert(pid, (name.to_string(), args.to_string(), idx));
            }
        } else if let Some((name, tail)) = rest.split_once('(') {
            if name.starts_with(['+', '-', '<']) {
                continue;
            }
            if let Some((args, ret)) = ret_of(&format!("{tail} ")) {
                calls.push(Call { name: name.to_string(), args, ret, start: idx, end: idx });
            }
        }
    }
    calls
}

fn parent(p: &str) -> &str {
    p.rsplit_once('/').map(|(d, _)| d).unwrap_or("")
}

/// Checks the durability order of every commit, directory creation and eviction under `root`,
/// `ack` naming the marker that acknowledges each step there. Returns what it checked, for
/// the test to assert the trace covered everything.
fn check_root(
    calls: &[Call],
    root: &str,
    data_sync_visible: &dyn Fn(&str) -> bool,
    ack: &dyn Fn(u64) -> String,
) -> (usize, usize) {
    let ok = |c: &&Call| c.ret >= 0;
    let renames: Vec<&Call> = calls
        .iter()
        .filter(ok)
        .filter(|c| matches!(c.name.as_str(), "rename" | "renameat" | "renameat2"))
        .filter(|c| c.resolved_paths().get(1).is_some_and(|d| d.starts_with(&format!("{root}/ckpt/"))))
        .collect();
    let fsyncs: Vec<&Call> =
        calls.iter().filter(ok).filter(|c| matches!(c.name.as_str(), "fsync" | "fdatasync")).collect();
    let dir_synced_after = |dir: &str, after: usize| {
        fsyncs.iter().find(|s| s.start > after && s.fd_path().as_deref() == Some(dir)).copied()
    };
    let marker = |what: &str| {
        calls
            .iter()
            .find(|c| c.name == "openat" && c.resolved_paths().iter().any(|p| p.ends_with(&format!("{MARKER}-{what}"))))
    };
    let mut manifests = 0;
    for r in &renames {
        let paths = r.resolved_paths();
        let (src, dst) = (&paths[0], &paths[1]);
        // The data is durable before the name is: the staged file's fsync ends before the
        // rename, after its last write.
        if data_sync_visible(dst) {
            let sync = fsyncs
                .iter()
                .rev()
                .find(|s| s.end < r.start && s.fd_path().as_deref() == Some(src.as_str()))
                .unwrap_or_else(|| panic!("{dst}: renamed from {src} without a data fsync before it"));
            let late_write = calls.iter().find(|w| {
                w.name.starts_with("pwrite") && w.fd_path().as_deref() == Some(src.as_str()) && w.end > sync.start
            });
            assert!(late_write.is_none(), "{dst}: written after its data fsync: {late_write:?}");
        }
        // The rename is durable: its directory is fsynced after it.
        let dir_sync = dir_synced_after(parent(dst), r.end)
            .unwrap_or_else(|| panic!("{dst}: no fsync of {} after the rename", parent(dst)));
        if let Some(step_dir) = dst.strip_suffix("/MANIFEST.json") {
            manifests += 1;
            // Every part is durable (renamed, its directory fsynced) before the manifest's
            // rename, the commit point; nothing is renamed into the checkpoint after it.
            let parts: Vec<&&Call> =
                renames.iter().filter(|p| p.resolved_paths()[1].starts_with(&format!("{step_dir}/parts/"))).collect();
            assert_eq!(parts.len(), PARTS.len(), "{step_dir}: parts committed: {parts:?}");
            for p in parts {
                let pd = p.resolved_paths()[1].clone();
                assert!(p.end < r.start, "{pd} renamed after the manifest {dst}");
                let synced = dir_synced_after(parent(&pd), p.end);
                assert!(
                    synced.is_some_and(|s| s.end < r.start),
                    "{pd}: its directory is not fsynced before the manifest's rename ({synced:?}, manifest {r:?})"
                );
            }
            // Acknowledged only once the manifest is durable.
            let step: u64 = step_dir.rsplit('/').next().and_then(|s| s.parse().ok()).expect("step directory");
            let what = ack(step);
            let m = marker(&what).unwrap_or_else(|| panic!("no marker {what} in the trace"));
            assert!(dir_sync.end < m.start, "{dst}: {what} acknowledged before the manifest's directory fsync");
        }
    }
    // New directories are durable in their parents before anything is renamed into them.
    let mkdirs: Vec<&Call> = calls
        .iter()
        .filter(ok)
        .filter(|c| matches!(c.name.as_str(), "mkdir" | "mkdirat"))
        .filter(|c| c.resolved_paths().first().is_some_and(|d| d.starts_with(&format!("{root}/ckpt"))))
        .collect();
    for m in &mkdirs {
        let dir = m.resolved_paths()[0].clone();
        let first_use = renames.iter().find(|r| r.resolved_paths()[1].starts_with(&format!("{dir}/"))).map(|r| r.start);
        if let Some(first_use) = first_use {
            let synced = dir_synced_after(parent(&dir), m.end);
            assert!(
                synced.is_some_and(|s| s.end < first_use),
                "{dir}: created, but its parent is not fsynced before the first rename into it ({synced:?})"
            );
        }
    }
    // Eviction: the manifest's removal is durable before any part is removed, so a crash
    // midway leaves a partial checkpoint (which recovery removes), never a torn committed one.
    let unlinks: Vec<&Call> = calls
        .iter()
        .filter(ok)
        .filter(|c| matches!(c.name.as_str(), "unlink" | "unlinkat"))
        .filter(|c| c.resolved_paths().iter().any(|p| p.starts_with(&format!("{root}/ckpt/"))))
        .collect();
    let mut evicted = 0;
    for u in unlinks.iter().filter(|u| u.resolved_paths().iter().any(|p| p.contains("/parts/"))) {
        let p = u.resolved_paths().into_iter().find(|p| p.contains("/parts/")).unwrap_or_default();
        let step_dir = p.split("/parts/").next().unwrap_or_default().to_string();
        let manifest = format!("{step_dir}/MANIFEST.json");
        let um = unlinks
            .iter()
            .find(|m| m.resolved_paths().contains(&manifest))
            .unwrap_or_else(|| panic!("{p} removed but its manifest never was"));
        assert!(um.end < u.start, "{p} removed before its manifest");
        let synced = dir_synced_after(&step_dir, um.end);
        assert!(
            synced.is_some_and(|s| s.end < u.start),
            "{p} removed before the manifest's removal was made durable ({synced:?})"
        );
        evicted += 1;
    }
    (manifests, evicted)
}

fn strace_works() -> Result<(), String> {
    let out = Command::new("strace").args(["-f", "-qq", "-e", "trace=none", "true"]).output();
    match out {
        Err(e) => Err(format!("strace not found ({e})")),
        Ok(o) if !o.status.success() => Err(format!(
            "strace cannot trace here (ptrace not permitted?): {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Ok(_) => Ok(()),
    }
}

/// The strace checks on tier `kind`; with `commit_files`, step [`FILES_STEP`] is committed
/// from files the child wrote under the fast tier (adopted: their data fsync is a system call
/// on either tier, checked before each one's rename into the step).
fn strace_check(kind: &str, commit_files: bool) {
    if let Err(why) = strace_works() {
        eprintln!("SKIPPED durability order of the {kind} tier: {why}");
        return;
    }
    let base = base_dir(&format!("durability-{kind}"));
    let base_path = base.path().canonicalize().expect("canonical temp dir");
    let trace = base_path.join("strace.txt");
    let mut cmd = child_command("strace", kind, &base_path, 2);
    cmd.env(COMMIT_FILES_ENV, if commit_files { "1" } else { "0" });
    cmd.args(["-f", "-y", "-qq", "-o"]).arg(&trace).args([
        "-e",
        "trace=openat,rename,renameat,renameat2,fsync,fdatasync,pwrite64,pwritev,pwritev2,mkdir,mkdirat,unlink,unlinkat",
    ]);
    let text = run_traced(cmd, &trace);
    let calls = parse_strace(&text);
    let root = |t: &str| base_path.join(t).display().to_string();
    // The io_uring tier's data fsync goes through the ring, which strace does not show (the
    // perf test checks it); its buffered fallback would show as pwrite + fdatasync.
    let adopted = format!("{}/ckpt/{FILES_STEP:020}/parts/", root("fast"));
    let data_sync_visible = |dst: &str| kind == "posix" || (commit_files && dst.starts_with(&adopted));
    let (fast_manifests, fast_evicted) =
        check_root(&calls, &root("fast"), &data_sync_visible, &|s| format!("saved-{s}"));
    let (slow_manifests, _) = check_root(&calls, &root("slow"), &data_sync_visible, &|s| format!("drained-{s}"));
    assert_eq!((fast_manifests, slow_manifests), (STEPS.len(), STEPS.len()), "every commit was traced");
    // keep_last 0: every drained checkpoint was evicted from the fast tier, part by part.
    let nonempty = PARTS.len();
    assert_eq!(fast_evicted, STEPS.len() * nonempty, "every eviction was traced");
    eprintln!(
        "{kind}: durability order holds over {} traced calls ({} commits, {fast_evicted} part removals)",
        calls.len(),
        2 * STEPS.len() * (PARTS.len() + 1)
    );
}

#[test]
fn posix_tier_commits_in_durability_order() {
    strace_check("posix", false);
}

#[test]
fn uring_tier_commits_in_durability_order() {
    strace_check("uring", false);
}

#[test]
fn posix_tier_commits_adopted_files_in_durability_order() {
    strace_check("posix", true);
}

#[test]
fn uring_tier_commits_adopted_files_in_durability_order() {
    strace_check("uring", true);
}

// ---- perf trace (io_uring tracepoints) ------------------------------------------------------

/// One io_uring request as its tracepoints show it.
#[derive(Debug, Clone)]
struct RingOp {
    req: String,
    op: String,
    fd: Option<i64>,
    submitted: f64,
    completed: Option<f64>,
    res: i64,
}

fn field<'a>(args: &'a str, name: &str) -> Option<&'a str> {
    let i = args.find(&format!("{name}: "))? + name.len() + 2;
    let rest = &args[i..];
    let end = rest.find([',', ')']).unwrap_or(rest.len());
    Some(rest[..end].trim().trim_matches('"'))
}

/// Ring operations and rename times (ms) from `perf trace` output. Events are taken in time
/// order (a request's submission before its file lookup before its completion at equal times),
/// whatever order the CPUs' buffers printed them in.
/// A `perf trace` time stamp (milliseconds, 3 decimals) as milliseconds. perf times events from
/// the first one it reads; an event read after it from another CPU's buffer but earlier comes out
/// negative, printed as 2^64 ns wrapped (`18446744073709.219`): unwrapped here, so that it sorts
/// before the events after it (it left a completion before its own submission, and the test
/// found "requests without a completion" in every retry).
fn perf_ms(token: &str) -> Option<f64> {
    let (whole, frac) = token.split_once('.').unwrap_or((token, "0"));
    let us = whole.parse::<i128>().ok()? * 1000 + format!("{frac:0<3}").get(..3)?.parse::<i128>().ok()?;
    // 2^64 ns in microseconds, rounded down as perf's printing does.
    const WRAP_US: i128 = 18_446_744_073_709_551;
    let us = if us > WRAP_US / 2 { us - WRAP_US } else { us };
    Some(us as f64 / 1000.0)
}

fn parse_perf(text: &str) -> (Vec<RingOp>, Vec<f64>) {
    let mut events: Vec<(f64, u8, &str, &str, &str)> = Vec::new();
    for line in text.lines() {
        let Some(ts) = line.split_whitespace().next().and_then(perf_ms) else { continue };
        let Some(open) = line.find("): ").map(|i| i + 3) else { continue };
        let Some((_, event)) = line[open..].split_once(' ') else { continue };
        let Some((name, args)) = event.split_once('(') else { continue };
        let rank = match name {
            "io_uring:io_uring_submit_req" => 0,
            "io_uring:io_uring_file_get" => 1,
            "io_uring:io_uring_complete" => 2,
            _ => 3,
        };
        events.push((ts, rank, name, args, event));
    }
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut ops: Vec<RingOp> = Vec::new();
    let mut renames = Vec::new();
    for (ts, _, name, args, event) in events {
        match name {
            "io_uring:io_uring_submit_req" => {
                if let (Some(req), Some(op)) = (field(args, "req"), field(args, "op_str")) {
                    let op = op.into();
                    ops.push(RingOp { req: req.into(), op, fd: None, submitted: ts, completed: None, res: 0 });
                }
            }
            "io_uring:io_uring_file_get" => {
                if let (Some(req), Some(fd)) = (field(args, "req"), field(args, "fd")) {
                    if let Some(o) = ops.iter_mut().rev().find(|o| o.req == req && o.fd.is_none()) {
                        o.fd = fd.parse().ok();
                    }
                }
            }
            "io_uring:io_uring_complete" => {
                if let Some(req) = field(args, "req") {
                    if let Some(o) = ops.iter_mut().rev().find(|o| o.req == req && o.completed.is_none()) {
                        o.completed = Some(ts);
                        // perf leaves out fields that are zero.
                        o.res = field(args, "res").and_then(|r| r.parse().ok()).unwrap_or(0);
                    }
                }
            }
            "rename" | "renameat" | "renameat2" if event.trim_end().ends_with("= 0") => renames.push(ts),
            _ => {}
        }
    }
    (ops, renames)
}

fn perf_works() -> Result<(), String> {
    let tracefs = ["/sys/kernel/tracing/events/io_uring", "/sys/kernel/debug/tracing/events/io_uring"];
    if !tracefs.iter().any(|p| Path::new(p).is_dir()) {
        return Err("no io_uring tracepoints (tracefs not mounted, or a kernel without them)".into());
    }
    let out = Command::new("perf").args(["trace", "-e", "io_uring:io_uring_submit_req", "--", "true"]).output();
    match out {
        Err(e) => Err(format!("perf not found ({e})")),
        Ok(o) if !o.status.success() => {
            Err(format!("perf trace cannot read tracepoints here: {}", String::from_utf8_lossy(&o.stderr).trim()))
        }
        Ok(_) => Ok(()),
    }
}

#[test]
fn uring_tier_syncs_data_through_the_ring_before_each_rename() {
    if let Err(why) = perf_works() {
        eprintln!("SKIPPED the io_uring data-fsync order: {why}");
        return;
    }
    let base = base_dir("durability-ring");
    let base_path = base.path().canonicalize().expect("canonical temp dir");
    // perf drops events when its buffers overflow (a busy machine); a trace with a write or
    // fsync that never completes is incomplete, not evidence, and is taken again.
    let mut attempt = 0;
    let (ops, renames) = loop {
        attempt += 1;
        let run = base_path.join(format!("run{attempt}"));
        let trace = base_path.join(format!("perf{attempt}.txt"));
        let mut cmd = child_command("perf", "uring", &run, 1);
        cmd.env(LANES_ENV, "1");
        cmd.args(["trace", "-o"]).arg(&trace).args([
            "-e",
            "io_uring:io_uring_submit_req,io_uring:io_uring_file_get,io_uring:io_uring_complete,rename,renameat,renameat2",
            "--",
        ]);
        let text = run_traced(cmd, &trace);
        let (ops, renames) = parse_perf(&text);
        let incomplete =
            ops.iter().filter(|o| matches!(o.op.as_str(), "WRITE" | "FSYNC") && o.completed.is_none()).count();
        let lost_renames = renames.len() < STEPS.len() * (PARTS.len() + 1);
        if incomplete == 0 && !lost_renames && !text.contains("LOST") {
            break (ops, renames);
        }
        let why = format!("{incomplete} requests without a completion, {} renames", renames.len());
        assert!(attempt < 4, "{attempt} perf traces lost events ({why} in the last, {})", trace.display());
        eprintln!("perf trace {attempt} lost events ({why}); tracing again");
    };
    // One tier, saves one after another: every commit is one rename, parts then manifest.
    assert_eq!(renames.len(), STEPS.len() * (PARTS.len() + 1), "renames traced: {renames:?}");
    let mut prev = 0.0;
    let mut writes_checked = 0;
    for &at in &renames {
        let window: Vec<&RingOp> = ops.iter().filter(|o| o.submitted > prev && o.submitted < at).collect();
        let synced: Vec<&&RingOp> =
            window.iter().filter(|o| o.op == "FSYNC" && o.res == 0 && o.completed.is_some_and(|c| c < at)).collect();
        assert!(!synced.is_empty(), "rename at {at} ms with no completed ring FSYNC since {prev} ms (the previous rename or the start): {window:?}");
        let written: std::collections::BTreeSet<i64> =
            window.iter().filter(|o| o.op == "WRITE").filter_map(|o| o.fd).collect();
        for fd in written {
            let last_write = window
                .iter()
                .filter(|o| o.op == "WRITE" && o.fd == Some(fd))
                .map(|o| o.completed.unwrap_or(f64::MAX))
                .fold(f64::MIN, f64::max);
            let ok = synced.iter().any(|s| s.fd == Some(fd) && s.submitted >= last_write);
            assert!(
                ok,
                "rename at {at} ms: fd {fd} written (last completion {last_write} ms) but not fsynced after it"
            );
            writes_checked += 1;
        }
        prev = at;
    }
    assert!(writes_checked >= STEPS.len() * 2, "the ring's writes were traced ({writes_checked} files)");
    eprintln!("uring: {} renames, each after a completed ring FSYNC of every file written before it", renames.len());
}

#[test]
fn perf_time_stamps_read_before_the_first_event_are_unwrapped() {
    let before = perf_ms("18446744073709.219").expect("wrapped");
    assert!((before + 0.332).abs() < 1e-9, "{before}");
    assert_eq!(perf_ms("0.541"), Some(0.541));
    assert_eq!(perf_ms("12.5"), Some(12.5));
    assert!(before < perf_ms("0.000").expect("zero"));
    assert_eq!(perf_ms("(x"), None);
}
