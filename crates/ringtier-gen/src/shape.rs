//! What a dataset looks like: its format, the presets, the spec (count, size distribution,
//! classes, seed) and the sizes it draws; with the feature `clap`, the flags that set them.

use anyhow::{bail, Result};

use crate::rng::Rng;

/// File contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// Random bytes.
    Raw,
    /// Real JPEG images.
    Jpeg,
    /// TFRecord shards of random samples (`--shards`, sample i in shard i mod shards).
    Tfrecord,
    /// WebDataset tar shards: per sample a `.bin` (random bytes) and a `.cls` (its class).
    Wds,
}

/// Named dataset shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Preset {
    /// The paper's ImageNet subset: 16,384 files, median 112 KB.
    Imagenet,
    /// Caltech-101: 9,144 files, median 12 KB.
    Caltech101,
    /// The demo's: 2,000 ImageNet-like files.
    Small,
}

/// Shape of a generated dataset.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DatasetSpec {
    /// Samples (files, or records across the shards).
    pub files: usize,
    /// Median of the log-normal sizes, in bytes.
    pub median_bytes: u64,
    /// Log-normal sigma of the sizes.
    pub sigma: f64,
    /// Smallest size: drawn sizes are clipped to it.
    pub min_bytes: u64,
    /// Largest size: drawn sizes are clipped to it.
    pub max_bytes: u64,
    /// Classes: sample i is in class i mod classes (directory `classNNNN`).
    pub classes: usize,
    /// Seed of sizes and contents.
    pub seed: u64,
    /// File contents.
    pub format: Format,
    /// Every drawn size is rounded up to a multiple of this (1: no rounding). fio reads only
    /// whole blocks of each file, so a comparison with fio at block size B uses multiples of B.
    pub size_multiple: u64,
}

impl DatasetSpec {
    /// The spec of a preset: raw bytes, seed 1, no rounding.
    pub fn preset(p: Preset) -> Self {
        let (files, median_bytes, sigma, min_bytes, max_bytes, classes) = match p {
            Preset::Imagenet => (16_384, 112_000, 0.6, 2_000, 1 << 20, 1000),
            Preset::Caltech101 => (9_144, 12_000, 0.5, 1_000, 256 << 10, 102),
            Preset::Small => (2_000, 112_000, 0.6, 1_000, 1 << 20, 16),
        };
        DatasetSpec {
            files,
            median_bytes,
            sigma,
            min_bytes,
            max_bytes,
            classes,
            seed: 1,
            format: Format::Raw,
            size_multiple: 1,
        }
    }

    /// Refuses a spec that draws nothing or whose sizes contradict each other, naming the flag.
    pub fn validate(&self) -> Result<()> {
        if self.files == 0 {
            bail!("--files must be at least 1");
        }
        if self.classes == 0 {
            bail!("--classes must be at least 1");
        }
        if self.median_bytes == 0 || self.median_bytes > self.max_bytes || self.min_bytes > self.median_bytes {
            bail!("sizes must satisfy 0 < --min <= --median <= --max-size");
        }
        if self.size_multiple == 0 || self.size_multiple > self.max_bytes {
            bail!("--size-multiple must be between 1 and --max-size");
        }
        if !(0.0..=3.0).contains(&self.sigma) {
            bail!("--sigma must be between 0 and 3");
        }
        Ok(())
    }
}

/// The sizes a spec draws, in file order.
pub fn sizes(spec: &DatasetSpec) -> Vec<u64> {
    let mut rng = Rng::new(spec.seed);
    (0..spec.files)
        .map(|_| {
            let s = (spec.median_bytes as f64) * (spec.sigma * rng.normal()).exp();
            (s as u64).clamp(spec.min_bytes, spec.max_bytes).div_ceil(spec.size_multiple.max(1))
                * spec.size_multiple.max(1)
        })
        .collect()
}

/// Parses sizes such as `4096`, `128k`, `1M`, `2G` (binary multiples).
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let m = match s[i..].to_ascii_lowercase().trim_end_matches("ib").trim_end_matches('b') {
                "" => 1,
                "k" => 1 << 10,
                "m" => 1 << 20,
                "g" => 1 << 30,
                "t" => 1u64 << 40,
                other => return Err(format!("unknown size suffix {other:?} in {s:?}")),
            };
            (&s[..i], m)
        }
        None => (s, 1),
    };
    let n: u64 = num.trim().parse().map_err(|_| format!("not a size: {s:?}"))?;
    n.checked_mul(mult).ok_or_else(|| format!("size {s:?} overflows"))
}

/// The shape of a generated dataset, as flags: each unset one is the preset's.
#[cfg(feature = "clap")]
#[derive(clap::Args, Debug, Clone)]
pub struct ShapeArgs {
    /// Number of files (default: the preset's).
    #[arg(long)]
    pub files: Option<usize>,
    /// Median file size (log-normal sizes), e.g. 112000 or 12k (default: the preset's).
    #[arg(long, value_parser = parse_size)]
    pub median: Option<u64>,
    /// Log-normal sigma of the sizes (default: the preset's).
    #[arg(long)]
    pub sigma: Option<f64>,
    /// Smallest file size (default: the preset's).
    #[arg(long, value_parser = parse_size)]
    pub min_size: Option<u64>,
    /// Largest file size (default: the preset's).
    #[arg(long, value_parser = parse_size)]
    pub max_size: Option<u64>,
    /// Class directories (default: the preset's).
    #[arg(long)]
    pub classes: Option<usize>,
    /// Seed of sizes and contents.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// File contents: raw random bytes or real JPEG images.
    #[arg(long, value_enum, default_value = "raw")]
    pub format: Format,
    /// Round every size up to a multiple of this (raw format), e.g. 128k for a comparison
    /// with fio at that block size: fio reads only whole blocks of each file.
    #[arg(long, default_value = "1", value_parser = parse_size)]
    pub size_multiple: u64,
}

#[cfg(feature = "clap")]
impl ShapeArgs {
    /// The preset's spec with the flags given applied, validated. A median outside the
    /// preset's bounds widens them.
    pub fn spec(&self, preset: Preset) -> Result<DatasetSpec> {
        let d = DatasetSpec::preset(preset);
        let spec = DatasetSpec {
            files: self.files.unwrap_or(d.files),
            median_bytes: self.median.unwrap_or(d.median_bytes),
            sigma: self.sigma.unwrap_or(d.sigma),
            min_bytes: self.min_size.unwrap_or(d.min_bytes.min(self.median.unwrap_or(d.median_bytes))),
            max_bytes: self.max_size.unwrap_or(d.max_bytes.max(self.median.unwrap_or(d.median_bytes))),
            classes: self.classes.unwrap_or(d.classes),
            seed: self.seed,
            format: self.format,
            size_multiple: self.size_multiple,
        };
        spec.validate()?;
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_deterministic_and_have_the_asked_median() {
        let spec = DatasetSpec { files: 4001, ..DatasetSpec::preset(Preset::Small) };
        let a = sizes(&spec);
        assert_eq!(a, sizes(&spec));
        let mut s = a.clone();
        s.sort();
        let median = s[s.len() / 2] as f64;
        assert!((median / 112_000.0 - 1.0).abs() < 0.05, "median {median}");
        assert!(s[0] >= 1000 && *s.last().unwrap_or(&0) <= 1 << 20);
    }

    #[test]
    fn sizes_round_up_to_the_multiple() {
        let spec = DatasetSpec { files: 100, size_multiple: 4096, ..DatasetSpec::preset(Preset::Caltech101) };
        assert!(sizes(&spec).iter().all(|s| s % 4096 == 0 && *s > 0));
        assert!(DatasetSpec { size_multiple: 0, ..spec.clone() }.validate().is_err());
        assert!(DatasetSpec { sigma: 9.0, ..spec }.validate().is_err());
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("128k"), Ok(128 << 10));
        assert_eq!(parse_size("128KiB"), Ok(128 << 10));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert!(parse_size("12x").is_err());
        assert!(parse_size("k").is_err());
    }
}
