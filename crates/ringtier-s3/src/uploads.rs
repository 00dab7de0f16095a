//! Multipart uploads: start, complete, abort, and recovery of uploads a killed process left.
//!
//! Every upload this tier starts is recorded twice: in a process-wide set of live upload ids
//! (so recovery never aborts what this process is still writing) and in a marker object
//! `PREFIX/.ringtier-uploads/HEX(UPLOAD_ID)` holding the object path and the upload id,
//! written right after the upload is created and deleted once it is completed or aborted.
//! [`S3Tier::recover_uploads`](crate::S3Tier::recover_uploads) aborts the upload of every
//! marker not live here, then, where the server implements `ListMultipartUploads` (AWS,
//! moto, MinIO; not s3s-fs), every other upload under the prefix not live here: that also
//! catches a process killed between creating an upload and writing its marker.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::StreamExt;
use object_store::client::{HttpConnector, HttpRequestBody, ReqwestConnector};
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutPayload};
use ringtier_core::{Error, ErrorKind, Operation, Result};

use crate::tier::Inner;
use crate::xml;

/// Most uploads one recovery lists (over all pages) before it gives up: a bound on what a
/// server's answers can make it hold.
const MAX_LISTED_UPLOADS: usize = 1_000_000;

/// Marker directory (a reserved key component: never listed as an object).
pub(crate) const MARKER_DIR: &str = ".ringtier-uploads";

fn live_set() -> &'static Mutex<HashSet<String>> {
    static LIVE: std::sync::OnceLock<Mutex<HashSet<String>>> = std::sync::OnceLock::new();
    LIVE.get_or_init(|| Mutex::new(HashSet::new()))
}

fn is_live(id: &str) -> bool {
    live_set().lock().unwrap_or_else(|p| p.into_inner()).contains(id)
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// A multipart upload this process is writing.
#[derive(Debug)]
pub(crate) struct LiveUpload {
    id: String,
    marker: Path,
}

impl LiveUpload {
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// Forgets the upload: deletes its marker, drops it from the live set.
    pub(crate) async fn finish(self, inner: &Arc<Inner>) {
        let store = Arc::clone(&inner.store);
        let marker = self.marker.clone();
        let _ = inner
            .spawn(async move {
                if let Err(e) = store.delete(&marker).await {
                    tracing::warn!(%marker, error = %e, "s3: cannot delete an upload marker (recovery will)");
                }
            })
            .await;
        live_set().lock().unwrap_or_else(|p| p.into_inner()).remove(&self.id);
    }
}

fn marker_path(inner: &Inner, id: &str) -> Result<Path> {
    Path::parse(format!("{}{MARKER_DIR}/{}", inner.root, hex(id)))
        .map_err(|e| Error::new(ErrorKind::InvalidInput, format!("marker path: {e}")))
}

/// Creates the multipart upload of `path` and its marker; `checked`: an upload whose parts
/// carry CRC-32C checksums ([`create_checked`]).
pub(crate) async fn start(inner: &Arc<Inner>, path: &Path, key: &str, checked: bool) -> Result<LiveUpload> {
    let me = Arc::clone(inner);
    let (path, key) = (path.clone(), key.to_string());
    inner
        .spawn(async move {
            let id = if checked {
                me.retry.run(|| create_checked(&me, &path, &key)).await?
            } else {
                me.retry
                    .run(|| async {
                        me.store.create_multipart(&path).await.map_err(|e| me.err(e, Operation::Write, &key))
                    })
                    .await?
            };
            live_set().lock().unwrap_or_else(|p| p.into_inner()).insert(id.clone());
            let marker = marker_path(&me, &id)?;
            let body = format!("{path}\n{id}\n");
            let wrote = me
                .retry
                .run(|| async {
                    me.store
                        .put(&marker, PutPayload::from(body.clone().into_bytes()))
                        .await
                        .map_err(|e| me.err(e, Operation::Write, &key))
                })
                .await;
            let live = LiveUpload { id, marker };
            match wrote {
                Ok(_) => Ok(live),
                Err(e) => {
                    let _ = abort(&me, &path, &key, live).await;
                    Err(e)
                }
            }
        })
        .await?
}

/// Completes the upload with `parts` (in order; with `crcs`, the parts' CRC-32Cs, an upload
/// from [`create_checked`], completed by [`complete_checked`]). A retried completion that the
/// server says is gone (the first attempt did complete) is accepted when the object has
/// `size` bytes.
pub(crate) async fn complete(
    inner: &Arc<Inner>,
    path: &Path,
    key: &str,
    live: &LiveUpload,
    parts: Vec<PartId>,
    crcs: Option<Vec<u32>>,
    size: u64,
) -> Result<()> {
    let me = Arc::clone(inner);
    let (path, key, id) = (path.clone(), key.to_string(), live.id.clone());
    inner
        .spawn(async move {
            let mut retried = false;
            // The object's checksum, where the server answers with one.
            let reported: Mutex<Option<String>> = Mutex::new(None);
            me.retry
                .run(|| {
                    let first = !retried;
                    retried = true;
                    let (me, path, key, id, parts, crcs, reported) =
                        (&me, &path, &key, &id, parts.clone(), &crcs, &reported);
                    async move {
                        let res = match crcs {
                            Some(crcs) => {
                                let named: Vec<(String, u32)> =
                                    parts.into_iter().map(|p| p.content_id).zip(crcs.iter().copied()).collect();
                                complete_checked(me, path, id, &named, key)
                                    .await
                                    .map(|r| *reported.lock().unwrap_or_else(|p| p.into_inner()) = r)
                            }
                            None => me
                                .store
                                .complete_multipart(path, id, parts)
                                .await
                                .map(|_| ())
                                .map_err(|e| me.err(e, Operation::Commit, key)),
                        };
                        match res {
                            Ok(()) => Ok(()),
                            Err(e) => {
                                if !first && e.kind() == ErrorKind::NotFound {
                                    if let Ok(m) = me.store.head(path).await {
                                        if m.size == size {
                                            return Ok(());
                                        }
                                    }
                                }
                                Err(e)
                            }
                        }
                    }
                })
                .await?;
            // The server's checksum of the object (AWS: from the part checksums it checked;
            // moto: from the bytes it stored) must be ours; if not, the object goes.
            let reported = reported.into_inner().unwrap_or_else(|p| p.into_inner());
            if let (Some(reported), Some(crcs)) = (reported, &crcs) {
                let ours = composite_crc32c(crcs);
                if reported != ours {
                    let _ = me.store.delete(&path).await;
                    return Err(Error::new(
                        ErrorKind::Corrupt,
                        format!(
                            "s3://{}/{path}: the server reports the object's checksum {reported}, not {ours} (the CRC-32C of the parts' CRC-32Cs); deleted",
                            me.cfg.bucket
                        ),
                    )
                    .set_temporary(true)
                    .context(Operation::Commit, &key, &me.cfg.name));
                }
            }
            Ok(())
        })
        .await?
}

/// Aborts the upload (a missing one counts as aborted) and forgets it.
pub(crate) async fn abort(inner: &Arc<Inner>, path: &Path, key: &str, live: LiveUpload) -> Result<()> {
    let me = Arc::clone(inner);
    let (p, k, id) = (path.clone(), key.to_string(), live.id.clone());
    let res = inner
        .spawn(async move {
            me.retry
                .run(|| async {
                    match me.store.abort_multipart(&p, &id).await {
                        Ok(()) => Ok(()),
                        Err(e) => {
                            let e = me.err(e, Operation::Abort, &k);
                            if e.kind() == ErrorKind::NotFound {
                                Ok(())
                            } else {
                                Err(e)
                            }
                        }
                    }
                })
                .await
        })
        .await
        .and_then(|r| r);
    if res.is_ok() {
        live.finish(inner).await;
    } else {
        // Keep the marker: the next recovery aborts it.
        live_set().lock().unwrap_or_else(|p| p.into_inner()).remove(&live.id);
    }
    res
}

/// Checks that the object at `path` has `size` bytes (HEAD); on a mismatch deletes it and
/// fails with a temporary `Corrupt` error.
pub(crate) async fn check_size(inner: &Arc<Inner>, path: &Path, key: &str, size: u64) -> Result<()> {
    let me = Arc::clone(inner);
    let (path, key) = (path.clone(), key.to_string());
    inner
        .spawn(async move {
            let stored = me
                .retry
                .run(|| async { me.store.head(&path).await.map_err(|e| me.err(e, Operation::Commit, &key)) })
                .await?;
            if stored.size == size {
                return Ok(());
            }
            let _ = me.store.delete(&path).await;
            Err(Error::new(
                ErrorKind::Corrupt,
                format!("s3://{}/{path} holds {} bytes, not the {size} written; deleted", me.cfg.bucket, stored.size),
            )
            .set_temporary(true)
            .context(Operation::Commit, &key, &me.cfg.name))
        })
        .await?
}

/// Reads the object at `path` back (ranges of a part, several at once, in order) and checks
/// its size and CRC-32C; on a mismatch deletes it and fails with a temporary `Corrupt` error.
pub(crate) async fn verify(inner: &Arc<Inner>, path: &Path, key: &str, size: u64, crc: u32) -> Result<()> {
    let me = Arc::clone(inner);
    let (path, key) = (path.clone(), key.to_string());
    inner
        .spawn(async move {
            let step = me.cfg.part_size as u64;
            let ranges: Vec<_> = (0..size.div_ceil(step)).map(|i| i * step..((i + 1) * step).min(size)).collect();
            let stored = me.retry.run(|| async { me.store.head(&path).await.map_err(|e| me.err(e, Operation::Commit, &key)) }).await?;
            let (mut got, mut read) = (0u32, 0u64);
            if stored.size == size {
                let mut reads = futures::stream::iter(ranges)
                    .map(|r| {
                        let (me, path, key) = (&me, &path, &key);
                        async move {
                            // The body is checked chunk by chunk as it arrives, never gathered
                            // into one buffer (a fresh part-sized allocation per range cost more
                            // CPU in page faults than the CRC).
                            me.retry
                                .run(|| async {
                                    let opts = GetOptions::new().with_range(Some(GetRange::Bounded(r.clone())));
                                    let res = me.store.get_opts(path, opts).await;
                                    let mut body = res.map_err(|e| me.err(e, Operation::Commit, key))?.into_stream();
                                    let (mut crc, mut len) = (0u32, 0u64);
                                    while let Some(chunk) = body.next().await {
                                        let chunk = chunk.map_err(|e| me.err(e, Operation::Commit, key))?;
                                        crc = crc32c::crc32c_append(crc, &chunk);
                                        len += chunk.len() as u64;
                                    }
                                    Ok((crc, len))
                                })
                                .await
                        }
                    })
                    .buffered(me.cfg.upload_concurrency);
                while let Some(range) = reads.next().await {
                    let (range_crc, len) = range?;
                    got = crc32c::crc32c_combine(got, range_crc, usize::try_from(len).unwrap_or(usize::MAX));
                    read += len;
                }
            }
            if stored.size == size && read == size && got == crc {
                return Ok(());
            }
            let _ = me.store.delete(&path).await;
            Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "s3://{}/{path} does not hold what was written (the server lists {} bytes, read back {read} bytes, crc32c {got:08x}; wrote {size} bytes, crc32c {crc:08x}); deleted",
                    me.cfg.bucket, stored.size
                ),
            )
            .set_temporary(true)
            .context(Operation::Commit, &key, &me.cfg.name))
        })
        .await?
}

/// Standard base64 of `bytes` (the `x-amz-checksum-*` header encoding).
pub(crate) fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n =
            (u32::from(c[0]) << 16) | (u32::from(*c.get(1).unwrap_or(&0)) << 8) | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The URL of object `path` (path style at a configured endpoint, else virtual-hosted AWS).
pub(crate) fn object_url(inner: &Inner, path: &Path) -> String {
    let key: Vec<String> = path.as_ref().split('/').map(encode).collect();
    format!("{}/{}", bucket_url(inner), key.join("/"))
}

/// One request of our own (what object_store 0.14 cannot send: CRC-32C checksums), signed
/// with the tier's credentials; the body is unsigned (`UNSIGNED-PAYLOAD`) unless
/// [`S3Config::unsigned_payload`](crate::S3Config::unsigned_payload) is `Some(false)`.
/// Returns the status, headers and body (at most [`S3Config::max_xml_bytes`](crate::S3Config::max_xml_bytes): a longer one
/// is an `Io` error, never read into memory); a transport error is a temporary `Io` error.
pub(crate) async fn send_own(
    inner: &Inner,
    method: &str,
    url: &str,
    headers: &[(&str, String)],
    body: Bytes,
    key: &str,
    op: Operation,
) -> Result<(u16, http::HeaderMap, Bytes)> {
    let fail = |kind: ErrorKind, m: String| Error::new(kind, m).context(op, key, &inner.cfg.name);
    let cred = inner.store.credentials().get_credential().await.map_err(|e| inner.err(e, op, key))?;
    let mut b = http::Request::builder().method(method).uri(url).header(http::header::CONTENT_LENGTH, body.len());
    for (k, v) in headers {
        b = b.header(*k, v);
    }
    let mut req = b
        .body(HttpRequestBody::from(body))
        .map_err(|e| fail(ErrorKind::InvalidInput, format!("request {url}: {e}")))?;
    object_store::aws::AwsAuthorizer::new(&cred, "s3", &inner.region)
        .with_sign_payload(inner.cfg.unsigned_payload == Some(false))
        .try_authorize(&mut req, None)
        .map_err(|e| fail(ErrorKind::Io, format!("signing {url}: {e}")))?;
    let resp = inner
        .http
        .execute(req)
        .await
        .map_err(|e| fail(ErrorKind::Io, format!("{method} {url}: {e}")).set_temporary(true))?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let announced =
        headers.get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    let body =
        xml::read_capped(resp.into_body().bytes_stream(), announced, inner.cfg.max_xml_bytes).await.map_err(|e| {
            fail(ErrorKind::Io, format!("{method} {url}: {e}")).set_temporary(matches!(e, xml::ReadError::Body(_)))
        })?;
    Ok((status, headers, body))
}

/// The error for an S3 error answer (`status`, XML `body`) to a request on `path`.
fn answer_error(inner: &Inner, status: u16, body: &[u8], path: &Path, key: &str, op: Operation) -> Error {
    let (code, message) = xml::parse_error(body);
    let msg = format!("s3://{}/{path}: HTTP {status} {code}: {message}", inner.cfg.bucket);
    let fail = |kind: ErrorKind, m: String| Error::new(kind, m).context(op, key, &inner.cfg.name);
    match (status, code.as_str()) {
        (400, "BadDigest" | "InvalidDigest" | "XAmzContentSHA256Mismatch") => fail(
            ErrorKind::Corrupt,
            format!("{msg} (the server refused the body as not matching its checksum: damaged on the way)"),
        )
        .set_temporary(true),
        (401 | 403, _) => fail(ErrorKind::PermissionDenied, format!("{msg} (check the credentials)")),
        (404, "NoSuchBucket") => {
            fail(ErrorKind::NotFound, format!("bucket {:?} does not exist ({msg})", inner.cfg.bucket))
        }
        (404, _) => fail(ErrorKind::NotFound, msg),
        (408 | 429, _) | (500.., _) => fail(ErrorKind::Io, msg).set_temporary(true),
        // A 200 whose body is an error (CompleteMultipartUpload may answer so): S3 says retry.
        (200, _) => fail(ErrorKind::Io, msg).set_temporary(true),
        _ => fail(ErrorKind::Io, msg),
    }
}

/// Creates a multipart upload of `path` whose parts carry CRC-32C checksums
/// (`x-amz-checksum-algorithm: CRC32C`: AWS refuses a part checksum the upload was not
/// created for, and then wants every part's checksum in the completion). Returns its id.
pub(crate) async fn create_checked(inner: &Inner, path: &Path, key: &str) -> Result<String> {
    let url = format!("{}?uploads=", object_url(inner, path));
    let headers = [("x-amz-checksum-algorithm", "CRC32C".to_string())];
    let (status, _, body) = send_own(inner, "POST", &url, &headers, Bytes::new(), key, Operation::Write).await?;
    let id = xml::parse_upload_id(&body).map_err(|e| {
        Error::new(ErrorKind::Io, format!("POST {url}: unreadable answer: {e}")).context(
            Operation::Write,
            key,
            &inner.cfg.name,
        )
    })?;
    match id {
        Some(id) if status == 200 => Ok(id),
        _ => Err(answer_error(inner, status, &body, path, key, Operation::Write)),
    }
}

/// Completes an upload made by [`create_checked`], naming every part by its ETag and CRC-32C
/// (`parts`: in order). Returns the object's checksum where the server answers with one.
async fn complete_checked(
    inner: &Inner,
    path: &Path,
    upload_id: &str,
    parts: &[(String, u32)],
    key: &str,
) -> Result<Option<String>> {
    let mut xml = String::from("<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">");
    for (i, (etag, crc)) in parts.iter().enumerate() {
        let etag = etag.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
        xml.push_str(&format!(
            "<Part><PartNumber>{}</PartNumber><ETag>{etag}</ETag><ChecksumCRC32C>{}</ChecksumCRC32C></Part>",
            i + 1,
            base64(&crc.to_be_bytes())
        ));
    }
    xml.push_str("</CompleteMultipartUpload>");
    let url = format!("{}?uploadId={}", object_url(inner, path), encode(upload_id));
    let (status, _, body) = send_own(inner, "POST", &url, &[], Bytes::from(xml), key, Operation::Commit).await?;
    let (is_error, sum) = xml::parse_complete(&body).map_err(|e| {
        Error::new(ErrorKind::Io, format!("POST {url}: unreadable answer: {e}")).context(
            Operation::Commit,
            key,
            &inner.cfg.name,
        )
    })?;
    if status != 200 || is_error {
        return Err(answer_error(inner, status, &body, path, key, Operation::Commit));
    }
    Ok(sum)
}

/// The checksum S3 gives an object uploaded in parts with CRC-32C checksums: the CRC-32C of
/// the parts' CRC-32Cs (big-endian, concatenated), base64, `-` the number of parts.
pub(crate) fn composite_crc32c(crcs: &[u32]) -> String {
    let bytes: Vec<u8> = crcs.iter().flat_map(|c| c.to_be_bytes()).collect();
    format!("{}-{}", base64(&crc32c::crc32c(&bytes).to_be_bytes()), crcs.len())
}

/// Sends `data` as part `idx` (0-based) of upload `upload_id` (`Some`, an upload from
/// [`create_checked`]), or as the whole object (`None`: a PutObject), with its CRC-32C in a
/// signed `x-amz-checksum-crc32c` header (the body signed or not as [`send_own`] says).
/// Returns the part's ETag and whether the server answered with the same checksum (a server
/// that checks part checksums does; one that ignores them does not). A body the server
/// refuses as not matching (`BadDigest`) is a temporary `Corrupt` error: sent again, it may
/// arrive whole.
pub(crate) async fn put_checked(
    inner: &Inner,
    path: &Path,
    part: Option<(&str, usize)>,
    data: Bytes,
    crc: u32,
    key: &str,
    op: Operation,
) -> Result<(PartId, bool)> {
    let url = match part {
        Some((id, idx)) => format!("{}?partNumber={}&uploadId={}", object_url(inner, path), idx + 1, encode(id)),
        None => object_url(inner, path),
    };
    let sum = base64(&crc.to_be_bytes());
    let (status, headers, body) =
        send_own(inner, "PUT", &url, &[("x-amz-checksum-crc32c", sum.clone())], data, key, op).await?;
    if !(200..300).contains(&status) {
        return Err(answer_error(inner, status, &body, path, key, op));
    }
    let Some(etag) = headers.get(http::header::ETAG).and_then(|v| v.to_str().ok()).map(str::to_string) else {
        return Err(Error::new(ErrorKind::Io, format!("PUT {url}: the answer has no ETag"))
            .set_temporary(true)
            .context(op, key, &inner.cfg.name));
    };
    let echoed = headers.get("x-amz-checksum-crc32c").and_then(|v| v.to_str().ok());
    Ok((PartId { content_id: etag }, echoed == Some(sum.as_str())))
}

/// Whether the server checks part checksums: sends one small part with a wrong
/// `x-amz-checksum-crc32c` to a throwaway upload (aborted after) and expects `BadDigest`.
/// Asked once per tier, the answer kept.
pub(crate) async fn server_checks_parts(inner: &Arc<Inner>) -> Result<bool> {
    let me = Arc::clone(inner);
    inner
        .part_checks
        .get_or_try_init(|| async move {
            let spawned = Arc::clone(&me);
            me.spawn(async move {
                let me = spawned;
                let path = Path::parse(format!("{}{MARKER_DIR}/checksum-probe-{}", me.root, std::process::id()))
                    .map_err(|e| Error::new(ErrorKind::InvalidInput, format!("probe path: {e}")))?;
                let key = "(part checksum probe)";
                let id = me.retry.run(|| create_checked(&me, &path, key)).await?;
                // Live: a recovery running meanwhile leaves it alone.
                live_set().lock().unwrap_or_else(|p| p.into_inner()).insert(id.clone());
                let body = Bytes::from_static(b"ringtier: does this server check part checksums?");
                let wrong = crc32c::crc32c(&body) ^ 1;
                let res = me
                    .retry
                    .run(|| async {
                        match put_checked(&me, &path, Some((&id, 0)), body.clone(), wrong, key, Operation::Write).await
                        {
                            Err(e) if e.kind() == ErrorKind::Corrupt => Ok(true),
                            Err(e) => Err(e),
                            Ok(_) => Ok(false),
                        }
                    })
                    .await;
                let _ = me.store.abort_multipart(&path, &id).await;
                live_set().lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
                let checks = res?;
                if !checks {
                    tracing::info!(
                        tier = %me.cfg.name,
                        "s3: the server does not check part checksums; uploads are read back to check them"
                    );
                }
                Ok(checks)
            })
            .await?
        })
        .await
        .copied()
}

/// What [`S3Tier::recover_uploads`](crate::S3Tier::recover_uploads) did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct UploadRecovery {
    /// Uploads aborted (found by marker or by listing).
    pub aborted: usize,
    /// Object keys whose uploads were aborted.
    pub keys: Vec<String>,
    /// Leftover uploads that could not be aborted (tried again by the next recovery).
    pub failed: usize,
    /// False where the server does not implement `ListMultipartUploads` (markers only).
    pub listed: bool,
}

/// Aborts every multipart upload under the tier's prefix that no writer of this process owns;
/// refused (`InvalidInput`) for a tier without a prefix, whose recovery would abort every
/// upload in the bucket, other tools' included.
pub(crate) async fn recover(inner: &Arc<Inner>) -> Result<UploadRecovery> {
    if inner.root.is_empty() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "refusing to recover multipart uploads in {}: the tier has no prefix, so recovery would abort every \
                 upload in the bucket, other tools' included; give the tier a prefix (s3://{}/PREFIX)",
                inner.cfg.url(),
                inner.cfg.bucket
            ),
        )
        .context(Operation::Open, "", &inner.cfg.name));
    }
    let me = Arc::clone(inner);
    inner
        .spawn(async move {
            let mut out = UploadRecovery::default();
            let mut seen = HashSet::new();
            // 1. Markers.
            let dir = Path::parse(format!("{}{MARKER_DIR}", me.root))
                .map_err(|e| Error::new(ErrorKind::InvalidInput, format!("marker path: {e}")))?;
            let markers: Vec<_> = me
                .retry
                .run(|| async {
                    let mut s = me.store.list(Some(&dir));
                    let mut v = Vec::new();
                    while let Some(m) = s.next().await {
                        if v.len() == MAX_LISTED_UPLOADS {
                            return Err(Error::new(
                                ErrorKind::Io,
                                format!("more than {MAX_LISTED_UPLOADS} upload markers under {dir}"),
                            )
                            .context(Operation::Open, MARKER_DIR, &me.cfg.name));
                        }
                        v.push(m.map_err(|e| me.err(e, Operation::Open, MARKER_DIR))?.location);
                    }
                    Ok(v)
                })
                .await?;
            for marker in markers {
                let body = match me.store.get(&marker).await {
                    Ok(r) => {
                        let size = r.meta.size;
                        match xml::read_capped(r.into_stream(), Some(size), xml::MAX_MARKER_BYTES).await {
                            Ok(b) => Some(b),
                            Err(xml::ReadError::TooLong(_)) => None,
                            Err(e) => {
                                return Err(Error::new(ErrorKind::Io, format!("upload marker {marker}: {e}"))
                                    .set_temporary(true)
                                    .context(Operation::Open, marker.as_ref(), &me.cfg.name))
                            }
                        }
                    }
                    Err(object_store::Error::NotFound { .. }) => continue,
                    Err(e) => return Err(me.err(e, Operation::Open, marker.as_ref())),
                };
                // Only an upload under the tier's own prefix is ever aborted, whatever a
                // marker says.
                let parsed = body.as_deref().and_then(xml::parse_marker).filter(|(p, _)| p.starts_with(me.root.as_str()));
                let Some((p, id)) = parsed else {
                    tracing::warn!(%marker, "s3: unreadable upload marker (or one naming an upload outside the prefix), deleted");
                    let _ = me.store.delete(&marker).await;
                    continue;
                };
                let (p, id) = (p.as_str(), id.as_str());
                if is_live(id) {
                    continue;
                }
                let Ok(path) = Path::parse(p) else {
                    tracing::warn!(%marker, "s3: upload marker with a bad path, deleted");
                    let _ = me.store.delete(&marker).await;
                    continue;
                };
                if let Err(e) = abort_by_id(&me, &path, id).await {
                    // Kept: the next recovery tries again.
                    tracing::warn!(%marker, error = %e, "s3: cannot abort a leftover upload");
                    out.failed += 1;
                    continue;
                }
                let _ = me.store.delete(&marker).await;
                seen.insert(id.to_string());
                out.aborted += 1;
                out.keys.push(p.strip_prefix(me.root.as_str()).unwrap_or(p).to_string());
            }
            // 2. The server's own list, where it has one.
            if let Some(listed) = list_multipart_uploads(&me).await? {
                out.listed = true;
                for (key, id) in listed {
                    if seen.contains(&id) || is_live(&id) || !key.starts_with(me.root.as_str()) {
                        continue;
                    }
                    let path = Path::parse(&key).map_err(|e| Error::new(ErrorKind::Corrupt, format!("upload {key}: {e}")))?;
                    if let Err(e) = abort_by_id(&me, &path, &id).await {
                        tracing::warn!(%key, error = %e, "s3: cannot abort a leftover upload");
                        out.failed += 1;
                        continue;
                    }
                    out.aborted += 1;
                    out.keys.push(key.strip_prefix(me.root.as_str()).unwrap_or(&key).to_string());
                }
            }
            if out.aborted > 0 {
                tracing::info!(aborted = out.aborted, keys = ?out.keys, "s3: aborted multipart uploads left by an earlier process");
            }
            Ok(out)
        })
        .await?
}

async fn abort_by_id(me: &Arc<Inner>, path: &Path, id: &str) -> Result<()> {
    me.retry
        .run(|| async {
            match me.store.abort_multipart(path, &id.to_string()).await {
                Ok(()) => Ok(()),
                Err(e) => {
                    let e = me.err(e, Operation::Abort, path.as_ref());
                    if e.kind() == ErrorKind::NotFound {
                        Ok(())
                    } else {
                        Err(e)
                    }
                }
            }
        })
        .await
}

/// Percent-encodes a query value (RFC 3986 unreserved characters kept).
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn bucket_url(inner: &Inner) -> String {
    match &inner.endpoint {
        Some(e) => format!("{}/{}", e.trim_end_matches('/'), inner.cfg.bucket),
        None => format!("https://{}.s3.{}.amazonaws.com", inner.cfg.bucket, inner.region),
    }
}

/// Sends one SigV4-signed request to the bucket (for calls object_store has none for):
/// returns the status and body (at most [`S3Config::max_xml_bytes`](crate::S3Config::max_xml_bytes)).
pub(crate) async fn signed_request(inner: &Inner, method: &str, query: &str) -> Result<(u16, Bytes)> {
    let fail = |m: String| Error::new(ErrorKind::Io, m).with_tier(&inner.cfg.name);
    let cred = inner.store.credentials().get_credential().await.map_err(|e| inner.err(e, Operation::Setup, ""))?;
    let url = if query.is_empty() { bucket_url(inner) } else { format!("{}?{query}", bucket_url(inner)) };
    let mut req = http::Request::builder()
        .method(method)
        .uri(&url)
        .body(HttpRequestBody::empty())
        .map_err(|e| fail(format!("request {url}: {e}")))?;
    object_store::aws::AwsAuthorizer::new(&cred, "s3", &inner.region)
        .try_authorize(&mut req, None)
        .map_err(|e| fail(format!("signing {url}: {e}")))?;
    let opts = ClientOptions::new()
        .with_allow_http(true)
        .with_timeout(inner.cfg.request_timeout)
        .with_connect_timeout(inner.cfg.connect_timeout);
    let client = ReqwestConnector::default().connect(&opts).map_err(|e| fail(format!("HTTP client: {e}")))?;
    let resp = client.execute(req).await.map_err(|e| {
        let temporary = true;
        fail(format!("{method} {url}: {e}")).set_temporary(temporary)
    })?;
    let status = resp.status().as_u16();
    let announced = resp
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let body = xml::read_capped(resp.into_body().bytes_stream(), announced, inner.cfg.max_xml_bytes)
        .await
        .map_err(|e| fail(format!("{method} {url}: {e}")).set_temporary(matches!(e, xml::ReadError::Body(_))))?;
    Ok((status, body))
}

/// `ListMultipartUploads` under the tier's prefix: (object path, upload id) pairs, or `None`
/// where the server does not implement it.
pub(crate) async fn list_multipart_uploads(inner: &Inner) -> Result<Option<Vec<(String, String)>>> {
    let mut out = Vec::new();
    let mut markers = (String::new(), String::new());
    let bad = |m: String| {
        Error::new(ErrorKind::Io, format!("listing multipart uploads of s3://{}/{}: {m}", inner.cfg.bucket, inner.root))
            .context(Operation::Open, &inner.root, &inner.cfg.name)
    };
    loop {
        let mut query = format!("prefix={}&uploads=", encode(&inner.root));
        if !markers.0.is_empty() {
            query = format!("key-marker={}&{query}&upload-id-marker={}", encode(&markers.0), encode(&markers.1));
        }
        let (status, body) = inner.retry.run(|| signed_request(inner, "GET", &query)).await?;
        let (code, message) = xml::parse_error(&body);
        match status {
            200 => {}
            501 | 405 => return Ok(None),
            s if code == "NotImplemented" => {
                tracing::debug!(status = s, "s3: server has no ListMultipartUploads");
                return Ok(None);
            }
            s => {
                let kind = match s {
                    403 | 401 => ErrorKind::PermissionDenied,
                    404 => ErrorKind::NotFound,
                    _ => ErrorKind::Io,
                };
                return Err(Error::new(
                    kind,
                    format!(
                        "listing multipart uploads of s3://{}/{}: HTTP {s} {code}: {message}",
                        inner.cfg.bucket, inner.root
                    ),
                )
                .set_temporary(s >= 500 || s == 429)
                .context(Operation::Open, &inner.root, &inner.cfg.name));
            }
        }
        let page = xml::parse_uploads_page(&body).map_err(|e| bad(format!("unreadable answer: {e}")))?;
        if out.len() + page.uploads.len() > MAX_LISTED_UPLOADS {
            return Err(bad(format!("more than {MAX_LISTED_UPLOADS} uploads listed; abort them first (an AWS lifecycle rule, AbortIncompleteMultipartUpload)")));
        }
        out.extend(page.uploads);
        // The next page must start past this one (a server that repeats a page would loop).
        if !page.truncated || page.next.0.is_empty() || page.next <= markers {
            break;
        }
        markers = page.next;
    }
    Ok(Some(out))
}

/// Creates the tier's bucket (`PUT /BUCKET`); an existing bucket owned by the caller is fine.
pub(crate) async fn create_bucket(inner: &Inner) -> Result<()> {
    let (status, body) = inner.retry.run(|| signed_request(inner, "PUT", "")).await?;
    let (code, message) = xml::parse_error(&body);
    if (200..300).contains(&status) || code == "BucketAlreadyOwnedByYou" {
        return Ok(());
    }
    let kind = if status == 403 { ErrorKind::PermissionDenied } else { ErrorKind::Io };
    Err(Error::new(kind, format!("creating bucket {:?}: HTTP {status} {code}: {message}", inner.cfg.bucket))
        .with_operation(Operation::Setup)
        .with_tier(&inner.cfg.name))
}

/// Forgets every live upload of this process, as its death would (tests of recovery).
#[cfg(feature = "testing")]
pub(crate) fn forget_live_uploads() {
    live_set().lock().unwrap_or_else(|p| p.into_inner()).clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_query_values() {
        assert_eq!(encode("a/b c"), "a%2Fb%20c");
    }
}
