//! Listing, restoring and verifying checkpoints, falling back to slower copies.

use super::*;

/// A checkpoint as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointInfo {
    /// The step.
    pub step: u64,
    /// Total bytes.
    pub bytes: u64,
    /// Names of the tiers holding a committed copy, fastest first.
    pub tiers: Vec<String>,
}

/// A restored checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// The step.
    pub step: u64,
    /// The tier it was read from.
    pub tier: String,
    /// The parts, in save order.
    pub parts: Vec<(String, Vec<u8>)>,
    /// Why faster copies were not used, one line per skipped tier.
    pub fallbacks: Vec<String>,
}

impl Inner {
    pub(super) async fn read_all(&self, t: usize, key: &str, size: u64) -> Result<Vec<u8>> {
        let data = ringtier_core::ops::read_exact_at(self.tiers[t].as_ref(), key, 0, size as usize).await?;
        if data.len() as u64 != size {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!("{key}: {} of {size} bytes present (truncated)", data.len()),
            ));
        }
        Ok(data)
    }

    pub(super) async fn manifest(&self, t: usize, step: u64) -> Result<CheckpointManifest> {
        let key = self.manifest_key(step);
        let tier = self.tiers[t].as_ref();
        let bytes = ringtier_core::ops::get(tier, &key).await?;
        CheckpointManifest::parse(&bytes, step, &format!("{key} on tier {:?}", tier.name()))
    }
}

impl CheckpointStore {
    /// Every checkpoint with a committed copy somewhere, by step.
    pub async fn list(&self) -> Result<Vec<CheckpointInfo>> {
        let inner = &self.inner;
        let mut out: BTreeMap<u64, CheckpointInfo> = BTreeMap::new();
        for t in 0..inner.tiers.len() {
            for (step, f) in inner.scan(t).await? {
                if !f.manifest {
                    continue;
                }
                let e = out.entry(step).or_insert(CheckpointInfo { step, bytes: f.bytes, tiers: Vec::new() });
                e.tiers.push(inner.tiers[t].name().to_string());
            }
        }
        Ok(out.into_values().collect())
    }

    /// The newest step with a committed copy.
    pub async fn latest(&self) -> Result<Option<u64>> {
        Ok(self.list().await?.last().map(|c| c.step))
    }

    /// Reads and verifies the newest committed checkpoint ([`latest`](Self::latest), then
    /// [`load`](Self::load)): what a restarted training job resumes from. `None` when the store
    /// holds none; an error (naming every copy's reason) when the newest cannot be read from
    /// any tier, rather than silently resuming from an older step.
    pub async fn load_latest(&self) -> Result<Option<Restored>> {
        match self.latest().await? {
            Some(step) => self.load(step).await.map(Some),
            None => Ok(None),
        }
    }

    /// Reads and verifies checkpoint `step` from the fastest tier holding a committed copy,
    /// falling back to slower copies when one fails verification (and saying why).
    pub async fn load(&self, step: u64) -> Result<Restored> {
        let inner = &self.inner;
        let mut fallbacks = Vec::new();
        for t in 0..inner.tiers.len() {
            if !inner.is_committed(t, step).await? {
                continue;
            }
            match self.load_from(t, step).await {
                Ok(parts) => {
                    for f in &fallbacks {
                        tracing::warn!("checkpoint {step}: {f}");
                    }
                    return Ok(Restored { step, tier: inner.tiers[t].name().to_string(), parts, fallbacks });
                }
                Err(e) => {
                    inner.m.fallbacks[t].increment(1);
                    fallbacks.push(format!("copy on tier {:?} unusable: {e}", inner.tiers[t].name()));
                }
            }
        }
        if fallbacks.is_empty() {
            return Err(Error::new(ErrorKind::NotFound, format!("no committed copy of checkpoint {step} on any tier")));
        }
        Err(Error::new(ErrorKind::Corrupt, format!("checkpoint {step}: every copy failed: {}", fallbacks.join("; "))))
    }

    pub(super) async fn load_from(&self, t: usize, step: u64) -> Result<Vec<(String, Vec<u8>)>> {
        let inner = &self.inner;
        let manifest = inner.manifest(t, step).await?;
        let mut parts = Vec::with_capacity(manifest.parts.len());
        for p in &manifest.parts {
            let key = inner.part_key(step, &p.name);
            let data = inner.read_all(t, &key, p.size).await?;
            let crc = crc32c::crc32c(&data);
            if crc != p.crc32c {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!("part {:?}: checksum mismatch (crc32c {crc:08x}, manifest {:08x})", p.name, p.crc32c),
                ));
            }
            parts.push((p.name.clone(), data));
        }
        Ok(parts)
    }

    /// Verifies every committed copy of `step`: one line per tier, `Ok` or the reason.
    pub async fn verify(&self, step: u64) -> Result<Vec<(String, Result<()>)>> {
        let inner = &self.inner;
        let mut out = Vec::new();
        for t in 0..inner.tiers.len() {
            if inner.is_committed(t, step).await? {
                let res = self.load_from(t, step).await.map(|_| ());
                out.push((inner.tiers[t].name().to_string(), res));
            }
        }
        Ok(out)
    }
}
