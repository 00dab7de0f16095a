//! The cache's bookkeeping, without I/O: which objects are where, the bytes each level holds
//! (never above its capacity), the policies' admission and eviction, the clairvoyant
//! placement (Belady on the future of the ranks sharing the cache) and the prefetcher's next
//! pick. [`super::tier`] does the I/O around it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use super::window::{Window, NEVER};
use super::CachePolicy;

/// Not a position (the sample is not in this epoch's order).
pub(crate) const NO_POS: u32 = u32::MAX;

/// One cached copy.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) level: usize,
    pub(crate) size: u64,
    /// The bytes, for the memory level, once ready.
    pub(crate) data: Option<Arc<[u8]>>,
    /// Written and readable (a directory copy is being written until then).
    pub(crate) ready: bool,
    /// Part of the clairvoyant placement (kept for reuse) rather than a staged prefetch
    /// (dropped once read). Always true for the other policies.
    pub(crate) placed: bool,
    /// When the prefetcher brought it in, if it did.
    pub(crate) prefetched: Option<Instant>,
    /// Read at least once since it came in.
    pub(crate) used: bool,
    /// Clairvoyant: when the ranks sharing the cache read it next ([`NEVER`] in the window).
    pub(crate) next: u64,
    tick: u64,
}

/// What a read finds.
#[derive(Debug)]
pub(crate) enum Lookup {
    /// In memory.
    Memory(Arc<[u8]>),
    /// In the directory level `usize`.
    Dir(usize),
    /// Being fetched by the prefetcher (or written to a level): wait and look again.
    Pending,
    /// Not cached.
    Miss,
}

/// Counters of one cache (also exported as metrics by the tier).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Counters {
    pub(crate) hits: Vec<u64>,
    pub(crate) prefetch_hits: Vec<u64>,
    pub(crate) misses: u64,
    /// Misses that waited for a copy on its way in (a prefetch that came too late).
    pub(crate) late: u64,
    pub(crate) hit_bytes: u64,
    pub(crate) miss_bytes: u64,
    pub(crate) fetched_bytes: u64,
    pub(crate) prefetched: u64,
    pub(crate) prefetched_bytes: u64,
    pub(crate) unused_evicted: u64,
    pub(crate) unused_evicted_bytes: u64,
    pub(crate) evictions: u64,
    pub(crate) lead_seconds_sum: f64,
    pub(crate) lead_count: u64,
}

/// An eviction the tier must carry out (a directory file to delete); memory copies are
/// simply dropped.
#[derive(Debug)]
pub(crate) struct Victim {
    pub(crate) id: u32,
    pub(crate) level: usize,
    pub(crate) size: u64,
}

/// A copy to move down a level (LRU): write `data` to `level`, then [`State::complete`].
#[derive(Debug)]
pub(crate) struct Demotion {
    pub(crate) id: u32,
    pub(crate) level: usize,
    pub(crate) data: Arc<[u8]>,
}

/// The result of an admission: where the object goes (space reserved there), what to evict
/// and what to demote.
#[derive(Debug, Default)]
pub(crate) struct Admission {
    pub(crate) level: Option<usize>,
    pub(crate) victims: Vec<Victim>,
    pub(crate) demotions: Vec<Demotion>,
}

#[derive(Debug)]
pub(crate) struct State {
    pub(crate) policy: CachePolicy,
    pub(crate) caps: Vec<u64>,
    /// Bytes of the first level the prefetcher may fill with staged (unplaced) samples.
    pub(crate) budget: u64,
    /// Bytes reserved or held per level.
    pub(crate) used: Vec<u64>,
    /// Bytes of staged samples (in level 0, part of `used[0]`).
    pub(crate) staged: u64,
    pub(crate) entries: HashMap<u32, Entry>,
    lru: Vec<BTreeMap<u64, u32>>,
    tick: u64,
    /// Objects being fetched from the slow tier for the cache.
    pub(crate) inflight: HashSet<u32>,
    /// Clairvoyant: the future of the ranks sharing the cache.
    pub(crate) window: Window,
    /// Clairvoyant: placed copies by their next read, (next, id); the last goes first.
    by_next: BTreeSet<(u64, u32)>,
    /// Copies dropped by the prefetcher's picks, for the tier to delete.
    pub(crate) dropped: Vec<Victim>,
    pub(crate) counters: Counters,
}

impl State {
    pub(crate) fn new(policy: CachePolicy, caps: Vec<u64>, budget: u64) -> Self {
        let n = caps.len();
        State {
            policy,
            used: vec![0; n],
            lru: (0..n).map(|_| BTreeMap::new()).collect(),
            counters: Counters { hits: vec![0; n], prefetch_hits: vec![0; n], ..Counters::default() },
            caps,
            budget,
            staged: 0,
            entries: HashMap::new(),
            tick: 0,
            inflight: HashSet::new(),
            window: Window::default(),
            by_next: BTreeSet::new(),
            dropped: Vec::new(),
        }
    }

    fn bump(&mut self, id: u32) {
        self.tick += 1;
        let tick = self.tick;
        if let Some(e) = self.entries.get_mut(&id) {
            self.lru[e.level].remove(&e.tick);
            e.tick = tick;
            self.lru[e.level].insert(tick, id);
        }
    }

    /// A read of `[offset, offset + len)` of object `id` (of `size` bytes when known): counts a
    /// hit or a miss (reads at offset 0 are the accesses; one that had to wait for its copy to
    /// arrive, `waited`, is a miss and a late prefetch), moves the clairvoyant cursor, and
    /// drops a staged sample once read to its end.
    pub(crate) fn lookup(&mut self, id: u32, offset: u64, len: usize, waited: bool) -> Lookup {
        let access = offset == 0;
        if access && !waited && self.policy == CachePolicy::Clairvoyant {
            self.window.access(id);
            self.renew(id);
        }
        let Some(e) = self.entries.get_mut(&id) else {
            if self.inflight.contains(&id) {
                return Lookup::Pending;
            }
            if access {
                self.counters.misses += 1;
            }
            return Lookup::Miss;
        };
        if !e.ready {
            return Lookup::Pending;
        }
        let (level, size) = (e.level, e.size);
        if access && waited {
            e.used = true;
            self.counters.misses += 1;
            self.counters.late += 1;
        } else if access {
            if !e.used {
                e.used = true;
                if let Some(at) = e.prefetched {
                    self.counters.prefetch_hits[level] += 1;
                    self.counters.lead_seconds_sum += at.elapsed().as_secs_f64();
                    self.counters.lead_count += 1;
                } else {
                    self.counters.hits[level] += 1;
                }
            } else {
                self.counters.hits[level] += 1;
            }
        }
        let found = match &e.data {
            Some(d) => Lookup::Memory(Arc::clone(d)),
            None => Lookup::Dir(level),
        };
        let done = offset.saturating_add(len as u64) >= size;
        if !e.placed && done {
            // A staged sample is read once: its room goes back to the prefetcher. Its bytes
            // were handed out above (memory), so dropping the entry is safe.
            if let Some(e) = self.entries.remove(&id) {
                self.lru[e.level].remove(&e.tick);
                self.used[e.level] -= e.size;
                self.staged -= e.size;
                self.by_next.remove(&(e.next, id));
            }
        } else {
            self.bump(id);
        }
        found
    }

    /// Clairvoyant: `id`'s next read from the window, in its entry and the eviction order.
    fn renew(&mut self, id: u32) {
        let next = self.window.next_use(id);
        if let Some(e) = self.entries.get_mut(&id) {
            if e.placed {
                self.by_next.remove(&(e.next, id));
                self.by_next.insert((next, id));
            }
            e.next = next;
        }
    }

    /// Counts the bytes a read moved.
    pub(crate) fn count_bytes(&mut self, hit: bool, bytes: u64) {
        if hit {
            self.counters.hit_bytes += bytes;
        } else {
            self.counters.miss_bytes += bytes;
        }
    }

    /// Bytes of `level`'s copies that are written and ready to serve.
    pub(crate) fn ready_bytes(&self, level: usize) -> u64 {
        self.entries.values().filter(|e| e.level == level && e.ready).map(|e| e.size).sum()
    }

    fn room_placed(&self, level: usize) -> u64 {
        let reserve = if level == 0 { self.budget.saturating_sub(self.staged) } else { 0 };
        self.caps[level].saturating_sub(self.used[level] + reserve)
    }

    fn reserve(&mut self, id: u32, level: usize, size: u64, placed: bool, prefetched: bool) {
        self.used[level] += size;
        debug_assert!(self.used[level] <= self.caps[level], "level {level} over capacity");
        if !placed {
            self.staged += size;
        }
        self.tick += 1;
        let used = !prefetched;
        let prefetched = prefetched.then(Instant::now);
        let next = if self.policy == CachePolicy::Clairvoyant { self.window.next_use(id) } else { NEVER };
        if placed && self.policy == CachePolicy::Clairvoyant {
            self.by_next.insert((next, id));
        }
        self.entries.insert(
            id,
            Entry { level, size, data: None, ready: false, placed, prefetched, used, next, tick: self.tick },
        );
        self.lru[level].insert(self.tick, id);
    }

    /// Removes `id`'s copy (counting it as evicted, and unused if the prefetcher brought it
    /// and nobody read it), returning what the tier must delete.
    pub(crate) fn evict(&mut self, id: u32) -> Option<Victim> {
        let e = self.entries.remove(&id)?;
        self.lru[e.level].remove(&e.tick);
        self.by_next.remove(&(e.next, id));
        self.used[e.level] -= e.size;
        if !e.placed {
            self.staged -= e.size;
        }
        self.counters.evictions += 1;
        if e.prefetched.is_some() && !e.used {
            self.counters.unused_evicted += 1;
            self.counters.unused_evicted_bytes += e.size;
        }
        Some(Victim { id, level: e.level, size: e.size })
    }

    /// Decides whether object `id` of `size` bytes, just read on a miss (`prefetch` false) or
    /// picked by the prefetcher (`prefetch` true), is kept, and where; reserves its room.
    pub(crate) fn admit(&mut self, id: u32, size: u64, prefetch: bool) -> Admission {
        let mut out = Admission::default();
        if self.entries.contains_key(&id) || self.caps.is_empty() {
            return out;
        }
        match self.policy {
            CachePolicy::None => {}
            CachePolicy::Static => {
                if let Some(level) = (0..self.caps.len()).find(|&l| self.used[l] + size <= self.caps[l]) {
                    self.reserve(id, level, size, true, prefetch);
                    out.level = Some(level);
                }
            }
            CachePolicy::Lru => {
                if size > self.caps[0] {
                    return out;
                }
                self.make_room_lru(0, size, &mut out);
                if self.used[0] + size <= self.caps[0] {
                    self.reserve(id, 0, size, true, prefetch);
                    out.level = Some(0);
                }
            }
            CachePolicy::Clairvoyant => {
                // Belady: kept if it is read again before a copy that would have to make room
                // for it (those read furthest in the future, or never in the window, go).
                let next = self.window.next_use(id);
                if next != NEVER {
                    if let Some((level, victims)) = self.room_before(next, size, prefetch) {
                        for v in victims {
                            out.victims.extend(self.evict(v));
                        }
                        self.reserve(id, level, size, true, prefetch);
                        out.level = Some(level);
                    }
                }
            }
        }
        out
    }

    /// Clairvoyant: the first level with room for `size` bytes for a copy read next at `next`,
    /// counting the room of ready placed copies read later than that (or, for a prefetch,
    /// never again in the window: a prefetch never costs a later reuse), and those copies,
    /// the furthest first. Prefetched copies not read yet are kept: their bytes are spent, and
    /// dropping one costs a read as not keeping the new copy does. `None` when no level has
    /// that room.
    fn room_before(&self, next: u64, size: u64, prefetch: bool) -> Option<(usize, Vec<u32>)> {
        let limit = if prefetch { NEVER } else { next.saturating_add(1) };
        for level in 0..self.caps.len() {
            let mut free = self.room_placed(level);
            let mut victims = Vec::new();
            for &(t, id) in self.by_next.iter().rev() {
                if free >= size || t < limit {
                    break;
                }
                let unread_prefetch = |e: &&Entry| e.prefetched.is_some() && !e.used;
                if let Some(e) = self.entries.get(&id).filter(|e| e.level == level && e.ready && !unread_prefetch(e)) {
                    free += e.size;
                    victims.push(id);
                }
            }
            if free >= size {
                return Some((level, victims));
            }
        }
        None
    }

    /// LRU: frees `size` bytes in `level` by moving its least recently used ready copies down
    /// a level (memory copies into the next level, evicting there in turn) or out.
    fn make_room_lru(&mut self, level: usize, size: u64, out: &mut Admission) {
        while self.used[level] + size > self.caps[level] {
            let Some(id) = self.lru[level].values().copied().find(|id| self.entries.get(id).is_some_and(|e| e.ready))
            else {
                return; // only copies still being written: no room now
            };
            let data = self.entries.get(&id).and_then(|e| e.data.clone());
            let Some(victim) = self.evict(id) else { return };
            let next = level + 1;
            match data {
                Some(data) if next < self.caps.len() && victim.size <= self.caps[next] => {
                    self.counters.evictions -= 1; // moved, not dropped
                    self.make_room_lru(next, victim.size, out);
                    if self.used[next] + victim.size <= self.caps[next] {
                        self.reserve(id, next, victim.size, true, false);
                        if let Some(e) = self.entries.get_mut(&id) {
                            e.used = true;
                        }
                        out.demotions.push(Demotion { id, level: next, data });
                    } else {
                        self.counters.evictions += 1;
                    }
                }
                _ => out.victims.push(victim),
            }
        }
    }

    /// The copy of `id` is in place: readable from now on.
    pub(crate) fn complete(&mut self, id: u32, data: Option<Arc<[u8]>>) {
        if let Some(e) = self.entries.get_mut(&id) {
            e.data = data;
            e.ready = true;
        }
    }

    /// The copy of `id` could not be made: gives its room back.
    pub(crate) fn abandon(&mut self, id: u32) {
        if let Some(e) = self.entries.remove(&id) {
            self.lru[e.level].remove(&e.tick);
            self.by_next.remove(&(e.next, id));
            self.used[e.level] -= e.size;
            if !e.placed {
                self.staged -= e.size;
            }
        }
    }

    /// Moves the clairvoyant window to epochs `first..first + orders.len()` (`orders[k]`: per
    /// rank sharing the cache, its samples of that epoch in order) and renews every copy's next
    /// read. Returns the staged copies no longer read in the window (to drop).
    pub(crate) fn set_window(&mut self, first: u64, orders: Vec<Vec<Vec<u32>>>, ids: usize) -> Vec<Victim> {
        self.window.set(first, orders, ids);
        self.by_next.clear();
        let all: Vec<u32> = self.entries.keys().copied().collect();
        for &id in &all {
            let next = self.window.next_use(id);
            if let Some(e) = self.entries.get_mut(&id) {
                e.next = next;
                if e.placed {
                    self.by_next.insert((next, id));
                }
            }
        }
        let gone: Vec<u32> = all
            .into_iter()
            .filter(|id| self.entries.get(id).is_some_and(|e| e.ready && !e.placed && e.next == NEVER))
            .collect();
        gone.into_iter().filter_map(|id| self.evict(id)).collect()
    }

    /// The prefetcher's next object: the first one in the node's time order from the
    /// prefetcher's place on that is neither read, cached nor being fetched, if it may come in
    /// now: as a placed copy where a level has free room (or room held by copies not read
    /// again in the window, dropped for it into [`State::dropped`]), else as a staged copy
    /// within the prefetch budget. `None` when the next one must wait (or nothing is left).
    pub(crate) fn next_prefetch(&mut self, sizes: &[u64]) -> Option<(u32, u64)> {
        if self.policy != CachePolicy::Clairvoyant {
            return None;
        }
        loop {
            let (entries, inflight) = (&self.entries, &self.inflight);
            let (id, next) = self.window.peek(|id| entries.contains_key(&id) || inflight.contains(&id))?;
            let size = sizes.get(id as usize).copied().unwrap_or(u64::MAX);
            if size == u64::MAX {
                self.window.advance(); // size unknown: read on demand
                continue;
            }
            if let Some((level, victims)) = self.room_before(next, size, true) {
                for v in victims {
                    let dropped = self.evict(v);
                    self.dropped.extend(dropped);
                }
                self.reserve(id, level, size, true, true);
            } else if self.staged + size <= self.budget && self.used[0] + size <= self.caps[0] {
                self.reserve(id, 0, size, false, true);
            } else {
                return None;
            }
            self.window.advance();
            self.inflight.insert(id);
            self.counters.prefetched += 1;
            self.counters.prefetched_bytes += size;
            return Some((id, size));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `order` (ids, each of `size` bytes) through a state without prefetch: every miss is
    /// admitted as the tier does. Returns the hits.
    fn replay(st: &mut State, order: &[u32], size: u64) -> u64 {
        let before: u64 = st.counters.hits.iter().sum();
        for &id in order {
            if let Lookup::Miss = st.lookup(id, 0, size as usize + 1, false) {
                let adm = st.admit(id, size, false);
                if let Some(level) = adm.level {
                    st.complete(id, (level == 0).then(|| Arc::from(vec![0u8; size as usize])));
                }
                for d in adm.demotions {
                    st.complete(d.id, None);
                }
            }
            for (l, &u) in st.used.iter().enumerate() {
                assert!(u <= st.caps[l], "level {l}: {u} > {}", st.caps[l]);
            }
        }
        st.counters.hits.iter().sum::<u64>() - before
    }

    fn shuffled(n: u32, seed: u64) -> Vec<u32> {
        ringtier_dataset::Sampler::new(n as usize, seed, 0, 1, true).expect("sampler").epoch(0)
    }

    #[test]
    fn lru_on_repeated_scans_and_static_keep_what_they_say() {
        // A cyclic scan of 10 ids through room for 4: LRU always evicts the next one read
        // (0 hits), static keeps the first 4 (4 hits a pass).
        let order: Vec<u32> = (0..3).flat_map(|_| 0..10u32).collect();
        let mut lru = State::new(CachePolicy::Lru, vec![40], 0);
        assert_eq!(replay(&mut lru, &order, 10), 0);
        let mut st = State::new(CachePolicy::Static, vec![40], 0);
        assert_eq!(replay(&mut st, &order, 10), 8);
        // Working set that fits: everything after the first pass hits, either way.
        let order: Vec<u32> = (0..3).flat_map(|_| 0..4u32).collect();
        let mut lru = State::new(CachePolicy::Lru, vec![40], 0);
        assert_eq!(replay(&mut lru, &order, 10), 8);
        let mut none = State::new(CachePolicy::None, vec![40], 0);
        assert_eq!(replay(&mut none, &order, 10), 0);
    }

    #[test]
    fn shuffled_epochs_lru_hits_about_c_squared_over_2_static_c() {
        // 20,000 ids, cache c = 0.25, epoch 1 after a cold epoch 0: LRU about c²/2 (3.1%),
        // static c (25%), within sampling noise.
        let n = 20_000u32;
        let c = 0.25;
        let cap = (n as f64 * c) as u64;
        let (e0, e1) = (shuffled(n, 1), shuffled(n, 2));
        let mut lru = State::new(CachePolicy::Lru, vec![cap], 0);
        replay(&mut lru, &e0, 1);
        let lru_ratio = replay(&mut lru, &e1, 1) as f64 / n as f64;
        assert!((lru_ratio - c * c / 2.0).abs() < 0.01, "lru {lru_ratio}");
        let mut st = State::new(CachePolicy::Static, vec![cap], 0);
        replay(&mut st, &e0, 1);
        let st_ratio = replay(&mut st, &e1, 1) as f64 / n as f64;
        assert!((st_ratio - c).abs() < 0.01, "static {st_ratio}");
    }

    #[test]
    fn lru_demotes_memory_copies_to_the_next_level() {
        // Memory for 2, directory for 3: a scan of 5 ids then the same 5 again hits all 5
        // (the 2 most recent in memory, 3 in the directory).
        let order: Vec<u32> = (0..2).flat_map(|_| 0..5u32).collect();
        let mut st = State::new(CachePolicy::Lru, vec![20, 30], 0);
        assert_eq!(replay(&mut st, &order, 10), 5);
        assert_eq!(st.used, vec![20, 30]);
        assert!(st.counters.hits[1] > 0, "{:?}", st.counters);
    }

    /// Per epoch, per local rank: the shards of ranks `0..local` of a job of `world` ranks.
    fn shards(n: usize, seed: u64, local: usize, world: usize, epoch: u64) -> Vec<Vec<u32>> {
        (0..local)
            .map(|r| ringtier_dataset::Sampler::new(n, seed, r, world, true).expect("sampler").epoch(epoch))
            .collect()
    }

    /// The node's reads of one epoch in time order (rank k's p-th read at p * ranks + k).
    fn node_order(shards: &[Vec<u32>]) -> Vec<u32> {
        let longest = shards.iter().map(Vec::len).max().unwrap_or(0);
        (0..longest).flat_map(|p| shards.iter().filter_map(move |s| s.get(p).copied())).collect()
    }

    /// Reuse hits per epoch of the clairvoyant policy (no prefetch) on the node's reads over
    /// `epochs`, its window moved at each epoch start, and of static on the same reads.
    fn clairvoyant_and_static(n: usize, cap: u64, local: usize, world: usize, epochs: u64) -> (Vec<u64>, Vec<u64>) {
        let mut cv = State::new(CachePolicy::Clairvoyant, vec![cap], 0);
        let mut st = State::new(CachePolicy::Static, vec![cap], 0);
        let (mut cv_hits, mut st_hits) = (Vec::new(), Vec::new());
        for e in 0..epochs {
            let orders: Vec<Vec<Vec<u32>>> = (e..e + 3).map(|w| shards(n, 5, local, world, w)).collect();
            let order = node_order(&orders[0]);
            assert!(cv.set_window(e, orders, n).is_empty());
            cv_hits.push(replay(&mut cv, &order, 1));
            st_hits.push(replay(&mut st, &order, 1));
        }
        (cv_hits, st_hits)
    }

    #[test]
    fn belady_keeps_the_copies_read_soonest() {
        // One reader, room for 2 of 4: epoch 0 reads 0 1 2 3, epoch 1 reads 3 2 1 0. Belady
        // keeps 2 and 3 (read first in epoch 1) in place of 0 and 1: 2 hits, as static's 0 and
        // 1 give (every sample read once an epoch: no policy holds more than the cache across
        // the epoch's boundary).
        let mut st = State::new(CachePolicy::Clairvoyant, vec![20], 0);
        assert!(st.set_window(0, vec![vec![vec![0, 1, 2, 3]], vec![vec![3, 2, 1, 0]]], 4).is_empty());
        assert_eq!(replay(&mut st, &[0, 1, 2, 3], 10), 0);
        let mut kept: Vec<u32> = st.entries.keys().copied().collect();
        kept.sort_unstable();
        assert_eq!(kept, [2, 3]);
        assert_eq!(replay(&mut st, &[3, 2], 10), 2);
        // 1 and 0 are not read again in the window: not admitted.
        assert_eq!(replay(&mut st, &[1, 0], 10), 0);
        assert!(!st.entries.contains_key(&1) && !st.entries.contains_key(&0));
        assert_eq!(st.counters.evictions, 2);
    }

    #[test]
    fn a_node_that_reads_everything_each_epoch_is_bounded_by_c_and_static_reaches_it() {
        // 4 ranks, the whole job on one node sharing a cache of 10%: every sample is read once
        // an epoch by the node, so at each epoch boundary every reuse is pending and at most
        // the cache's worth of them can be held: reuse hits per warm epoch <= c, for any policy.
        let n = 8000usize;
        let cap = (n / 10) as u64;
        let (cv, st) = clairvoyant_and_static(n, cap, 4, 4, 4);
        for e in 1..4 {
            assert!(cv[e] <= cap, "epoch {e}: {} hits above the bound {cap}", cv[e]);
            assert!(cv[e] as f64 >= 0.97 * cap as f64, "epoch {e}: clairvoyant {} well below {cap}", cv[e]);
            assert!((st[e] as f64 - cap as f64).abs() <= 0.03 * cap as f64, "epoch {e}: static {}", st[e]);
        }
    }

    #[test]
    fn a_node_of_a_larger_job_beats_static_with_belady_on_its_ranks_union() {
        // The first node (4 ranks) of a 16-rank job: the node reads a quarter of the dataset an
        // epoch, a different quarter each time. Static keeps the first 10% it read and hits
        // about c of its reads; Belady on the node's union keeps what the node reads next.
        let n = 8000usize;
        let cap = (n / 10) as u64;
        let (cv, st) = clairvoyant_and_static(n, cap, 4, 16, 4);
        let (cv_warm, st_warm): (u64, u64) = (cv[1..].iter().sum(), st[1..].iter().sum());
        let reads = 3.0 * n as f64 / 4.0;
        assert!((st_warm as f64 / reads - 0.1).abs() < 0.02, "static {st_warm} of {reads}");
        assert!(cv_warm as f64 >= 2.0 * st_warm as f64, "clairvoyant {cv:?} vs static {st:?}");
    }

    #[test]
    fn the_prefetcher_fills_free_room_in_time_order_and_never_displaces_a_reuse() {
        // One reader, room for 3, no staged budget. Window: 0 1 2 3 4, then 4 3 2 1 (0 is not
        // read in the second epoch).
        let sizes = vec![10u64; 5];
        let mut st = State::new(CachePolicy::Clairvoyant, vec![30], 0);
        st.set_window(0, vec![vec![vec![0, 1, 2, 3, 4]], vec![vec![4, 3, 2, 1]]], 5);
        // Free room: 0, 1, 2 come in, placed; then the cache is full of copies read again.
        assert_eq!(st.next_prefetch(&sizes), Some((0, 10)));
        assert_eq!(st.next_prefetch(&sizes), Some((1, 10)));
        assert_eq!(st.next_prefetch(&sizes), Some((2, 10)));
        assert_eq!(st.next_prefetch(&sizes), None);
        assert_eq!(st.used, vec![30]);
        for id in 0..3 {
            st.inflight.remove(&id);
            st.complete(id, Some(Arc::from(vec![0u8; 10])));
        }
        // Reading 0 (its last read in the window) leaves its copy with no future: it makes room
        // for the next prefetch, 3.
        assert!(matches!(st.lookup(0, 0, 11, false), Lookup::Memory(..)));
        assert_eq!(st.counters.prefetch_hits[0], 1);
        assert_eq!(st.next_prefetch(&sizes), Some((3, 10)));
        assert_eq!(st.dropped.len(), 1);
        assert!(!st.entries.contains_key(&0));
        assert_eq!(st.used, vec![30]);
        // A staged budget lets samples come in past a full cache, dropped once read.
        let mut st = State::new(CachePolicy::Clairvoyant, vec![30], 10);
        st.set_window(0, vec![vec![vec![0, 1, 2]], vec![vec![0, 1, 2]]], 5);
        assert_eq!(st.next_prefetch(&sizes), Some((0, 10)));
        assert_eq!(st.next_prefetch(&sizes), Some((1, 10)));
        assert_eq!(st.next_prefetch(&sizes), Some((2, 10)), "staged, within the budget");
        assert_eq!(st.staged, 10);
    }
}
