//! The node's placement plan: which reads of the node's ranks keep a copy, in which slot of the
//! shared directory and under which generation. Every rank computes the same plan from the
//! samplers (the shared seed), the sample sizes and the capacity, so no rank tells another
//! anything.
//!
//! Time runs on the node's clock (as in [`crate::window`]): in an epoch, rank `r` of the `n`
//! sharing the cache reads its `p`-th sample at `p * n + r`. The capacity is `slots` copies of
//! the largest sample. A plan is made epoch by epoch, each from the state the previous one left
//! and the reads of a window of future epochs (the clairvoyant policy's future), and is kept as
//! one [`Decision`] per read. The window is the rest of the job when its number of epochs is
//! known (at most [`MAX_HORIZON_EPOCHS`]; no read is planned for an epoch past the job's end), else
//! `lookahead` epochs. Memory: 4 bytes per sample per window epoch while an epoch is planned,
//! plus the decisions of the last 4 epochs planned (24 bytes per read).
//!
//! - a *run* is a stretch of node time during which one sample holds one slot: it starts at a
//!   read (the reader writes the copy; a prefetcher may write it earlier, once the slot is free)
//!   and ends at a read (the reader drops the copy) or when a later run takes the slot;
//! - a slot's runs get increasing generations, so a copy can never displace a newer one;
//! - at most `slots` runs overlap at any node time, whatever the ranks' skew: the slot names
//!   are the capacity.
//!
//! The clairvoyant plan is Belady's on the union of the node's reads (a copy is kept when it is
//! read again before the copies it would displace; the one read furthest ahead goes), the LRU
//! plan is LRU on the union, the static plan keeps the first copies the node reads.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use ringtier_dataset::Sampler;

use crate::CachePolicy;

/// Not kept: the read goes to the slow tier and leaves no copy.
pub(crate) const NO_SLOT: u32 = u32::MAX;
const NEVER: u64 = u64::MAX;
const NO_POS: u32 = u32::MAX;
/// The most epochs of future a plan looks at when the job's length is known (bounds the
/// planner's memory to 4 bytes per sample per epoch of it).
pub(crate) const MAX_HORIZON_EPOCHS: u64 = 64;

/// What one read does with the shared directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Decision {
    /// The slot of the run this read belongs to, or [`NO_SLOT`].
    pub(crate) slot: u32,
    /// The run's generation in its slot (from 1).
    pub(crate) gen: u64,
    /// A run starts at this read: the copy is written by this reader (unless prefetched).
    pub(crate) start: bool,
    /// The run ends with this read: the reader drops the copy once read.
    pub(crate) end: bool,
    /// The slot's previous copy has no read left in the plan (it died at the epoch's start,
    /// not at a read): a prefetcher may replace it at once.
    pub(crate) replace_dead: bool,
}

impl Decision {
    const BYPASS: Decision = Decision { slot: NO_SLOT, gen: 0, start: false, end: false, replace_dead: false };

    /// The read belongs to a run: a copy should be (or come) in its slot.
    pub(crate) fn kept(&self) -> bool {
        self.slot != NO_SLOT
    }
}

/// One epoch's decisions, per rank sharing the cache and per position in its order.
#[derive(Debug)]
pub(crate) struct EpochPlan {
    pub(crate) epoch: u64,
    pub(crate) ranks: Vec<Vec<Decision>>,
}

impl EpochPlan {
    /// Runs started in the epoch (copies written when nothing goes wrong).
    pub(crate) fn starts(&self) -> usize {
        self.ranks.iter().flatten().filter(|d| d.start).count()
    }

    /// Reads planned as hits (a copy read in a run that started earlier).
    pub(crate) fn planned_hits(&self) -> usize {
        self.ranks.iter().flatten().filter(|d| d.kept() && !d.start).count()
    }
}

/// Computes [`EpochPlan`]s in order, keeping the state they carry from one to the next.
#[derive(Debug)]
pub(crate) struct Planner {
    policy: CachePolicy,
    samplers: Vec<Sampler>,
    ids: usize,
    slots: usize,
    lookahead: u64,
    /// The job's number of epochs, when known: the window runs to its end.
    total: Option<u64>,
    /// The next epoch to plan.
    next_epoch: u64,
    slot_of: HashMap<u32, u32>,
    gens: Vec<u64>,
    free: BTreeSet<u32>,
    /// Free slots whose last copy died without a read that drops it.
    dead: BTreeSet<u32>,
    /// Belady: (next read, sample) of the copies held.
    by_next: BTreeSet<(u64, u32)>,
    next_of: HashMap<u32, u64>,
    /// LRU: (tick, sample) of the copies held.
    lru: BTreeMap<u64, u32>,
    tick_of: HashMap<u32, u64>,
    tick: u64,
    /// The last plans made (a rank resuming far behind recomputes from epoch 0).
    done: VecDeque<Arc<EpochPlan>>,
}

impl Planner {
    /// A planner for the ranks of `samplers` (all over the same `ids` samples, seed and world)
    /// sharing `slots` slots, looking `lookahead` epochs ahead, or to the end of a job of
    /// `total` epochs when known.
    pub(crate) fn new(
        policy: CachePolicy,
        samplers: Vec<Sampler>,
        ids: usize,
        slots: usize,
        lookahead: u64,
        total: Option<u64>,
    ) -> Self {
        Planner {
            policy,
            samplers,
            ids,
            slots,
            lookahead: lookahead.max(1),
            total,
            next_epoch: 0,
            slot_of: HashMap::new(),
            gens: vec![0; slots],
            free: (0..slots as u32).collect(),
            dead: BTreeSet::new(),
            by_next: BTreeSet::new(),
            next_of: HashMap::new(),
            lru: BTreeMap::new(),
            tick_of: HashMap::new(),
            tick: 0,
            done: VecDeque::new(),
        }
    }

    /// The plan of `epoch` (made, with every epoch before it, when first asked for).
    pub(crate) fn plan(&mut self, epoch: u64) -> Arc<EpochPlan> {
        if let Some(p) = self.done.iter().find(|p| p.epoch == epoch) {
            return Arc::clone(p);
        }
        if epoch < self.next_epoch {
            // Older than what is kept: start over (the plan is a function of the epochs).
            *self = Planner::new(
                self.policy,
                std::mem::take(&mut self.samplers),
                self.ids,
                self.slots,
                self.lookahead,
                self.total,
            );
        }
        while self.next_epoch <= epoch {
            let p = Arc::new(self.make(self.next_epoch));
            self.next_epoch += 1;
            self.done.push_back(p);
            if self.done.len() > 4 {
                self.done.pop_front();
            }
        }
        self.done.back().map(Arc::clone).unwrap_or_else(|| Arc::new(EpochPlan { epoch, ranks: Vec::new() }))
    }

    /// The epochs of future a plan of `epoch` looks at (from `epoch` on): to the job's end when
    /// known (at most [`MAX_HORIZON_EPOCHS`]), else `lookahead`. An epoch past a known end (a job
    /// run longer than it said) falls back to `lookahead`.
    fn horizon(&self, epoch: u64) -> u64 {
        match self.total {
            Some(t) if epoch < t => (t - epoch).min(MAX_HORIZON_EPOCHS),
            _ => self.lookahead,
        }
    }

    /// Per epoch of the future window, each sample's node time in it (or [`NO_POS`]).
    fn times(&self, epoch: u64) -> (Vec<Vec<u32>>, u64) {
        let n = self.samplers.len().max(1);
        let mut span = 1u64;
        let mut out = Vec::new();
        for e in epoch..epoch + self.horizon(epoch) {
            let mut at = vec![NO_POS; self.ids];
            for (r, s) in self.samplers.iter().enumerate() {
                let order = s.epoch(e);
                span = span.max((order.len() * n) as u64);
                for (p, &id) in order.iter().enumerate() {
                    if let Some(slot) = at.get_mut(id as usize) {
                        *slot = (p * n + r) as u32;
                    }
                }
            }
            out.push(at);
        }
        (out, span)
    }

    fn make(&mut self, epoch: u64) -> EpochPlan {
        let orders: Vec<Vec<u32>> = self.samplers.iter().map(|s| s.epoch(epoch)).collect();
        let mut ranks: Vec<Vec<Decision>> = orders.iter().map(|o| vec![Decision::BYPASS; o.len()]).collect();
        if self.policy == CachePolicy::None || self.slots == 0 {
            return EpochPlan { epoch, ranks };
        }
        let (at, span) = self.times(epoch);
        // The next read of `id` after window epoch `k` (node time), or NEVER.
        let next_after = |id: u32, k: usize| -> u64 {
            (k..at.len())
                .find(|&j| at[j].get(id as usize).is_some_and(|&t| t != NO_POS))
                .map_or(NEVER, |j| (epoch + j as u64) * span + u64::from(at[j][id as usize]))
        };
        // Where each held copy was last read in this epoch: (rank, position).
        let mut last: HashMap<u32, (usize, usize)> = HashMap::new();
        if self.policy == CachePolicy::Clairvoyant {
            // Copies carried in: renew their next read; those never read again die now.
            self.by_next.clear();
            let held: Vec<u32> = self.slot_of.keys().copied().collect();
            for id in held {
                let n = next_after(id, 0);
                if n == NEVER {
                    self.release(id, true);
                } else {
                    self.next_of.insert(id, n);
                    self.by_next.insert((n, id));
                }
            }
        }
        let n = orders.len();
        let longest = orders.iter().map(Vec::len).max().unwrap_or(0);
        for p in 0..longest {
            for r in 0..n {
                let Some(&id) = orders[r].get(p) else { continue };
                let next = if self.policy == CachePolicy::Clairvoyant { next_after(id, 1) } else { 0 };
                let d = self.step(id, next, &mut last, &mut ranks);
                ranks[r][p] = d;
                if d.kept() {
                    last.insert(id, (r, p));
                    if d.end {
                        last.remove(&id);
                    }
                }
            }
        }
        EpochPlan { epoch, ranks }
    }

    /// Frees `id`'s slot (`dead`: without a read that drops the copy).
    fn release(&mut self, id: u32, dead: bool) -> Option<u32> {
        let slot = self.slot_of.remove(&id)?;
        if let Some(n) = self.next_of.remove(&id) {
            self.by_next.remove(&(n, id));
        }
        if let Some(t) = self.tick_of.remove(&id) {
            self.lru.remove(&t);
        }
        self.free.insert(slot);
        if dead {
            self.dead.insert(slot);
        } else {
            self.dead.remove(&slot);
        }
        Some(slot)
    }

    /// Evicts `victim` for a new run: its last read this epoch becomes the run's end (its
    /// reader drops the copy); a copy not read this epoch died at the epoch's start.
    fn evict(&mut self, victim: u32, last: &mut HashMap<u32, (usize, usize)>, ranks: &mut [Vec<Decision>]) {
        let at = last.remove(&victim);
        if let Some((r, p)) = at {
            // Its reader drops the copy (a run that starts and ends at one read writes none,
            // but its end still clears the slot of an older copy).
            ranks[r][p].end = true;
        }
        self.release(victim, at.is_none());
    }

    fn start(&mut self, id: u32, next: u64) -> Decision {
        let Some(slot) = self.free.pop_first() else { return Decision::BYPASS };
        let replace_dead = self.dead.remove(&slot);
        self.gens[slot as usize] += 1;
        self.slot_of.insert(id, slot);
        match self.policy {
            CachePolicy::Clairvoyant => {
                self.next_of.insert(id, next);
                self.by_next.insert((next, id));
            }
            CachePolicy::Lru => {
                self.tick += 1;
                self.tick_of.insert(id, self.tick);
                self.lru.insert(self.tick, id);
            }
            _ => {}
        }
        Decision { slot, gen: self.gens[slot as usize], start: true, end: false, replace_dead }
    }

    /// One read of `id` (read next at `next`, clairvoyant only).
    fn step(
        &mut self,
        id: u32,
        next: u64,
        last: &mut HashMap<u32, (usize, usize)>,
        ranks: &mut [Vec<Decision>],
    ) -> Decision {
        if let Some(&slot) = self.slot_of.get(&id) {
            let mut d = Decision { slot, gen: self.gens[slot as usize], start: false, end: false, replace_dead: false };
            match self.policy {
                CachePolicy::Clairvoyant => {
                    if let Some(old) = self.next_of.insert(id, next) {
                        self.by_next.remove(&(old, id));
                    }
                    if next == NEVER {
                        d.end = true;
                        self.release(id, false);
                    } else {
                        self.by_next.insert((next, id));
                    }
                }
                CachePolicy::Lru => {
                    if let Some(t) = self.tick_of.remove(&id) {
                        self.lru.remove(&t);
                    }
                    self.tick += 1;
                    self.tick_of.insert(id, self.tick);
                    self.lru.insert(self.tick, id);
                }
                _ => {}
            }
            return d;
        }
        match self.policy {
            CachePolicy::Clairvoyant => {
                if next == NEVER {
                    return Decision::BYPASS;
                }
                if self.free.is_empty() {
                    match self.by_next.last().copied() {
                        Some((vn, v)) if vn > next => self.evict(v, last, ranks),
                        _ => return Decision::BYPASS,
                    }
                }
                self.start(id, next)
            }
            CachePolicy::Lru => {
                if self.free.is_empty() {
                    if let Some((_, v)) = self.lru.first_key_value().map(|(t, v)| (*t, *v)) {
                        self.evict(v, last, ranks);
                    }
                }
                self.start(id, next)
            }
            CachePolicy::Static => self.start(id, next),
            CachePolicy::None => Decision::BYPASS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samplers(n: usize, ranks: usize, world: usize) -> Vec<Sampler> {
        (0..ranks).map(|r| Sampler::new(n, 7, r, world, true).expect("sampler")).collect()
    }

    /// Replays plans in node time, checking that at most `slots` runs are open at once and
    /// that every planned hit follows a run's start; returns the planned hits of epochs 1..
    fn replay(policy: CachePolicy, n: usize, ranks: usize, world: usize, slots: usize, epochs: u64) -> usize {
        replay_with(policy, n, ranks, world, slots, epochs, None)
    }

    fn replay_with(
        policy: CachePolicy,
        n: usize,
        ranks: usize,
        world: usize,
        slots: usize,
        epochs: u64,
        total: Option<u64>,
    ) -> usize {
        let mut pl = Planner::new(policy, samplers(n, ranks, world), n, slots, 3, total);
        let mut open: HashMap<u32, (u32, u64)> = HashMap::new(); // slot -> (sample, gen)
        let mut hits = 0;
        for e in 0..epochs {
            let plan = pl.plan(e);
            let orders: Vec<Vec<u32>> = samplers(n, ranks, world).iter().map(|s| s.epoch(e)).collect();
            let longest = orders.iter().map(Vec::len).max().unwrap_or(0);
            for p in 0..longest {
                for (r, order) in orders.iter().enumerate() {
                    let Some(&id) = order.get(p) else { continue };
                    let d = plan.ranks[r][p];
                    if !d.kept() {
                        continue;
                    }
                    if d.start {
                        let prev = open.insert(d.slot, (id, d.gen));
                        assert!(prev.is_none_or(|(_, g)| g < d.gen), "generations go up");
                    } else {
                        assert_eq!(open.get(&d.slot), Some(&(id, d.gen)), "a planned hit reads its run's copy");
                        if e > 0 {
                            hits += 1;
                        }
                    }
                    if d.end {
                        open.remove(&d.slot);
                    }
                    assert!(open.len() <= slots);
                    assert!((d.slot as usize) < slots);
                }
            }
        }
        hits
    }

    #[test]
    fn plans_keep_within_the_slots_and_hits_read_their_runs_copy() {
        for policy in [CachePolicy::Lru, CachePolicy::Static, CachePolicy::Clairvoyant] {
            replay(policy, 2000, 4, 16, 50, 4);
            replay(policy, 500, 2, 2, 100, 3);
        }
    }

    #[test]
    fn belady_on_a_node_of_a_larger_job_beats_static_by_far() {
        // A node of 4 ranks in a 16-rank job reads a different quarter each epoch: static hits
        // about c of the node's reads, Belady on the union keeps what the node reads next.
        let (n, slots) = (4000, 400);
        let st = replay(CachePolicy::Static, n, 4, 16, slots, 4);
        let cv = replay(CachePolicy::Clairvoyant, n, 4, 16, slots, 4);
        let reads = 3 * n / 4;
        assert!((st as f64 / reads as f64 - 0.1).abs() < 0.03, "static {st} of {reads}");
        assert!(cv as f64 >= 2.0 * st as f64, "clairvoyant {cv} vs static {st}");
    }

    #[test]
    fn the_plan_is_the_same_on_every_rank_and_when_recomputed() {
        let mut a = Planner::new(CachePolicy::Clairvoyant, samplers(1000, 4, 8), 1000, 64, 3, None);
        let mut b = Planner::new(CachePolicy::Clairvoyant, samplers(1000, 4, 8), 1000, 64, 3, None);
        let late = a.plan(6);
        for e in 0..=6 {
            let p = b.plan(e);
            if e == 6 {
                assert_eq!(p.ranks, late.ranks);
            }
        }
        // Asking again for an epoch no longer kept recomputes the same plan.
        let again = a.plan(0);
        assert_eq!(again.ranks, b.plan(0).ranks);
        assert!(again.starts() > 0 && late.planned_hits() > 0);
    }

    #[test]
    fn knowing_the_jobs_length_keeps_more_of_the_nodes_reuse() {
        // The benchmark's node: 4 ranks of a 16-rank job, 4,000 samples, 6 epochs, seed 7.
        let (n, epochs) = (4000, 6);
        let reads = (epochs as usize - 1) * n / 4;
        for slots in [400, 1000] {
            let st = replay_with(CachePolicy::Static, n, 4, 16, slots, epochs, None);
            let la = replay_with(CachePolicy::Clairvoyant, n, 4, 16, slots, epochs, None);
            let job = replay_with(CachePolicy::Clairvoyant, n, 4, 16, slots, epochs, Some(epochs));
            let bytes = |h: usize| (reads - h) as f64 / (reads - st) as f64;
            eprintln!(
                "slots {slots}: warm reuse static {:.3} lookahead-3 {:.3} whole job {:.3}; bytes / static {:.3} {:.3}",
                st as f64 / reads as f64,
                la as f64 / reads as f64,
                job as f64 / reads as f64,
                bytes(la),
                bytes(job)
            );
            assert!(job >= la, "the whole job's horizon keeps at least the 3-epoch plan's hits ({job} < {la})");
        }
    }

    #[test]
    fn a_known_end_keeps_no_copy_past_it_and_stays_within_the_slots() {
        let (n, epochs) = (2000, 4);
        replay_with(CachePolicy::Clairvoyant, n, 4, 16, 200, epochs, Some(epochs));
        let mut pl = Planner::new(CachePolicy::Clairvoyant, samplers(n, 4, 16), n, 200, 3, Some(epochs));
        let last = pl.plan(epochs - 1);
        // Nothing is read after the job's last epoch: no run starts in it, and the horizon
        // never reaches past the end.
        assert_eq!(last.starts(), 0);
        assert!(last.planned_hits() > 0);
        assert_eq!(pl.horizon(0), epochs);
        assert_eq!(pl.horizon(epochs - 1), 1);
        // A job run past its stated end falls back to the lookahead.
        assert_eq!(pl.horizon(epochs), 3);
        let mut unknown = Planner::new(CachePolicy::Clairvoyant, samplers(n, 4, 16), n, 200, 3, None);
        assert!(unknown.plan(epochs - 1).starts() > 0, "without the end the last epoch keeps copies");
    }
}
