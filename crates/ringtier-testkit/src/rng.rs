//! Deterministic test data and schedules: [`pattern`] bytes from a seed, and [`SeededRng`], a
//! small generator whose one seed always replays the same schedule (which future to drop,
//! where to cut the power, which crash state to build).

use ringtier_core::rng::SplitMix64;

/// Deterministic test bytes: `len` bytes from `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect()
}

/// splitmix64: a small seeded generator for test schedules (which future to drop, where to
/// cut the power). One seed always gives the same sequence, so a failing seed replays.
#[derive(Debug, Clone)]
pub struct SeededRng(SplitMix64);

impl SeededRng {
    /// A generator started from `seed`.
    pub fn new(seed: u64) -> Self {
        SeededRng(SplitMix64::new(seed))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}
