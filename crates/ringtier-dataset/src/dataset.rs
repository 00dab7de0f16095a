//! The samples a loader reads: keys and sizes on a tier.

use std::path::Path;
use std::sync::Arc;

use crate::manifest::Manifest;
use ringtier_core::error::{Error, ErrorKind, Result};
use ringtier_core::Tier;

/// Stats [`Dataset::from_keys`] keeps in flight.
pub(crate) const STATS_IN_FLIGHT: usize = 64;

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
        if dir.join(crate::manifest::MANIFEST_FILE).exists() {
            return Ok(Self::from_manifest(tier, &Manifest::load(dir)?));
        }
        let samples: Vec<Sample> =
            tier.list("").await?.into_iter().map(|m| Sample { key: m.key, size: m.size, crc32c: None }).collect();
        if samples.is_empty() {
            return Err(Error::new(ErrorKind::NotFound, format!("no samples in {}", dir.display())));
        }
        Ok(Dataset { tier, samples })
    }

    /// From keys on any tier; sizes come from `stat`, up to 64 at a time
    /// (on a remote or parallel file system each stat is a round trip). Order is kept; the
    /// first error wins.
    pub async fn from_keys(tier: Arc<dyn Tier>, keys: impl IntoIterator<Item = String>) -> Result<Self> {
        let keys: Vec<String> = keys.into_iter().collect();
        let mut sizes = vec![0u64; keys.len()];
        let mut stats = tokio::task::JoinSet::new();
        let mut next = 0;
        while next < keys.len() || !stats.is_empty() {
            while next < keys.len() && stats.len() < STATS_IN_FLIGHT {
                let (tier, key, i) = (Arc::clone(&tier), keys[next].clone(), next);
                stats.spawn(async move { (i, tier.stat(&key).await) });
                next += 1;
            }
            if let Some(joined) = stats.join_next().await {
                let (i, meta) =
                    joined.map_err(|e| Error::new(ErrorKind::Shutdown, format!("a stat task failed: {e}")))?;
                sizes[i] = meta?.size;
            }
        }
        let samples = keys.into_iter().zip(sizes).map(|(key, size)| Sample { key, size, crc32c: None }).collect();
        Ok(Dataset { tier, samples })
    }

    /// The same samples on another tier (the same files opened with other options, e.g. a
    /// tier given a buffer pool sized from [`Dataset::max_size`]).
    pub fn with_tier(mut self, tier: Arc<dyn Tier>) -> Self {
        self.tier = tier;
        self
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

#[cfg(test)]
mod tests {
    use super::*;
    use ringtier_core::{ops, MemoryTier};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn from_keys_stats_concurrently_and_keeps_order() {
        let tier = Arc::new(MemoryTier::new());
        let keys: Vec<String> = (0..300).map(|i| format!("k{i:03}")).collect();
        for (i, k) in keys.iter().enumerate() {
            ops::put(tier.as_ref(), k, &vec![7u8; i + 1], 4096).await.expect("put");
        }
        let ds = Dataset::from_keys(tier.clone(), keys.clone()).await.expect("dataset");
        let got: Vec<(String, u64)> = ds.samples().iter().map(|s| (s.key.clone(), s.size)).collect();
        let want: Vec<(String, u64)> = keys.iter().enumerate().map(|(i, k)| (k.clone(), i as u64 + 1)).collect();
        assert_eq!(got, want);
        let mut with_missing = keys;
        with_missing.insert(150, "missing".into());
        let e = Dataset::from_keys(tier, with_missing).await.expect_err("a missing key fails");
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    }
}
