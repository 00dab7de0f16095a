//! S3 servers on loopback for tests and benchmarks (feature `testing`): `s3s-fs` in-process,
//! `moto_server` as a child process, and a fault-injecting HTTP proxy.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{S3Config, S3Tier};

/// Access key the test servers accept.
pub const ACCESS_KEY: &str = "ringtier-test";
/// Secret key the test servers accept.
pub const SECRET_KEY: &str = "ringtier-test-secret";

/// An `s3s-fs` server (S3 over a directory) on `127.0.0.1`, on its own thread and runtime;
/// it checks signatures against [`ACCESS_KEY`]/[`SECRET_KEY`]. Stops when dropped.
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
        use hyper_util::rt::{TokioExecutor, TokioIo};
        use hyper_util::server::conn::auto::Builder as ConnBuilder;

        let fs = s3s_fs::FileSystem::new(root).map_err(|e| std::io::Error::other(format!("s3s-fs: {e:?}")))?;
        let mut b = s3s::service::S3ServiceBuilder::new(PartChecksumFs {
            inner: fs,
            check: part_checksums,
            root: root.to_path_buf(),
            conditional: tokio::sync::Mutex::new(()),
        });
        b.set_auth(s3s::auth::SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
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

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port())
}

fn wait_for_port(port: u16, child: &mut Child, timeout: Duration) -> std::io::Result<()> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(std::io::Error::other(format!("moto_server exited at start: {status}")));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "moto_server did not listen in time"))
}

/// A `moto_server` (Python `moto[server]`) child process on `127.0.0.1`. Killed when dropped.
#[derive(Debug)]
pub struct MotoServer {
    child: Child,
    port: u16,
}

impl MotoServer {
    /// Starts `moto_server` (from `$PATH`, or `python3 -m moto.server`) on a free port.
    pub fn start() -> std::io::Result<Self> {
        let port = free_port()?;
        let spawn = |cmd: &mut Command| cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn();
        let mut child = match spawn(Command::new("moto_server").args(["-H", "127.0.0.1", "-p", &port.to_string()])) {
            Ok(c) => c,
            Err(_) => {
                spawn(Command::new("python3").args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()]))?
            }
        };
        if let Err(e) = wait_for_port(port, &mut child, Duration::from_secs(60)) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
        Ok(MotoServer { child, port })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

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

/// What the [`FaultProxy`] does to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Answer with this HTTP status (and an S3-style XML error body) instead of forwarding.
    Status(u16),
    /// Hold the request this long without answering, then drop the connection.
    Stall(Duration),
    /// Forward the request with one byte of its body flipped (damage on the way).
    CorruptBody,
}

#[derive(Debug, Default)]
struct Rules {
    /// Faults for the next requests, in order.
    next: Vec<Fault>,
    /// A fault for requests whose request line contains the string (the next n, or all).
    matching: Vec<(String, Fault, Option<usize>)>,
}

/// An HTTP proxy on `127.0.0.1` in front of an S3 server that can answer requests with 5xx
/// errors or stall them. It serves one request per connection (`Connection: close`), so each
/// request is seen on its own.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    rules: Arc<Mutex<Rules>>,
    requests: Arc<AtomicU64>,
    faults: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl FaultProxy {
    /// Starts a proxy forwarding to `upstream` (`host:port`).
    pub fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let addr = listener.local_addr()?;
        let rules = Arc::new(Mutex::new(Rules::default()));
        let (requests, faults, stop) =
            (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let (r, q, f, s) = (Arc::clone(&rules), Arc::clone(&requests), Arc::clone(&faults), Arc::clone(&stop));
        std::thread::Builder::new().name("fault-proxy".into()).spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (r, q, f) = (Arc::clone(&r), Arc::clone(&q), Arc::clone(&f));
                std::thread::spawn(move || {
                    let _ = serve_one(conn, upstream, &r, &q, &f);
                });
            }
        })?;
        Ok(FaultProxy { addr, rules, requests, faults, stop })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The next `n` requests get `fault`.
    pub fn fail_next(&self, n: usize, fault: Fault) {
        let mut r = self.rules.lock().unwrap_or_else(|p| p.into_inner());
        r.next.extend(std::iter::repeat_n(fault, n));
    }

    /// Every request whose request line (`METHOD /path?query HTTP/1.1`) contains `pattern`
    /// gets `fault`, until [`clear`](Self::clear).
    pub fn fail_matching(&self, pattern: &str, fault: Fault) {
        self.rules.lock().unwrap_or_else(|p| p.into_inner()).matching.push((pattern.to_string(), fault, None));
    }

    /// The next `n` requests whose request line contains `pattern` get `fault`.
    pub fn fail_matching_n(&self, pattern: &str, fault: Fault, n: usize) {
        self.rules.lock().unwrap_or_else(|p| p.into_inner()).matching.push((pattern.to_string(), fault, Some(n)));
    }

    /// Removes every rule.
    pub fn clear(&self) {
        *self.rules.lock().unwrap_or_else(|p| p.into_inner()) = Rules::default();
    }

    /// Requests seen so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }

    /// Requests answered with a fault so far.
    pub fn faults(&self) -> u64 {
        self.faults.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve_one(
    mut client: TcpStream,
    upstream: SocketAddr,
    rules: &Mutex<Rules>,
    requests: &AtomicU64,
    faults: &AtomicU64,
) -> std::io::Result<()> {
    client.set_read_timeout(Some(Duration::from_secs(30)))?;
    // Request head.
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if client.read(&mut byte)? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let line = text.lines().next().unwrap_or("").to_string();
    let length: usize = text
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case("content-length").then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    client.read_exact(&mut body)?;
    requests.fetch_add(1, Ordering::SeqCst);
    let fault = {
        let mut r = rules.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = r.matching.iter().position(|(p, _, n)| line.contains(p.as_str()) && *n != Some(0)) {
            let rule = &mut r.matching[i];
            if let Some(n) = rule.2.as_mut() {
                *n -= 1;
            }
            Some(rule.1.clone())
        } else if !r.next.is_empty() {
            Some(r.next.remove(0))
        } else {
            None
        }
    };
    match fault {
        Some(Fault::Status(code)) => {
            faults.fetch_add(1, Ordering::SeqCst);
            let xml = format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{}</Code><Message>injected by the fault proxy</Message></Error>",
                if code >= 500 { "SlowDown" } else { "InvalidRequest" }
            );
            let resp = format!(
                "HTTP/1.1 {code} Injected\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{xml}",
                xml.len()
            );
            client.write_all(resp.as_bytes())?;
            return Ok(());
        }
        Some(Fault::Stall(d)) => {
            faults.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(d);
            return Ok(());
        }
        Some(Fault::CorruptBody) => {
            faults.fetch_add(1, Ordering::SeqCst);
            if let Some(b) = body.get_mut(length / 2) {
                *b ^= 0x5a;
            }
        }
        None => {}
    }
    // Forward with Connection: close, then copy the response until the server closes.
    let mut up = TcpStream::connect(upstream)?;
    let mut new_head = String::new();
    for l in text.split("\r\n").filter(|l| !l.is_empty()) {
        if l.to_ascii_lowercase().starts_with("connection:") {
            continue;
        }
        new_head.push_str(l);
        new_head.push_str("\r\n");
    }
    new_head.push_str("Connection: close\r\n\r\n");
    up.write_all(new_head.as_bytes())?;
    up.write_all(&body)?;
    std::io::copy(&mut up, &mut client)?;
    Ok(())
}

/// Simulates the death of this process for upload recovery: forgets which multipart uploads
/// its writers own, so that [`S3Tier::recover_uploads`] treats them as left behind. Call it
/// after `std::mem::forget`ting the writers that stand for the killed process.
pub fn forget_live_uploads() {
    crate::uploads::forget_live_uploads();
}

/// s3s-fs with AWS S3's conditional writes made atomic (`If-None-Match: *` and `If-Match`
/// on PutObject, `If-Match` on DeleteObject, which s3s-fs 0.14 ignores) and with AWS S3's
/// check of UploadPart checksums: a part whose body does not match its
/// `x-amz-checksum-crc32|crc32c|sha1|sha256|crc64nvme` header is refused with `BadDigest`
/// (400), and an accepted part's response carries the checksum the server computed, as AWS
/// does; as AWS, a part checksum of a kind the upload was not created with
/// (`x-amz-checksum-algorithm`) is refused, and the completion of such an upload must name
/// every part's checksum. s3s-fs 0.14 checks these headers on PutObject but ignores them on
/// UploadPart. Every other operation is s3s-fs's own.
#[derive(Debug)]
pub struct PartChecksumFs {
    inner: s3s_fs::FileSystem,
    check: bool,
    /// The checksum algorithm each multipart upload was created with (upload id to
    /// lower-case name), as AWS keeps it: a part checksum of another kind is refused, and the
    /// completion must name every part's checksum.
    /// Kept in files under the server's root (`.checksum-algorithm-UPLOAD_ID`), so a
    /// restarted server knows them, as s3s-fs keeps its uploads.
    root: PathBuf,
    /// Held across every conditional write (PutObject with `If-None-Match`/`If-Match`,
    /// DeleteObject with `If-Match`): its check and its write are one step, as on AWS.
    /// s3s-fs 0.14 checks the PutObject conditions, but apart from the write (two racing
    /// `If-None-Match: *` creates can both succeed), and ignores `If-Match` on DeleteObject.
    conditional: tokio::sync::Mutex<()>,
}

impl PartChecksumFs {
    fn algorithm_file(&self, upload_id: &str) -> Option<PathBuf> {
        let ok = !upload_id.is_empty() && upload_id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        ok.then(|| self.root.join(format!(".checksum-algorithm-{upload_id}")))
    }

    fn algorithm_of(&self, upload_id: &str) -> Option<String> {
        std::fs::read_to_string(self.algorithm_file(upload_id)?).ok().map(|s| s.trim().to_string())
    }

    fn set_algorithm(&self, upload_id: &str, alg: &str) {
        if let Some(f) = self.algorithm_file(upload_id) {
            let _ = std::fs::write(f, alg);
        }
    }
}

macro_rules! part_checksum_fs {
    ($($op:ident: $input:ident => $output:ident),* $(,)?) => {
        #[async_trait::async_trait]
        impl s3s::S3 for PartChecksumFs {
            $(
                async fn $op(
                    &self,
                    req: s3s::S3Request<s3s::dto::$input>,
                ) -> s3s::S3Result<s3s::S3Response<s3s::dto::$output>> {
                    self.inner.$op(req).await
                }
            )*

            async fn create_multipart_upload(
                &self,
                req: s3s::S3Request<s3s::dto::CreateMultipartUploadInput>,
            ) -> s3s::S3Result<s3s::S3Response<s3s::dto::CreateMultipartUploadOutput>> {
                let alg = req.input.checksum_algorithm.as_ref().map(|a| a.as_str().to_ascii_lowercase());
                let resp = self.inner.create_multipart_upload(req).await?;
                if let (Some(alg), Some(id)) = (alg, resp.output.upload_id.as_deref()) {
                    self.set_algorithm(id, &alg);
                }
                Ok(resp)
            }

            async fn complete_multipart_upload(
                &self,
                req: s3s::S3Request<s3s::dto::CompleteMultipartUploadInput>,
            ) -> s3s::S3Result<s3s::S3Response<s3s::dto::CompleteMultipartUploadOutput>> {
                if self.check {
                    if let Some(alg) = self.algorithm_of(&req.input.upload_id) {
                        let parts = req.input.multipart_upload.as_ref().and_then(|m| m.parts.as_ref());
                        for (n, p) in parts.into_iter().flatten().enumerate() {
                            let has = match alg.as_str() {
                                "crc32" => p.checksum_crc32.is_some(),
                                "crc32c" => p.checksum_crc32c.is_some(),
                                "sha1" => p.checksum_sha1.is_some(),
                                "sha256" => p.checksum_sha256.is_some(),
                                "crc64nvme" => p.checksum_crc64nvme.is_some(),
                                _ => true,
                            };
                            if !has {
                                return Err(s3s::s3_error!(
                                    InvalidRequest,
                                    "The upload was created using a {alg} checksum. The complete request must include the checksum for each part. It was missing for part {} in the request.",
                                    n + 1
                                ));
                            }
                        }
                    }
                }
                let id = req.input.upload_id.clone();
                let resp = self.inner.complete_multipart_upload(req).await?;
                if let Some(f) = self.algorithm_file(&id) {
                    let _ = std::fs::remove_file(f);
                }
                Ok(resp)
            }

            async fn put_object(
                &self,
                req: s3s::S3Request<s3s::dto::PutObjectInput>,
            ) -> s3s::S3Result<s3s::S3Response<s3s::dto::PutObjectOutput>> {
                // AWS: a PutObject into a missing bucket is NoSuchBucket; s3s-fs 0.14 creates
                // the bucket's directory instead.
                if !self.root.join(&req.input.bucket).is_dir() {
                    return Err(s3s::s3_error!(NoSuchBucket));
                }
                if req.input.if_none_match.is_none() && req.input.if_match.is_none() {
                    return self.inner.put_object(req).await;
                }
                // s3s-fs checks the conditions; held here, no other conditional write comes
                // between its check and its write.
                let _one = self.conditional.lock().await;
                self.inner.put_object(req).await
            }

            async fn delete_object(
                &self,
                req: s3s::S3Request<s3s::dto::DeleteObjectInput>,
            ) -> s3s::S3Result<s3s::S3Response<s3s::dto::DeleteObjectOutput>> {
                let Some(want) = req.input.if_match.clone() else {
                    return self.inner.delete_object(req).await;
                };
                let _one = self.conditional.lock().await;
                let head = s3s::S3Request {
                    input: s3s::dto::HeadObjectInput::builder()
                        .bucket(req.input.bucket.clone())
                        .key(req.input.key.clone())
                        .build()
                        .map_err(|e| s3s::s3_error!(InternalError, "head input: {e}"))?,
                    method: http::Method::HEAD,
                    uri: req.uri.clone(),
                    headers: http::HeaderMap::new(),
                    extensions: http::Extensions::new(),
                    credentials: req.credentials.clone(),
                    region: req.region.clone(),
                    service: req.service.clone(),
                    trailing_headers: None,
                };
                // AWS: 412 when the object's ETag differs, 404 when there is no object.
                let etag = match self.inner.head_object(head).await {
                    Ok(r) => r.output.e_tag,
                    Err(e) if *e.code() == s3s::S3ErrorCode::NoSuchKey => return Err(s3s::s3_error!(NoSuchKey)),
                    Err(e) => return Err(e),
                };
                let matches = match (&want, &etag) {
                    (s3s::dto::ETagCondition::Any, Some(_)) => true,
                    (s3s::dto::ETagCondition::ETag(w), Some(have)) => have.strong_cmp(w),
                    _ => false,
                };
                if !matches {
                    return Err(s3s::s3_error!(PreconditionFailed, "At least one of the pre-conditions you specified did not hold"));
                }
                self.inner.delete_object(req).await
            }

            async fn upload_part(
                &self,
                mut req: s3s::S3Request<s3s::dto::UploadPartInput>,
            ) -> s3s::S3Result<s3s::S3Response<s3s::dto::UploadPartOutput>> {
                use futures::TryStreamExt;
                let i = &req.input;
                let want = (
                    i.checksum_crc32.clone(),
                    i.checksum_crc32c.clone(),
                    i.checksum_sha1.clone(),
                    i.checksum_sha256.clone(),
                    i.checksum_crc64nvme.clone(),
                );
                if !self.check || want == (None, None, None, None, None) {
                    return self.inner.upload_part(req).await;
                }
                // AWS: "Checksum Type mismatch occurred, expected checksum Type: null, actual
                // checksum Type: crc32c" for a part checksum the upload was not created for.
                let sent = [("crc32", want.0.is_some()), ("crc32c", want.1.is_some()), ("sha1", want.2.is_some()), ("sha256", want.3.is_some()), ("crc64nvme", want.4.is_some())]
                    .iter()
                    .find(|(_, on)| *on)
                    .map(|(n, _)| *n)
                    .unwrap_or("");
                let expected = self.algorithm_of(&i.upload_id);
                if expected.as_deref() != Some(sent) {
                    return Err(s3s::s3_error!(
                        InvalidRequest,
                        "Checksum Type mismatch occurred, expected checksum Type: {}, actual checksum Type: {sent}",
                        expected.as_deref().unwrap_or("null")
                    ));
                }
                let mut hasher = s3s::checksum::ChecksumHasher::default();
                if want.0.is_some() {
                    hasher.crc32 = Some(Default::default());
                }
                if want.1.is_some() {
                    hasher.crc32c = Some(Default::default());
                }
                if want.2.is_some() {
                    hasher.sha1 = Some(Default::default());
                }
                if want.3.is_some() {
                    hasher.sha256 = Some(Default::default());
                }
                if want.4.is_some() {
                    hasher.crc64nvme = Some(Default::default());
                }
                let hasher = Arc::new(Mutex::new(Some(hasher)));
                if let Some(body) = req.input.body.take() {
                    let h = Arc::clone(&hasher);
                    let body = body
                        .inspect_ok(move |b| {
                            if let Some(h) = h.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
                                h.update(b);
                            }
                        })
                        .map_err(std::io::Error::other);
                    req.input.body = Some(s3s::dto::StreamingBlob::wrap(body));
                }
                let mut resp = self.inner.upload_part(req).await?;
                let got = hasher.lock().unwrap_or_else(|p| p.into_inner()).take().map(|h| h.finalize()).unwrap_or_default();
                let have = (
                    got.checksum_crc32.clone(),
                    got.checksum_crc32c.clone(),
                    got.checksum_sha1.clone(),
                    got.checksum_sha256.clone(),
                    got.checksum_crc64nvme.clone(),
                );
                if have != want {
                    // The part's file stays under the upload until it is overwritten, completed
                    // without it (a client never lists a refused part) or aborted.
                    return Err(s3s::s3_error!(BadDigest, "the part's checksum does not match its body"));
                }
                let o = &mut resp.output;
                (o.checksum_crc32, o.checksum_crc32c, o.checksum_sha1, o.checksum_sha256, o.checksum_crc64nvme) = have;
                Ok(resp)
            }
        }
    };
}

part_checksum_fs!(
    create_bucket: CreateBucketInput => CreateBucketOutput,
    copy_object: CopyObjectInput => CopyObjectOutput,
    delete_bucket: DeleteBucketInput => DeleteBucketOutput,
    delete_objects: DeleteObjectsInput => DeleteObjectsOutput,
    get_bucket_location: GetBucketLocationInput => GetBucketLocationOutput,
    get_object: GetObjectInput => GetObjectOutput,
    head_bucket: HeadBucketInput => HeadBucketOutput,
    head_object: HeadObjectInput => HeadObjectOutput,
    list_buckets: ListBucketsInput => ListBucketsOutput,
    list_objects: ListObjectsInput => ListObjectsOutput,
    list_objects_v2: ListObjectsV2Input => ListObjectsV2Output,
    upload_part_copy: UploadPartCopyInput => UploadPartCopyOutput,
    list_parts: ListPartsInput => ListPartsOutput,
    abort_multipart_upload: AbortMultipartUploadInput => AbortMultipartUploadOutput,
);
