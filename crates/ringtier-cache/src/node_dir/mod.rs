//! The node cache across processes: the ranks of a node (separate processes, as under
//! `torchrun`) share one directory (on tmpfs it is memory), one copy of a sample per node.
//! Placement needs no messages: every rank computes the same [`plan::Planner`] from the shared
//! seed, and the directory protocol ([`dir::SlotDir`]) makes concurrent writers, readers and
//! evictions safe. See `docs/CACHE.md` ("The node cache across processes").

pub(crate) mod dir;
pub(crate) mod plan;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};

use ringtier_dataset::Sampler;

use crate::CachePolicy;
use dir::SlotDir;
use plan::{Decision, EpochPlan, Planner};

/// One rank's view of the current epoch's plan.
#[derive(Debug)]
pub(crate) struct Current {
    pub(crate) epoch: u64,
    pub(crate) plan: Arc<EpochPlan>,
    /// This rank's samples of the epoch, in order.
    pub(crate) order: Vec<u32>,
    /// This rank's position of each sample in the epoch (u32::MAX: not this rank's).
    pos_of: Vec<u32>,
    /// Reads issued so far (the furthest position read, plus one).
    pub(crate) cursor: AtomicUsize,
    /// Positions of this rank's run starts not yet prefetched or passed (clairvoyant).
    pub(crate) pending: Mutex<BTreeSet<u32>>,
    /// Samples this rank's prefetcher is fetching now: a read of one waits for its copy
    /// rather than reading the slow tier a second time.
    pub(crate) fetching: Mutex<std::collections::HashSet<u32>>,
}

impl Current {
    /// This rank's decision for reading sample `id` now, and its position.
    pub(crate) fn decision(&self, local: usize, id: u32) -> Option<(usize, Decision)> {
        let p = *self.pos_of.get(id as usize)?;
        if p == u32::MAX {
            return None;
        }
        let d = *self.plan.ranks.get(local)?.get(p as usize)?;
        Some((p as usize, d))
    }
}

/// Totals of the directory protocol (one process's).
#[derive(Debug, Default)]
pub(crate) struct DirCounters {
    pub(crate) placed: AtomicU64,
    pub(crate) skipped: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) bad: AtomicU64,
}

/// A rank's share of the node cache: the plan, the directory, its epoch.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) dir: SlotDir,
    planner: Mutex<Planner>,
    pub(crate) local: usize,
    sampler: Sampler,
    ids: usize,
    pub(crate) policy: CachePolicy,
    pub(crate) slots: usize,
    pub(crate) cur: Mutex<Option<Arc<Current>>>,
    pub(crate) counters: DirCounters,
}

/// FNV-1a over the words that make the plan: ranks' orders of epoch 0, sizes, slots, policy.
fn plan_id(
    policy: CachePolicy,
    samplers: &[Sampler],
    sizes: &[u64],
    slots: usize,
    lookahead: u64,
    total: Option<u64>,
) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut eat = |w: u64| {
        for b in w.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for b in policy.as_str().bytes() {
        eat(u64::from(b));
    }
    eat(slots as u64);
    eat(lookahead);
    eat(total.map_or(u64::MAX, |t| t));
    eat(samplers.len() as u64);
    for s in samplers {
        eat(s.len() as u64);
        for id in s.epoch(0).into_iter().take(64) {
            eat(u64::from(id));
        }
    }
    eat(sizes.len() as u64);
    for &s in sizes {
        eat(s);
    }
    h
}

/// The future a node's plan looks at: `lookahead` epochs, or the rest of a job of `total`
/// epochs when known ([`crate::CacheConfig::total_epochs`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Horizon {
    pub(crate) lookahead: u64,
    pub(crate) total: Option<u64>,
}

impl Shared {
    /// The share of rank `local` of `samplers` (the node's ranks) in a node cache of
    /// `capacity` bytes under `dir`, for samples of `sizes`.
    pub(crate) fn open(
        dir: &std::path::Path,
        policy: CachePolicy,
        samplers: Vec<Sampler>,
        local: usize,
        sizes: &[u64],
        capacity: u64,
        horizon: Horizon,
    ) -> ringtier_core::Result<Shared> {
        let Horizon { lookahead, total } = horizon;
        use ringtier_core::error::{Error, ErrorKind};
        let Some(&sampler) = samplers.get(local) else {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("local rank {local} is not one of the node's {} ranks", samplers.len()),
            ));
        };
        let largest = sizes.iter().copied().max().unwrap_or(0).max(1);
        let slots = (capacity / largest) as usize;
        if slots == 0 && policy != CachePolicy::None {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("a node cache of {capacity} bytes cannot hold the largest sample ({largest} bytes)"),
            ));
        }
        let id = plan_id(policy, &samplers, sizes, slots, lookahead, total);
        let dir = SlotDir::open(dir, id)?;
        Ok(Shared {
            dir,
            planner: Mutex::new(Planner::new(policy, samplers, sizes.len(), slots, lookahead, total)),
            local,
            sampler,
            ids: sizes.len(),
            policy,
            slots,
            cur: Mutex::new(None),
            counters: DirCounters::default(),
        })
    }

    /// Starts `epoch` at `position`: computes its plan (and any before it not yet made).
    pub(crate) fn begin_epoch(&self, epoch: u64, position: usize) -> Arc<Current> {
        let plan = self.planner.lock().unwrap_or_else(|p| p.into_inner()).plan(epoch);
        let order = self.sampler.epoch(epoch);
        let mut pos_of = vec![u32::MAX; self.ids];
        for (p, &id) in order.iter().enumerate() {
            if let Some(slot) = pos_of.get_mut(id as usize) {
                *slot = p as u32;
            }
        }
        let pending: BTreeSet<u32> = match (self.policy, plan.ranks.get(self.local)) {
            (CachePolicy::Clairvoyant, Some(mine)) => mine
                .iter()
                .enumerate()
                .skip(position)
                .filter(|(_, d)| d.start && !d.end)
                .map(|(p, _)| p as u32)
                .collect(),
            _ => BTreeSet::new(),
        };
        let cur = Arc::new(Current {
            epoch,
            plan,
            order,
            pos_of,
            cursor: AtomicUsize::new(position),
            pending: Mutex::new(pending),
            fetching: Mutex::new(std::collections::HashSet::new()),
        });
        *self.cur.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&cur));
        cur
    }

    /// The epoch this rank is in, if it began one.
    pub(crate) fn current(&self) -> Option<Arc<Current>> {
        self.cur.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
