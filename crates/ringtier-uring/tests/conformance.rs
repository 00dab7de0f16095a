//! The conformance suite against the io_uring tier on ext4 (inside the work tree) and on
//! tmpfs (`/dev/shm`), with each direct-I/O policy that applies.

use std::path::Path;
use std::sync::Arc;

use ringtier_core::{BufferPool, PoolConfig};
use ringtier_testkit::conformance::Fixture;
use ringtier_uring::{BufferedWrites, DirectIoPolicy, UringConfig, UringTier, UringTierOptions};

fn fixture(base: &Path, config: UringConfig) -> Fixture {
    let dir = tempfile::Builder::new().prefix("conf-uring").tempdir_in(base).expect("tempdir");
    let pool = BufferPool::new(PoolConfig::new(256 << 10, 8, 4096)).expect("pool");
    let options = UringTierOptions::default().with_pool(pool);
    let tier = UringTier::with_options(dir.path(), config, options).expect("uring tier");
    Fixture::with_guard(Arc::new(tier), dir)
}

fn ext4() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

mod ext4_direct_auto {
    use super::*;
    ringtier_testkit::conformance_tests!(|| fixture(ext4(), UringConfig::default()));
}

mod ext4_direct_required {
    use super::*;
    ringtier_testkit::conformance_tests!(|| fixture(
        ext4(),
        UringConfig::default().with_direct_io(DirectIoPolicy::Required).with_queue_depth(4)
    ));
}

mod ext4_buffered_two_rings {
    use super::*;
    ringtier_testkit::conformance_tests!(|| fixture(
        ext4(),
        UringConfig::default().with_direct_io(DirectIoPolicy::Off).with_rings(2)
    ));
}

mod tmpfs_auto {
    use super::*;
    ringtier_testkit::conformance_tests!(|| fixture(Path::new("/dev/shm"), UringConfig::default()));
}

/// Buffered writes through the ring (the default issues them from the tier's threads).
mod tmpfs_buffered_writes_on_ring {
    use super::*;
    ringtier_testkit::conformance_tests!(|| fixture(
        Path::new("/dev/shm"),
        UringConfig::default().with_buffered_writes(BufferedWrites::Ring)
    ));
}

mod ext4_buffered_writes_on_ring {
    use super::*;
    ringtier_testkit::conformance_tests!(|| fixture(
        ext4(),
        UringConfig::default().with_direct_io(DirectIoPolicy::Off).with_buffered_writes(BufferedWrites::Ring)
    ));
}

mod ext4_sqpoll {
    use super::*;
    ringtier_testkit::conformance_tests!(|| fixture(ext4(), UringConfig::default().with_sqpoll_idle_ms(10)));
}

/// COOP_TASKRUN: completions run at the driver's next entry into the kernel.
mod ext4_coop_taskrun {
    use super::*;
    ringtier_testkit::conformance_tests!(|| fixture(ext4(), UringConfig::default().with_coop_taskrun(true)));
}

/// DEFER_TASKRUN + SINGLE_ISSUER, two rings, registered files: every ring is submitted to,
/// registered on and reaped by its own driver thread only (the kernel enforces it: EEXIST).
mod ext4_defer_taskrun_fixed_files {
    use super::*;
    ringtier_testkit::conformance_tests!(|| fixture(
        ext4(),
        UringConfig::default().with_defer_taskrun(true).with_rings(2).with_register_files(true)
    ));
}

/// Links inside an io_uring tier's root are refused and named, and nothing outside changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uring_confinement() {
    ringtier_testkit::conformance::confinement(|root| {
        Arc::new(ringtier_uring::UringTier::new(root, ringtier_uring::UringConfig::default()).expect("uring"))
    })
    .await;
}

/// Staged files of dead writers go when the tier is next locked; live and locked ones stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uring_staging_hygiene() {
    ringtier_testkit::conformance::staging_hygiene(|root| {
        Arc::new(ringtier_uring::UringTier::new(root, ringtier_uring::UringConfig::default()).expect("uring"))
    })
    .await;
}

/// Directories emptied by deletes go; anything holding a file or a link stays, links are never
/// followed, and bad prefixes are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uring_empty_dirs_on_disk() {
    ringtier_testkit::conformance::empty_dirs_on_disk(|root| {
        Arc::new(ringtier_uring::UringTier::new(root, ringtier_uring::UringConfig::default()).expect("uring"))
    })
    .await;
}

/// One on-disk format whichever engine wrote it: io_uring (O_DIRECT on ext4, buffered on
/// tmpfs) writes and the thread pool reads, and the reverse, through `open_dir_tier`.
mod across_engines {
    use super::*;
    use ringtier_uring::{open_dir_tier, DirTierOptions, Engine};

    fn open(engine: Engine) -> impl Fn(&Path) -> Arc<dyn ringtier_core::Tier> {
        move |dir: &Path| {
            let options = DirTierOptions::default().with_engine(engine).with_name(engine.as_str());
            open_dir_tier(dir, options).expect("open").tier
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn uring_writes_posix_reads() {
        ringtier_testkit::conformance::same_files_across_engines(open(Engine::Uring), open(Engine::Posix)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn posix_writes_uring_reads() {
        ringtier_testkit::conformance::same_files_across_engines(open(Engine::Posix), open(Engine::Uring)).await;
    }
}

/// A writer killed mid-write leaves a staged file: the tier's first write removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uring_staging_swept_by_first_write() {
    ringtier_testkit::conformance::staging_swept_by_first_write(|root| {
        Arc::new(ringtier_uring::UringTier::new(root, ringtier_uring::UringConfig::default()).expect("uring"))
    })
    .await;
}
