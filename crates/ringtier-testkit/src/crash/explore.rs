//! The exploration: every crash point of a trace, every model, every state, deduplicated by
//! the image they produce.

use std::collections::{BTreeMap, HashSet};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use crate::SeededRng;
use ringtier_core::fs::trace::FsOp;

use super::check::check;
use super::image::{Image, Persist};
use super::model::{states, Model, State};
use super::workload::{Trace, OUTSIDE_DATA};

/// Settings of an exploration.
#[derive(Debug, Clone)]
pub struct ExploreConfig {
    /// The models to explore.
    pub models: Vec<Model>,
    /// Random subsets per crash point for [`Model::WeakPosix`].
    pub randoms: usize,
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
    /// Every model and point, 8 random subsets per point, materialised under `scratch`.
    pub fn new(scratch: impl Into<PathBuf>) -> Self {
        ExploreConfig {
            models: Model::ALL.to_vec(),
            randoms: 8,
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
    /// Distinct states checked (recovery and invariants run), per model.
    pub checked: BTreeMap<Model, u64>,
    /// The failures.
    pub failures: Vec<Failure>,
}

impl Exploration {
    /// Distinct states checked, all models.
    pub fn total_checked(&self) -> u64 {
        self.checked.values().sum()
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

fn acked(ops: &[FsOp]) -> Vec<u64> {
    ops.iter()
        .filter_map(|o| match o {
            FsOp::Mark(m) => m.strip_prefix("ack ").and_then(|s| s.parse().ok()),
            _ => None,
        })
        .collect()
}

fn image_key(img: &Image, acked: &[u64]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    img.names.hash(&mut h);
    for id in img.names.values() {
        img.files.get(id).hash(&mut h);
    }
    img.dirs.hash(&mut h);
    acked.hash(&mut h);
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
    // Distinct states per model: a state another model also allows counts for both, but is
    // checked once per model.
    let mut seen: HashSet<(Model, u64)> = HashSet::new();
    let n = trace.ops.len();
    let points: Vec<usize> = (0..n).filter(|p| p % cfg.stride.max(1) == 0 || *p + 1 == n).collect();
    'points: for point in points {
        // Markers change nothing on disk: a point after one is the point before it.
        if matches!(trace.ops[point], FsOp::Mark(_)) && point + 1 != n {
            continue;
        }
        out.points += 1;
        let full = build(trace, &State { model: Model::WeakPosix, point, choices: BTreeMap::new() });
        let acked = acked(&trace.ops[..=point]);
        for &model in &cfg.models {
            for state in states(model, &trace.ops, point, cfg.randoms, &mut rng) {
                *out.generated.entry(model).or_default() += 1;
                let img = if state.choices.values().all(|c| *c == Persist::Whole) {
                    full.clone()
                } else {
                    build(trace, &state)
                };
                if !seen.insert((model, image_key(&img, &acked))) {
                    continue;
                }
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
