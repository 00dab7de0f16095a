//! The cache's bookkeeping, without I/O: which objects are where, the bytes each level holds
//! (never above its capacity), the policies' admission and eviction, the clairvoyant
//! placement and the prefetcher's next pick. [`super::tier`] does the I/O around it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

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

/// The rank's future: the order of its reads over the lookahead window.
#[derive(Debug, Default)]
pub(crate) struct Future {
    /// Sample ids in access order: the rest of the current epoch, then the next epochs.
    pub(crate) seq: Vec<u32>,
    /// Position of each id in the current epoch's part, or [`NO_POS`].
    pub(crate) pos: Vec<u32>,
    /// Reads of the current epoch seen so far (the furthest position read, plus one).
    pub(crate) cursor: usize,
    /// Length of the current epoch's part of `seq`.
    pub(crate) epoch_len: usize,
    /// Where the prefetcher goes on from.
    pub(crate) next: usize,
    /// Where the prefetcher's look for placed objects past a wait for the budget goes on from.
    pub(crate) next_placed: usize,
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
    /// The clairvoyant placement.
    pub(crate) placement: HashSet<u32>,
    pub(crate) future: Future,
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
            placement: HashSet::new(),
            future: Future::default(),
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
        if access && !waited {
            if let Some(&p) = self.future.pos.get(id as usize) {
                if p != NO_POS {
                    self.future.cursor = self.future.cursor.max(p as usize + 1);
                }
            }
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
            }
        } else {
            self.bump(id);
        }
        found
    }

    /// Counts the bytes a read moved.
    pub(crate) fn count_bytes(&mut self, hit: bool, bytes: u64) {
        if hit {
            self.counters.hit_bytes += bytes;
        } else {
            self.counters.miss_bytes += bytes;
        }
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
        self.entries
            .insert(id, Entry { level, size, data: None, ready: false, placed, prefetched, used, tick: self.tick });
        self.lru[level].insert(self.tick, id);
    }

    /// Removes `id`'s copy (counting it as evicted, and unused if the prefetcher brought it
    /// and nobody read it), returning what the tier must delete.
    pub(crate) fn evict(&mut self, id: u32) -> Option<Victim> {
        let e = self.entries.remove(&id)?;
        self.lru[e.level].remove(&e.tick);
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
                if self.placement.contains(&id) {
                    if let Some(level) = (0..self.caps.len()).find(|&l| size <= self.room_placed(l)) {
                        self.reserve(id, level, size, true, prefetch);
                        out.level = Some(level);
                    }
                } else if prefetch && self.staged + size <= self.budget && self.used[0] + size <= self.caps[0] {
                    self.reserve(id, 0, size, false, true);
                    out.level = Some(0);
                }
            }
        }
        out
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
            self.used[e.level] -= e.size;
            if !e.placed {
                self.staged -= e.size;
            }
        }
    }

    /// Installs the rank's future (`seq`: the rest of the current epoch, `epoch_len` long, then
    /// the next epochs) and, for the clairvoyant policy, places the samples with the most reads
    /// in it that a kept copy would serve (all of a cached sample's, all but the first of
    /// another's; ties: those already cached, then the soonest such read) within the levels'
    /// capacity minus the prefetch budget. Returns the copies dropped: placed ones no longer placed, and
    /// staged ones not read in the rest of this epoch.
    pub(crate) fn set_future(&mut self, seq: Vec<u32>, epoch_len: usize, ids: usize, sizes: &[u64]) -> Vec<Victim> {
        let mut pos = vec![NO_POS; ids];
        for (p, &id) in seq[..epoch_len].iter().enumerate() {
            pos[id as usize] = p as u32;
        }
        self.future = Future { seq, epoch_len, pos, cursor: 0, next: 0, next_placed: 0 };
        let mut victims = Vec::new();
        if self.policy != CachePolicy::Clairvoyant {
            return victims;
        }
        // Reads in the window that a copy kept now would serve: every read of a sample cached
        // now, all but the first of one that is not (that read brings it in, or the prefetcher
        // does, at the same cost to the slow tier). Ties: cached first, then the soonest such read.
        let mut freq = vec![0u32; ids];
        let mut first = vec![u32::MAX; ids];
        let mut second = vec![u32::MAX; ids];
        for (p, &id) in self.future.seq.iter().enumerate() {
            let i = id as usize;
            freq[i] += 1;
            if first[i] == u32::MAX {
                first[i] = p as u32;
            } else if second[i] == u32::MAX {
                second[i] = p as u32;
            }
        }
        let cached: Vec<bool> = (0..ids as u32).map(|i| self.entries.get(&i).is_some_and(|e| e.placed)).collect();
        let served = |i: usize| freq[i].saturating_sub(u32::from(!cached[i]));
        let mut order: Vec<u32> = (0..ids as u32).filter(|&i| served(i as usize) > 0).collect();
        order.sort_by_key(|&i| {
            let i = i as usize;
            (std::cmp::Reverse(served(i)), !cached[i], if cached[i] { first[i] } else { second[i] })
        });
        let mut room = self.caps.iter().sum::<u64>().saturating_sub(self.budget);
        let mut placement = HashSet::new();
        for i in order {
            let size = sizes[i as usize];
            if size <= room {
                room -= size;
                placement.insert(i);
            }
        }
        self.placement = placement;
        let drop: Vec<u32> = self
            .entries
            .iter()
            .filter(|(id, e)| {
                e.ready
                    && if e.placed { !self.placement.contains(id) } else { self.future.pos[**id as usize] == NO_POS }
            })
            .map(|(&id, _)| id)
            .collect();
        for id in drop {
            victims.extend(self.evict(id));
        }
        // Staged copies that are now placed become part of the placement.
        let staged_now_placed: Vec<u32> =
            self.entries.iter().filter(|(id, e)| !e.placed && self.placement.contains(id)).map(|(&id, _)| id).collect();
        for id in staged_now_placed {
            if let Some(e) = self.entries.get_mut(&id) {
                e.placed = true;
                self.staged -= e.size;
            }
        }
        victims
    }

    /// The prefetcher's next object: the first one in access order from the cursor on that is
    /// neither cached nor being fetched, if it may come in now (placed, or within the budget);
    /// when the next unplaced one must wait for the budget, the next placed one further on
    /// (placed copies need no budget). `None` when nothing may come in now.
    pub(crate) fn next_prefetch(&mut self, sizes: &[u64]) -> Option<(u32, u64)> {
        if self.policy != CachePolicy::Clairvoyant {
            return None;
        }
        let mut p = self.future.next.max(self.future.cursor);
        let mut blocked = false;
        while p < self.future.seq.len() {
            let id = self.future.seq[p];
            if self.entries.contains_key(&id) || self.inflight.contains(&id) {
                p += 1;
                continue;
            }
            if self.take(id, sizes[id as usize]) {
                self.future.next = p + 1;
                return Some((id, sizes[id as usize]));
            }
            if self.placement.contains(&id) {
                // Placed, but no level has room for it now (sizes): read on demand.
                p += 1;
                continue;
            }
            blocked = true;
            break;
        }
        self.future.next = p;
        if !blocked {
            return None;
        }
        // Placed objects further on in this epoch do not wait for the budget. (Those of later
        // epochs come in order: fetched early they would take the slow tier's bandwidth from
        // this epoch's reads, and the placement may change before they are read.)
        let mut q = self.future.next_placed.max(p + 1);
        while q < self.future.epoch_len {
            let id = self.future.seq[q];
            q += 1;
            if !self.placement.contains(&id) || self.entries.contains_key(&id) || self.inflight.contains(&id) {
                continue;
            }
            if self.take(id, sizes[id as usize]) {
                self.future.next_placed = q;
                return Some((id, sizes[id as usize]));
            }
        }
        self.future.next_placed = q;
        None
    }

    /// Admits `id` for the prefetcher and marks it in flight; false when it may not come in.
    fn take(&mut self, id: u32, size: u64) -> bool {
        let adm = self.admit(id, size, true);
        debug_assert!(adm.victims.is_empty() && adm.demotions.is_empty());
        if adm.level.is_none() {
            return false;
        }
        self.inflight.insert(id);
        self.counters.prefetched += 1;
        self.counters.prefetched_bytes += size;
        true
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

    #[test]
    fn clairvoyant_places_the_most_frequent_of_the_window() {
        // Window: ids 0..3 read three times, 3..9 once. Room for 3 (no budget): 0, 1, 2.
        let seq = vec![3, 0, 1, 2, 4, 0, 1, 2, 5, 6, 0, 1, 2, 7, 8];
        let mut st = State::new(CachePolicy::Clairvoyant, vec![30], 0);
        let sizes = vec![10u64; 9];
        let victims = st.set_future(seq.clone(), 5, 9, &sizes);
        assert!(victims.is_empty());
        assert_eq!(st.placement, HashSet::from([0, 1, 2]));
        // Without prefetch, replaying the window: the first read of each is a miss, then 2 hits each.
        assert_eq!(replay(&mut st, &seq, 10), 6);
        // A budget is taken from the placement: room for 2 placed + 1 staged.
        let mut st = State::new(CachePolicy::Clairvoyant, vec![30], 10);
        st.set_future(seq.clone(), 5, 9, &sizes);
        assert_eq!(st.placement.len(), 2);
        // The prefetcher takes, in access order, 3 (staged: the budget), 0 and 1 (placed: no
        // budget needed), then must wait: 2 is not placed and the budget is full.
        assert_eq!(st.next_prefetch(&sizes), Some((3, 10)));
        assert_eq!(st.next_prefetch(&sizes), Some((0, 10)));
        assert_eq!(st.next_prefetch(&sizes), Some((1, 10)));
        assert_eq!(st.next_prefetch(&sizes), None);
        assert_eq!(st.future.next, 3, "waits at 2");
        assert_eq!(st.used, vec![30]);
        st.inflight.remove(&3);
        st.complete(3, Some(Arc::from(vec![0u8; 10])));
        // Reading 3 to its end frees the budget; the prefetcher goes on with 2.
        assert!(matches!(st.lookup(3, 0, 11, false), Lookup::Memory(..)));
        assert_eq!(st.counters.prefetch_hits[0], 1);
        assert_eq!(st.staged, 0);
        assert_eq!(st.next_prefetch(&sizes), Some((2, 10)));
        assert_eq!(st.used, vec![30]);
    }

    #[test]
    fn clairvoyant_per_rank_beats_static_on_four_ranks() {
        // Four ranks, a cache of 10% of the dataset on each, three epochs: what rank r reads is
        // computed from the seed alone. Static holds c; the clairvoyant placement (no
        // prefetch budget, so only reuse hits count) holds the samples this rank reads 2-3
        // times of 3: analytically (3 * (1/4)^2 * (3/4) + (1/4)^3) = 15.6% of the dataset.
        let n = 8000usize;
        let world = 4;
        let cap = (n / 10) as u64;
        let sizes = vec![1u64; n];
        for rank in 0..world {
            let s = ringtier_dataset::Sampler::new(n, 5, rank, world, true).expect("sampler");
            let epochs: Vec<Vec<u32>> = (0..3).map(|e| s.epoch(e)).collect();
            let all: Vec<u32> = epochs.concat();
            let mut st = State::new(CachePolicy::Static, vec![cap], 0);
            let static_hits = replay(&mut st, &all, 1);
            let mut cv = State::new(CachePolicy::Clairvoyant, vec![cap], 0);
            let mut cv_hits = 0;
            for e in 0..3 {
                let seq: Vec<u32> = epochs[e..].concat();
                cv.set_future(seq, epochs[e].len(), n, &sizes);
                cv_hits += replay(&mut cv, &epochs[e], 1);
            }
            // Static: c of epochs 1 and 2 (2 x 200 of 2000 reads, binomial noise ~ +-30).
            let reads = all.len() as f64;
            assert!((static_hits as f64 - 0.1 * 2.0 * reads / 3.0).abs() < 60.0, "rank {rank}: static {static_hits}");
            assert!(
                cv_hits as f64 >= 1.8 * static_hits as f64,
                "rank {rank}: clairvoyant {cv_hits} vs static {static_hits}"
            );
        }
    }
}
