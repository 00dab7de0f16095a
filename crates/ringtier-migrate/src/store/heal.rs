//! A store that heals: every copy checked at open, bad copies replaced from intact ones, steps
//! with no intact copy quarantined (set aside with their reason, never a wedge), and steps
//! deleted on request with eviction's safety.

use super::*;

/// The largest quarantine marker read back, in bytes.
const MAX_MARKER_BYTES: u64 = 1 << 20;

/// A copy of a step set aside because no intact copy of the step exists: its manifest was
/// torn or damaged, or a part failed its checksum. It is never listed as a checkpoint, never
/// restored and never drained; `ringtier ckpt rm --step N` (or [`CheckpointStore::delete`])
/// removes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuarantinedCopy {
    /// The step.
    pub step: u64,
    /// Name of the tier holding the copy.
    pub tier: String,
    /// Why it was set aside.
    pub reason: String,
    /// When, in milliseconds since the Unix epoch (0 when the marker cannot be read).
    pub unix_ms: u64,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Marker {
    step: u64,
    reason: String,
    unix_ms: u64,
    /// The manifest as it was found (lossy UTF-8, at most 64 KiB), for a post-mortem.
    manifest: Option<String>,
}

impl Inner {
    /// Checks the copy of `step` on tier `t` found by a scan: its manifest reads, passes its
    /// own checksum and names parts that are all present at their sizes. `Err` carries the
    /// reason the copy is bad; a tier that cannot be asked is an error of the outer `Result`.
    pub(super) async fn check_copy(
        &self,
        t: usize,
        step: u64,
        found: &Found,
    ) -> Result<std::result::Result<(), String>> {
        let m = match self.manifest(t, step).await {
            Ok(m) => m,
            Err(e) if e.kind() == ErrorKind::Corrupt => return Ok(Err(e.to_string())),
            // A manifest of a newer format: not this build's to judge or to set aside.
            Err(e) if e.kind() == ErrorKind::Unsupported => {
                tracing::warn!(step, tier = self.tiers[t].name(), "{e}");
                return Ok(Ok(()));
            }
            Err(e) => return Err(e),
        };
        for p in &m.parts {
            match found.parts.get(&p.name) {
                Some(&size) if size == p.size => {}
                Some(&size) => {
                    return Ok(Err(format!("part {:?} holds {size} bytes; its manifest says {}", p.name, p.size)))
                }
                None => return Ok(Err(format!("part {:?} named by the manifest is missing", p.name))),
            }
        }
        Ok(Ok(()))
    }

    /// Recovery's check of every committed copy in `scans` (one map per tier): a bad copy with
    /// an intact copy elsewhere is removed, and replaced in the background where the intact
    /// copy is on a slower tier; a step with no intact copy has its bad copies quarantined.
    /// `scans` is updated to what stays committed.
    pub(super) async fn heal(self: &Arc<Self>, scans: &mut [BTreeMap<u64, Found>]) -> Result<()> {
        let steps: BTreeSet<u64> = scans.iter().flat_map(|s| s.keys().copied()).collect();
        for step in steps {
            let mut bad: Vec<(usize, String)> = Vec::new();
            let mut intact: Vec<usize> = Vec::new();
            for (t, scan) in scans.iter().enumerate() {
                let Some(f) = scan.get(&step).filter(|f| f.committed()) else { continue };
                match self.check_copy(t, step, f).await? {
                    Ok(()) => intact.push(t),
                    Err(why) => bad.push((t, why)),
                }
            }
            for (t, why) in bad {
                if let Some(f) = scans[t].get_mut(&step) {
                    f.manifest = false;
                }
                match intact.iter().copied().find(|&s| s > t).or(intact.first().copied()) {
                    Some(good) => {
                        tracing::warn!(
                            step,
                            tier = self.tiers[t].name(),
                            "a bad copy ({why}); removing it, an intact copy is on {}",
                            self.tiers[good].name()
                        );
                        self.remove(t, step).await?;
                        scans[t].remove(&step);
                        self.m.repairs[t].increment(1);
                        if good > t {
                            // Replaced from the slower copy, in the background: open does not
                            // wait for a copy of a whole checkpoint.
                            let me = Arc::clone(self);
                            tokio::spawn(async move {
                                if let Err(e) = me.copy_step(step, good, t).await {
                                    tracing::warn!(step, "replacing the bad copy on {}: {e}", me.tiers[t].name());
                                }
                            });
                        }
                    }
                    None => {
                        self.quarantine(t, step, &why).await?;
                        if let Some(f) = scans[t].get_mut(&step) {
                            f.quarantined = true;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Sets the copy of `step` on tier `t` aside: a marker with the reason (and the manifest
    /// as found) is committed next to it, then its manifest is removed, so that the copy is no
    /// longer committed but stays for a post-mortem until `rm`. A crash between the two leaves
    /// both, and the marker wins.
    pub(super) async fn quarantine(&self, t: usize, step: u64, why: &str) -> Result<()> {
        let tier = self.tiers[t].as_ref();
        let mkey = self.manifest_key(step);
        let manifest = match tier.stat(&mkey).await {
            Ok(meta) if meta.size <= 64 << 10 => {
                ringtier_core::ops::get(tier, &mkey).await.ok().map(|b| String::from_utf8_lossy(&b).into_owned())
            }
            _ => None,
        };
        let marker = Marker { step, reason: why.to_string(), unix_ms: now_ms(), manifest };
        let bytes = serde_json::to_vec_pretty(&marker).unwrap_or_default();
        self.write_object(t, &self.quarantine_key(step), &bytes).await?;
        match tier.delete(&mkey).await {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        tracing::error!(target: QUARANTINE_LOG_TARGET, step, tier = tier.name(), "checkpoint copy quarantined: {why}");
        self.m.quarantined[t].increment(1);
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.quarantined.insert(step, format!("on tier {:?}: {why}", tier.name()));
        Ok(())
    }

    /// Whether `step` has a quarantined copy on tier `t`.
    pub(super) async fn is_quarantined(&self, t: usize, step: u64) -> Result<bool> {
        match self.tiers[t].stat(&self.quarantine_key(step)).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Copies `step` from tier `from` to tier `to` (either direction), verifying every
    /// checksum on the way, then commits its manifest there. Returns the bytes copied (0 when
    /// already committed there).
    pub(super) async fn copy_step(&self, step: u64, from: usize, to: usize) -> Result<u64> {
        let manifest = self.manifest(from, step).await?;
        if self.is_committed(to, step).await? {
            return Ok(0);
        }
        // A partial copy from an interrupted copy is replaced part by part.
        let mut bytes = 0;
        for p in &manifest.parts {
            let key = self.part_key(step, &p.name);
            let (chunk, _) = self.chunk_layout(to);
            let src =
                TierChunks::new(Arc::clone(&self.tiers[from]), key.clone(), p.size, chunk, drain::DRAIN_READ_DEPTH);
            let (size, crc) = self.write_stream(to, &key, true, src).await?;
            if size != p.size || crc != p.crc32c {
                let _ = self.tiers[to].delete(&key).await;
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!(
                        "part {:?} of step {step} on tier {:?} does not match its manifest (size {size} vs {}, crc32c {crc:08x} vs {:08x})",
                        p.name,
                        self.tiers[from].name(),
                        p.size,
                        p.crc32c
                    ),
                ));
            }
            bytes += size;
        }
        self.write_object(to, &self.manifest_key(step), &manifest.to_bytes()).await?;
        Ok(bytes)
    }
}

impl CheckpointStore {
    /// Every quarantined copy on every tier, by step then tier.
    pub async fn quarantined(&self) -> Result<Vec<QuarantinedCopy>> {
        let inner = &self.inner;
        let mut out = Vec::new();
        for t in 0..inner.tiers.len() {
            let tier = inner.tiers[t].as_ref();
            for (step, f) in inner.scan(t).await? {
                if !f.quarantined {
                    continue;
                }
                let key = inner.quarantine_key(step);
                let marker = match tier.stat(&key).await {
                    Ok(meta) if meta.size <= MAX_MARKER_BYTES => ringtier_core::ops::get(tier, &key)
                        .await
                        .ok()
                        .and_then(|b| serde_json::from_slice::<Marker>(&b).ok()),
                    _ => None,
                };
                let (reason, unix_ms) = match marker {
                    Some(m) => (m.reason, m.unix_ms),
                    None => ("(the quarantine marker cannot be read)".to_string(), 0),
                };
                out.push(QuarantinedCopy { step, tier: tier.name().to_string(), reason, unix_ms });
            }
        }
        out.sort_by(|a, b| (a.step, &a.tier).cmp(&(b.step, &b.tier)));
        Ok(out)
    }

    /// Deletes checkpoint `step` from every tier, quarantined copies included, each copy
    /// manifest first (a crash midway leaves a partial copy that recovery removes, never a
    /// committed one with missing parts). A save of `step` in progress makes it fail with
    /// [`ErrorKind::Busy`]; a drain of it in progress drops what it copied. Deleting a step
    /// that is nowhere is [`ErrorKind::NotFound`].
    pub async fn delete(&self, step: u64) -> Result<()> {
        let inner = &self.inner;
        if !inner.writable {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("cannot delete checkpoint {step}: the store is open read-only"),
            )
            .with_operation(Operation::Delete));
        }
        if inner.saving_steps.lock().unwrap_or_else(|p| p.into_inner()).contains(&step) {
            return Err(Error::new(ErrorKind::Busy, format!("cannot delete checkpoint {step}: it is being saved"))
                .with_operation(Operation::Delete));
        }
        let pending = {
            let mut st = inner.state.lock().unwrap_or_else(|p| p.into_inner());
            let pending = st.pending.contains_key(&step);
            if pending {
                st.deleted.insert(step);
            }
            st.failed.remove(&step);
            st.quarantined.remove(&step);
            pending
        };
        let mut found = false;
        for t in 0..inner.tiers.len() {
            let here = inner.tiers[t].list(&format!("{}/", inner.dir(step))).await?;
            if here.is_empty() {
                continue;
            }
            found = true;
            inner.remove(t, step).await?;
        }
        if !found && !pending {
            return Err(Error::new(ErrorKind::NotFound, format!("no checkpoint {step} on any tier"))
                .with_operation(Operation::Delete));
        }
        tracing::info!(step, "checkpoint deleted");
        inner.changed.notify_waiters();
        Ok(())
    }
}
