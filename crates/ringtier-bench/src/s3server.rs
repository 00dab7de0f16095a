//! The S3 server the S3 benchmarks run against, on loopback. Every use of an S3 test server
//! in the benchmarks goes through this module ([`start`], [`serve`] and the credentials), so
//! that moving the test servers out of the shipped binary changes only this file.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;

/// The access key the test servers accept.
pub(crate) const ACCESS_KEY: &str = ringtier_s3::testing::ACCESS_KEY;
/// The secret key the test servers accept.
pub(crate) const SECRET_KEY: &str = ringtier_s3::testing::SECRET_KEY;

/// Which S3 server a benchmark runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
pub enum ServerKind {
    /// s3s-fs (Rust, files in a directory), a child process of this binary.
    S3sFs,
    /// moto_server (Python, objects in memory).
    Moto,
}

/// A running S3 server: a child process, killed (and its directory removed) when dropped.
#[derive(Debug)]
pub struct S3Server {
    child: Child,
    endpoint: String,
    root: Option<tempfile::TempDir>,
}

impl S3Server {
    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The directory the buckets are stored in (s3s-fs), where objects are files.
    pub fn root(&self) -> Option<&Path> {
        self.root.as_ref().map(tempfile::TempDir::path)
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts an S3 server of `kind` on a free loopback port, its buckets in a new directory
/// under `dir` (s3s-fs; removed when the server is dropped, so a re-run with the same work
/// directory starts empty), answering every request `latency_ms` late (s3s-fs only) and
/// checking UploadPart checksums when `part_checks` (s3s-fs only, as AWS S3 does); returns
/// once it listens.
pub fn start(kind: ServerKind, dir: &Path, latency_ms: f64, part_checks: bool) -> Result<S3Server> {
    if latency_ms > 0.0 && kind != ServerKind::S3sFs {
        bail!("a server latency needs the s3s-fs server");
    }
    let port = std::net::TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port();
    let (mut cmd, root) = match kind {
        ServerKind::S3sFs => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            let root = tempfile::Builder::new().prefix("s3-").tempdir_in(dir)?;
            let mut c = Command::new(std::env::current_exe()?);
            c.args(["bench", "s3", "serve", "--port", &port.to_string(), "--latency-ms", &latency_ms.to_string()]);
            c.arg("--root").arg(root.path());
            if !part_checks {
                c.arg("--ignore-part-checksums");
            }
            (c, Some(root))
        }
        ServerKind::Moto => {
            let mut c = Command::new("moto_server");
            c.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
            (c, None)
        }
    };
    let child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().context("starting the S3 server")?;
    let server = S3Server { child, endpoint: format!("http://127.0.0.1:{port}"), root };
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("the S3 server did not listen on port {port}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(server)
}

/// Serves S3 (s3s-fs) over `root` on 127.0.0.1:`port` until the process is killed (the
/// child that [`start`] runs: `ringtier bench s3 serve`).
pub(crate) fn serve(root: &Path, port: u16, latency_ms: f64, part_checks: bool) -> Result<()> {
    let latency = Duration::from_secs_f64(latency_ms.max(0.0) / 1000.0);
    let _server = ringtier_s3::testing::S3sFsServer::start_with(root, port, latency, part_checks)?;
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
