//! The crash-state explorer over the checkpoint store's real file-system operations: no crash
//! state any model allows breaks an invariant, and each injected protocol bug is found.
//!
//! `RINGTIER_CRASH_STATES=N` makes `long_run_no_crash_state_breaks_an_invariant` explore until
//! N distinct states are checked (the documented long run, best in release); `RINGTIER_CRASH_REPLAY=DESCRIPTOR` (with `RINGTIER_CRASH_ENGINE=posix|uring` and
//! `RINGTIER_CRASH_MUTATION` as printed) replays one state.

use std::path::PathBuf;
use std::time::Instant;

use ringtier_core::fs::trace::Mutation;
use ringtier_testkit::crash::explore::replay;
use ringtier_testkit::crash::workload::record;
use ringtier_testkit::crash::{explore, explore_with, Engine, Exploration, ExploreConfig, Model, SeenStates, Workload};

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
        e.total_generated(),
        e.failures.len()
    );
    for f in e.failures.iter().take(5) {
        eprintln!("  FAILED {} after {}: {}", f.state, f.op, f.why);
    }
}

/// The short run (CI): two steps, every third crash point, two new random subsets per point.
fn explore_clean(engine: Engine) -> Exploration {
    let scratch = scratch();
    let mut cfg = ExploreConfig::new(scratch.path());
    cfg.randoms = 2;
    cfg.random_draws = 8;
    cfg.stride = 3;
    let trace = record(&Workload::new(engine, 2), &work()).expect("record the workload");
    assert!(trace.ops.len() > 50, "a trace of a few saves, drains and a restart: {} ops", trace.ops.len());
    let t = Instant::now();
    let e = explore(&trace, &cfg);
    report(&format!("{engine:?}"), &e, t.elapsed().as_secs_f64());
    assert!(e.failures.is_empty(), "{} failures, first: {:?}", e.failures.len(), e.failures.first());
    e
}

#[test]
fn no_crash_state_breaks_an_invariant_posix() {
    let e = explore_clean(Engine::Posix);
    for m in [Model::Ext4Ordered, Model::WeakPosix] {
        assert!(e.checked.get(&m).copied().unwrap_or(0) > 0, "{} explored nothing", m.name());
    }
    // No O_DIRECT write: the device-cache model allows exactly ext4's states.
    assert_eq!(e.generated.get(&Model::DeviceCache), e.generated.get(&Model::Ext4Ordered));
}

#[test]
fn no_crash_state_breaks_an_invariant_uring() {
    let e = explore_clean(Engine::Uring);
    // The io_uring tier writes with O_DIRECT on ext4: the device-cache model has states of its
    // own there (O_DIRECT writes lost or torn from the cache while later operations persisted),
    // on top of ext4's.
    let n = |m: Model| e.generated.get(&m).copied().unwrap_or(0);
    assert!(n(Model::DeviceCache) > n(Model::Ext4Ordered), "{:?}", e.generated);
}

/// The long run, with `RINGTIER_CRASH_STATES=N` (without it the test returns at once): the
/// workloads below on both engines, every crash point, until N distinct states are checked
/// (one [`SeenStates`] across all of them, so a state two workloads share counts once). When the
/// traces run out first, they are explored again with other seeds for the random subsets; the
/// test fails if it cannot reach N, or on any failure. `RINGTIER_CRASH_RANDOMS` sets the new
/// random subsets per point (default 48).
#[test]
fn long_run_no_crash_state_breaks_an_invariant() {
    let Some(target) = env_u64("RINGTIER_CRASH_STATES") else { return };
    let randoms = env_u64("RINGTIER_CRASH_RANDOMS").unwrap_or(48) as usize;
    // (steps, part scale, saves between drains): larger parts are more writes per part, so
    // more un-fsynced writes at once; batched drains copy and evict several steps at a time.
    // Few steps each: every listed step is loaded several times per check, so a state's cost
    // grows with the steps on disk, while the states a step adds grow with its parts' size.
    let shapes: [(u64, usize, u64); 6] = [(2, 16, 1), (3, 10, 3), (2, 12, 2), (3, 8, 1), (2, 20, 1), (2, 14, 2)];
    let scratch = scratch();
    let mut traces = Vec::new();
    for &(steps, scale, drain_every) in &shapes {
        for engine in [Engine::Posix, Engine::Uring] {
            let w = Workload { part_scale: scale, drain_every, ..Workload::new(engine, steps) };
            let trace = record(&w, &work()).expect("record the workload");
            let what = format!("{engine:?}, {steps} steps, scale {scale}, drain every {drain_every}");
            eprintln!("{what}: {} operations", trace.ops.len());
            traces.push((what, trace));
        }
    }
    let mut seen = SeenStates::new();
    let mut total = Exploration::default();
    let t = Instant::now();
    'rounds: for round in 0..8u64 {
        let before = seen.len();
        for (what, trace) in &traces {
            let mut cfg = ExploreConfig::new(scratch.path());
            cfg.randoms = randoms;
            cfg.random_draws = randoms * 4;
            cfg.seed = 1 + round;
            cfg.max_states = Some(target.saturating_sub(seen.len() as u64));
            // After the first round only the random subsets are new: weak POSIX alone.
            if round > 0 {
                cfg.models = vec![Model::WeakPosix];
            }
            let ts = Instant::now();
            let e = explore_with(trace, &cfg, &mut seen);
            report(&format!("round {round}, {what}"), &e, ts.elapsed().as_secs_f64());
            total.merge(e);
            if seen.len() as u64 >= target {
                break 'rounds;
            }
        }
        if seen.len() == before {
            break;
        }
    }
    let secs = t.elapsed().as_secs_f64();
    report("long run, all workloads", &total, secs);
    eprintln!("{:.2} ms per distinct state checked", secs * 1000.0 / total.total_checked().max(1) as f64);
    assert!(total.failures.is_empty(), "{} failures, first: {:?}", total.failures.len(), total.failures.first());
    assert!(seen.len() as u64 >= target, "only {} distinct states of the {target} asked for", seen.len());
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
