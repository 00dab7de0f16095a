//! The generator's seeded stream (xorshift64*): the bytes, sizes and pictures of a dataset
//! depend on it, so it never changes (a changed stream is a different dataset for the same
//! seed).

/// xorshift64* with a multiplied seed.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub(crate) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    pub(crate) fn normal(&mut self) -> f64 {
        let u1 = self.next_f64().max(f64::MIN_POSITIVE);
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// Fills `buf` with pseudo-random bytes.
    pub(crate) fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let x = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&x[..chunk.len()]);
        }
    }

    /// The generator of sample `i` of a dataset seeded `seed`: a sample's contents do not
    /// depend on which thread or shard writes it.
    pub(crate) fn for_sample(seed: u64, i: usize) -> Rng {
        Rng::new(seed.wrapping_mul(1_000_003).wrapping_add(i as u64 + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_never_changes() {
        // Pinned: every generated dataset is drawn from these values.
        let mut r = Rng::new(1);
        assert_eq!((r.next_u64(), r.next_u64()), (0x0D83_B3E2_9A21_487A, 0x54C4_4C79_F1FE_9D67));
        let mut buf = [0u8; 5];
        Rng::new(1).fill(&mut buf);
        assert_eq!(buf, 0x0D83_B3E2_9A21_487Au64.to_le_bytes()[..5]);
    }
}
