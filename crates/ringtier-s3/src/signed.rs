//! The S3 requests this crate sends itself, where object_store 0.14 has no call for them
//! (object_store sends every other request, with its own client): CreateMultipartUpload,
//! UploadPart, PutObject and CompleteMultipartUpload with CRC-32C checksums
//! (`checksummed.rs`), the lease's conditional writes, reads and deletes (`lease.rs`),
//! ListMultipartUploads (`recovery.rs`) and CreateBucket.
//!
//! They are all signed here (SigV4, with the tier's credentials: those of the configuration,
//! else the AWS environment, through object_store's credential provider) and all sent through
//! one HTTP client, built once per tier from the same options as object_store's client
//! (timeouts, plain `http://` allowed or not, idle connections kept per host) and reused, so
//! its connections are pooled. A body is signed with its SHA-256 where it is empty (a
//! constant) or [`S3Config::unsigned_payload`] is `Some(false)`; otherwise it goes
//! `UNSIGNED-PAYLOAD`. An answer's body is read into memory only up to
//! [`S3Config::max_xml_bytes`]. Retries are the callers' (`Retry::run` around a request:
//! a transport error is temporary, an error answer as [`SignedClient::answer_error`] says).

use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use object_store::aws::{AwsAuthorizer, AwsCredentialProvider};
use object_store::client::{HttpClient, HttpConnector, HttpRequestBody, ReqwestConnector};
use object_store::path::Path;
use object_store::ClientOptions;
use ringtier_core::{Error, ErrorKind, Operation, Result};

use crate::config::S3Config;
use crate::error::map_err;
use crate::xml;

/// What the server answered: status, headers, and the body (at most `max_xml_bytes`).
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: http::HeaderMap,
    pub(crate) body: Bytes,
}

impl Answer {
    /// The text of header `name`, if present and readable.
    pub(crate) fn header(&self, name: impl http::header::AsHeaderName) -> Option<String> {
        self.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
    }

    /// The `ETag` header.
    pub(crate) fn etag(&self) -> Option<String> {
        self.header(http::header::ETAG)
    }
}

/// Signs and sends the tier's own requests; one per tier, holding the tier's one HTTP client.
pub(crate) struct SignedClient {
    http: HttpClient,
    /// HTTP clients built so far: 1 for the tier's life (checked by tests).
    built: AtomicUsize,
    credentials: AwsCredentialProvider,
    region: String,
    /// `ENDPOINT/BUCKET` (path style at a configured endpoint) or
    /// `https://BUCKET.s3.REGION.amazonaws.com`.
    bucket_url: String,
    /// Whether non-empty bodies are signed (`unsigned_payload = Some(false)`).
    sign_bodies: bool,
    max_body: usize,
    bucket: String,
    tier: String,
    /// `prefix/` (or empty), for messages naming an object.
    root: String,
}

impl SignedClient {
    /// The client of the tier configured by `cfg`, its HTTP client built from `options`.
    /// `region` and `endpoint` are the resolved ones (the configuration's or the
    /// environment's); `credentials` are object_store's for the same tier.
    pub(crate) fn new(
        cfg: &S3Config,
        options: &ClientOptions,
        credentials: AwsCredentialProvider,
        region: &str,
        endpoint: Option<&str>,
        root: &str,
    ) -> Result<Self> {
        let bucket_url = match endpoint {
            Some(e) => format!("{}/{}", e.trim_end_matches('/'), cfg.bucket),
            None => format!("https://{}.s3.{region}.amazonaws.com", cfg.bucket),
        };
        let built = AtomicUsize::new(0);
        let http = connect(options, &built).map_err(|e| {
            Error::new(ErrorKind::InvalidInput, format!("HTTP client for {}: {e}", cfg.url()))
                .with_operation(Operation::Setup)
                .with_tier(&cfg.name)
        })?;
        Ok(SignedClient {
            http,
            built,
            credentials,
            region: region.to_string(),
            bucket_url,
            sign_bodies: cfg.unsigned_payload == Some(false),
            max_body: cfg.max_xml_bytes,
            bucket: cfg.bucket.clone(),
            tier: cfg.name.clone(),
            root: root.to_string(),
        })
    }

    /// HTTP clients this tier built (1: the one client, reused by every request).
    pub(crate) fn clients_built(&self) -> usize {
        self.built.load(Ordering::Relaxed)
    }

    /// The bucket's URL, with `query` (already encoded) when not empty.
    pub(crate) fn bucket_url(&self, query: &str) -> String {
        if query.is_empty() {
            self.bucket_url.clone()
        } else {
            format!("{}?{query}", self.bucket_url)
        }
    }

    /// The URL of object `path`, each path segment percent-encoded.
    pub(crate) fn object_url(&self, path: &Path) -> String {
        let key: Vec<String> = path.as_ref().split('/').map(encode).collect();
        format!("{}/{}", self.bucket_url, key.join("/"))
    }

    /// Sends one request, signed: `headers` are added (and signed), `body` is sent as is.
    /// `op` and `key` (a key of the tier, or what the request is about) go into errors. A
    /// transport error, or a body that breaks off, is a temporary `Io` error; a body longer
    /// than `max_xml_bytes` a permanent one, never read into memory. Any status is an
    /// [`Answer`]: the caller decides what it means ([`SignedClient::answer_error`]).
    pub(crate) async fn send(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, String)],
        body: Bytes,
        op: Operation,
        key: &str,
    ) -> Result<Answer> {
        let fail = |kind: ErrorKind, m: String| Error::new(kind, m).context(op, key, &self.tier);
        let cred = self
            .credentials
            .get_credential()
            .await
            .map_err(|e| map_err(e, &self.tier, &self.bucket, op, &format!("{}{key}", self.root)))?;
        let sign_body = self.sign_bodies || body.is_empty();
        let mut b = http::Request::builder().method(method).uri(url).header(http::header::CONTENT_LENGTH, body.len());
        for (k, v) in headers {
            b = b.header(*k, v);
        }
        let mut req = b
            .body(HttpRequestBody::from(body))
            .map_err(|e| fail(ErrorKind::InvalidInput, format!("request {url}: {e}")))?;
        AwsAuthorizer::new(&cred, "s3", &self.region)
            .with_sign_payload(sign_body)
            .try_authorize(&mut req, None)
            .map_err(|e| fail(ErrorKind::Io, format!("signing {url}: {e}")))?;
        let resp = self
            .http
            .execute(req)
            .await
            .map_err(|e| fail(ErrorKind::Io, format!("{method} {url}: {e}")).set_temporary(true))?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let announced =
            headers.get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
        let body = xml::read_capped(resp.into_body().bytes_stream(), announced, self.max_body).await.map_err(|e| {
            fail(ErrorKind::Io, format!("{method} {url}: {e}")).set_temporary(matches!(e, xml::ReadError::Body(_)))
        })?;
        Ok(Answer { status, headers, body })
    }

    /// The error for an S3 error answer (`status`, XML `body`) to a request about `what`
    /// (`s3://bucket/key`, `PUT URL`, ...): `what: HTTP STATUS CODE: MESSAGE`, with its kind
    /// and whether it is temporary from the status and the S3 error code.
    pub(crate) fn answer_error(&self, status: u16, body: &[u8], what: &str, op: Operation, key: &str) -> Error {
        let (code, message) = xml::parse_error(body);
        let msg = format!("{what}: HTTP {status} {code}: {message}");
        let fail = |kind: ErrorKind, m: String| Error::new(kind, m).context(op, key, &self.tier);
        match (status, code.as_str()) {
            (400, "BadDigest" | "InvalidDigest" | "XAmzContentSHA256Mismatch") => fail(
                ErrorKind::Corrupt,
                format!("{msg} (the server refused the body as not matching its checksum: damaged on the way)"),
            )
            .set_temporary(true),
            (401 | 403, _) => fail(ErrorKind::PermissionDenied, format!("{msg} (check the credentials)")),
            (404, "NoSuchBucket") => {
                fail(ErrorKind::NotFound, format!("bucket {:?} does not exist ({msg})", self.bucket))
            }
            (404, _) => fail(ErrorKind::NotFound, msg),
            (408 | 429, _) | (500.., _) => fail(ErrorKind::Io, msg).set_temporary(true),
            // A 200 whose body is an error (CompleteMultipartUpload may answer so): S3 says retry.
            (200, _) => fail(ErrorKind::Io, msg).set_temporary(true),
            _ => fail(ErrorKind::Io, msg),
        }
    }
}

/// Builds an HTTP client from `options`, counting it in `built`. Called once per tier, by
/// [`SignedClient::new`]: a request never builds its own.
fn connect(options: &ClientOptions, built: &AtomicUsize) -> object_store::Result<HttpClient> {
    built.fetch_add(1, Ordering::Relaxed);
    ReqwestConnector::default().connect(options)
}

/// Percent-encodes a query value or a path segment (RFC 3986 unreserved characters kept).
pub(crate) fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_query_values() {
        assert_eq!(encode("a/b c"), "a%2Fb%20c");
    }
}
