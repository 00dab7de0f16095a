//! Free space and durability as tiers report them: file tiers from the file system they sit
//! on (statvfs, statfs), the memory tier from its bound, layers passing both through.

use std::sync::Arc;

use ringtier_core::layers::{Metered, Throttle, Throttled};
use ringtier_core::{ops, MemoryTier, PosixConfig, PosixTier, Tier};
use ringtier_testkit::layers::FaultInjecting;

fn posix_at(dir: &std::path::Path) -> PosixTier {
    PosixTier::new(PosixConfig::new(dir).with_threads(2).with_create(true)).expect("posix tier")
}

#[tokio::test]
async fn posix_tier_on_disk_is_durable_and_reports_its_file_system_space() {
    let dir = tempfile::Builder::new().prefix("space").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let tier = posix_at(dir.path());
    assert_eq!(ringtier_core::fs::fs_type_name(dir.path()), "ext4", "this test wants the work tree on ext4");
    assert!(tier.capabilities().durable, "ext4 is durable");
    let space = tier.space().await.expect("space").expect("a file tier knows its space");
    assert!(space.total_bytes > 0 && space.free_bytes <= space.total_bytes, "{space:?}");
    // Layers pass space and durability through.
    let inner: Arc<dyn Tier> = Arc::new(tier);
    let layered: Arc<dyn Tier> = Arc::new(Metered::new(Arc::new(Throttled::new(
        Arc::new(FaultInjecting::new(inner, vec![], 1)),
        Throttle::bandwidth(1 << 30),
    ))));
    assert!(layered.capabilities().durable);
    let through = layered.space().await.expect("space").expect("forwarded");
    assert_eq!(through.total_bytes, space.total_bytes);
}

#[tokio::test]
async fn posix_tier_on_tmpfs_is_not_durable() {
    let shm = std::path::Path::new("/dev/shm");
    if ringtier_core::fs::fs_type_name(shm) != "tmpfs" {
        eprintln!("skipped: /dev/shm is not tmpfs here");
        return;
    }
    let dir = tempfile::Builder::new().prefix("ringtier-space").tempdir_in(shm).expect("tempdir");
    assert!(!ringtier_core::fs::is_durable_fs(dir.path()));
    let tier = posix_at(dir.path());
    assert!(!tier.capabilities().durable, "tmpfs loses everything in a power cut");
    assert!(tier.space().await.expect("space").is_some());
}

#[tokio::test]
async fn memory_tier_space_is_its_bound_minus_what_it_holds() {
    assert_eq!(MemoryTier::new().space().await.expect("space"), None, "unbounded: no space to report");
    let tier = MemoryTier::with_capacity(10_000);
    assert!(!tier.capabilities().durable);
    ops::put(&tier, "a", &[7u8; 3000], 1024).await.expect("put");
    let space = tier.space().await.expect("space").expect("bounded");
    assert_eq!((space.free_bytes, space.total_bytes), (7000, 10_000));
}
