//! Checkpoint stores over paths or URLs, and restores into a directory: what `ringtier ckpt`
//! and the benchmarks open, through the front door ([`open`](crate::open())).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ringtier_core::{Error, ErrorKind, PosixConfig, PosixTier, Result, Tier};
use ringtier_migrate::{CheckpointStore, RestoreOptions, RestoreReport, StoreConfig, TierSink};

use crate::open::{open, OpenOptions};

/// Tier names for a list of tiers: `fast`/`slow` for two, `tier0`.. otherwise.
pub fn tier_names(n: usize) -> Vec<String> {
    match n {
        1 => vec!["fast".into()],
        2 => vec!["fast".into(), "slow".into()],
        _ => (0..n).map(|i| format!("tier{i}")).collect(),
    }
}

/// Opens a checkpoint store over `tiers` (directories, created when missing, or S3 URLs),
/// fastest first, each opened with `options` (named `fast`, `slow`, ...); the last one
/// throttled to `throttle_last` bytes per second where given. `read_only` opens to list,
/// load and verify next to a process that saves (no recovery).
pub async fn open_store(
    tiers: &[PathBuf],
    options: &OpenOptions,
    throttle_last: Option<u64>,
    cfg: StoreConfig,
    read_only: bool,
) -> Result<CheckpointStore> {
    if tiers.is_empty() {
        return Err(Error::new(ErrorKind::InvalidInput, "a store needs at least one tier"));
    }
    let names = tier_names(tiers.len());
    let mut opened = Vec::with_capacity(tiers.len());
    for (i, t) in tiers.iter().enumerate() {
        let throttle = if i + 1 == tiers.len() { throttle_last } else { None };
        let o = options.clone().with_name(names[i].clone()).with_create(true).with_throttle(throttle);
        let tier = open(t, &o).map_err(|e| {
            let what = format!("opening tier {} at {}: {e}", names[i], t.display());
            Error::new(e.kind(), what).set_temporary(e.is_temporary())
        })?;
        opened.push(tier.tier);
    }
    if read_only {
        CheckpointStore::open_read_only(opened, cfg).await
    } else {
        CheckpointStore::open(opened, cfg).await
    }
}

/// Restores `step` of `store` into the directory `dir` (created), one file per part. With
/// `sync` each file is written through a tier opened with `options` (O_DIRECT where the
/// file system allows), staged, fsynced and renamed into place only once whole and checked;
/// without, buffered into the page cache and renamed without fsync (`cp`'s durability). A
/// failed restore removes what it wrote: nothing in `dir` looks like a restored checkpoint.
pub async fn restore_to_dir(
    store: &CheckpointStore,
    step: u64,
    dir: &Path,
    opts: &RestoreOptions,
    sync: bool,
    options: &OpenOptions,
) -> Result<RestoreReport> {
    std::fs::create_dir_all(dir).map_err(|e| Error::from(e).with_key(format!("creating {}", dir.display())))?;
    let tier: Arc<dyn Tier> = if sync {
        open(dir, &options.clone().with_name("out").with_metered(false))?.tier
    } else {
        let config = PosixConfig::new(dir).with_name("out".to_string()).with_threads(2).with_sync(false);
        Arc::new(PosixTier::new(config)?)
    };
    let mut sink = TierSink::new(Arc::clone(&tier), None);
    let res = store.restore(step, &mut sink, opts).await;
    if res.is_err() {
        for meta in sink.written() {
            let _ = tier.delete(&meta.key).await;
        }
    }
    drop(sink);
    drop(tier);
    let _ = std::fs::remove_dir(dir.join(ringtier_core::fs::STAGING_DIR));
    res
}
