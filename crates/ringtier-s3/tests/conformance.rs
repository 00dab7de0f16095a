//! The conformance suite against two independent S3 servers on loopback: s3s-fs in-process
//! and moto_server as a child process (skipped with a message only where moto cannot start,
//! unless `RINGTIER_REQUIRE_MOTO=1`, as CI sets).

use std::sync::Arc;

use ringtier_testkit::conformance::Fixture;
use ringtier_testkit::s3::{test_tier, MotoServer, S3sFsServer};

/// Runs `fut` to completion from inside a multi-threaded test runtime.
fn block<T>(fut: impl std::future::Future<Output = T>) -> T {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(fut))
}

mod s3s_fs {
    use super::*;

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let server = S3sFsServer::start(dir.path()).expect("start s3s-fs");
        let tier = block(test_tier(&server.endpoint(), "conf", "suite/a")).expect("tier");
        Fixture::with_guard(Arc::new(tier), (server, dir))
    }

    ringtier_testkit::conformance_tests!(fixture);
}

mod moto {
    use super::*;

    /// A moto-backed fixture, or `None` (with the reason printed) where moto cannot start.
    fn fixture() -> Option<Fixture> {
        let server = match MotoServer::start() {
            Ok(s) => s,
            Err(e) => {
                if std::env::var("RINGTIER_REQUIRE_MOTO").is_ok_and(|v| v == "1") {
                    panic!("moto_server must run here (RINGTIER_REQUIRE_MOTO=1): {e}");
                }
                eprintln!("skipped: moto_server cannot start ({e}); install it with: pip install 'moto[server]'");
                return None;
            }
        };
        let tier = block(test_tier(&server.endpoint(), "conf", "suite")).expect("tier");
        Some(Fixture::with_guard(Arc::new(tier), server))
    }

    macro_rules! moto_tests {
        ($($name:ident),*) => {$(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let Some(fixture) = fixture() else { return };
                ringtier_testkit::conformance::$name(Arc::clone(&fixture.tier)).await;
                drop(fixture);
            }
        )*};
    }

    moto_tests!(
        round_trip,
        short_read_at_eof,
        unaligned_ranges,
        sub_block_objects,
        concurrent_readers,
        list_and_delete,
        bad_keys,
        commit_visibility,
        batch_reads,
        locks
    );
}
