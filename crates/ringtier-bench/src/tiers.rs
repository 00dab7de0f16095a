//! The tiers and checkpoint stores the experiments open, through the front door
//! (`ringtier::open`): these adapters only say which settings an experiment asks for.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use ringtier::open::{open, Engine, OpenOptions};
use ringtier_core::Tier;
use ringtier_migrate::{CheckpointStore, RestoreOptions, RestoreReport, StoreConfig};
use ringtier_uring::{BufferedWrites, DirectIoPolicy, UringConfig};

/// The options of a store tier the experiments open: created, with `engine`, Direct I/O where
/// the file system allows it, buffered writes issued as `buffered_writes` says.
fn store_options(engine: Engine, buffered_writes: BufferedWrites) -> OpenOptions {
    OpenOptions::store()
        .with_engine(engine)
        .with_uring(UringConfig::default().with_direct_io(DirectIoPolicy::Auto).with_buffered_writes(buffered_writes))
        .with_create(true)
}

/// A metered tier over a directory (created when missing) through `engine`, or, for
/// `s3://bucket/prefix[?settings]`, the S3 tier; throttled to `throttle` bytes per second
/// where given.
pub fn dir_tier(
    dir: &Path,
    name: &str,
    throttle: Option<u64>,
    buffered_writes: BufferedWrites,
    engine: Engine,
) -> Result<Arc<dyn Tier>> {
    let options = store_options(engine, buffered_writes).with_name(name).with_throttle(throttle);
    Ok(open(dir, &options).with_context(|| format!("opening tier {name} at {}", dir.display()))?.tier)
}

/// A metered io_uring tier over a local directory set up with `config` (created if missing),
/// throttled to `throttle` bytes per second if given. `tune --workload ckpt` opens its store's
/// tier here with each configuration's settings (io_uring asked for by name: a tuning run of
/// the thread pool would measure nothing it tunes).
pub(crate) fn uring_dir_tier(
    dir: &Path,
    name: &str,
    throttle: Option<u64>,
    config: UringConfig,
) -> Result<Arc<dyn Tier>> {
    let options = OpenOptions::store()
        .with_engine(Engine::Uring)
        .with_uring(config)
        .with_create(true)
        .with_name(name)
        .with_throttle(throttle);
    Ok(open(dir, &options).with_context(|| format!("opening tier {name} at {}", dir.display()))?.tier)
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
    let options = store_options(engine, buffered_writes);
    Ok(ringtier::store::open_store(dirs, &options, throttle_last, cfg, read_only).await?)
}

/// Restores `step` into `dir`, one file per part, through a tier opened with `engine` (see
/// `ringtier::store::restore_to_dir`).
pub async fn restore_to_dir(
    store: &CheckpointStore,
    step: u64,
    dir: &Path,
    opts: &RestoreOptions,
    sync: bool,
    engine: Engine,
) -> Result<RestoreReport> {
    let options = OpenOptions::store().with_engine(engine);
    Ok(ringtier::store::restore_to_dir(store, step, dir, opts, sync, &options).await?)
}
