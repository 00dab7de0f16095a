//! Persistence models: which crash states a file system may leave when the power goes after
//! operation `point` of a trace.
//!
//! Every model applies the operations `0..=point` in order, each as a [`Choice`] says: whole,
//! not at all, or (a write) torn at a 4 KiB boundary of the file or with a zero-filled tail.
//! What differs is which operations may be dropped or torn:
//!
//! * [`Model::Ext4Ordered`] (ext4 `data=ordered`, as ALICE models it): operations persist in
//!   order; an fsync commits the journal, making everything before it durable; after the last
//!   fsync any prefix of the operations persists, and the last write of the prefix may be torn.
//! * [`Model::WeakPosix`]: only what an fsync covers is durable: a file's writes by a later
//!   fsync of that file, a directory entry (a create, mkdir, rename or unlink) by a later
//!   fsync of its directory. Every other operation may be dropped independently of the others
//!   (which covers any reordering of them) and a write may be torn or zero-tailed. The subsets
//!   are too many to enumerate: each point gets the all/none states, every single operation
//!   dropped, every single one kept alone, every write torn at up to three boundaries and
//!   zero-tailed, and a number of seeded random subsets.
//! * [`Model::DeviceCache`]: ext4's ordering for the page cache, but an O_DIRECT write sits in
//!   the device's volatile cache until an fsync of its file flushes it: such writes may be
//!   dropped or torn whatever else persisted.
//!
//! A staged file's creation is never dropped: the file exists as an inode whatever its name in
//! the staging directory (which nothing reads), and a later rename of it that persists brings
//! it along.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::Path;

use crate::SeededRng;
use ringtier_core::fs::trace::FsOp;

use super::image::Persist;

/// A persistence model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Model {
    /// (a) ext4 `data=ordered`.
    Ext4Ordered,
    /// (b) weak POSIX.
    WeakPosix,
    /// (c) a device cache for O_DIRECT writes.
    DeviceCache,
}

impl Model {
    /// Every model.
    pub const ALL: [Model; 3] = [Model::Ext4Ordered, Model::WeakPosix, Model::DeviceCache];

    /// A short name (`ext4-ordered`, `weak-posix`, `device-cache`).
    pub fn name(self) -> &'static str {
        match self {
            Model::Ext4Ordered => "ext4-ordered",
            Model::WeakPosix => "weak-posix",
            Model::DeviceCache => "device-cache",
        }
    }

    /// The model named `s`.
    pub fn parse(s: &str) -> Option<Model> {
        Model::ALL.into_iter().find(|m| m.name() == s)
    }
}

/// How one operation of a crash state persisted.
pub type Choice = Persist;

/// One crash state: the operations `0..=point`, each whole unless `choices` says otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The model that allowed it.
    pub model: Model,
    /// The last operation issued before the power went.
    pub point: usize,
    /// Operations that did not persist whole, by index.
    pub choices: BTreeMap<usize, Choice>,
}

impl State {
    /// How operation `i` persisted.
    pub fn choice(&self, i: usize) -> Choice {
        self.choices.get(&i).copied().unwrap_or(Persist::Whole)
    }

    /// Parses a descriptor written by `Display` (`weak-posix@123:5L,7T4096,9Z8192`).
    pub fn parse(s: &str) -> Option<State> {
        let (model, rest) = s.split_once('@')?;
        let model = Model::parse(model)?;
        let (point, list) = rest.split_once(':').unwrap_or((rest, ""));
        let point = point.parse().ok()?;
        let mut choices = BTreeMap::new();
        for item in list.split(',').filter(|i| !i.is_empty()) {
            let pos = item.find(|c: char| !c.is_ascii_digit())?;
            let (idx, what) = item.split_at(pos);
            let idx: usize = idx.parse().ok()?;
            let choice = match what.as_bytes().first()? {
                b'L' => Persist::Lost,
                b'T' => Persist::Torn(what[1..].parse().ok()?),
                b'Z' => Persist::ZeroTail(what[1..].parse().ok()?),
                _ => return None,
            };
            choices.insert(idx, choice);
        }
        Some(State { model, point, choices })
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}:", self.model.name(), self.point)?;
        let mut first = true;
        for (i, c) in &self.choices {
            if !first {
                f.write_str(",")?;
            }
            first = false;
            match c {
                Persist::Whole => write!(f, "{i}W")?,
                Persist::Lost => write!(f, "{i}L")?,
                Persist::Torn(n) => write!(f, "{i}T{n}")?,
                Persist::ZeroTail(n) => write!(f, "{i}Z{n}")?,
            }
        }
        Ok(())
    }
}

/// Whether an operation changes the image (not an fsync or a marker) and may be dropped (a
/// create never is).
fn droppable(op: &FsOp) -> bool {
    matches!(
        op,
        FsOp::Write { .. }
            | FsOp::SetLen { .. }
            | FsOp::Mkdir { .. }
            | FsOp::Rename { .. }
            | FsOp::Unlink { .. }
            | FsOp::Rmdir { .. }
    )
}

/// For each operation of `ops[..=point]`: whether a later fsync in the prefix made it durable.
/// One backward pass, remembering the files and directories fsynced further on.
pub fn durable(ops: &[FsOp], point: usize) -> Vec<bool> {
    let prefix = &ops[..=point];
    let mut out = vec![false; prefix.len()];
    let mut files_synced: HashSet<u64> = HashSet::new();
    let mut dirs_synced: HashSet<&Path> = HashSet::new();
    for (i, op) in prefix.iter().enumerate().rev() {
        out[i] = match op {
            FsOp::Write { file, .. } | FsOp::SetLen { file, .. } => files_synced.contains(file),
            FsOp::Mkdir { path } | FsOp::Unlink { path } | FsOp::Rmdir { path } => {
                dirs_synced.contains(parent_of(path))
            }
            FsOp::Rename { to, .. } => dirs_synced.contains(parent_of(to)),
            _ => true,
        };
        match op {
            FsOp::Fsync { file } => {
                files_synced.insert(*file);
            }
            FsOp::FsyncDir { path } => {
                dirs_synced.insert(path.as_path());
            }
            _ => {}
        }
    }
    out
}

fn parent_of(p: &Path) -> &Path {
    p.parent().unwrap_or(Path::new(""))
}

/// The operations of `ops[..=point]` that [`Model::WeakPosix`] may drop or tear: those that
/// change the image, are not creates, and no later fsync of the prefix made durable.
pub fn optional(ops: &[FsOp], point: usize) -> Vec<usize> {
    let synced = durable(ops, point);
    (0..=point).filter(|&j| droppable(&ops[j]) && !synced[j]).collect()
}

/// One random [`Model::WeakPosix`] state at `point`: each of `optional` (from [`optional`])
/// kept whole with probability 1/2, dropped with 1/4, torn or zero-tailed with 1/4.
pub fn random_state(ops: &[FsOp], point: usize, optional: &[usize], rng: &mut SeededRng) -> State {
    let mut choices = BTreeMap::new();
    for &j in optional {
        match rng.below(4) {
            0 | 1 => {}
            2 => {
                choices.insert(j, Persist::Lost);
            }
            _ => {
                let t = tears(&ops[j]);
                let choice = if t.is_empty() { Persist::Lost } else { t[rng.below(t.len() as u64) as usize] };
                choices.insert(j, choice);
            }
        }
    }
    State { model: Model::WeakPosix, point, choices }
}

/// 4 KiB boundaries inside a write of `len` bytes at `offset`, as lengths kept: at most three
/// (the first, the middle one, the last).
fn cuts(offset: u64, len: u64) -> Vec<u64> {
    const PAGE: u64 = 4096;
    let mut all = Vec::new();
    let mut b = (offset / PAGE + 1) * PAGE;
    while b < offset + len {
        all.push(b - offset);
        b += PAGE;
    }
    if all.is_empty() {
        // A write within one page: torn at its start.
        return vec![0];
    }
    let mut picked = vec![all[0], all[all.len() / 2], all[all.len() - 1]];
    picked.dedup();
    picked
}

fn tears(op: &FsOp) -> Vec<Choice> {
    match op {
        FsOp::Write { offset, data, .. } => {
            let mut out = Vec::new();
            for c in cuts(*offset, data.len() as u64) {
                out.push(Persist::Torn(c));
                out.push(Persist::ZeroTail(c));
            }
            out
        }
        _ => Vec::new(),
    }
}

/// The crash states `model` allows when the power goes after `ops[point]`, with `randoms`
/// seeded random subsets where the model has too many to enumerate.
pub fn states(model: Model, ops: &[FsOp], point: usize, randoms: usize, rng: &mut SeededRng) -> Vec<State> {
    let mk = |choices: BTreeMap<usize, Choice>| State { model, point, choices };
    let mut out = Vec::new();
    match model {
        Model::Ext4Ordered | Model::DeviceCache => {
            let barrier = ops[..=point]
                .iter()
                .rposition(|o| matches!(o, FsOp::Fsync { .. } | FsOp::FsyncDir { .. }))
                .unwrap_or(0);
            for k in barrier..=point {
                // ops[..=k] persisted, the rest of the prefix not.
                let lost: BTreeMap<usize, Choice> =
                    (k + 1..=point).filter(|&j| droppable(&ops[j])).map(|j| (j, Persist::Lost)).collect();
                out.push(mk(lost.clone()));
                for t in tears(&ops[k]) {
                    let mut c = lost.clone();
                    c.insert(k, t);
                    out.push(mk(c));
                }
                if model == Model::DeviceCache {
                    // O_DIRECT writes of the persisted prefix not yet flushed by an fsync of
                    // their file: each dropped or torn, and all of them dropped.
                    let synced = durable(ops, k);
                    let cached: Vec<usize> =
                        (0..=k).filter(|&j| matches!(ops[j], FsOp::Write { direct: true, .. }) && !synced[j]).collect();
                    for &j in &cached {
                        let mut c = lost.clone();
                        c.insert(j, Persist::Lost);
                        out.push(mk(c));
                        for t in tears(&ops[j]) {
                            let mut c = lost.clone();
                            c.insert(j, t);
                            out.push(mk(c));
                        }
                    }
                    if cached.len() > 1 {
                        let mut c = lost.clone();
                        c.extend(cached.iter().map(|&j| (j, Persist::Lost)));
                        out.push(mk(c));
                    }
                }
            }
        }
        Model::WeakPosix => {
            let optional = optional(ops, point);
            let all_lost: BTreeMap<usize, Choice> = optional.iter().map(|&j| (j, Persist::Lost)).collect();
            out.push(mk(BTreeMap::new()));
            if optional.is_empty() {
                return out;
            }
            out.push(mk(all_lost.clone()));
            for &j in &optional {
                out.push(mk(BTreeMap::from([(j, Persist::Lost)])));
                let mut alone = all_lost.clone();
                alone.remove(&j);
                out.push(mk(alone));
                for t in tears(&ops[j]) {
                    out.push(mk(BTreeMap::from([(j, t)])));
                }
            }
            for _ in 0..randoms {
                out.push(random_state(ops, point, &optional, rng));
            }
        }
    }
    out
}
