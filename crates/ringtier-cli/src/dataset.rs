//! A generated dataset of many small files in class directories, deterministic from a seed.
//!
//! Sizes follow a log-normal distribution (median and sigma given), clipped to
//! `[min_bytes, max_bytes]`, as image datasets such as ImageNet are long-tailed. The full
//! generator with presets and a manifest is `ringtier gen` (later); this one serves the demo
//! and the tier benchmark.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::stats::Rng;

/// Shape of a generated dataset.
#[derive(Debug, Clone)]
pub(crate) struct DatasetSpec {
    pub files: usize,
    pub median_bytes: u64,
    pub sigma: f64,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub classes: usize,
    pub seed: u64,
}

impl Default for DatasetSpec {
    fn default() -> Self {
        // ImageNet-like: median 112 KB, long tail; capped so buffers stay modest.
        DatasetSpec {
            files: 2000,
            median_bytes: 112 * 1000,
            sigma: 0.6,
            min_bytes: 1024,
            max_bytes: 1 << 20,
            classes: 16,
            seed: 1,
        }
    }
}

/// One file of a dataset: its key (relative path) and size.
#[derive(Debug, Clone)]
pub(crate) struct FileEntry {
    pub key: String,
    pub size: u64,
}

/// A dataset on disk.
#[derive(Debug)]
pub(crate) struct Dataset {
    pub root: PathBuf,
    pub files: Vec<FileEntry>,
}

impl Dataset {
    pub(crate) fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    pub(crate) fn max_size(&self) -> u64 {
        self.files.iter().map(|f| f.size).max().unwrap_or(0)
    }
}

/// The sizes a spec produces, in file order.
pub(crate) fn sizes(spec: &DatasetSpec) -> Vec<u64> {
    let mut rng = Rng::new(spec.seed);
    (0..spec.files)
        .map(|_| {
            let s = (spec.median_bytes as f64) * (spec.sigma * rng.normal()).exp();
            (s as u64).clamp(spec.min_bytes, spec.max_bytes)
        })
        .collect()
}

/// Writes the dataset under `root` (created), syncs it so it can be evicted from the cache.
pub(crate) fn generate(root: &Path, spec: &DatasetSpec) -> Result<Dataset> {
    if spec.files == 0 || spec.classes == 0 {
        bail!("a dataset needs at least one file and one class");
    }
    std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    let mut rng = Rng::new(spec.seed ^ 0xDA7A);
    let mut buf = vec![0u8; spec.max_bytes as usize];
    let mut files = Vec::with_capacity(spec.files);
    for (i, size) in sizes(spec).into_iter().enumerate() {
        let key = format!("class{:03}/img{:06}.bin", i % spec.classes, i);
        let path = root.join(&key);
        if i < spec.classes {
            std::fs::create_dir_all(path.parent().unwrap_or(root))
                .with_context(|| format!("creating {}", path.display()))?;
        }
        rng.fill(&mut buf[..size as usize]);
        let mut f = std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        f.write_all(&buf[..size as usize]).with_context(|| format!("writing {}", path.display()))?;
        files.push(FileEntry { key, size });
    }
    // Write everything back so posix_fadvise(DONTNEED) can evict it before each cold pass.
    let dir = std::fs::File::open(root).with_context(|| format!("opening {}", root.display()))?;
    // SAFETY: syncfs on our own open descriptor.
    if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
        return Err(std::io::Error::last_os_error()).context("syncfs");
    }
    Ok(Dataset { root: root.to_path_buf(), files })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_deterministic_and_have_the_asked_median() {
        let spec = DatasetSpec { files: 4001, ..DatasetSpec::default() };
        let a = sizes(&spec);
        assert_eq!(a, sizes(&spec));
        let mut s = a.clone();
        s.sort();
        let median = s[s.len() / 2] as f64;
        assert!((median / 112_000.0 - 1.0).abs() < 0.05, "median {median}");
        assert!(s[0] >= 1024 && *s.last().unwrap_or(&0) <= 1 << 20);
    }

    #[test]
    fn generate_writes_files_of_the_listed_sizes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = DatasetSpec { files: 20, classes: 3, ..DatasetSpec::default() };
        let ds = generate(dir.path(), &spec).expect("generate");
        assert_eq!(ds.files.len(), 20);
        for f in &ds.files {
            assert_eq!(std::fs::metadata(dir.path().join(&f.key)).expect("stat").len(), f.size);
        }
        assert!(generate(dir.path(), &DatasetSpec { files: 0, ..spec }).is_err());
    }
}
