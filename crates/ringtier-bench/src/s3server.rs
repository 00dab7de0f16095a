//! The S3 server the S3 benchmarks run against, on loopback. Every use of an S3 test server
//! in the benchmarks goes through this module ([`start`], `serve` and the credentials).
//!
//! Nothing here links an S3 server: s3s-fs runs as a child process, the test kit's binary
//! `ringtier-s3-server`, found next to this executable (or, where this executable is a test
//! under `deps/`, one directory up), or on the `PATH`. Build it with
//! `cargo build --release -p ringtier-testkit --bin ringtier-s3-server` (`cargo test
//! --workspace` builds it too).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;

/// The access key the benchmarks' servers accept (given to `ringtier-s3-server`).
pub(crate) const ACCESS_KEY: &str = "ringtier-test";
/// The secret key the benchmarks' servers accept (given to `ringtier-s3-server`).
pub(crate) const SECRET_KEY: &str = "ringtier-test-secret";

/// The test kit's s3s-fs server binary.
const SERVER_BIN: &str = "ringtier-s3-server";

/// Which S3 server a benchmark runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
pub enum ServerKind {
    /// s3s-fs (Rust, files in a directory): the test kit's `ringtier-s3-server`, a child
    /// process.
    S3sFs,
    /// moto_server (Python, objects in memory).
    Moto,
}

/// A running S3 server: a child process, killed (and its directory removed) when dropped.
#[derive(Debug)]
pub struct S3Server {
    child: Child,
    /// Held open: `ringtier-s3-server` stops when its stdin closes, so it never outlives this
    /// process, even one that is killed.
    _stdin: Option<ChildStdin>,
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

/// The test kit's `ringtier-s3-server`: next to this executable (or one directory up from a
/// test executable under `deps/`), else on the `PATH`.
fn server_binary() -> Result<PathBuf> {
    if let Some(dir) = std::env::current_exe().ok().as_deref().and_then(Path::parent) {
        let mut dirs = vec![dir.to_path_buf()];
        if dir.file_name().is_some_and(|n| n == "deps") {
            dirs.extend(dir.parent().map(Path::to_path_buf));
        }
        if let Some(bin) = dirs.iter().map(|d| d.join(SERVER_BIN)).find(|b| b.is_file()) {
            return Ok(bin);
        }
    }
    if let Some(bin) = std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(SERVER_BIN))
        .find(|b| b.is_file())
    {
        return Ok(bin);
    }
    bail!(
        "the s3s-fs benchmark server `{SERVER_BIN}` is neither next to this executable nor on the PATH: \
         build it with `cargo build --release -p ringtier-testkit --bin {SERVER_BIN}` (it lands next to \
         target/release/ringtier), or use --server moto"
    )
}

/// The `ringtier-s3-server` command over `root` on `port` (0: any free port).
fn server_command(root: &Path, port: u16, latency_ms: f64, part_checks: bool) -> Result<Command> {
    let mut c = Command::new(server_binary()?);
    c.arg("--root").arg(root);
    c.args(["--port", &port.to_string(), "--latency-ms", &latency_ms.to_string()]);
    c.args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY]);
    if !part_checks {
        c.arg("--ignore-part-checksums");
    }
    Ok(c)
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
    match kind {
        ServerKind::S3sFs => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            let root = tempfile::Builder::new().prefix("s3-").tempdir_in(dir)?;
            let mut child = server_command(root.path(), 0, latency_ms, part_checks)?
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .with_context(|| format!("starting {SERVER_BIN}"))?;
            let stdin = child.stdin.take();
            let stdout = child.stdout.take();
            // The server prints its endpoint once it listens; read it off this thread, so a
            // server that never answers is a timeout, not a hang.
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let line = stdout.and_then(|out| {
                    let mut line = String::new();
                    BufReader::new(out).read_line(&mut line).ok().map(|_| line)
                });
                let _ = tx.send(line);
            });
            let mut server = S3Server { child, _stdin: stdin, endpoint: String::new(), root: Some(root) };
            let endpoint = match rx.recv_timeout(Duration::from_secs(60)) {
                Ok(Some(line)) if line.trim().starts_with("http://") => line.trim().to_string(),
                Ok(_) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    let status = server.child.wait().map(|s| s.to_string()).unwrap_or_default();
                    bail!("{SERVER_BIN} did not start ({status}; its errors are above)");
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => bail!("{SERVER_BIN} did not listen within 60 s"),
            };
            server.endpoint = endpoint;
            Ok(server)
        }
        ServerKind::Moto => {
            let port = std::net::TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port();
            let child = Command::new("moto_server")
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting moto_server (pip install 'moto[server]')")?;
            let server = S3Server { child, _stdin: None, endpoint: format!("http://127.0.0.1:{port}"), root: None };
            let deadline = Instant::now() + Duration::from_secs(60);
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                if Instant::now() > deadline {
                    bail!("the S3 server did not listen on port {port}");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(server)
        }
    }
}

/// Serves S3 (s3s-fs) over `root` on 127.0.0.1:`port` until this process is killed or the
/// server stops (`ringtier bench s3 serve`): runs `ringtier-s3-server` in the foreground.
pub(crate) fn serve(root: &Path, port: u16, latency_ms: f64, part_checks: bool) -> Result<()> {
    std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    // stdin piped and held: the server lives as long as this process.
    let mut child = server_command(root, port, latency_ms, part_checks)?
        .stdin(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {SERVER_BIN}"))?;
    let _stdin = child.stdin.take();
    let status = child.wait()?;
    if !status.success() {
        bail!("{SERVER_BIN} stopped: {status}");
    }
    Ok(())
}
