//! The tiers and checkpoint stores the experiments (and `ringtier ckpt`) open over
//! directories or S3 URLs.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use ringtier_core::layers::{Metered, Throttle, Throttled};
use ringtier_core::{PosixConfig, PosixTier, Tier};
use ringtier_migrate::{CheckpointStore, RestoreOptions, RestoreReport, StoreConfig, TierSink};
use ringtier_uring::{
    open_dir_tier, BufferedWrites, DirTierOptions, DirectIoPolicy, Engine, UringConfig, UringTier, UringTierOptions,
};

/// A tier over a directory, through `engine` (io_uring with O_DIRECT where the filesystem
/// allows; under `auto` the thread pool where io_uring is refused), metered; or, for
/// `s3://bucket/prefix[?settings]`, the S3 tier (see `ringtier_s3::S3Config::from_url`).
pub fn dir_tier(
    dir: &Path,
    name: &str,
    throttle: Option<u64>,
    buffered_writes: BufferedWrites,
    engine: Engine,
) -> Result<Arc<dyn Tier>> {
    if let Some(url) = dir.to_str().filter(|d| ringtier_s3::S3Config::is_s3_url(d)) {
        let cfg = ringtier_s3::S3Config::from_url(url)?.named(name);
        let tier: Arc<dyn Tier> =
            Arc::new(ringtier_s3::S3Tier::new(cfg).with_context(|| format!("opening tier {name} at {url}"))?);
        let tier: Arc<dyn Tier> = match throttle {
            Some(bps) => Arc::new(Throttled::new(tier, Throttle::bandwidth(bps))),
            None => tier,
        };
        return Ok(Arc::new(Metered::new(tier)));
    }
    let options = DirTierOptions::default()
        .with_engine(engine)
        .with_uring(UringConfig::default().with_direct_io(DirectIoPolicy::Auto).with_buffered_writes(buffered_writes))
        .with_name(name)
        .with_create(true);
    let tier = open_dir_tier(dir, options).with_context(|| format!("opening tier {name} at {}", dir.display()))?.tier;
    let tier: Arc<dyn Tier> = match throttle {
        Some(bps) => Arc::new(Throttled::new(tier, Throttle::bandwidth(bps))),
        None => tier,
    };
    Ok(Arc::new(Metered::new(tier)))
}

/// A tier over a local directory through io_uring set up with `config` (created if missing),
/// throttled to `throttle` bytes per second if given, metered. `tune --workload ckpt` opens
/// its store's tier here with each configuration's settings.
pub(crate) fn uring_dir_tier(
    dir: &Path,
    name: &str,
    throttle: Option<u64>,
    config: UringConfig,
) -> Result<Arc<dyn Tier>> {
    let options = UringTierOptions::default().with_name(name.to_string()).with_create_root(true);
    let tier: Arc<dyn Tier> = Arc::new(
        UringTier::with_options(dir, config, options)
            .with_context(|| format!("opening tier {name} at {}", dir.display()))?,
    );
    let tier: Arc<dyn Tier> = match throttle {
        Some(bps) => Arc::new(Throttled::new(tier, Throttle::bandwidth(bps))),
        None => tier,
    };
    Ok(Arc::new(Metered::new(tier)))
}

/// Tier names for a list of directories: fast/slow for two, tier0.. otherwise.
pub fn tier_names(n: usize) -> Vec<String> {
    match n {
        1 => vec!["fast".into()],
        2 => vec!["fast".into(), "slow".into()],
        _ => (0..n).map(|i| format!("tier{i}")).collect(),
    }
}

/// Opens a store over `dirs` (fastest first) with `engine`; the last tier throttled to
/// `throttle_last`.
pub async fn open_store(
    dirs: &[PathBuf],
    throttle_last: Option<u64>,
    buffered_writes: BufferedWrites,
    cfg: StoreConfig,
    read_only: bool,
    engine: Engine,
) -> Result<CheckpointStore> {
    if dirs.is_empty() {
        bail!("--tiers needs at least one directory");
    }
    let names = tier_names(dirs.len());
    let mut tiers = Vec::new();
    for (i, d) in dirs.iter().enumerate() {
        let throttle = if i + 1 == dirs.len() { throttle_last } else { None };
        tiers.push(dir_tier(d, &names[i], throttle, buffered_writes, engine)?);
    }
    Ok(if read_only {
        CheckpointStore::open_read_only(tiers, cfg).await?
    } else {
        CheckpointStore::open(tiers, cfg).await?
    })
}

/// Restores `step` into `dir`, one file per part, through a tier over the directory opened
/// with `engine` (io_uring with O_DIRECT where it allows): each file staged, fsynced and
/// renamed into place only once whole and checked. The tier's staging directory is removed
/// after.
pub async fn restore_to_dir(
    store: &CheckpointStore,
    step: u64,
    dir: &Path,
    opts: &RestoreOptions,
    sync: bool,
    engine: Engine,
) -> Result<RestoreReport> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tier: Arc<dyn Tier> = if sync {
        let options = DirTierOptions::default()
            .with_engine(engine)
            .with_uring(UringConfig::default().with_direct_io(DirectIoPolicy::Auto))
            .with_name("out");
        open_dir_tier(dir, options).with_context(|| format!("opening {} for writing", dir.display()))?.tier
    } else {
        // Buffered writes into the page cache, renamed without fsync (`cp`'s durability).
        let config = PosixConfig::new(dir).with_name("out".to_string()).with_threads(2).with_sync(false);
        Arc::new(PosixTier::new(config).with_context(|| format!("opening {} for writing", dir.display()))?)
    };
    let mut sink = TierSink::new(Arc::clone(&tier), None);
    let res = store.restore(step, &mut sink, opts).await;
    if res.is_err() {
        // Parts of a failed restore that were already written go: nothing in `dir` may look
        // like a checkpoint that was restored.
        for meta in sink.written() {
            let _ = tier.delete(&meta.key).await;
        }
    }
    drop(sink);
    drop(tier);
    let _ = std::fs::remove_dir(dir.join(ringtier_core::fs::STAGING_DIR));
    Ok(res?)
}
