//! [`S3sFsServer`]: s3s-fs (S3 over a directory) in-process, on its own thread and runtime.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{bind_retry, PartChecksumFs, ACCESS_KEY, SECRET_KEY};

/// An `s3s-fs` server (S3 over a directory) on `127.0.0.1`, on its own thread and runtime;
/// it checks signatures against [`ACCESS_KEY`]/[`SECRET_KEY`] (or the credentials given to
/// [`S3sFsServer::start_with_credentials`]). Stops when dropped.
#[derive(Debug)]
pub struct S3sFsServer {
    addr: SocketAddr,
    root: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl S3sFsServer {
    /// Starts a server over `root` (buckets are its subdirectories) on a free port.
    pub fn start(root: &Path) -> std::io::Result<Self> {
        Self::start_on(root, 0)
    }

    /// Starts a server over `root` on `port` (0: any free port); used to restart a stopped
    /// server on the same address.
    pub fn start_on(root: &Path, port: u16) -> std::io::Result<Self> {
        Self::start_with_latency(root, port, Duration::ZERO)
    }

    /// Like [`S3sFsServer::start_on`], answering every request `latency` late (before it is
    /// served): a remote endpoint's round trip, the same for every client (benchmarks).
    pub fn start_with_latency(root: &Path, port: u16, latency: Duration) -> std::io::Result<Self> {
        Self::start_with(root, port, latency, true)
    }

    /// Like [`S3sFsServer::start_with_latency`]; `part_checksums` says whether UploadPart
    /// checks the body against its `x-amz-checksum-*` header (BadDigest on a mismatch) and
    /// returns the checksum, as AWS S3 does. s3s-fs 0.14 checks them on PutObject only; the
    /// check on parts is this server's (a layer over s3s-fs, [`PartChecksumFs`]). Off: a
    /// server that ignores part checksums, as s3s-fs alone does.
    pub fn start_with(root: &Path, port: u16, latency: Duration, part_checksums: bool) -> std::io::Result<Self> {
        Self::start_with_credentials(root, port, latency, part_checksums, (ACCESS_KEY, SECRET_KEY))
    }

    /// Like [`S3sFsServer::start_with`], accepting the credentials `(access key, secret key)`
    /// instead of [`ACCESS_KEY`]/[`SECRET_KEY`] (the benchmarks' server binary takes them from
    /// its caller).
    pub fn start_with_credentials(
        root: &Path,
        port: u16,
        latency: Duration,
        part_checksums: bool,
        (access_key, secret_key): (&str, &str),
    ) -> std::io::Result<Self> {
        use hyper_util::rt::{TokioExecutor, TokioIo};
        use hyper_util::server::conn::auto::Builder as ConnBuilder;

        let fs = s3s_fs::FileSystem::new(root).map_err(|e| std::io::Error::other(format!("s3s-fs: {e:?}")))?;
        let mut b = s3s::service::S3ServiceBuilder::new(PartChecksumFs::new(fs, part_checksums, root.to_path_buf()));
        b.set_auth(s3s::auth::SimpleAuth::from_single(access_key, secret_key));
        let service = b.build();
        let std_listener = bind_retry(port)?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new().name("s3s-fs".into()).spawn(move || {
            let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("s3s-fs runtime: {e}");
                    return;
                }
            };
            rt.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(std_listener) else {
                    return;
                };
                let http = ConnBuilder::new(TokioExecutor::new());
                loop {
                    tokio::select! {
                        res = listener.accept() => {
                            let Ok((socket, _)) = res else { continue };
                            // As S3 endpoints do: without it, a response's last small
                            // segment waits for the client's delayed ACK (40 ms a request).
                            let _ = socket.set_nodelay(true);
                            let service = service.clone();
                            let delayed = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                                let service = service.clone();
                                async move {
                                    if !latency.is_zero() {
                                        tokio::time::sleep(latency).await;
                                    }
                                    hyper::service::Service::call(&service, req).await
                                }
                            });
                            let conn = http.serve_connection(TokioIo::new(socket), delayed).into_owned();
                            tokio::spawn(async move { let _ = conn.await; });
                        }
                        _ = &mut stop_rx => break,
                    }
                }
            });
            // Dropping the runtime here cuts every open connection: a killed server.
            rt.shutdown_timeout(Duration::from_millis(100));
        })?;
        Ok(S3sFsServer { addr, root: root.to_path_buf(), stop: Some(stop_tx), thread: Some(thread) })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The directory the server keeps buckets in.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Creates bucket `name` (a directory).
    pub fn create_bucket(&self, name: &str) -> std::io::Result<()> {
        std::fs::create_dir_all(self.root.join(name))
    }

    /// Stops the server at once, cutting open connections (requests in flight fail).
    pub fn kill(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for S3sFsServer {
    fn drop(&mut self) {
        self.stop_now();
    }
}
