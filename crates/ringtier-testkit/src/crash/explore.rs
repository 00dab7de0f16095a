//! The exploration: every crash point of a trace, every model, every state, deduplicated by
//! the image they produce.

use std::collections::{BTreeMap, HashSet};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use crate::SeededRng;
use ringtier_core::fs::trace::FsOp;

use super::check::check;
use super::image::{Image, Persist};
use super::model::{optional, random_state, states, Model, State};
use super::workload::{Trace, OUTSIDE_DATA};

/// Settings of an exploration.
#[derive(Debug, Clone)]
pub struct ExploreConfig {
    /// The models to explore.
    pub models: Vec<Model>,
    /// Random subsets per crash point for [`Model::WeakPosix`]: draws go on until this many
    /// of them built an image not checked before, or [`ExploreConfig::random_draws`] ran out.
    pub randoms: usize,
    /// The most random subsets drawn per crash point (at least `randoms`).
    pub random_draws: usize,
    /// Explore every `stride`-th crash point (1: all), always including the last.
    pub stride: usize,
    /// Stop after this many distinct states checked.
    pub max_states: Option<u64>,
    /// Seed of the random subsets.
    pub seed: u64,
    /// Where states are materialised (a fresh directory per state, removed after).
    pub scratch: PathBuf,
    /// Stop at the first failure.
    pub stop_at_first: bool,
}

impl ExploreConfig {
    /// Every model and point, 8 new random subsets per point (at most 32 drawn), materialised
    /// under `scratch`.
    pub fn new(scratch: impl Into<PathBuf>) -> Self {
        ExploreConfig {
            models: Model::ALL.to_vec(),
            randoms: 8,
            random_draws: 32,
            stride: 1,
            max_states: None,
            seed: 1,
            scratch: scratch.into(),
            stop_at_first: false,
        }
    }
}

/// A crash state that broke an invariant.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The state (its `Display` is a replayable descriptor, see [`replay`]).
    pub state: State,
    /// The operation the power went after.
    pub op: String,
    /// The invariant that broke.
    pub why: String,
}

/// What an exploration did.
#[derive(Debug, Clone, Default)]
pub struct Exploration {
    /// Crash points visited.
    pub points: u64,
    /// States generated, per model (duplicates included).
    pub generated: BTreeMap<Model, u64>,
    /// Distinct states checked (recovery and invariants run), per model: a state counts for
    /// the first model that allowed it (models in [`ExploreConfig::models`] order); one that
    /// builds the image of a state already checked, with the same acknowledged steps and the
    /// same expected bytes, is not checked again (see [`SeenStates`]).
    pub checked: BTreeMap<Model, u64>,
    /// The failures.
    pub failures: Vec<Failure>,
}

impl Exploration {
    /// Distinct states checked, all models.
    pub fn total_checked(&self) -> u64 {
        self.checked.values().sum()
    }

    /// States generated, all models.
    pub fn total_generated(&self) -> u64 {
        self.generated.values().sum()
    }

    /// Adds `other`'s counts and failures to this one.
    pub fn merge(&mut self, other: Exploration) {
        self.points += other.points;
        for (m, n) in other.generated {
            *self.generated.entry(m).or_default() += n;
        }
        for (m, n) in other.checked {
            *self.checked.entry(m).or_default() += n;
        }
        self.failures.extend(other.failures);
    }
}

/// The crash states already checked, by a 64-bit hash of everything the check depends on: the
/// image (names, the contents they point at, directories), the acknowledged steps, what the
/// writers wrote to each file published under the store's prefix (the torn-object check
/// compares with it), the store's prefix and the parts' scale (the expected bytes). Shared by
/// explorations of several traces, it makes their counts of distinct states add up.
#[derive(Debug, Default)]
pub struct SeenStates {
    keys: HashSet<u64>,
}

impl SeenStates {
    /// None seen.
    pub fn new() -> Self {
        SeenStates::default()
    }

    /// Distinct states seen.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether none was seen.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Records the state (`img` over `full`, with `acked` steps, of `trace`); false when it
    /// was seen before.
    fn insert(&mut self, trace: &Trace, img: &Image, full: &Image, acked: &[u64]) -> bool {
        self.keys.insert(state_key(trace, img, full, acked))
    }
}

/// The image of `state` over `trace`.
pub fn build(trace: &Trace, state: &State) -> Image {
    let mut img = Image::initial(&["fast", "slow"], OUTSIDE_DATA);
    for (i, op) in trace.ops[..=state.point].iter().enumerate() {
        img.apply(op, state.choice(i));
    }
    img
}

/// Images of the trace's whole prefixes every [`Prefixes::EVERY`] operations, so that a state
/// is built from the last one before its first choice (contents are shared, see [`Image`]).
struct Prefixes {
    snaps: Vec<Image>,
}

impl Prefixes {
    const EVERY: usize = 4;

    fn new(trace: &Trace) -> Self {
        let mut img = Image::initial(&["fast", "slow"], OUTSIDE_DATA);
        let mut snaps = vec![img.clone()];
        for (i, op) in trace.ops.iter().enumerate() {
            img.apply(op, Persist::Whole);
            if (i + 1) % Self::EVERY == 0 {
                snaps.push(img.clone());
            }
        }
        Prefixes { snaps }
    }

    /// The same image as [`build`].
    fn build(&self, trace: &Trace, state: &State) -> Image {
        let first = state.choices.keys().next().copied().unwrap_or(state.point + 1).min(state.point + 1);
        let k = (first / Self::EVERY).min(self.snaps.len() - 1);
        let mut img = self.snaps[k].clone();
        for i in k * Self::EVERY..=state.point {
            img.apply(&trace.ops[i], state.choice(i));
        }
        img
    }
}

fn acked(ops: &[FsOp]) -> Vec<u64> {
    ops.iter()
        .filter_map(|o| match o {
            FsOp::Mark(m) => m.strip_prefix("ack ").and_then(|s| s.parse().ok()),
            _ => None,
        })
        .collect()
}

fn state_key(trace: &Trace, img: &Image, full: &Image, acked: &[u64]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    trace.prefix.hash(&mut h);
    trace.part_scale.hash(&mut h);
    acked.hash(&mut h);
    img.dirs.hash(&mut h);
    img.names.hash(&mut h);
    for (name, id) in &img.names {
        img.files.get(id).hash(&mut h);
        if name.components().nth(1).is_some_and(|c| c.as_os_str() == trace.prefix.as_str()) {
            full.files.get(id).hash(&mut h);
        }
    }
    h.finish()
}

/// Materialises `state` and checks it; `Err` is the broken invariant.
pub fn check_state(trace: &Trace, state: &State, scratch: &Path, rt: &tokio::runtime::Runtime) -> Result<(), String> {
    let img = build(trace, state);
    let full = build(trace, &State { model: state.model, point: state.point, choices: BTreeMap::new() });
    run_check(trace, state, &img, &full, scratch, rt)
}

fn run_check(
    trace: &Trace,
    state: &State,
    img: &Image,
    full: &Image,
    scratch: &Path,
    rt: &tokio::runtime::Runtime,
) -> Result<(), String> {
    let dir =
        tempfile::Builder::new().prefix("crash-state").tempdir_in(scratch).map_err(|e| format!("scratch dir: {e}"))?;
    img.materialize(dir.path()).map_err(|e| format!("materialising: {e}"))?;
    let acked = acked(&trace.ops[..=state.point]);
    rt.block_on(check(img, full, dir.path(), &trace.prefix, &acked, trace.part_scale))
}

/// Replays one state from its descriptor (a failure's `state`), with the trace it came from.
pub fn replay(trace: &Trace, descriptor: &str, scratch: &Path) -> Result<(), String> {
    let state = State::parse(descriptor).ok_or_else(|| format!("not a state descriptor: {descriptor:?}"))?;
    if state.point >= trace.ops.len() {
        return Err(format!("point {} is past the trace ({} ops)", state.point, trace.ops.len()));
    }
    let rt = runtime()?;
    check_state(trace, &state, scratch, &rt)
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))
}

/// Explores `trace` as `cfg` says.
pub fn explore(trace: &Trace, cfg: &ExploreConfig) -> Exploration {
    explore_with(trace, cfg, &mut SeenStates::new())
}

/// Explores `trace` as `cfg` says, skipping the states in `seen` and adding those it checks
/// ([`ExploreConfig::max_states`] counts this exploration's alone).
pub fn explore_with(trace: &Trace, cfg: &ExploreConfig, seen: &mut SeenStates) -> Exploration {
    let mut out = Exploration::default();
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(why) => {
            out.failures.push(Failure {
                state: State { model: Model::WeakPosix, point: 0, choices: BTreeMap::new() },
                op: String::new(),
                why,
            });
            return out;
        }
    };
    let mut rng = SeededRng::new(cfg.seed);
    let prefixes = Prefixes::new(trace);
    let n = trace.ops.len();
    let points: Vec<usize> = (0..n).filter(|p| p % cfg.stride.max(1) == 0 || *p + 1 == n).collect();
    'points: for point in points {
        // Markers change nothing on disk: a point after one is the point before it.
        if matches!(trace.ops[point], FsOp::Mark(_)) && point + 1 != n {
            continue;
        }
        out.points += 1;
        let full = prefixes.build(trace, &State { model: Model::WeakPosix, point, choices: BTreeMap::new() });
        let acked = acked(&trace.ops[..=point]);
        for &model in &cfg.models {
            let mut enumerated = states(model, &trace.ops, point, 0, &mut rng).into_iter();
            // Weak POSIX: then random subsets, until enough of them were new.
            let optional = if model == Model::WeakPosix { optional(&trace.ops, point) } else { Vec::new() };
            // Draws stop early once this many in a row built states already seen.
            const DUPLICATES_IN_A_ROW: usize = 16;
            let (mut draws, mut new_randoms, mut dups_in_a_row) = (0, 0, 0);
            loop {
                let (state, random) = match enumerated.next() {
                    Some(s) => (s, false),
                    None if !optional.is_empty()
                        && new_randoms < cfg.randoms
                        && draws < cfg.random_draws.max(cfg.randoms)
                        && dups_in_a_row < DUPLICATES_IN_A_ROW =>
                    {
                        draws += 1;
                        (random_state(&trace.ops, point, &optional, &mut rng), true)
                    }
                    None => break,
                };
                *out.generated.entry(model).or_default() += 1;
                let img = if state.choices.values().all(|c| *c == Persist::Whole) {
                    full.clone()
                } else {
                    prefixes.build(trace, &state)
                };
                if !seen.insert(trace, &img, &full, &acked) {
                    dups_in_a_row += usize::from(random);
                    continue;
                }
                dups_in_a_row = 0;
                new_randoms += usize::from(random);
                *out.checked.entry(model).or_default() += 1;
                if let Err(why) = run_check(trace, &state, &img, &full, &cfg.scratch, &rt) {
                    out.failures.push(Failure { op: format!("{:?}", short(&trace.ops[point])), state, why });
                    if cfg.stop_at_first {
                        break 'points;
                    }
                }
                if cfg.max_states.is_some_and(|m| out.total_checked() >= m) {
                    break 'points;
                }
            }
        }
    }
    out
}

/// An operation without its data, for messages.
fn short(op: &FsOp) -> String {
    match op {
        FsOp::Write { file, offset, data, direct } => {
            format!("Write {{ file: {file}, offset: {offset}, len: {}, direct: {direct} }}", data.len())
        }
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crash::workload::Engine;

    fn op_trace() -> Trace {
        let p = PathBuf::from;
        let w = |file, offset, len: usize, b: u8| FsOp::Write { file, offset, data: vec![b; len], direct: false };
        let ops = vec![
            FsOp::Mkdir { path: p("fast/.ringtier-staging") },
            FsOp::Mkdir { path: p("fast/ckpt") },
            FsOp::Create { file: 1, path: p("fast/.ringtier-staging/a") },
            w(1, 0, 8192, 1),
            w(1, 8192, 5000, 2),
            FsOp::Fsync { file: 1 },
            FsOp::Rename { from: p("fast/.ringtier-staging/a"), to: p("fast/ckpt/a") },
            FsOp::FsyncDir { path: p("fast/ckpt") },
            FsOp::Mark("ack 1".into()),
            FsOp::Create { file: 2, path: p("fast/.ringtier-staging/b") },
            w(2, 0, 4096, 3),
            FsOp::SetLen { file: 2, len: 3000 },
            FsOp::Rename { from: p("fast/.ringtier-staging/b"), to: p("fast/ckpt/b") },
            FsOp::Unlink { path: p("fast/ckpt/a") },
            w(2, 3000, 9000, 4),
            FsOp::Mkdir { path: p("slow/ckpt") },
            FsOp::Create { file: 3, path: p("slow/ckpt/c") },
            w(3, 0, 100, 5),
        ];
        Trace { ops, prefix: "ckpt".into(), steps: 1, engine: Engine::Posix, part_scale: 1 }
    }

    /// A state built from the nearest whole prefix is the state built from nothing.
    #[test]
    fn prefix_snapshots_build_the_same_images() {
        let trace = op_trace();
        let prefixes = Prefixes::new(&trace);
        let mut rng = SeededRng::new(7);
        let mut compared = 0;
        for point in 0..trace.ops.len() {
            for model in Model::ALL {
                let mut all = states(model, &trace.ops, point, 16, &mut rng);
                all.push(random_state(&trace.ops, point, &optional(&trace.ops, point), &mut rng));
                for state in all {
                    assert_eq!(prefixes.build(&trace, &state), build(&trace, &state), "{state}");
                    compared += 1;
                }
            }
        }
        assert!(compared > 200, "{compared}");
    }

    /// The key tells apart states that differ in what the check compares: the bytes under a
    /// name, the acknowledged steps, and what the writer wrote to a published file.
    #[test]
    fn state_keys_differ_where_the_check_would() {
        let trace = op_trace();
        let at = |point: usize, choices: &[(usize, Persist)]| {
            build(&trace, &State { model: Model::WeakPosix, point, choices: choices.iter().copied().collect() })
        };
        let full10 = at(10, &[]);
        let key = |img: &Image, full: &Image, acked: &[u64]| state_key(&trace, img, full, acked);
        assert_eq!(key(&at(10, &[]), &full10, &[1]), key(&at(10, &[]), &full10, &[1]));
        assert_ne!(key(&at(10, &[(10, Persist::Lost)]), &full10, &[1]), key(&full10, &full10, &[1]));
        assert_ne!(
            key(&at(10, &[(10, Persist::Torn(0))]), &full10, &[1]),
            key(&at(10, &[(10, Persist::ZeroTail(0))]), &full10, &[1])
        );
        assert_ne!(key(&full10, &full10, &[1]), key(&full10, &full10, &[]));
        // The same image (write 14 to the published `b` lost) against two points: at 13 the
        // writer had not written it yet, at 14 it had.
        let (full13, full14) = (at(13, &[]), at(14, &[]));
        let lost14 = at(14, &[(14, Persist::Lost)]);
        assert_eq!(lost14, full13);
        assert_ne!(key(&lost14, &full14, &[1]), key(&full13, &full13, &[1]));
    }
}
