//! The node's future: when each sample will be read, over a window of epochs, by the ranks
//! that share a cache (one rank, or every rank of a node). Computed from the samplers (the
//! shared seed), so no rank asks another anything.
//!
//! Time runs on one clock for the node: in an epoch, rank `k` of the `n` sharing the cache
//! reads its `p`-th sample at `p * n + k` (the ranks advance together, a step at a time), and
//! epoch `e` starts at `e * span`. Every sample is read at most once per epoch by the node,
//! so a read is placed in time by the first epoch of the window where that sample is still
//! unread.

use super::state::NO_POS;

/// No further read in the window.
pub(crate) const NEVER: u64 = u64::MAX;

/// Reads of the window's epochs, by sample.
#[derive(Debug, Default)]
pub(crate) struct Window {
    /// The window's first epoch.
    first: u64,
    /// Times per epoch: ranks x the longest shard.
    span: u64,
    /// Per epoch of the window: each sample's time in the epoch, or [`NO_POS`].
    at: Vec<Vec<u32>>,
    /// Per epoch of the window: read already.
    read: Vec<Vec<bool>>,
    /// Per epoch of the window: the samples in time order.
    order: Vec<Vec<u32>>,
    /// The prefetcher's place: (epoch of the window, index into its order).
    pub(crate) next: (usize, usize),
}

impl Window {
    /// The window's first epoch and its epochs' count.
    pub(crate) fn range(&self) -> (u64, usize) {
        (self.first, self.at.len())
    }

    /// Moves the window to epochs `first..first + orders.len()`: `orders[k]` gives, per rank
    /// sharing the cache, that rank's samples of epoch `first + k` in order; `ids` is the
    /// number of samples. Read marks of epochs still in the window are kept.
    pub(crate) fn set(&mut self, first: u64, orders: Vec<Vec<Vec<u32>>>, ids: usize) {
        let mut at = Vec::with_capacity(orders.len());
        let mut read = Vec::with_capacity(orders.len());
        let mut order = Vec::with_capacity(orders.len());
        let mut span = 0u64;
        for (k, ranks) in orders.iter().enumerate() {
            let n = ranks.len().max(1);
            let longest = ranks.iter().map(Vec::len).max().unwrap_or(0);
            span = span.max((longest * n) as u64);
            let mut times = vec![NO_POS; ids];
            let mut seq = vec![u32::MAX; longest * n];
            for (r, shard) in ranks.iter().enumerate() {
                for (p, &id) in shard.iter().enumerate() {
                    let t = p * n + r;
                    if let Some(slot) = times.get_mut(id as usize) {
                        *slot = t as u32;
                        seq[t] = id;
                    }
                }
            }
            seq.retain(|&id| id != u32::MAX);
            let epoch = first + k as u64;
            let kept = epoch.checked_sub(self.first).map(|old| old as usize).filter(|&old| old < self.read.len());
            read.push(match kept {
                Some(old) => std::mem::take(&mut self.read[old]),
                None => vec![false; ids],
            });
            at.push(times);
            order.push(seq);
        }
        // The prefetcher's place, moved with the window (or back to its start).
        let next = match (self.first + self.next.0 as u64).checked_sub(first) {
            Some(k) if (k as usize) < at.len() => (k as usize, self.next.1),
            _ => (0, 0),
        };
        *self = Window { first, span: span.max(1), at, read, order, next };
    }

    /// Marks `[0, position)` of a rank's shard of `epoch` read (a resumed epoch skips them).
    pub(crate) fn mark_read(&mut self, epoch: u64, shard: &[u32]) {
        let Some(k) = self.index(epoch) else { return };
        for &id in shard {
            if let Some(r) = self.read[k].get_mut(id as usize) {
                *r = true;
            }
        }
    }

    fn index(&self, epoch: u64) -> Option<usize> {
        epoch.checked_sub(self.first).map(|k| k as usize).filter(|&k| k < self.at.len())
    }

    fn first_unread(&self, id: u32) -> Option<usize> {
        let i = id as usize;
        (0..self.at.len()).find(|&k| self.at[k].get(i).is_some_and(|&t| t != NO_POS) && !self.read[k][i])
    }

    /// A read of `id`: marks it read in the first window epoch where it was still unread.
    /// False when the window has no read of it left (a read outside the samplers' order).
    pub(crate) fn access(&mut self, id: u32) -> bool {
        match self.first_unread(id) {
            Some(k) => {
                self.read[k][id as usize] = true;
                true
            }
            None => false,
        }
    }

    /// When `id` is read next (node time), or [`NEVER`] within the window.
    pub(crate) fn next_use(&self, id: u32) -> u64 {
        match self.first_unread(id) {
            Some(k) => (self.first + k as u64) * self.span + u64::from(self.at[k][id as usize]),
            None => NEVER,
        }
    }

    /// The next sample in time order from the prefetcher's place on that is not read yet and
    /// for which `skip` is false, without moving the place; `None` at the window's end.
    pub(crate) fn peek(&mut self, mut skip: impl FnMut(u32) -> bool) -> Option<(u32, u64)> {
        let (mut k, mut i) = self.next;
        while k < self.order.len() {
            while i < self.order[k].len() {
                let id = self.order[k][i];
                if !self.read[k][id as usize] && !skip(id) {
                    self.next = (k, i);
                    return Some((id, (self.first + k as u64) * self.span + u64::from(self.at[k][id as usize])));
                }
                i += 1;
            }
            k += 1;
            i = 0;
        }
        self.next = (k, i);
        None
    }

    /// Moves the prefetcher's place past the sample [`Window::peek`] gave.
    pub(crate) fn advance(&mut self) {
        self.next.1 += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_placed_in_node_time_across_ranks_and_epochs() {
        // Two ranks, 4 samples; epoch 0: rank 0 reads 0, 2; rank 1 reads 1, 3. Epoch 1: rank 0
        // reads 3, 1; rank 1 reads 2, 0.
        let mut w = Window::default();
        w.set(0, vec![vec![vec![0, 2], vec![1, 3]], vec![vec![3, 1], vec![2, 0]]], 4);
        assert_eq!(w.next_use(0), 0);
        assert_eq!(w.next_use(3), 3);
        assert!(w.access(0));
        // 0's next read: epoch 1 (span 4), rank 1's second (1 * 2 + 1).
        assert_eq!(w.next_use(0), 4 + 3);
        assert!(w.access(0));
        assert_eq!(w.next_use(0), NEVER);
        assert!(!w.access(0));
        // The window slides: epoch 1's marks stay, epoch 2 is new.
        w.set(1, vec![vec![vec![3, 1], vec![2, 0]], vec![vec![0, 1], vec![2, 3]]], 4);
        assert_eq!(w.next_use(0), 2 * 4);
        assert_eq!(w.next_use(1), 4 + 2);
        // The prefetcher walks node time, skipping what is read or what it is told to.
        assert_eq!(w.peek(|id| id == 3), Some((2, 5)));
        w.advance();
        assert_eq!(w.peek(|_| false), Some((1, 6)));
    }
}
