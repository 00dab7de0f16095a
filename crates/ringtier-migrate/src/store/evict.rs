//! Eviction: the faster copies of drained checkpoints removed, manifest first.

use super::*;

/// Why [`Inner::evict`] runs.
#[derive(Debug, Clone, Copy)]
pub(super) enum Evict {
    /// Keep the newest `keep_last` drained checkpoints and the capacity bound.
    Policy,
    /// A save needs this many bytes on the tier.
    Room(u64),
    /// A save of this many bytes (0 when unknown) failed with ENOSPC on the tier.
    AfterEnospc(u64),
}

impl Inner {
    /// Applies the eviction policy to tier `t` (not the slowest) and returns how many
    /// checkpoints it removed. Only checkpoints already committed on a slower tier are evicted,
    /// oldest first: those beyond the newest `keep_last`; then, for [`Evict::Room`], while the
    /// fast tier's capacity bound or the file system's free space (less [`free_slack`]) leaves
    /// no room for the bytes a save needs; for [`Evict::AfterEnospc`], also at least one (the
    /// file system said it is full, whatever its free count said).
    pub(super) async fn evict(&self, t: usize, why: Evict) -> Result<usize> {
        if t + 1 >= self.tiers.len() {
            return Ok(0);
        }
        let need = match why {
            Evict::Policy => 0,
            Evict::Room(n) | Evict::AfterEnospc(n) => n,
        };
        let here = self.scan(t).await?;
        let mut slower = BTreeSet::new();
        for s in t + 1..self.tiers.len() {
            slower.extend(self.committed(s).await?);
        }
        let committed: Vec<u64> = here.iter().filter(|(_, f)| f.manifest).map(|(s, _)| *s).collect();
        let keep_from = committed.len().saturating_sub(self.cfg.keep_last);
        let mut used: u64 = here.values().filter(|f| f.manifest).map(|f| f.bytes).sum();
        let mut evicted = 0;
        for (i, step) in committed.iter().enumerate() {
            if !slower.contains(step) {
                continue; // never evict the only copy
            }
            let over_capacity = t == 0 && self.cfg.fast_capacity_bytes.is_some_and(|c| used + need > c);
            let short = match why {
                Evict::Policy => false,
                Evict::Room(_) => self.free_space(t).await.is_some_and(|free| free < need + free_slack(need)),
                Evict::AfterEnospc(_) => {
                    evicted == 0 || self.free_space(t).await.is_some_and(|free| free < need + free_slack(need))
                }
            };
            if i < keep_from || over_capacity || short {
                // Freeing a large file costs CPU (tmpfs frees every page on unlink): not while a
                // save writes.
                self.yield_to_saves().await;
                self.remove(t, *step).await?;
                used -= here[step].bytes;
                evicted += 1;
                self.evictions.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                self.m.evictions[t].increment(1);
                tracing::debug!(step, tier = self.tiers[t].name(), "evicted");
            }
        }
        Ok(evicted)
    }

    /// Removes every object of `step` on tier `t`, manifest first (so a crash midway leaves a
    /// partial checkpoint that recovery removes, never a committed one with missing parts),
    /// then the step's directories on a file tier (a failure there is logged: the checkpoint
    /// is gone either way).
    pub(super) async fn remove(&self, t: usize, step: u64) -> Result<()> {
        let tier = self.tiers[t].as_ref();
        let mkey = self.manifest_key(step);
        match tier.delete(&mkey).await {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        for meta in tier.list(&format!("{}/", self.dir(step))).await? {
            match tier.delete(&meta.key).await {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        if let Err(e) = tier.remove_empty_dirs(&self.dir(step)).await {
            tracing::warn!(step, tier = tier.name(), "removing the empty directories of a deleted checkpoint: {e}");
        }
        Ok(())
    }
}
