//! `--make N`: the layout of `bench/scale/make_files.py` (N files of 1-3 KB in class
//! directories, `DIR/cNNNN/NNNNNNN.bin`, file i in class i mod classes, sizes uniform in
//! [1024, 3072], each a slice of a seeded 1 MiB pool), written here so that a run needs no
//! Python. The bytes come from the bench's own generator, not Python's: the same shape, other
//! contents (`--verify-bytes` compares with the files on disk, never with a generator).

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::harness::Rng;

/// Smallest and largest file, bytes (make_files.py's).
const MIN_SIZE: usize = 1024;
const MAX_SIZE: usize = 3072;

/// Bytes of the pool the files are cut from.
const POOL_BYTES: usize = 1 << 20;

/// Writes `files` files in `classes` class directories under `dir` (created; it must be empty),
/// then syncs. Returns the bytes written.
pub(crate) fn make_files(dir: &Path, files: usize, classes: usize, seed: u64) -> Result<u64> {
    if classes == 0 || classes > 10_000 {
        bail!("--classes must be from 1 to 10,000 (cNNNN directories), not {classes}");
    }
    if files > 10_000_000 {
        bail!("--make writes at most 10,000,000 files (NNNNNNN.bin names), not {files}");
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    if std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))?.next().is_some() {
        bail!("{} is not empty: --make writes into an empty directory only", dir.display());
    }
    let t0 = Instant::now();
    let mut rng = Rng::new(seed);
    let mut pool = vec![0u8; POOL_BYTES];
    for chunk in pool.chunks_mut(8) {
        let v = rng.next_u64().to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
    for c in 0..classes {
        let d = dir.join(format!("c{c:04}"));
        std::fs::create_dir(&d).with_context(|| format!("creating {}", d.display()))?;
    }
    let mut total = 0u64;
    for i in 0..files {
        let size = MIN_SIZE + (rng.next_u64() % (MAX_SIZE - MIN_SIZE + 1) as u64) as usize;
        let at = (rng.next_u64() % (POOL_BYTES - size) as u64) as usize;
        let path = dir.join(format!("c{:04}", i % classes)).join(format!("{i:07}.bin"));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        f.write_all(&pool[at..at + size]).with_context(|| format!("writing {}", path.display()))?;
        total += size as u64;
        if i > 0 && i % 100_000 == 0 {
            eprintln!("{i} files, {:.0} s", t0.elapsed().as_secs_f64());
        }
    }
    nix::unistd::sync();
    eprintln!(
        "{files} files, {:.2} GB, in {classes} directories of {}, {:.0} s",
        total as f64 / 1e9,
        dir.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_is_make_files_py_s_and_a_full_directory_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let root = dir.path().join("d");
        let total = make_files(&root, 25, 10, 37).expect("make");
        let mut n = 0;
        let mut bytes = 0;
        for c in 0..10 {
            for e in std::fs::read_dir(root.join(format!("c{c:04}"))).expect("class dir") {
                let e = e.expect("entry");
                let name = e.file_name().into_string().expect("utf-8");
                let i: usize = name.strip_suffix(".bin").expect(".bin").parse().expect("number");
                assert_eq!(i % 10, c, "{name}");
                let len = e.metadata().expect("stat").len() as usize;
                assert!((MIN_SIZE..=MAX_SIZE).contains(&len), "{len}");
                n += 1;
                bytes += len as u64;
            }
        }
        assert_eq!((n, bytes), (25, total));
        assert!(make_files(&root, 1, 1, 37).is_err());
    }
}
