//! S3 servers on loopback for the S3 tier's tests: `s3s-fs` in-process (`s3s_fs.rs`, with
//! AWS's checks of part checksums and conditional writes layered over it in
//! `part_checksum_fs.rs`, which also serves GetObject bodies in 1 MiB reads: `file_body.rs`),
//! `moto_server` as a child process (`moto.rs`), and a
//! fault-injecting HTTP proxy (`proxy.rs`). They reach `ringtier-s3` only through its public
//! API, and [`forget_live_uploads`] through its test-only feature `test-hooks`.
//!
//! The benchmarks run the same s3s-fs server as a child process, the kit's binary
//! `ringtier-s3-server` (`src/bin/ringtier-s3-server.rs`), so that nothing shipped links s3s.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use ringtier_s3::{S3Config, S3Tier};

mod file_body;
mod moto;
mod part_checksum_fs;
mod proxy;
mod s3s_fs;

pub use moto::MotoServer;
pub use part_checksum_fs::PartChecksumFs;
pub use proxy::{Fault, FaultProxy};
pub use s3s_fs::S3sFsServer;

/// Access key the test servers accept.
pub const ACCESS_KEY: &str = "ringtier-test";
/// Secret key the test servers accept.
pub const SECRET_KEY: &str = "ringtier-test-secret";

/// A configuration for `s3://bucket/prefix` at `endpoint` with the test credentials, short
/// timeouts and retry deadline (tests).
pub fn test_config(endpoint: &str, bucket: &str, prefix: &str) -> S3Config {
    S3Config::new(bucket, prefix)
        .with_endpoint(endpoint)
        .with_credentials(ACCESS_KEY, SECRET_KEY)
        .with_region("us-east-1")
        .with_allow_http(true)
        .with_request_timeout(Duration::from_secs(10))
        .with_retry_deadline(Duration::from_secs(20))
        .with_backoff(Duration::from_millis(20), Duration::from_millis(500))
}

/// A tier on `bucket`/`prefix` at `endpoint` (the bucket created if missing).
pub async fn test_tier(endpoint: &str, bucket: &str, prefix: &str) -> ringtier_core::Result<S3Tier> {
    let tier = S3Tier::new(test_config(endpoint, bucket, prefix))?;
    tier.create_bucket().await?;
    Ok(tier)
}

/// Simulates the death of this process for upload recovery: forgets which multipart uploads
/// its writers own, so that [`S3Tier::recover_uploads`] treats them as left behind. Call it
/// after `std::mem::forget`ting the writers that stand for the killed process.
pub fn forget_live_uploads() {
    ringtier_s3::test_hooks::forget_live_uploads();
}

/// A listener on `127.0.0.1:port` (0: any free port), retried for up to 10 s while a
/// given port is still taken (a server restarted on its old port).
fn bind_retry(port: u16) -> std::io::Result<TcpListener> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match TcpListener::bind(("127.0.0.1", port)) {
            Ok(l) => return Ok(l),
            Err(e) if port != 0 && Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(e),
        }
    }
}

/// A port free on `127.0.0.1` now.
fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port())
}
