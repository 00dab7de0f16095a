//! The workload whose system calls the explorer replays: checkpoints saved on a fast
//! directory tier, drained to a slow one, evicted, then a restart with recovery and a drain.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ringtier_core::fs::trace::{FsOp, FsTrace, Mutation};
use ringtier_core::{PosixConfig, PosixTier, Tier};
use ringtier_migrate::{CheckpointStore, Part, StoreConfig};
use ringtier_uring::{UringConfig, UringTier, UringTierOptions};

/// The fast tier's engine (the slow tier is always posix).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// Buffered writes from a thread pool.
    Posix,
    /// O_DIRECT writes through io_uring where the file system allows (ext4 here).
    Uring,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Workload {
    /// The fast tier's engine.
    pub engine: Engine,
    /// Steps saved (drained every `drain_every` saves and after the last, `keep_last` 1
    /// evicting the fast copies of the older ones).
    pub steps: u64,
    /// Saves between drains (1: each step drained at once; more: one drain copies several
    /// steps and evicts several fast copies).
    pub drain_every: u64,
    /// A protocol bug to inject, for the mutation check.
    pub mutation: Option<Mutation>,
    /// Multiplies the larger parts' sizes (1: about 13 KB, 5 KB and 4 KiB; larger parts are
    /// more writes, and more crash states between them; see [`parts_of`]).
    pub part_scale: usize,
}

impl Workload {
    /// `steps` steps on `engine`, no mutation.
    pub fn new(engine: Engine, steps: u64) -> Self {
        Workload { engine, steps, drain_every: 1, mutation: None, part_scale: 1 }
    }
}

/// A recorded workload: its operations with paths relative to its base directory (`fast/`,
/// `slow/`, `outside/`), and what the checks need.
#[derive(Debug, Clone)]
pub struct Trace {
    /// The operations, in order, markers included (`ack STEP` once a save returned).
    pub ops: Vec<FsOp>,
    /// The store's key prefix on both tiers.
    pub prefix: String,
    /// Steps saved, 1..=steps.
    pub steps: u64,
    /// What the workload ran.
    pub engine: Engine,
    /// The parts' size scale ([`parts_of`]).
    pub part_scale: usize,
}

/// Contents of `outside/keep`.
pub const OUTSIDE_DATA: &[u8] = b"a file next to the tiers that no crash state may change";

/// The parts of `step` at `scale`: two whose sizes span several 4 KiB pages and end mid-page
/// (about 13 KB and 5 KB times `scale`, a little more each step), one of exactly `scale` pages,
/// and one smaller than a page.
pub fn parts_of(step: u64, scale: usize) -> Vec<(String, Vec<u8>)> {
    let scale = scale.max(1);
    let step_len = step as usize;
    [
        ("model", 13_000 * scale + step_len * 517),
        ("optim", 5_000 * scale + step_len * 77),
        ("pages", 4096 * scale),
        ("rng", 100 + step_len * 13),
    ]
    .iter()
    .enumerate()
    .map(|(i, (name, size))| {
        let tag = (step as u8).wrapping_mul(29) ^ (i as u8).wrapping_mul(101);
        let data = (0..*size as u64).map(|j| ((j.wrapping_mul(2_654_435_761) >> 11) as u8) ^ tag).collect();
        (name.to_string(), data)
    })
    .collect()
}

/// The store configuration of the workload and of the checks.
pub fn store_config() -> StoreConfig {
    StoreConfig::default().with_chunk_bytes(8 << 10).with_keep_last(1).with_prefix("ckpt".to_string())
}

fn relative(p: &Path, base: &Path) -> PathBuf {
    p.strip_prefix(base).map(Path::to_path_buf).unwrap_or_else(|_| p.to_path_buf())
}

fn rel_op(op: FsOp, base: &Path) -> FsOp {
    match op {
        FsOp::Create { file, path } => FsOp::Create { file, path: relative(&path, base) },
        FsOp::Mkdir { path } => FsOp::Mkdir { path: relative(&path, base) },
        FsOp::FsyncDir { path } => FsOp::FsyncDir { path: relative(&path, base) },
        FsOp::Rename { from, to } => FsOp::Rename { from: relative(&from, base), to: relative(&to, base) },
        FsOp::Unlink { path } => FsOp::Unlink { path: relative(&path, base) },
        FsOp::Rmdir { path } => FsOp::Rmdir { path: relative(&path, base) },
        other => other,
    }
}

/// Runs `w` in a fresh directory under `parent` (a file system with direct I/O for the
/// io_uring engine, such as ext4) and returns its trace.
pub fn record(w: &Workload, parent: &Path) -> std::io::Result<Trace> {
    let base = tempfile::Builder::new().prefix("crash-workload").tempdir_in(parent)?;
    let base_path = base.path().canonicalize()?;
    for d in ["fast", "slow", "outside"] {
        std::fs::create_dir_all(base_path.join(d))?;
    }
    std::fs::write(base_path.join("outside/keep"), OUTSIDE_DATA)?;
    let trace = Arc::new(FsTrace::new());
    trace.set_mutation(w.mutation.clone());
    let fast_trace = Arc::clone(&trace);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let res: ringtier_core::Result<()> = rt.block_on(async {
        let open_tiers = || -> ringtier_core::Result<Vec<Arc<dyn Tier>>> {
            let fast: Arc<dyn Tier> = match w.engine {
                Engine::Posix => Arc::new(PosixTier::new(
                    PosixConfig::new(base_path.join("fast"))
                        .with_threads(2)
                        .with_name("fast".into())
                        .with_fs_trace(Some(Arc::clone(&fast_trace))),
                )?),
                Engine::Uring => Arc::new(UringTier::with_options(
                    base_path.join("fast"),
                    UringConfig::default(),
                    UringTierOptions::default()
                        .with_name("fast".to_string())
                        .with_fs_trace(Some(Arc::clone(&fast_trace))),
                )?),
            };
            let slow: Arc<dyn Tier> = Arc::new(PosixTier::new(
                PosixConfig::new(base_path.join("slow"))
                    .with_threads(2)
                    .with_name("slow".into())
                    .with_fs_trace(Some(Arc::clone(&trace))),
            )?);
            Ok(vec![fast, slow])
        };
        let store = CheckpointStore::open(open_tiers()?, store_config()).await?;
        for step in 1..=w.steps {
            let data = parts_of(step, w.part_scale);
            store.save(step, data.iter().map(|(n, d)| Part::bytes(n.clone(), d)).collect()).await?;
            trace.mark(format!("ack {step}"));
            if step % w.drain_every.max(1) == 0 || step == w.steps {
                store.drain().await?;
                trace.mark(format!("drained {step}"));
            }
        }
        drop(store);
        // The store's background tasks end with it; a moment for them to let go of the locks.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        trace.mark("restart");
        let store = CheckpointStore::open(open_tiers()?, store_config()).await?;
        store.drain().await?;
        drop(store);
        Ok(())
    });
    drop(rt);
    res.map_err(|e| std::io::Error::other(e.to_string()))?;
    let ops = trace.ops();
    Ok(Trace {
        ops: ops.into_iter().map(|op| rel_op(op, &base_path)).collect(),
        prefix: "ckpt".to_string(),
        steps: w.steps,
        engine: w.engine,
        part_scale: w.part_scale,
    })
}
