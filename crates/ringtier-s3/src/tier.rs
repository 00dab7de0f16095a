//! [`S3Tier`]: the [`Tier`] trait over an S3 bucket and prefix.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey, Checksum};
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig,
};
use ringtier_core::key::{validate_key, validate_prefix};
use ringtier_core::{
    AlignedBuf, Capabilities, Error, ErrorKind, ObjectMeta, ObjectWriter, Operation, ReadBatch, Result, Tier,
};

use crate::config::S3Config;
use crate::error::{map_err, Retry};
use crate::parts::{LentPool, PartPool};
use crate::signed::SignedClient;
use crate::writer::S3Writer;

/// The tier's own tokio runtime: every request runs on it, so callers may use any executor
/// (or none, through `ringtier_core::blocking`), and connections live as long as the tier.
pub(crate) struct IoRuntime {
    rt: Option<tokio::runtime::Runtime>,
    pub(crate) handle: tokio::runtime::Handle,
}

impl IoRuntime {
    fn new(threads: usize, name: &str) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name(format!("ringtier-{name}"))
            .enable_all()
            .build()
            .map_err(|e| Error::from(e).with_operation(Operation::Setup))?;
        let handle = rt.handle().clone();
        Ok(IoRuntime { rt: Some(rt), handle })
    }
}

impl Drop for IoRuntime {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which tokio forbids inside another runtime's worker;
        // requests still running are cancelled either way.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// State shared by the tier, its clones and its writers.
pub(crate) struct Inner {
    pub(crate) cfg: S3Config,
    pub(crate) store: Arc<AmazonS3>,
    pub(crate) io: IoRuntime,
    pub(crate) retry: Retry,
    /// `prefix/` (or empty): what every object path starts with.
    pub(crate) root: String,
    /// Resolved endpoint (`None`: AWS), naming the tier's leases in this process.
    pub(crate) endpoint: Option<String>,
    /// Part buffers of this tier's uploads, reused.
    pub(crate) parts: Arc<PartPool>,
    /// Writers' buffers sent as parts without a copy, and those handed back in their place.
    pub(crate) lent: Arc<LentPool>,
    /// The requests object_store has no call for, signed and sent through one HTTP client.
    pub(crate) signed: SignedClient,
    /// Whether the server refuses a part whose checksum does not match (probed once).
    pub(crate) part_checks: tokio::sync::OnceCell<bool>,
    /// Leases of this tier lost to a take-over while their guard lives (lock name to why):
    /// while any is, commits and deletes fail with `Busy`.
    pub(crate) lost_leases: std::sync::Mutex<std::collections::HashMap<String, String>>,
}

impl Inner {
    /// Runs `fut` on the tier's runtime and waits for it from any executor.
    pub(crate) async fn spawn<T: Send + 'static>(&self, fut: impl Future<Output = T> + Send + 'static) -> Result<T> {
        self.io.handle.spawn(fut).await.map_err(|e| {
            Error::new(ErrorKind::Shutdown, format!("S3 request task ended early: {e}")).with_tier(&self.cfg.name)
        })
    }

    /// The runtime requests run on.
    pub(crate) fn io_handle(&self) -> &tokio::runtime::Handle {
        &self.io.handle
    }

    /// The object path of `key`.
    pub(crate) fn path(&self, key: &str) -> Result<Path> {
        Path::parse(format!("{}{key}", self.root)).map_err(|e| {
            Error::new(ErrorKind::InvalidKey, format!("not a valid S3 object path: {e}")).with_tier(&self.cfg.name)
        })
    }

    /// `Busy` while a lease of this tier is lost (another writer took the prefix over).
    pub(crate) fn check_lease(&self, op: Operation, key: &str) -> Result<()> {
        let lost = self.lost_leases.lock().unwrap_or_else(|p| p.into_inner());
        match lost.values().next() {
            Some(why) => Err(Error::new(ErrorKind::Busy, format!("{why}: this writer no longer owns the prefix"))
                .context(op, key, &self.cfg.name)),
            None => Ok(()),
        }
    }

    /// Maps an object_store error of `key` (bucket and key named in the message).
    pub(crate) fn err(&self, e: object_store::Error, op: Operation, key: &str) -> Error {
        map_err(e, &self.cfg.name, &self.cfg.bucket, op, &format!("{}{key}", self.root))
    }

    /// Creates the tier's bucket (`PUT /BUCKET`); an existing bucket owned by the caller is
    /// fine.
    pub(crate) async fn create_bucket(&self) -> Result<()> {
        let url = self.signed.bucket_url("");
        let answer = self.retry.run(|| self.signed.send("PUT", &url, &[], Bytes::new(), Operation::Setup, "")).await?;
        let (code, _) = crate::xml::parse_error(&answer.body);
        if (200..300).contains(&answer.status) || code == "BucketAlreadyOwnedByYou" {
            return Ok(());
        }
        let what = format!("creating bucket {:?}", self.cfg.bucket);
        Err(self.signed.answer_error(answer.status, &answer.body, &what, Operation::Setup, ""))
    }

    /// One PUT of `data` as `path` (object `key`), retried on temporary errors; run it on the
    /// tier's runtime ([`Inner::spawn`]).
    pub(crate) async fn put_retrying(&self, path: &Path, data: Bytes, key: &str) -> Result<()> {
        self.retry
            .run(|| async {
                self.store
                    .put(path, PutPayload::from(data.clone()))
                    .await
                    .map(|_| ())
                    .map_err(|e| self.err(e, Operation::Commit, key))
            })
            .await
    }

    async fn head(self: &Arc<Self>, key: &str, op: Operation) -> Result<ObjectMeta> {
        let path = self.path(key).map_err(|e| e.context(op, key, &self.cfg.name))?;
        let me = Arc::clone(self);
        let owned = key.to_string();
        self.spawn(async move {
            me.retry
                .run(|| async {
                    me.store.head(&path).await.map_err(|e| me.err(e, op, &owned)).map(|m| ObjectMeta {
                        key: owned.clone(),
                        size: m.size,
                        modified: Some(m.last_modified.into()),
                    })
                })
                .await
        })
        .await?
    }

    /// One range read into `buf`; the end of the object is found with a HEAD only when the
    /// server refuses the range (a read at or past the end, an empty object).
    async fn read_range(
        self: Arc<Self>,
        key: String,
        offset: u64,
        len: usize,
        mut buf: AlignedBuf,
    ) -> (Result<usize>, AlignedBuf) {
        if len > buf.capacity() {
            let e = Error::new(
                ErrorKind::InvalidInput,
                format!("buffer of {} bytes is too small for a {len}-byte read", buf.capacity()),
            );
            return (Err(e.context(Operation::Read, &key, &self.cfg.name)), buf);
        }
        let path = match self.path(&key) {
            Ok(p) => p,
            Err(e) => return (Err(e.context(Operation::Read, &key, &self.cfg.name)), buf),
        };
        let got: Result<Option<Bytes>> = if len == 0 {
            Ok(None)
        } else {
            self.retry
                .run(|| async {
                    let opts = GetOptions::new().with_range(Some(GetRange::Bounded(offset..offset + len as u64)));
                    match self.store.get_opts(&path, opts).await {
                        Ok(r) => r.bytes().await.map(Some).map_err(|e| self.err(e, Operation::Read, &key)),
                        Err(e) => {
                            let mapped = self.err(e, Operation::Read, &key);
                            match mapped.kind() {
                                ErrorKind::NotFound | ErrorKind::PermissionDenied => Err(mapped),
                                _ if mapped.is_temporary() => Err(mapped),
                                // Refused range (416, not partial): decided by the size below.
                                _ => Ok(None),
                            }
                        }
                    }
                })
                .await
        };
        let data = match got {
            Ok(Some(d)) => d,
            Ok(None) => {
                let meta = match self.head(&key, Operation::Read).await {
                    Ok(m) => m,
                    Err(e) => return (Err(e), buf),
                };
                if offset > meta.size {
                    let e = Error::new(
                        ErrorKind::OutOfRange,
                        format!("offset {offset} is past the end ({} bytes)", meta.size),
                    );
                    return (Err(e.context(Operation::Read, &key, &self.cfg.name)), buf);
                }
                if offset < meta.size && len > 0 {
                    let e = Error::new(
                        ErrorKind::Io,
                        format!("server refused the range {offset}+{len} of a {}-byte object", meta.size),
                    );
                    return (Err(e.context(Operation::Read, &key, &self.cfg.name)), buf);
                }
                Bytes::new()
            }
            Err(e) => return (Err(e), buf),
        };
        let n = data.len().min(len);
        buf.capacity_mut()[..n].copy_from_slice(&data[..n]);
        let res = buf.set_window(0, n).map(|()| n);
        (res, buf)
    }
}

/// An S3 bucket and prefix as a [`Tier`], through `object_store`.
///
/// Keys map to `PREFIX/KEY`. Reads are range GETs; writes stage in memory and go out as a
/// multipart upload whose parts upload in parallel while the writer keeps writing, completed
/// at commit (objects up to [`S3Config::single_put_max`] go as one PUT). Nothing is visible
/// before commit. Temporary errors are retried with backoff up to
/// [`S3Config::retry_deadline`]; permanent ones (403, missing bucket or object) fail at once.
///
/// Cloning is cheap and shares the connection pool.
#[derive(Clone)]
pub struct S3Tier {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for S3Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Tier").field("url", &self.inner.cfg.url()).field("name", &self.inner.cfg.name).finish()
    }
}

impl S3Tier {
    /// A tier for `cfg`, with what it leaves unset taken from the AWS environment variables.
    /// Makes no request (see [`S3Tier::open`] for one that checks the bucket).
    pub fn new(cfg: S3Config) -> Result<Self> {
        cfg.validate()?;
        let mut b = AmazonS3Builder::from_env().with_bucket_name(&cfg.bucket);
        if let Some(r) = &cfg.region {
            b = b.with_region(r);
        }
        if let Some(e) = &cfg.endpoint {
            b = b.with_endpoint(e);
        }
        if let (Some(id), Some(secret)) = (&cfg.access_key_id, &cfg.secret_access_key) {
            b = b.with_access_key_id(id).with_secret_access_key(secret);
        }
        if let Some(t) = &cfg.session_token {
            b = b.with_token(t);
        }
        // AWS_ENDPOINT_URL is what the AWS CLI and SDKs read; object_store reads AWS_ENDPOINT.
        if b.get_config_value(&AmazonS3ConfigKey::Endpoint).is_none() {
            if let Ok(e) = std::env::var("AWS_ENDPOINT_URL") {
                b = b.with_endpoint(e);
            }
        }
        let endpoint = b.get_config_value(&AmazonS3ConfigKey::Endpoint);
        let region = b
            .get_config_value(&AmazonS3ConfigKey::Region)
            .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
            .unwrap_or_else(|| "us-east-1".to_string());
        b = b.with_region(&region);
        let allow_http =
            cfg.allow_http.unwrap_or_else(|| endpoint.as_deref().is_some_and(|e| e.starts_with("http://")));
        if endpoint.is_some() {
            b = b.with_virtual_hosted_style_request(false);
        }
        b = b.with_unsigned_payload(cfg.unsigned_payload == Some(true));
        b = match cfg.checksum {
            crate::config::UploadChecksum::None => b,
            crate::config::UploadChecksum::Crc64Nvme => b.with_checksum_algorithm(Checksum::CRC64NVME),
            crate::config::UploadChecksum::Sha256 => b.with_checksum_algorithm(Checksum::SHA256),
        };
        let client = ClientOptions::new()
            .with_allow_http(allow_http)
            .with_timeout(cfg.request_timeout)
            .with_connect_timeout(cfg.connect_timeout)
            .with_pool_max_idle_per_host(cfg.read_concurrency.max(cfg.upload_concurrency));
        // object_store retries each request a few times itself; `Retry` bounds the whole
        // operation by the deadline.
        let retry = RetryConfig {
            backoff: BackoffConfig { init_backoff: cfg.initial_backoff, max_backoff: cfg.max_backoff, base: 2.0 },
            retry_timeout: cfg.retry_deadline,
            max_retries: 3,
        };
        let store = b.with_client_options(client.clone()).with_retry(retry).build().map_err(|e| {
            Error::new(ErrorKind::InvalidInput, format!("S3 configuration for {}: {e}", cfg.url()))
                .with_operation(Operation::Setup)
                .with_tier(&cfg.name)
        })?;
        let root = if cfg.prefix.is_empty() { String::new() } else { format!("{}/", cfg.prefix) };
        // The same options and credentials as object_store's: one client for the tier's life.
        let signed =
            SignedClient::new(&cfg, &client, Arc::clone(store.credentials()), &region, endpoint.as_deref(), &root)?;
        let io = IoRuntime::new(cfg.io_threads, &cfg.name)?;
        let retry = Retry { initial: cfg.initial_backoff, max: cfg.max_backoff, deadline: cfg.retry_deadline };
        // Enough for the parts in flight plus the one being filled, for as many writers at
        // once as a DCP save runs by default (a pool holds only buffers given back, so at most
        // what was in use at once): a part buffer not reused costs its page faults, a sixth of
        // a DCP save's client CPU.
        let parts = PartPool::new((cfg.upload_concurrency + 1) * crate::parts::WRITERS_KEPT, cfg.part_size);
        // The same budget for buffers lent whole: what the parts in flight and the ones being
        // filled take, for as many writers.
        let lent = LentPool::new(
            (cfg.upload_concurrency + 1).saturating_mul(crate::parts::WRITERS_KEPT).saturating_mul(cfg.part_size),
        );
        let inner = Inner {
            store: Arc::new(store),
            io,
            retry,
            root,
            endpoint,
            parts,
            lent,
            signed,
            part_checks: tokio::sync::OnceCell::new(),
            lost_leases: std::sync::Mutex::default(),
            cfg,
        };
        Ok(S3Tier { inner: Arc::new(inner) })
    }

    /// Like [`S3Tier::new`], then checks that the bucket exists and the credentials work
    /// (one LIST request): a missing bucket is a `NotFound` error naming it, refused
    /// credentials a `PermissionDenied` one, both at once, without retries.
    pub async fn open(cfg: S3Config) -> Result<Self> {
        let tier = S3Tier::new(cfg)?;
        tier.check().await?;
        Ok(tier)
    }

    /// Lists at most one object of the prefix: proves the bucket exists and answers.
    pub async fn check(&self) -> Result<()> {
        self.check_within(self.inner.cfg.retry_deadline).await
    }

    /// [`S3Tier::check`], retrying temporary errors (an endpoint that refuses connections, a
    /// 503) for at most `deadline` instead of the tier's retry deadline: opening a tier whose
    /// endpoint is mistyped fails in seconds, while the tier's own operations keep retrying
    /// for [`S3Config::retry_deadline`].
    pub async fn check_within(&self, deadline: Duration) -> Result<()> {
        let retry = Retry { deadline: deadline.min(self.inner.cfg.retry_deadline), ..self.inner.retry };
        let inner = Arc::clone(&self.inner);
        self.inner
            .spawn(async move {
                let prefix = inner.path("x").ok().and_then(|p| {
                    let parts: Vec<_> = p.parts().collect();
                    (parts.len() > 1).then(|| Path::from_iter(parts[..parts.len() - 1].iter().cloned()))
                });
                retry
                    .run(|| async {
                        let mut s = inner.store.list(prefix.as_ref());
                        match s.next().await {
                            Some(Err(e)) => Err(inner.err(e, Operation::Open, "")),
                            _ => Ok(()),
                        }
                    })
                    .await
            })
            .await?
            .map_err(|e| {
                if e.kind() == ErrorKind::NotFound {
                    let b = &self.inner.cfg.bucket;
                    Error::new(
                        ErrorKind::NotFound,
                        format!("bucket {b:?} does not exist or cannot be listed ({})", e.message()),
                    )
                    .context(Operation::Open, "", &self.inner.cfg.name)
                } else {
                    e
                }
            })
    }

    /// The configuration the tier was made from.
    pub fn config(&self) -> &S3Config {
        &self.inner.cfg
    }

    /// The tier's URL, `s3://bucket/prefix`.
    pub fn url(&self) -> String {
        self.inner.cfg.url()
    }

    /// Writes `data` as `key` with one PUT (no staging): for small objects and tests.
    pub async fn put_object(&self, key: &str, data: Bytes) -> Result<ObjectMeta> {
        validate_key(key).map_err(|e| e.context(Operation::Commit, key, &self.inner.cfg.name))?;
        self.inner.check_lease(Operation::Commit, key)?;
        let path = self.inner.path(key)?;
        let inner = Arc::clone(&self.inner);
        let key = key.to_string();
        let size = data.len() as u64;
        self.inner
            .spawn(async move {
                inner.put_retrying(&path, data, &key).await.map(|_| ObjectMeta {
                    key,
                    size,
                    modified: Some(std::time::SystemTime::now()),
                })
            })
            .await?
    }
}

#[async_trait]
impl Tier for S3Tier {
    fn name(&self) -> &str {
        &self.inner.cfg.name
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { durable: true, native_batch: true, ..Capabilities::default() }
    }

    /// A lease on the prefix: the object `PREFIX/.ringtier-lease-NAME`, created with
    /// `If-None-Match: *`, renewed every quarter of [`S3Config::lease_timeout`] while the
    /// returned lock lives, deleted when it is dropped. A live lease held elsewhere is a
    /// `Busy` error naming its holder; one not renewed for its timeout (on the server's clock)
    /// is taken over, conditionally (`If-Match`). Once the lease is held, the multipart
    /// uploads a killed writer left under the prefix are aborted (see
    /// [`S3Tier::recover_uploads`]; refused for a tier without a prefix). docs/S3.md, "One
    /// writer per prefix".
    async fn lock(&self, name: &str) -> Result<Option<ringtier_core::TierLock>> {
        validate_key(name).map_err(|e| e.context(Operation::Open, name, &self.inner.cfg.name))?;
        if name.contains('/') {
            return Err(Error::new(ErrorKind::InvalidKey, "a lock name is one key component").context(
                Operation::Open,
                name,
                &self.inner.cfg.name,
            ));
        }
        // The lease first: a second writer must never abort the first one's uploads.
        let lease = crate::lease::acquire(&self.inner, name).await?;
        // On an error the lease is dropped, so released.
        self.recover_uploads().await?;
        Ok(Some(ringtier_core::TierLock::new(lease)))
    }

    async fn stat(&self, key: &str) -> Result<ObjectMeta> {
        validate_key(key).map_err(|e| e.context(Operation::Stat, key, &self.inner.cfg.name))?;
        self.inner.head(key, Operation::Stat).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        let name = &self.inner.cfg.name;
        validate_prefix(prefix).map_err(|e| e.context(Operation::List, prefix, name))?;
        // object_store lists whole path segments: list the directory part, filter by string.
        let dir = match prefix.rfind('/') {
            Some(i) => &prefix[..i],
            None => "",
        };
        let full_dir = format!("{}{dir}", self.inner.root);
        let full_dir = full_dir.trim_end_matches('/').to_string();
        let inner = Arc::clone(&self.inner);
        let want = prefix.to_string();
        let mut out = self
            .inner
            .spawn(async move {
                inner
                    .retry
                    .run(|| async {
                        let dir_path = if full_dir.is_empty() {
                            None
                        } else {
                            Some(Path::parse(&full_dir).map_err(|e| {
                                Error::new(ErrorKind::InvalidKey, format!("not a valid S3 prefix: {e}"))
                            })?)
                        };
                        let mut s = inner.store.list(dir_path.as_ref());
                        let mut out = Vec::new();
                        while let Some(item) = s.next().await {
                            let m = item.map_err(|e| inner.err(e, Operation::List, &want))?;
                            let Some(key) = m.location.as_ref().strip_prefix(inner.root.as_str()) else {
                                continue;
                            };
                            // Reserved names (upload markers) and foreign keys are not objects.
                            if !key.starts_with(want.as_str()) || validate_key(key).is_err() {
                                continue;
                            }
                            out.push(ObjectMeta {
                                key: key.to_string(),
                                size: m.size,
                                modified: Some(m.last_modified.into()),
                            });
                        }
                        Ok(out)
                    })
                    .await
            })
            .await??;
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    async fn delete(&self, key: &str) -> Result<()> {
        validate_key(key).map_err(|e| e.context(Operation::Delete, key, &self.inner.cfg.name))?;
        self.inner.check_lease(Operation::Delete, key)?;
        // S3 deletes of missing keys succeed; the contract says NotFound.
        self.inner.head(key, Operation::Delete).await?;
        let path = self.inner.path(key)?;
        let inner = Arc::clone(&self.inner);
        let key = key.to_string();
        self.inner
            .spawn(async move {
                inner
                    .retry
                    .run(|| async {
                        inner.store.delete(&path).await.map_err(|e| inner.err(e, Operation::Delete, &key))
                    })
                    .await
            })
            .await?
    }

    async fn read_at(&self, key: &str, offset: u64, len: usize, buf: AlignedBuf) -> (Result<usize>, AlignedBuf) {
        if let Err(e) = validate_key(key) {
            return (Err(e.context(Operation::Read, key, &self.inner.cfg.name)), buf);
        }
        let inner = Arc::clone(&self.inner);
        let key = key.to_string();
        // The buffer travels with the task; if the task is lost (runtime shut down), so is the
        // buffer, and a fresh empty one is handed back with the error.
        match self.inner.io.handle.spawn(inner.read_range(key, offset, len, buf)).await {
            Ok(r) => r,
            Err(e) => (
                Err(Error::new(ErrorKind::Shutdown, format!("S3 read task ended early: {e}"))),
                AlignedBuf::new(1, 1).expect("a 1-byte buffer"),
            ),
        }
    }

    async fn create(&self, key: &str) -> Result<Box<dyn ObjectWriter>> {
        validate_key(key).map_err(|e| e.context(Operation::Create, key, &self.inner.cfg.name))?;
        let path = self.inner.path(key).map_err(|e| e.context(Operation::Create, key, &self.inner.cfg.name))?;
        Ok(Box::new(S3Writer::new(Arc::clone(&self.inner), key.to_string(), path)))
    }

    async fn read_batch(&self, mut batch: ReadBatch) -> ReadBatch {
        let (keys, entries) = batch.parts_mut();
        let limit = Arc::new(tokio::sync::Semaphore::new(self.inner.cfg.read_concurrency));
        let mut tasks = Vec::new();
        for (i, entry) in entries.iter_mut().enumerate().filter(|(_, e)| !e.is_done()) {
            let Some(buf) = entry.take_buf() else {
                continue;
            };
            let key = entry.key(keys).to_string();
            if let Err(e) = validate_key(&key) {
                entry.finish(Err(e.context(Operation::Read, &key, &self.inner.cfg.name)), buf);
                continue;
            }
            let inner = Arc::clone(&self.inner);
            let limit = Arc::clone(&limit);
            let (offset, len) = (entry.offset(), entry.len());
            tasks.push((
                i,
                self.inner.io.handle.spawn(async move {
                    let _permit = limit.acquire_owned().await;
                    let start = Instant::now();
                    let (res, buf) = inner.read_range(key, offset, len, buf).await;
                    (res, buf, start.elapsed())
                }),
            ));
        }
        for (i, task) in tasks {
            let entry = &mut entries[i];
            match task.await {
                Ok((res, buf, latency)) => {
                    entry.set_latency(latency);
                    entry.finish(res, buf);
                }
                Err(e) => {
                    entry.set_result(Err(Error::new(ErrorKind::Shutdown, format!("S3 read task ended early: {e}"))))
                }
            }
        }
        batch
    }
}
