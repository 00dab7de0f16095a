//! The fuzz targets' short run in CI, on the stable toolchain: every input of each committed
//! corpus (`fuzz/corpus/<target>/`), then seeded mutations of them (bit flips, truncations,
//! byte runs, length fields set to extremes, splices), through the same entry points and
//! checks as `fuzz/fuzz_targets/*.rs`. No panic, no abort (an allocation the size of a hostile
//! length would abort the test process). The coverage-guided long runs (cargo-fuzz, at least
//! 10 million executions per target) are in `docs/FUZZING.md`.
//!
//! `RINGTIER_FUZZ_MUTATIONS=N` sets the mutations per target (default 20,000).

use std::path::{Path, PathBuf};

use ringtier_testkit::SeededRng;

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus").join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    let inputs: Vec<Vec<u8>> = files.iter().filter_map(|p| std::fs::read(p).ok()).collect();
    assert!(!inputs.is_empty(), "the {target} corpus is empty");
    inputs
}

fn mutate(rng: &mut SeededRng, seed: &[u8], other: &[u8]) -> Vec<u8> {
    let mut d = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        let len = d.len() as u64;
        match rng.below(8) {
            0 if len > 0 => {
                let i = rng.below(len) as usize;
                d[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => d.truncate(rng.below(len) as usize),
            2 => {
                let at = rng.below(len + 1) as usize;
                let run =
                    vec![[0u8, 0xff, b'0', b'7', b' ', b'\n', b'<'][rng.below(7) as usize]; 1 + rng.below(64) as usize];
                d.splice(at..at, run);
            }
            3 if len >= 8 => {
                // A little-endian length field set to an extreme.
                let at = rng.below(len - 7) as usize;
                let v: u64 = [u64::MAX, 1 << 40, 1 << 62, u32::MAX as u64, 0][rng.below(5) as usize];
                d[at..at + 8].copy_from_slice(&v.to_le_bytes());
            }
            4 if len >= 12 => {
                // An ASCII number field (tar sizes, index columns) set to a huge one.
                let at = rng.below(len - 11) as usize;
                d[at..at + 12].copy_from_slice(b"77777777777\0");
            }
            5 if len >= 12 => {
                // Base-256 (the tar size field's binary form).
                let at = rng.below(len - 11) as usize;
                d[at] = 0x80 | (rng.below(2) as u8) << 6;
                for b in &mut d[at + 1..at + 12] {
                    *b = 0xff;
                }
            }
            6 if !other.is_empty() => {
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

fn run(target: &str, f: impl Fn(&[u8])) {
    let inputs = corpus(target);
    for input in &inputs {
        f(input);
    }
    let n: u64 = std::env::var("RINGTIER_FUZZ_MUTATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let mut rng = SeededRng::new(0xF022 ^ target.len() as u64);
    for _ in 0..n {
        let a = &inputs[rng.below(inputs.len() as u64) as usize];
        let b = &inputs[rng.below(inputs.len() as u64) as usize];
        f(&mutate(&mut rng, a, b));
    }
    eprintln!("{target}: {} corpus inputs, {n} mutations, no panic", inputs.len());
}

#[test]
fn tfrecord() {
    run("tfrecord", ringtier_loader::records::fuzzing::tfrecord);
}

#[test]
fn wds() {
    run("wds", ringtier_loader::records::fuzzing::wds);
}

#[test]
fn record_index() {
    run("record_index", ringtier_loader::records::fuzzing::index);
}

#[test]
fn dataset_manifest() {
    run("dataset_manifest", ringtier_dataset::fuzzing::manifest);
}

#[test]
fn ckpt_manifest() {
    run("ckpt_manifest", ringtier_migrate::fuzzing::manifest);
}

#[test]
fn s3_xml() {
    run("s3_xml", ringtier_s3::fuzzing::xml);
}
