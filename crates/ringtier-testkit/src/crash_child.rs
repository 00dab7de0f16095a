//! The crash child: a process that saves checkpoints through a two-tier store (io_uring tiers
//! over a fast and a slow directory, the slow one throttled, `keep_last` 1) and prints
//! `saved STEP` once each save has returned, until it is killed. The SIGKILL test
//! (`tests/sigkill.rs`) kills the kit's binary `ringtier-crash-child` at random moments and
//! checks that every printed step survives, whole.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use ringtier_core::layers::{Throttle, Throttled};
use ringtier_core::{Result, Tier};
use ringtier_migrate::{CheckpointStore, Part, StoreConfig};
use ringtier_uring::{DirectIoPolicy, UringConfig, UringTier, UringTierOptions};

/// Deterministic contents of part `part` of checkpoint `step`, `size` bytes: the child writes
/// them, the test regenerates them to check what it restores.
pub fn part_contents(step: u64, part: usize, size: usize) -> Vec<u8> {
    (0..size as u64).map(|i| ((i.wrapping_mul(2_654_435_761) >> 7) ^ (step * 31 + part as u64)) as u8).collect()
}

/// The size of the second part of a checkpoint whose first part is `size` bytes.
pub fn second_part_size(size: usize) -> usize {
    size / 3 + 1
}

/// Opens the child's store: io_uring tiers `fast` and `slow` over the two directories
/// (created if missing, O_DIRECT where the file system allows), the slow one throttled to
/// `slow_bytes_per_sec`, keeping the last checkpoint.
pub async fn open_store(fast: &Path, slow: &Path, slow_bytes_per_sec: u64) -> Result<CheckpointStore> {
    let tier = |dir: &Path, name: &str| -> Result<Arc<dyn Tier>> {
        let options = UringTierOptions::default().with_name(name.to_string()).with_create_root(true);
        let config = UringConfig::default().with_direct_io(DirectIoPolicy::Auto);
        Ok(Arc::new(UringTier::with_options(dir, config, options)?))
    };
    let slow_tier: Arc<dyn Tier> =
        Arc::new(Throttled::new(tier(slow, "slow")?, Throttle::bandwidth(slow_bytes_per_sec)));
    CheckpointStore::open(vec![tier(fast, "fast")?, slow_tier], StoreConfig::default().with_keep_last(1)).await
}

/// Saves `count` checkpoints from `start` on (or from the step after the newest one stored,
/// if later), two parts each ([`part_contents`]), printing `saved STEP` on stdout after each
/// save returns (and is therefore durable); then drains and prints `drained`.
pub async fn save_until_killed(
    store: &CheckpointStore,
    start: u64,
    count: u64,
    size: usize,
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let start = start.max(store.latest().await?.map_or(0, |s| s + 1));
    let mut out = std::io::stdout();
    for step in start..start + count {
        let a = part_contents(step, 0, size);
        let b = part_contents(step, 1, second_part_size(size));
        store.save(step, vec![Part::bytes("a", &a), Part::bytes("b", &b)]).await?;
        writeln!(out, "saved {step}")?;
        out.flush()?;
    }
    store.drain().await?;
    writeln!(out, "drained")?;
    out.flush()?;
    Ok(())
}
