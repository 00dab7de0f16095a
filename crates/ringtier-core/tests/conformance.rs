//! The conformance suite against the memory and posix tiers and every layer.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ringtier_core::layers::{Metered, Throttle, Throttled};
use ringtier_core::{MemoryTier, PosixConfig, PosixTier, Tier};
use ringtier_testkit::conformance::Fixture;
use ringtier_testkit::layers::FaultInjecting;

fn posix() -> Fixture {
    // Inside the work tree: a real ext4 filesystem, not tmpfs.
    let dir = tempfile::Builder::new().prefix("conf-posix").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let tier = PosixTier::new(PosixConfig::new(dir.path()).with_threads(4)).expect("posix tier");
    Fixture::with_guard(Arc::new(tier), dir)
}

mod memory {
    use super::*;
    ringtier_testkit::conformance_tests!(|| Fixture::new(Arc::new(MemoryTier::new())));
}

mod posix_tier {
    use super::*;
    ringtier_testkit::conformance_tests!(posix);
}

/// Commits without fsyncs (`PosixConfig::sync` false) keep every other guarantee of the suite.
mod posix_unsynced {
    use super::*;
    ringtier_testkit::conformance_tests!(|| {
        let dir = tempfile::Builder::new()
            .prefix("conf-posix-nosync")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("tempdir");
        let tier = PosixTier::new(PosixConfig::new(dir.path()).with_threads(4).with_sync(false)).expect("posix tier");
        Fixture::with_guard(Arc::new(tier), dir)
    });
}

mod metered {
    use super::*;
    ringtier_testkit::conformance_tests!(|| {
        let f = posix();
        Fixture::with_guard(Arc::new(Metered::new(f.tier)), f.guard)
    });
}

mod throttled {
    use super::*;
    ringtier_testkit::conformance_tests!(|| {
        let inner: Arc<dyn Tier> = Arc::new(MemoryTier::new());
        let t = Throttle::bandwidth(2 << 30).with_latency(Duration::from_micros(50));
        Fixture::new(Arc::new(Throttled::new(inner, t)))
    });
}

mod fault_injecting_without_rules {
    use super::*;
    ringtier_testkit::conformance_tests!(|| {
        let f = posix();
        Fixture::with_guard(Arc::new(FaultInjecting::new(f.tier, vec![], 1)), f.guard)
    });
}

mod power_cut_synced {
    use super::*;
    use ringtier_testkit::layers::{Durability, PowerCutTier};
    ringtier_testkit::conformance_tests!(|| {
        Fixture::new(Arc::new(PowerCutTier::new(Arc::new(MemoryTier::new()), Durability::Synced, 1)))
    });
}

/// A `create` whose future is dropped while the pool thread makes the staged file leaves no
/// staged file behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posix_dropped_create_leaves_no_staged_file() {
    let dir = tempfile::Builder::new().prefix("posix-drop").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let tier = PosixTier::new(PosixConfig::new(dir.path()).with_threads(1)).expect("posix tier");
    let mut dropped = 0;
    for i in 0..50 {
        // Polled once (the job goes to the pool), then dropped unless it already finished.
        let key = format!("k{i}");
        let mut fut = std::pin::pin!(tier.create(&key));
        match std::future::poll_fn(|cx| std::task::Poll::Ready(fut.as_mut().poll(cx))).await {
            std::task::Poll::Ready(writer) => drop(writer.expect("create")),
            std::task::Poll::Pending => dropped += 1,
        }
    }
    assert!(dropped > 0, "no create was dropped while running");
    // The pool's one thread has finished every job once a later create returns.
    drop(tier.create("last").await.expect("create"));
    let staging = dir.path().join(ringtier_core::fs::STAGING_DIR);
    let left: Vec<_> = std::fs::read_dir(&staging).expect("staging dir").flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "staged files left by dropped creates: {left:?}");
}

/// Links inside a posix tier's root are refused and named, and nothing outside changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posix_confinement() {
    ringtier_testkit::conformance::confinement(|root| Arc::new(PosixTier::new(PosixConfig::new(root)).expect("posix")))
        .await;
}

/// Staged files of dead writers go when the tier is next locked; live and locked ones stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posix_staging_hygiene() {
    ringtier_testkit::conformance::staging_hygiene(|root| {
        Arc::new(PosixTier::new(PosixConfig::new(root)).expect("posix"))
    })
    .await;
}

/// Directories emptied by deletes go; anything holding a file or a link stays, links are never
/// followed, and bad prefixes are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posix_empty_dirs_on_disk() {
    ringtier_testkit::conformance::empty_dirs_on_disk(|root| {
        Arc::new(PosixTier::new(PosixConfig::new(root)).expect("posix"))
    })
    .await;
}

/// A writer killed mid-write leaves a staged file: the tier's first write removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posix_staging_swept_by_first_write() {
    ringtier_testkit::conformance::staging_swept_by_first_write(|root| {
        Arc::new(PosixTier::new(PosixConfig::new(root)).expect("posix"))
    })
    .await;
}
