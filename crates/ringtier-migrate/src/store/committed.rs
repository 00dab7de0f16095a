//! A step's committed manifest, as a caller outside the store sees it (the group commit).

use super::*;

impl CheckpointStore {
    /// The manifest of committed `step` from the fastest tier whose copy parses: what proves
    /// the step visible. `NotFound` when no tier holds a committed copy; the first other error
    /// (a torn or oversized manifest is `Corrupt`) when no copy parses.
    pub async fn committed_manifest(&self, step: u64) -> Result<CheckpointManifest> {
        let mut first: Option<Error> = None;
        for t in 0..self.inner.tiers.len() {
            match self.inner.manifest(t, step).await {
                Ok(m) => return Ok(m),
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        Err(first.unwrap_or_else(|| {
            Error::new(ErrorKind::NotFound, format!("checkpoint {step} has no committed copy on any tier"))
        }))
    }
}
