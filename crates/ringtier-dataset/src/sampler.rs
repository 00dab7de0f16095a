//! Seeded, sharded, resumable sampling.

use ringtier_core::error::{Error, ErrorKind, Result};

/// Which samples a rank reads in an epoch, and in what order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sampler {
    len: usize,
    seed: u64,
    rank: usize,
    world: usize,
    shuffle: bool,
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Sampler {
    /// A sampler over `len` samples for `rank` of `world`.
    pub fn new(len: usize, seed: u64, rank: usize, world: usize, shuffle: bool) -> Result<Self> {
        if world == 0 {
            return Err(Error::new(ErrorKind::InvalidInput, "world size must be at least 1"));
        }
        if rank >= world {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("rank {rank} is not below the world size {world}"),
            ));
        }
        Ok(Sampler { len, seed, rank, world, shuffle })
    }

    /// The whole epoch's order, the same on every rank (a Fisher-Yates shuffle seeded by the
    /// seed and the epoch).
    fn global_order(&self, epoch: u64) -> Vec<u32> {
        let mut v: Vec<u32> = (0..self.len as u32).collect();
        if self.shuffle {
            let mut state = mix(self.seed ^ mix(epoch.wrapping_add(0x9E37_79B9_7F4A_7C15)));
            for i in (1..v.len()).rev() {
                state = mix(state.wrapping_add(0x9E37_79B9_7F4A_7C15));
                v.swap(i, (state % (i as u64 + 1)) as usize);
            }
        }
        v
    }

    /// This rank's samples of `epoch`, in order: every `world`-th sample of the global order
    /// starting at `rank` (ranks get at most one sample more than each other; none is read
    /// twice or skipped).
    pub fn epoch(&self, epoch: u64) -> Vec<u32> {
        self.global_order(epoch).into_iter().skip(self.rank).step_by(self.world).collect()
    }

    /// This rank's samples of `epoch` from `position` on (to resume mid-epoch).
    pub fn epoch_from(&self, epoch: u64, position: usize) -> Result<Vec<u32>> {
        let all = self.epoch(epoch);
        if position > all.len() {
            return Err(Error::new(
                ErrorKind::OutOfRange,
                format!(
                    "resume position {position} is past the end of epoch {epoch} ({} samples on this rank)",
                    all.len()
                ),
            ));
        }
        Ok(all[position..].to_vec())
    }

    /// Samples of this rank per epoch.
    pub fn len(&self) -> usize {
        self.len.saturating_sub(self.rank).div_ceil(self.world)
    }

    /// True when this rank has no sample.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_different_per_epoch() {
        let s = Sampler::new(1000, 7, 0, 1, true).expect("sampler");
        assert_eq!(s.epoch(3), s.epoch(3));
        assert_ne!(s.epoch(3), s.epoch(4));
        let mut sorted = s.epoch(3);
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
        let plain = Sampler::new(5, 7, 0, 1, false).expect("sampler");
        assert_eq!(plain.epoch(9), [0, 1, 2, 3, 4]);
    }

    #[test]
    fn shards_cover_every_sample_exactly_once() {
        for (n, world) in [(1000, 3), (10, 4), (7, 7), (3, 5)] {
            let mut all = Vec::new();
            for rank in 0..world {
                let s = Sampler::new(n, 11, rank, world, true).expect("sampler");
                let e = s.epoch(2);
                assert_eq!(e.len(), s.len(), "n {n} world {world} rank {rank}");
                all.extend(e);
            }
            all.sort_unstable();
            assert_eq!(all, (0..n as u32).collect::<Vec<_>>(), "n {n} world {world}");
        }
    }

    #[test]
    fn resume_gives_exactly_the_rest() {
        let s = Sampler::new(100, 1, 1, 2, true).expect("sampler");
        let full = s.epoch(5);
        assert_eq!(s.epoch_from(5, 20).expect("resume"), &full[20..]);
        assert!(s.epoch_from(5, full.len()).expect("at end").is_empty());
        assert_eq!(s.epoch_from(5, full.len() + 1).expect_err("past end").kind(), ErrorKind::OutOfRange);
    }

    #[test]
    fn bad_world_and_rank() {
        assert!(Sampler::new(10, 0, 0, 0, true).is_err());
        assert!(Sampler::new(10, 0, 2, 2, true).is_err());
    }
}
