//! The crash-state explorer over the checkpoint store's real file-system operations: no crash
//! state any model allows breaks an invariant, and each injected protocol bug is found.
//!
//! `RINGTIER_CRASH_STATES=N` explores until N distinct states are checked (the documented long
//! run); `RINGTIER_CRASH_REPLAY=DESCRIPTOR` (with `RINGTIER_CRASH_ENGINE=posix|uring` and
//! `RINGTIER_CRASH_MUTATION` as printed) replays one state.

use std::path::PathBuf;
use std::time::Instant;

use ringtier_core::fs::trace::Mutation;
use ringtier_testkit::crash::explore::replay;
use ringtier_testkit::crash::workload::record;
use ringtier_testkit::crash::{explore, Engine, Exploration, ExploreConfig, Model, Workload};

fn scratch() -> tempfile::TempDir {
    // Materialised states are small and short-lived: memory is fine for them (the checks are
    // logical); the workload itself runs on the work tree's file system (ext4, O_DIRECT).
    let shm = PathBuf::from("/dev/shm");
    let dir = if shm.is_dir() { shm } else { PathBuf::from(env!("CARGO_TARGET_TMPDIR")) };
    tempfile::Builder::new().prefix("ringtier-crash").tempdir_in(dir).expect("scratch")
}

fn work() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn report(what: &str, e: &Exploration, secs: f64) {
    let per: Vec<String> = e.checked.iter().map(|(m, n)| format!("{} {n}", m.name())).collect();
    eprintln!(
        "{what}: {} crash points, {} distinct states checked ({}), {} generated, {} failures, {secs:.1} s",
        e.points,
        e.total_checked(),
        per.join(", "),
        e.generated.values().sum::<u64>(),
        e.failures.len()
    );
    for f in e.failures.iter().take(5) {
        eprintln!("  FAILED {} after {}: {}", f.state, f.op, f.why);
    }
}

fn run(engine: Engine, steps: u64, scale: usize, cfg: &ExploreConfig) -> Exploration {
    let w = Workload { part_scale: scale, ..Workload::new(engine, steps) };
    let trace = record(&w, &work()).expect("record the workload");
    assert!(trace.ops.len() > 50, "a trace of a few saves, drains and a restart: {} ops", trace.ops.len());
    let t = Instant::now();
    let e = explore(&trace, cfg);
    report(&format!("{engine:?}"), &e, t.elapsed().as_secs_f64());
    e
}

/// Explores the workload on `engine`: the short run, or with `RINGTIER_CRASH_STATES` set the
/// long one (four steps, parts six times larger, every point, 200 random subsets per point).
fn explore_clean(engine: Engine) -> Exploration {
    let scratch = scratch();
    let mut cfg = ExploreConfig::new(scratch.path());
    let long = env_u64("RINGTIER_CRASH_STATES");
    let (steps, scale) = match long {
        Some(n) => {
            cfg.randoms = 200;
            cfg.max_states = Some(n / 2);
            (4, 6)
        }
        None => {
            cfg.randoms = 2;
            cfg.stride = 3;
            (2, 1)
        }
    };
    let e = run(engine, steps, scale, &cfg);
    assert!(e.failures.is_empty(), "{} failures, first: {:?}", e.failures.len(), e.failures.first());
    e
}

#[test]
fn no_crash_state_breaks_an_invariant_posix() {
    let e = explore_clean(Engine::Posix);
    for m in [Model::Ext4Ordered, Model::WeakPosix] {
        assert!(e.checked.get(&m).copied().unwrap_or(0) > 0, "{} explored nothing", m.name());
    }
}

#[test]
fn no_crash_state_breaks_an_invariant_uring() {
    let e = explore_clean(Engine::Uring);
    // The io_uring tier writes with O_DIRECT on ext4: the device-cache model has states of its
    // own there.
    assert!(e.checked.get(&Model::DeviceCache).copied().unwrap_or(0) > 0, "{:?}", e.checked);
}

/// Each protocol bug, injected into the store's tiers, is found by some model.
#[test]
fn every_injected_protocol_bug_is_found() {
    let scratch = scratch();
    let bugs = [
        ("a tier that acknowledges unsynced data (the power-cut suite's lying tier)", Mutation::NoSync),
        ("a dropped parent-directory fsync", Mutation::SkipDirFsync),
        ("a dropped data fdatasync", Mutation::SkipDataSync),
        ("a rename before the data fsync", Mutation::RenameBeforeSync),
        (
            "eviction before the slow tier's directory fsync",
            Mutation::SkipDirFsyncAfterRenameOf { root_suffix: "slow".into(), key_suffix: "MANIFEST.json".into() },
        ),
    ];
    let mut missed = Vec::new();
    for (what, bug) in bugs {
        for engine in [Engine::Posix, Engine::Uring] {
            let w = Workload { mutation: Some(bug.clone()), ..Workload::new(engine, 2) };
            let trace = record(&w, &work()).expect("record");
            let mut cfg = ExploreConfig::new(scratch.path());
            cfg.randoms = 4;
            cfg.stop_at_first = true;
            let t = Instant::now();
            let e = explore(&trace, &cfg);
            report(&format!("{what} ({engine:?})"), &e, t.elapsed().as_secs_f64());
            match e.failures.first() {
                Some(f) => {
                    // The failure replays from its descriptor.
                    let again = replay(&trace, &f.state.to_string(), scratch.path());
                    assert!(again.is_err(), "{what}: {} did not fail again on replay", f.state);
                }
                None => missed.push(format!("{what} ({engine:?})")),
            }
        }
    }
    assert!(missed.is_empty(), "bugs the explorer did not find: {missed:?}");
}

/// A descriptor printed by a failure replays (`RINGTIER_CRASH_REPLAY`).
#[test]
fn a_state_replays_from_its_descriptor() {
    let Ok(descriptor) = std::env::var("RINGTIER_CRASH_REPLAY") else {
        // Without one: a round trip of a descriptor through its text.
        let s = ringtier_testkit::crash::State::parse("weak-posix@12:3L,5T4096,9Z8192").expect("parse");
        assert_eq!(s.to_string(), "weak-posix@12:3L,5T4096,9Z8192");
        return;
    };
    let engine = match std::env::var("RINGTIER_CRASH_ENGINE").as_deref() {
        Ok("uring") => Engine::Uring,
        _ => Engine::Posix,
    };
    let trace = record(&Workload::new(engine, 2), &work()).expect("record");
    let scratch = scratch();
    let res = replay(&trace, &descriptor, scratch.path());
    res.expect("the replayed state");
}
