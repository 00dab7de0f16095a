//! The `safetensors_header` fuzz target's short run on the stable toolchain: every input of
//! its committed corpus (`fuzz/corpus/safetensors_header/`), then seeded mutations of them
//! (bit flips, truncations, byte runs, the length field and offsets set to extremes, splices)
//! through the same entry point and checks as the target. The coverage-guided run:
//! docs/FUZZING.md. `RINGTIER_FUZZ_MUTATIONS=N` sets the mutations (default 20,000).

use std::path::Path;

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
    }
}

fn mutate(rng: &mut Rng, seed: &[u8], other: &[u8]) -> Vec<u8> {
    let mut d = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        let len = d.len() as u64;
        match rng.below(7) {
            0 if len > 0 => {
                let i = rng.below(len) as usize;
                d[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => d.truncate(rng.below(len) as usize),
            2 => {
                let at = rng.below(len + 1) as usize;
                let run =
                    vec![[0u8, 0xff, b'0', b'9', b' ', b'"', b'['][rng.below(7) as usize]; 1 + rng.below(32) as usize];
                d.splice(at..at, run);
            }
            3 if len >= 8 => {
                let v: u64 = [u64::MAX, 100_000_001, 1 << 40, len - 8, len, 0][rng.below(6) as usize];
                d[..8].copy_from_slice(&v.to_le_bytes());
            }
            4 if len > 8 => {
                // A number in the JSON set to an extreme.
                let at = 8 + rng.below(len - 8) as usize;
                if d[at].is_ascii_digit() {
                    let big =
                        ["18446744073709551615", "4294967296", "0", "9999999999999999999999"][rng.below(4) as usize];
                    d.splice(at..at + 1, big.bytes());
                }
            }
            5 if !other.is_empty() => {
                let a = rng.below(len + 1) as usize;
                let b = rng.below(other.len() as u64) as usize;
                d.truncate(a);
                d.extend_from_slice(&other[b..]);
            }
            _ => {
                let at = rng.below(len + 1) as usize;
                d.insert(at, rng.below(256) as u8);
            }
        }
    }
    d
}

#[test]
fn corpus_and_mutations_never_panic() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/safetensors_header");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    let inputs: Vec<Vec<u8>> = files.iter().filter_map(|p| std::fs::read(p).ok()).collect();
    assert!(inputs.len() >= 5, "the corpus has {} inputs", inputs.len());
    for input in &inputs {
        ringtier_safetensors::fuzzing::header(input);
    }
    let n: u64 = std::env::var("RINGTIER_FUZZ_MUTATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let mut rng = Rng(0x5afe_7e45_0125);
    for _ in 0..n {
        let a = &inputs[rng.below(inputs.len() as u64) as usize];
        let b = &inputs[rng.below(inputs.len() as u64) as usize];
        ringtier_safetensors::fuzzing::header(&mutate(&mut rng, a, b));
    }
}
