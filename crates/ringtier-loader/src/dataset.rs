//! The samples a loader reads: keys and sizes on a tier.

use std::path::Path;
use std::sync::Arc;

use ringtier_core::error::{Error, ErrorKind, Result};
use ringtier_core::manifest::Manifest;
use ringtier_core::Tier;

/// One sample: its key on the tier, its size, and its CRC-32C when a manifest gave one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// Key on the tier.
    pub key: String,
    /// Size in bytes.
    pub size: u64,
    /// CRC-32C from the manifest.
    pub crc32c: Option<u32>,
}

/// Samples on a tier.
#[derive(Debug, Clone)]
pub struct Dataset {
    tier: Arc<dyn Tier>,
    samples: Vec<Sample>,
}

impl Dataset {
    /// From a `ringtier gen` manifest of the tier's root directory.
    pub fn from_manifest(tier: Arc<dyn Tier>, manifest: &Manifest) -> Self {
        let samples = manifest
            .entries
            .iter()
            .map(|e| Sample { key: e.key.clone(), size: e.size, crc32c: Some(e.crc32c) })
            .collect();
        Dataset { tier, samples }
    }

    /// From the manifest in `dir` (the tier's root), or a listing of the tier when there is
    /// none.
    pub async fn from_dir(tier: Arc<dyn Tier>, dir: &Path) -> Result<Self> {
        if dir.join(ringtier_core::manifest::MANIFEST_FILE).exists() {
            return Ok(Self::from_manifest(tier, &Manifest::load(dir)?));
        }
        let samples: Vec<Sample> =
            tier.list("").await?.into_iter().map(|m| Sample { key: m.key, size: m.size, crc32c: None }).collect();
        if samples.is_empty() {
            return Err(Error::new(ErrorKind::NotFound, format!("no samples in {}", dir.display())));
        }
        Ok(Dataset { tier, samples })
    }

    /// From keys on any tier; sizes come from `stat`.
    pub async fn from_keys(tier: Arc<dyn Tier>, keys: impl IntoIterator<Item = String>) -> Result<Self> {
        let mut samples = Vec::new();
        for key in keys {
            let meta = tier.stat(&key).await?;
            samples.push(Sample { key, size: meta.size, crc32c: None });
        }
        Ok(Dataset { tier, samples })
    }

    /// The tier.
    pub fn tier(&self) -> &Arc<dyn Tier> {
        &self.tier
    }

    /// The samples.
    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// True without samples.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The largest sample.
    pub fn max_size(&self) -> u64 {
        self.samples.iter().map(|s| s.size).max().unwrap_or(0)
    }
}
