//! Direct restores: each chunk read straight into the memory its bytes end up in (a window of
//! the caller's destination for the part), so a load makes no copy of the data: O_DIRECT
//! reads land where the tensors will live, the checksum is computed over them in place.
//!
//! The destination memory and its windows are the caller's ([`ReadTargets`]); this crate stays
//! free of `unsafe`. A window is an owned [`AlignedBuf`] like any pool buffer: the kernel
//! writes into it only while a read owns it, and the caller gets its memory back once every
//! window is dropped (after the restore, or after the last read of a cancelled one).

use super::*;

/// The message of the `Unsupported` error a restore returns when its targets decline a direct
/// read (the caller then loads through a copying sink).
pub(super) const DIRECT_DECLINED: &str = "direct restore declined by its targets";

/// Destinations of a direct restore: where each chunk of each part is read.
pub trait ReadTargets: Send + Sync {
    /// Called once per restore attempt before anything is read, with the parts to be read,
    /// the size of each part's object on the tier read first (at most that many bytes will
    /// arrive; allocate no more than `min(part.size, size)` rounded up to `align`), and the
    /// alignment every read needs. `false` declines: the restore is not run (the caller
    /// reads through a copying sink instead, e.g. when an object is shorter than its
    /// manifest says, so that the usual truncation and fallback apply).
    fn prepare(&self, parts: &[PartInfo], sizes: &[u64], align: usize) -> Result<bool>;

    /// The window to read bytes `[offset, offset + len)` of part number `part` (an index into
    /// `parts` of [`prepare`](Self::prepare)) into: a buffer of at least `len` bytes rounded
    /// up to `align`, whose first byte is where byte `offset` of the part belongs. A window
    /// is asked for again when a part is read again from a slower tier (the earlier ones are
    /// dropped first).
    fn window(&self, part: usize, offset: u64, len: usize, align: usize) -> Result<AlignedBuf>;
}

/// A checkpoint restored by [`CheckpointStore::load_direct`]: where each part now is, in the
/// caller's targets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectRestored {
    /// The step.
    pub step: u64,
    /// The tiers its parts were read from.
    pub tier: String,
    /// The parts read, in save order, with their sizes.
    pub parts: Vec<(String, u64)>,
    /// Why faster copies were not used, one line per skipped tier.
    pub fallbacks: Vec<String>,
    /// Newer steps passed over (by [`CheckpointStore::load_latest_direct`]), as in
    /// [`Restored::skipped`].
    pub skipped: Vec<(u64, String)>,
}

/// The sink of a direct restore: the bytes are already where they belong.
struct InPlace {
    parts: Vec<(String, u64)>,
}

impl RestoreSink for InPlace {
    async fn begin(&mut self, _part: &PartInfo) -> Result<()> {
        Ok(())
    }

    async fn write(&mut self, _part: &PartInfo, _offset: u64, buf: AlignedBuf) -> (Result<()>, AlignedBuf) {
        (Ok(()), buf)
    }

    async fn finish(&mut self, part: &PartInfo) -> Result<()> {
        self.parts.push((part.name.clone(), part.size));
        Ok(())
    }

    async fn discard(&mut self, _part: &PartInfo) {}
}

impl CheckpointStore {
    /// Reads and verifies every part of checkpoint `step` straight into `targets` (see
    /// [`ReadTargets`]): the same reads, checksums and fallbacks to slower copies as
    /// [`load`](Self::load), without a copy of the data. `Ok(None)` when the targets decline
    /// (then use [`load`](Self::load)).
    pub async fn load_direct(
        &self,
        step: u64,
        opts: &RestoreOptions,
        targets: Arc<dyn ReadTargets>,
    ) -> Result<Option<DirectRestored>> {
        let mut sink = InPlace { parts: Vec::new() };
        let opts = RestoreOptions { parts: None, ..opts.clone() };
        match self.inner.run_restore(RestoreRequest::new(step, &opts).into_targets(targets), &mut sink).await {
            Ok(report) => Ok(Some(DirectRestored {
                step,
                tier: report.tier_summary(),
                parts: sink.parts,
                fallbacks: report.fallbacks,
                skipped: Vec::new(),
            })),
            Err(e) if e.kind() == ErrorKind::Unsupported && e.message() == DIRECT_DECLINED => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// [`load_direct`](Self::load_direct) of the newest intact checkpoint, passing over newer
    /// steps whose every copy is bad as [`load_latest`](Self::load_latest) does. `Ok(None)`
    /// when the store holds none; else `(step, restored, skipped)`, where `restored` is `None`
    /// when the targets declined `step` (load it with [`load`](Self::load)) and `skipped`
    /// names the newer steps passed over, newest first.
    pub async fn load_latest_direct(
        &self,
        opts: &RestoreOptions,
        targets: Arc<dyn ReadTargets>,
    ) -> Result<Option<(u64, Option<DirectRestored>, Vec<(u64, String)>)>> {
        let mut skipped = Vec::new();
        for step in self.list().await?.iter().rev().map(|c| c.step) {
            match self.load_direct(step, opts, Arc::clone(&targets)).await {
                Ok(Some(mut r)) => {
                    r.skipped = skipped.clone();
                    return Ok(Some((step, Some(r), skipped)));
                }
                Ok(None) => return Ok(Some((step, None, skipped))),
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
}
