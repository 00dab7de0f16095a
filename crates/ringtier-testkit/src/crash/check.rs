//! Recovery and the invariants on one materialised crash state.
//!
//! * Nothing published under a final name in the store's prefix is torn: every such file holds
//!   exactly what its writer wrote (the protocol publishes a name only after its data fsync).
//! * `CheckpointStore::open` (recovery) succeeds.
//! * Every acknowledged checkpoint loads, byte-identical.
//! * Every listed step loads (a step with no intact copy is quarantined, not listed).
//! * Recovery never deletes the last intact copy of a step: what loaded before it still loads.
//! * Nothing outside the store's prefix changes (`outside/keep`, and no file appears outside
//!   the tiers' prefix, staging directory and lock files).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ringtier_core::AlignedBuf;
use ringtier_core::{PosixConfig, PosixTier, Tier};
use ringtier_migrate::{CheckpointStore, PartInfo, RestoreOptions, RestoreSink};

use super::image::Image;
use super::workload::{parts_of, store_config, OUTSIDE_DATA};

fn tiers(dir: &Path) -> Result<Vec<Arc<dyn Tier>>, String> {
    let mut out: Vec<Arc<dyn Tier>> = Vec::new();
    for name in ["fast", "slow"] {
        let cfg = PosixConfig::new(dir.join(name)).with_threads(1).with_name(name.to_string());
        out.push(Arc::new(PosixTier::new(cfg).map_err(|e| format!("opening tier {name}: {e}"))?));
    }
    Ok(out)
}

/// Each part into a `Vec`, as `CheckpointStore::load` does, but through small read buffers:
/// `load`'s default 4 MiB chunks are huge pages zeroed per read, most of a state's check time
/// for parts of a few KiB. The same restore path (checksums, fallback to a slower copy).
#[derive(Default)]
struct PartsSink {
    parts: Vec<(String, Vec<u8>)>,
}

impl RestoreSink for PartsSink {
    async fn begin(&mut self, part: &PartInfo) -> ringtier_core::Result<()> {
        // Bounded: a manifest's size is not trusted for the allocation.
        let cap = usize::try_from(part.size).unwrap_or(usize::MAX).min(1 << 20);
        self.parts.push((part.name.clone(), Vec::with_capacity(cap)));
        Ok(())
    }

    async fn write(
        &mut self,
        _part: &PartInfo,
        _offset: u64,
        buf: AlignedBuf,
    ) -> (ringtier_core::Result<()>, AlignedBuf) {
        if let Some((_, v)) = self.parts.last_mut() {
            v.extend_from_slice(buf.as_slice());
        }
        (Ok(()), buf)
    }

    async fn finish(&mut self, _part: &PartInfo) -> ringtier_core::Result<()> {
        Ok(())
    }

    async fn discard(&mut self, _part: &PartInfo) {
        self.parts.pop();
    }
}

/// Reads and verifies every part of `step` (what `load` does, with 64 KiB reads).
async fn load(store: &CheckpointStore, step: u64) -> ringtier_core::Result<Vec<(String, Vec<u8>)>> {
    let mut sink = PartsSink::default();
    store.restore(step, &mut sink, &RestoreOptions::default().with_chunk_bytes(64 << 10).with_depth(2)).await?;
    Ok(sink.parts)
}

fn files_under(dir: &Path) -> BTreeSet<PathBuf> {
    fn walk(base: &Path, d: &Path, out: &mut BTreeSet<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(d) else { return };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(base, &p, out);
            } else {
                out.insert(p.strip_prefix(base).map(Path::to_path_buf).unwrap_or(p));
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(dir, dir, &mut out);
    out
}

/// Whether a relative path is the store's (its prefix, the staging directory, a lock file).
fn is_store_path(p: &Path, prefix: &str) -> bool {
    let mut comps = p.components();
    let Some(tier) = comps.next() else { return false };
    if !matches!(tier.as_os_str().to_str(), Some("fast" | "slow")) {
        return false;
    }
    match comps.next().and_then(|c| c.as_os_str().to_str()) {
        Some(first) => first == prefix || first.starts_with(".ringtier"),
        None => false,
    }
}

/// Checks the state `img` (materialised at `dir`) against the invariants; `full` is the
/// image with every operation of the prefix applied whole (what each writer wrote), `acked`
/// the steps whose save had returned. `Err` says which invariant broke.
pub async fn check(
    img: &Image,
    full: &Image,
    dir: &Path,
    prefix: &str,
    acked: &[u64],
    scale: usize,
) -> Result<(), String> {
    // Published names hold whole objects.
    for (name, id) in &img.names {
        let published = is_store_path(name, prefix)
            && name.components().nth(1).and_then(|c| c.as_os_str().to_str()) == Some(prefix);
        if !published {
            continue;
        }
        let want = full.files.get(id);
        let have = img.files.get(id);
        if want != have {
            let (w, h) =
                (want.map(|c| c.as_slice()).unwrap_or_default(), have.map(|c| c.as_slice()).unwrap_or_default());
            let first = w.iter().zip(h).position(|(a, b)| a != b).unwrap_or(w.len().min(h.len()));
            return Err(format!(
                "torn object visible under its final name: {} holds {} bytes, its writer wrote {}; they differ \
                 from byte {first}",
                name.display(),
                h.len(),
                w.len()
            ));
        }
    }
    // What loads before recovery (read-only: no lock, no recovery).
    let before: Vec<u64> = {
        let ro = CheckpointStore::open_read_only(tiers(dir)?, store_config())
            .await
            .map_err(|e| format!("read-only open: {e}"))?;
        let mut ok = Vec::new();
        for c in ro.list().await.map_err(|e| format!("read-only list: {e}"))? {
            if let Ok(parts) = load(&ro, c.step).await {
                if parts == parts_of(c.step, scale) {
                    ok.push(c.step);
                }
            }
        }
        ok
    };
    let outside_before = files_under(dir);
    let store =
        CheckpointStore::open(tiers(dir)?, store_config()).await.map_err(|e| format!("recovery failed: {e}"))?;
    let res = async {
        for &step in acked {
            let parts = load(&store, step).await.map_err(|e| format!("acknowledged step {step} does not load: {e}"))?;
            if parts != parts_of(step, scale) {
                return Err(format!("acknowledged step {step} loads with other bytes"));
            }
        }
        for c in store.list().await.map_err(|e| format!("list after recovery: {e}"))? {
            let parts = load(&store, c.step).await.map_err(|e| format!("listed step {} does not load: {e}", c.step))?;
            if parts != parts_of(c.step, scale) {
                return Err(format!("listed step {} loads with other bytes", c.step));
            }
        }
        for step in &before {
            load(&store, *step)
                .await
                .map_err(|e| format!("recovery deleted the last intact copy of step {step}: {e}"))?;
        }
        Ok(())
    }
    .await;
    drop(store);
    res?;
    // Nothing outside the store's paths changed.
    match std::fs::read(dir.join("outside/keep")) {
        Ok(b) if b == OUTSIDE_DATA => {}
        _ => return Err("outside/keep changed".to_string()),
    }
    let after = files_under(dir);
    let outside = |s: &BTreeSet<PathBuf>| -> BTreeSet<PathBuf> {
        s.iter().filter(|p| !is_store_path(p, prefix)).cloned().collect()
    };
    if outside(&after) != outside(&outside_before) {
        return Err(format!(
            "files outside the store changed: {:?} -> {:?}",
            outside(&outside_before),
            outside(&after)
        ));
    }
    Ok(())
}
