//! Listing, restoring and verifying checkpoints, falling back to slower copies.

use super::sinks::{DiscardSink, VecSink};
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
    /// Newer steps passed over (by [`CheckpointStore::load_latest`]) because no copy of
    /// theirs was intact, with the reason, newest first.
    pub skipped: Vec<(u64, String)>,
}

impl Inner {
    pub(super) async fn manifest(&self, t: usize, step: u64) -> Result<CheckpointManifest> {
        let key = self.manifest_key(step);
        let tier = self.tiers[t].as_ref();
        // Bounded before anything is allocated for it.
        let meta = tier.stat(&key).await?;
        if meta.size > crate::manifest::MAX_MANIFEST_BYTES {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "checkpoint manifest {key} on tier {:?}: {} bytes, more than a manifest can hold ({})",
                    tier.name(),
                    meta.size,
                    crate::manifest::MAX_MANIFEST_BYTES
                ),
            ));
        }
        let bytes = ringtier_core::ops::get(tier, &key).await?;
        CheckpointManifest::parse(&bytes, step, &format!("{key} on tier {:?}", tier.name()))
    }
}

impl CheckpointStore {
    /// Every checkpoint with a committed copy somewhere, by step. A tier that cannot be listed
    /// (an S3 tier while the server is down) is left out with a warning, so that what the
    /// other tiers hold stays listed and loadable; the error is returned only when no tier
    /// answers.
    pub async fn list(&self) -> Result<Vec<CheckpointInfo>> {
        let inner = &self.inner;
        let mut out: BTreeMap<u64, CheckpointInfo> = BTreeMap::new();
        let (mut failed, mut failures) = (None, 0);
        for t in 0..inner.tiers.len() {
            let scanned = match inner.scan(t).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(tier = inner.tiers[t].name(), "listing checkpoints: tier left out: {e}");
                    failed.get_or_insert(e);
                    failures += 1;
                    continue;
                }
            };
            for (step, f) in scanned {
                if !f.manifest {
                    continue;
                }
                let e = out.entry(step).or_insert(CheckpointInfo { step, bytes: f.bytes, tiers: Vec::new() });
                e.tiers.push(inner.tiers[t].name().to_string());
            }
        }
        match failed {
            Some(e) if failures == inner.tiers.len() => Err(e),
            _ => Ok(out.into_values().collect()),
        }
    }

    /// The newest step with a committed copy.
    pub async fn latest(&self) -> Result<Option<u64>> {
        Ok(self.list().await?.last().map(|c| c.step))
    }

    /// Reads and verifies the newest intact checkpoint: what a restarted training job resumes
    /// from. Steps newer than it whose every copy is bad (a torn manifest, a part failing its
    /// checksum) are passed over, each named with its reason in [`Restored::skipped`] and in a
    /// warning. `None` when the store holds none. A step that cannot be read because a tier
    /// cannot be asked now (an S3 server down) is an error, not passed over: resuming from an
    /// older step is only for steps known to be bad.
    pub async fn load_latest(&self) -> Result<Option<Restored>> {
        let mut skipped = Vec::new();
        for step in self.list().await?.iter().rev().map(|c| c.step) {
            match self.load(step).await {
                Ok(mut r) => {
                    r.skipped = skipped;
                    return Ok(Some(r));
                }
                Err(e) if is_bad_copy(&e) => {
                    tracing::warn!(step, "skipping checkpoint {step}, no intact copy: {e}");
                    skipped.push((step, e.to_string()));
                }
                Err(e) => return Err(e),
            }
        }
        if let Some((step, why)) = skipped.first() {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!("no intact checkpoint: every step is bad (the newest, {step}: {why})"),
            ));
        }
        Ok(None)
    }

    /// Reads and verifies checkpoint `step` into memory, one `Vec` per part: a convenience for
    /// small checkpoints. It reads through [`restore`](Self::restore) (chunks in flight,
    /// checksums on the fly, a slower copy of a part used when the faster one is bad); large
    /// checkpoints go into caller buffers ([`load_into`](Self::load_into)) or files
    /// ([`TierSink`]) instead, without holding the checkpoint twice.
    pub async fn load(&self, step: u64) -> Result<Restored> {
        let mut sink = VecSink::default();
        let report = self.restore(step, &mut sink, &RestoreOptions::default()).await?;
        Ok(Restored {
            step,
            tier: report.tier_summary(),
            parts: sink.parts,
            fallbacks: report.fallbacks,
            skipped: Vec::new(),
        })
    }

    /// Reads and verifies the parts named in `buffers` into them: each buffer must be exactly
    /// its part's size (checked before anything is read). Buffers can be anything the caller
    /// holds: a model's tensors, a slice of a pinned pool that `ringtier-stage` then copies to
    /// a GPU.
    pub async fn load_into(&self, step: u64, buffers: Vec<(String, &mut [u8])>) -> Result<RestoreReport> {
        let names = buffers.iter().map(|(n, _)| n.clone()).collect();
        let mut sink = BufferSink::new(buffers);
        self.restore(step, &mut sink, &RestoreOptions::default().with_parts(Some(names))).await
    }

    /// Reads and verifies one part of checkpoint `step` into memory.
    pub async fn read_part(&self, step: u64, name: &str) -> Result<Vec<u8>> {
        let mut sink = VecSink::default();
        let opts = RestoreOptions::default().with_parts(Some(vec![name.to_string()]));
        self.restore(step, &mut sink, &opts).await?;
        Ok(sink.parts.pop().map(|(_, data)| data).unwrap_or_default())
    }

    /// Reads bytes `[offset, offset + dst.len())` of part `name` of checkpoint `step` into
    /// `dst` (a rank reading only its shard). A range is not checked against the part's
    /// checksum (that covers the whole part); short or missing copies still fall back to
    /// slower tiers.
    pub async fn read_part_range(&self, step: u64, name: &str, offset: u64, dst: &mut [u8]) -> Result<RestoreReport> {
        let len = dst.len() as u64;
        let mut sink = BufferSink::new(vec![(name.to_string(), dst)]);
        let opts = RestoreOptions::default().with_parts(Some(vec![name.to_string()]));
        self.inner.run_restore(RestoreRequest::new(step, &opts).range(offset, len), &mut sink).await
    }

    /// Streams checkpoint `step` (or the parts [`RestoreOptions::parts`] names) into `sink`:
    /// the parts in save order, each read with [`RestoreOptions::depth`] chunk reads in flight
    /// across part boundaries, its checksum checked as the bytes pass, memory bounded by
    /// `depth` buffers of [`RestoreOptions::chunk_bytes`] whatever the checkpoint's size. Each
    /// part is read from the fastest tier holding a committed copy; a copy found truncated,
    /// corrupt or gone part-way is discarded and the part read again from the next tier (the
    /// report says why, and `ringtier_ckpt_restore_fallbacks_total` counts it).
    pub async fn restore<S: RestoreSink>(
        &self,
        step: u64,
        sink: &mut S,
        opts: &RestoreOptions,
    ) -> Result<RestoreReport> {
        self.inner.run_restore(RestoreRequest::new(step, opts), sink).await
    }

    /// Verifies every committed copy of `step`, each on its own (no fallback between them):
    /// one line per tier, `Ok` or the reason. Reads like [`restore`](Self::restore), into
    /// nothing.
    pub async fn verify(&self, step: u64) -> Result<Vec<(String, Result<()>)>> {
        let inner = &self.inner;
        let mut out = Vec::new();
        for t in 0..inner.tiers.len() {
            match inner.is_committed(t, step).await {
                Ok(true) => {
                    let mut sink = DiscardSink;
                    let opts = RestoreOptions::default();
                    let res = inner.run_restore(RestoreRequest::new(step, &opts).only(t), &mut sink).await;
                    out.push((inner.tiers[t].name().to_string(), res.map(|_| ())));
                }
                Ok(false) => {}
                // A tier that cannot be asked is a line of the report, not the end of it.
                Err(e) => out.push((inner.tiers[t].name().to_string(), Err(e))),
            }
        }
        Ok(out)
    }
}

/// Whether a restore error says the step's copies are bad (so an older step may be used),
/// rather than that a tier cannot be asked now.
pub fn is_bad_copy(e: &Error) -> bool {
    matches!(e.kind(), ErrorKind::Corrupt | ErrorKind::NotFound) && !e.is_temporary()
}

/// Settings of one restore.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RestoreOptions {
    /// Bytes per read request (rounded up to the tiers' alignment). Default 4 MiB: on the
    /// virtual disks measured, 4 MiB x 8 loaded at 1.06x a cold `cat` of the same files where
    /// 1 MiB x 16 reached 0.86x, and a restore into files writes 4 MiB at a time.
    pub chunk_bytes: usize,
    /// Read requests in flight. Default 8 (with the default chunk, 32 MiB of buffers).
    pub depth: usize,
    /// Only these parts, by name (read in save order); `None` (the default) for all.
    pub parts: Option<Vec<String>>,
}

impl Default for RestoreOptions {
    fn default() -> Self {
        RestoreOptions { chunk_bytes: 4 << 20, depth: 8, parts: None }
    }
}

impl RestoreOptions {
    /// Sets [`RestoreOptions::chunk_bytes`].
    pub fn with_chunk_bytes(mut self, chunk_bytes: usize) -> Self {
        self.chunk_bytes = chunk_bytes;
        self
    }

    /// Sets [`RestoreOptions::depth`].
    pub fn with_depth(mut self, depth: usize) -> Self {
        self.depth = depth;
        self
    }

    /// Sets [`RestoreOptions::parts`].
    pub fn with_parts(mut self, parts: impl Into<Option<Vec<String>>>) -> Self {
        self.parts = parts.into();
        self
    }
}

/// What a restore did.
#[derive(Debug, Clone, PartialEq)]
pub struct RestoreReport {
    /// The step.
    pub step: u64,
    /// Bytes delivered to the sink (each part counted once, the last delivery).
    pub bytes: u64,
    /// Each part delivered and the name of the tier its bytes came from, in save order.
    pub sources: Vec<(String, String)>,
    /// Why faster copies were not used, one line per copy skipped.
    pub fallbacks: Vec<String>,
    /// Wall time of the restore.
    pub seconds: f64,
}

impl RestoreReport {
    /// The tiers the parts came from, in order of first use, comma-separated.
    pub fn tier_summary(&self) -> String {
        let mut names: Vec<&str> = Vec::new();
        for (_, t) in &self.sources {
            if !names.contains(&t.as_str()) {
                names.push(t);
            }
        }
        names.join(", ")
    }
}
