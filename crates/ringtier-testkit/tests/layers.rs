//! Every layer over every tier kind keeps the inner tier's locks: its capabilities say it
//! locks exactly when the inner tier does, and a lock taken through it is the inner tier's
//! (`conformance::layer_keeps_locks`). The layers: metered, throttled, fault-injecting, power
//! cut, the cache tier, and all of them stacked; the tiers: memory, posix (threads) and
//! io_uring, both on the work tree's file system.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ringtier_cache::{CacheConfig, CacheLevel, CachePolicy, CachedTier};
use ringtier_core::layers::{Metered, Throttle, Throttled};
use ringtier_core::{MemoryTier, PosixConfig, PosixTier, Tier};
use ringtier_testkit::conformance::layer_keeps_locks;
use ringtier_testkit::layers::{Durability, FaultInjecting, PowerCutTier};
use ringtier_uring::{UringConfig, UringTier};

/// Wraps a tier in one layer.
type Wrap = fn(Arc<dyn Tier>) -> Arc<dyn Tier>;

fn metered(inner: Arc<dyn Tier>) -> Arc<dyn Tier> {
    Arc::new(Metered::new(inner))
}

fn throttled(inner: Arc<dyn Tier>) -> Arc<dyn Tier> {
    Arc::new(Throttled::new(inner, Throttle::bandwidth(1 << 30).with_latency(Duration::from_micros(10))))
}

fn faults(inner: Arc<dyn Tier>) -> Arc<dyn Tier> {
    Arc::new(FaultInjecting::new(inner, vec![], 1))
}

fn power_cut(inner: Arc<dyn Tier>) -> Arc<dyn Tier> {
    Arc::new(PowerCutTier::new(inner, Durability::Synced, 1))
}

fn cached(inner: Arc<dyn Tier>) -> Arc<dyn Tier> {
    let cfg = CacheConfig::new(CachePolicy::Lru, vec![CacheLevel::memory(1 << 20)]);
    Arc::new(CachedTier::new(inner, cfg).expect("cache tier"))
}

fn stacked(inner: Arc<dyn Tier>) -> Arc<dyn Tier> {
    metered(throttled(faults(power_cut(cached(inner)))))
}

const LAYERS: [(&str, Wrap); 6] = [
    ("metered", metered),
    ("throttled", throttled),
    ("fault-injecting", faults),
    ("power cut", power_cut),
    ("cache", cached),
    ("all stacked", stacked),
];

/// A directory on the work tree's file system (ext4 here, not tmpfs).
fn scratch(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(prefix).tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir")
}

/// Runs the check for every layer, each over a fresh tier from `open` (inside `dir`).
async fn every_layer_over(open: impl Fn(&Path) -> Arc<dyn Tier>) {
    for (layer, wrap) in LAYERS {
        let dir = scratch("layer-locks");
        let inner = open(dir.path());
        layer_keeps_locks(layer, Arc::clone(&inner), wrap(inner)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_layer_over_memory() {
    assert!(!MemoryTier::new().capabilities().locks, "the memory tier has no locks");
    every_layer_over(|_| Arc::new(MemoryTier::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_layer_over_posix() {
    every_layer_over(|root| {
        let tier = PosixTier::new(PosixConfig::new(root).with_threads(2)).expect("posix tier");
        assert!(tier.capabilities().locks, "file tiers lock");
        Arc::new(tier)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_layer_over_uring() {
    every_layer_over(|root| {
        let tier = UringTier::new(root, UringConfig::default()).expect("uring tier");
        assert!(tier.capabilities().locks, "file tiers lock");
        Arc::new(tier)
    })
    .await;
}

/// A layer that drops the lock (answers `lock` with `None`, as a hand-written layer that forgot
/// to forward it did) over a tier that locks: the check catches it.
#[derive(Debug)]
struct DropsTheLock(Arc<dyn Tier>);

#[async_trait::async_trait]
impl ringtier_core::LayeredTier for DropsTheLock {
    fn inner(&self) -> &dyn Tier {
        self.0.as_ref()
    }

    async fn lock(&self, name: &str) -> ringtier_core::Result<Option<ringtier_core::TierLock>> {
        let _ = name;
        Ok(None)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "lock() through the layer")]
async fn a_layer_that_drops_the_lock_is_caught() {
    let dir = scratch("layer-locks");
    let inner: Arc<dyn Tier> = Arc::new(PosixTier::new(PosixConfig::new(dir.path())).expect("posix tier"));
    layer_keeps_locks("drops the lock", Arc::clone(&inner), Arc::new(DropsTheLock(inner))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "capabilities().locks is true but lock() returned None")]
async fn the_locks_check_catches_a_dropped_lock() {
    let dir = scratch("layer-locks");
    let inner: Arc<dyn Tier> = Arc::new(PosixTier::new(PosixConfig::new(dir.path())).expect("posix tier"));
    ringtier_testkit::conformance::locks(Arc::new(DropsTheLock(inner))).await;
}
