//! [`S3Config`]: where the tier lives (bucket, prefix, endpoint), who it is (credentials,
//! region), and how it talks (part size, concurrency, timeouts, retries).

use std::fmt;
use std::time::Duration;

use ringtier_core::{Error, ErrorKind, Result};

/// The smallest part S3 accepts for every part of a multipart upload but the last: 5 MiB.
pub const MIN_PART_SIZE: usize = 5 << 20;

/// The most parts one S3 multipart upload may have.
pub const MAX_PARTS: usize = 10_000;

/// Configuration of an [`S3Tier`](crate::S3Tier).
///
/// Everything left unset comes from the standard AWS environment variables when the tier is
/// opened (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION` or
/// `AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL` or `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`); what is set
/// here wins over the environment.
#[derive(Clone)]
#[non_exhaustive]
pub struct S3Config {
    /// Bucket name.
    pub bucket: String,
    /// Key prefix inside the bucket under which the tier's objects live (no leading or
    /// trailing `/`; empty for the bucket's root).
    pub prefix: String,
    /// Region; default: the environment, else `us-east-1`.
    pub region: Option<String>,
    /// Endpoint URL of an S3-compatible server (`http://127.0.0.1:9000`); default: the
    /// environment, else AWS. Requests use path style (`ENDPOINT/BUCKET/KEY`) when set.
    pub endpoint: Option<String>,
    /// Access key id; default: the environment.
    pub access_key_id: Option<String>,
    /// Secret access key; default: the environment.
    pub secret_access_key: Option<String>,
    /// Session token; default: the environment.
    pub session_token: Option<String>,
    /// Allow plain `http://` endpoints; default: true when the endpoint starts with `http://`.
    pub allow_http: Option<bool>,
    /// Bytes per multipart part (every part but the last); default 8 MiB, at least 5 MiB.
    pub part_size: usize,
    /// Parts of one object uploaded at once; default 8.
    pub upload_concurrency: usize,
    /// Requests of one `read_batch` in flight at once; default 64.
    pub read_concurrency: usize,
    /// Objects of at most this many bytes are written with one PUT at commit instead of a
    /// multipart upload; default: the part size.
    pub single_put_max: usize,
    /// Time limit of one HTTP request, headers and body; default 60 s. A stalled server fails
    /// the request after this long (a temporary error, retried).
    pub request_timeout: Duration,
    /// Time limit to connect; default 5 s.
    pub connect_timeout: Duration,
    /// How long one operation keeps retrying temporary errors (5xx, throttling, timeouts,
    /// connection resets) before it fails; default 120 s. Permanent errors fail at once.
    pub retry_deadline: Duration,
    /// First backoff between retries; default 100 ms (doubling, with jitter, up to
    /// [`max_backoff`](Self::max_backoff)).
    pub initial_backoff: Duration,
    /// Longest backoff between retries; default 5 s.
    pub max_backoff: Duration,
    /// Worker threads of the tier's own I/O runtime; default 2.
    pub io_threads: usize,
    /// Tier name in errors and metrics; default `s3`.
    pub name: String,
    /// Checksum sent with every upload (each part and each single PUT) for the server to
    /// check on receipt (where it checks: AWS does, moto does not); default none, since the
    /// SigV4 signature already covers every body's SHA-256.
    pub checksum: UploadChecksum,
    /// How each upload is checked as stored before its commit returns; default
    /// [`UploadVerify::Checksums`].
    pub verify: UploadVerify,
    /// Whether request bodies go unsigned (`UNSIGNED-PAYLOAD`) instead of with their SHA-256
    /// in the SigV4 signature (one SHA-256 pass over every byte, most of an upload's CPU).
    /// `None` (default): parts and single PUTs sent with a signed `x-amz-checksum-crc32c`
    /// ([`UploadVerify::Checksums`]) go unsigned, as the AWS SDKs send them over HTTPS, and
    /// every other request is signed; `Some(true)`: every request unsigned; `Some(false)`:
    /// every request signed (the checksummed parts too: then they carry both).
    pub unsigned_payload: Option<bool>,
    /// How long a writer's lease on the prefix ([`Tier::lock`](ringtier_core::Tier::lock))
    /// lives without being renewed before another writer may take it over; default 60 s, at
    /// least 1 s. The holder renews it every quarter of this. See docs/S3.md, "One writer per
    /// prefix".
    pub lease_timeout: Duration,
    /// Largest body of an S3 answer this crate reads into memory itself (XML listings and
    /// errors, leases, upload markers); default 8 MiB, at least 64 KiB. A longer answer is an
    /// error, never an allocation.
    pub max_xml_bytes: usize,
}

/// How an upload is checked as stored (every part's bytes) before its commit returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum UploadVerify {
    /// Every part (and every single PUT) carries its CRC-32C in `x-amz-checksum-crc32c`; a
    /// server that checks it (AWS S3, and the test server) refuses a body that does not match
    /// (`BadDigest`, retried) and answers with the checksum of what it stored, which must be
    /// ours; then the object's size is checked (HEAD). Free on the client: the CRC-32C is
    /// computed anyway. Whether the server checks part checksums is probed once per tier
    /// (one part sent with a wrong checksum must be refused); where it does not (moto,
    /// s3s-fs alone) or a part's answer lacks the checksum, the object is read back instead
    /// ([`UploadVerify::ReadBack`]).
    #[default]
    Checksums,
    /// Read the object back after the upload (ranges of a part, several at once) and compare
    /// its size and CRC-32C with the bytes written: works with any server, costs a read of
    /// every byte.
    ReadBack,
    /// No check beyond the transport's (and the server's own checks of what it is sent).
    Off,
}

impl UploadVerify {
    /// The URL spelling: `checksums`, `readback`, `off`.
    pub fn as_str(self) -> &'static str {
        match self {
            UploadVerify::Checksums => "checksums",
            UploadVerify::ReadBack => "readback",
            UploadVerify::Off => "off",
        }
    }

    /// Parses `checksums`, `readback`, `off` (also `1` for the default and `0` for `off`).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "checksums" | "1" => Some(UploadVerify::Checksums),
            "readback" | "read-back" => Some(UploadVerify::ReadBack),
            "off" | "0" => Some(UploadVerify::Off),
            _ => None,
        }
    }
}

/// The checksum each upload carries (`x-amz-checksum-*`), checked by the server on receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum UploadChecksum {
    /// None: the server checks only the transport (TCP, TLS).
    None,
    /// CRC-64/NVME: cheap (SIMD), what AWS SDKs default to now.
    Crc64Nvme,
    /// SHA-256: costs more CPU.
    Sha256,
}

impl fmt::Debug for S3Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the secret.
        f.debug_struct("S3Config")
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("region", &self.region)
            .field("endpoint", &self.endpoint)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &self.secret_access_key.as_ref().map(|_| "<set>"))
            .field("part_size", &self.part_size)
            .field("upload_concurrency", &self.upload_concurrency)
            .field("read_concurrency", &self.read_concurrency)
            .field("request_timeout", &self.request_timeout)
            .field("retry_deadline", &self.retry_deadline)
            .field("name", &self.name)
            .field("checksum", &self.checksum)
            .field("verify", &self.verify)
            .field("unsigned_payload", &self.unsigned_payload)
            .field("lease_timeout", &self.lease_timeout)
            .field("max_xml_bytes", &self.max_xml_bytes)
            .finish_non_exhaustive()
    }
}

impl S3Config {
    /// A configuration for `bucket`, objects under `prefix` (may be empty), defaults elsewhere.
    pub fn new(bucket: impl Into<String>, prefix: impl Into<String>) -> Self {
        let prefix: String = prefix.into();
        S3Config {
            bucket: bucket.into(),
            prefix: prefix.trim_matches('/').to_string(),
            region: None,
            endpoint: None,
            access_key_id: None,
            secret_access_key: None,
            session_token: None,
            allow_http: None,
            part_size: 8 << 20,
            upload_concurrency: 8,
            read_concurrency: 64,
            single_put_max: 8 << 20,
            request_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(5),
            retry_deadline: Duration::from_secs(120),
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            io_threads: 2,
            name: "s3".to_string(),
            checksum: UploadChecksum::None,
            verify: UploadVerify::Checksums,
            unsigned_payload: None,
            lease_timeout: Duration::from_secs(60),
            max_xml_bytes: 8 << 20,
        }
    }

    /// Parses `s3://bucket/prefix` (the prefix may be empty: `s3://bucket`), with optional
    /// settings after `?`, `&`-separated: `endpoint=URL`, `region=R`, `part_size=BYTES`,
    /// `upload_concurrency=N`, `read_concurrency=N`, `verify=checksums|readback|off` (`1`, `0`),
    /// `unsigned_payload=0|1`, `lease_timeout=SECONDS`, `retry_deadline=SECONDS`,
    /// `request_timeout=SECONDS`, `connect_timeout=SECONDS`, `io_threads=N` (seconds may have a
    /// fraction; credentials come from the environment only, never from a URL). For example
    /// `s3://ckpt/run1?endpoint=http://127.0.0.1:9000&region=us-east-1`.
    pub fn from_url(url: &str) -> Result<Self> {
        let bad = |m: String| Error::new(ErrorKind::InvalidInput, m);
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| bad(format!("{url:?} is not an s3:// URL (s3://bucket/prefix)")))?;
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad(format!("{url:?} names no bucket (s3://bucket/prefix)")));
        }
        let prefix = prefix.trim_matches('/');
        if !prefix.is_empty() {
            ringtier_core::key::validate_key(prefix).map_err(|e| bad(format!("bad prefix in {url:?}: {e}")))?;
        }
        let mut cfg = S3Config::new(bucket, prefix);
        for kv in query.split('&').filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').ok_or_else(|| bad(format!("{url:?}: setting {kv:?} is not KEY=VALUE")))?;
            let num = |v: &str| v.parse::<usize>().map_err(|_| bad(format!("{url:?}: {k}={v:?} is not a number")));
            // Seconds, a fraction allowed, at most a day (a typo never waits for years).
            let secs = |v: &str| match v.parse::<f64>() {
                Ok(s) if s.is_finite() && (0.0..=86_400.0).contains(&s) => Ok(Duration::from_secs_f64(s)),
                _ => Err(bad(format!("{url:?}: {k}={v:?} is not a number of seconds (0 to 86400)"))),
            };
            match k {
                "endpoint" => cfg.endpoint = Some(v.to_string()),
                "region" => cfg.region = Some(v.to_string()),
                "part_size" => cfg.part_size = num(v)?,
                "upload_concurrency" => cfg.upload_concurrency = num(v)?,
                "read_concurrency" => cfg.read_concurrency = num(v)?,
                "verify" => {
                    cfg.verify = UploadVerify::parse(v)
                        .ok_or_else(|| bad(format!("{url:?}: verify={v:?} is not one of checksums, readback, off")))?
                }
                "unsigned_payload" => cfg.unsigned_payload = Some(v != "0"),
                "lease_timeout" => cfg.lease_timeout = Duration::from_secs(num(v)? as u64),
                "retry_deadline" => cfg.retry_deadline = secs(v)?,
                "request_timeout" => cfg.request_timeout = secs(v)?,
                "connect_timeout" => cfg.connect_timeout = secs(v)?,
                "io_threads" => cfg.io_threads = num(v)?,
                _ => {
                    return Err(bad(format!(
                        "{url:?}: unknown setting {k:?} (endpoint, region, part_size, upload_concurrency, \
                         read_concurrency, verify, unsigned_payload, lease_timeout, retry_deadline, request_timeout, \
                         connect_timeout, io_threads)"
                    )))
                }
            }
        }
        Ok(cfg)
    }

    /// True when `s` names an S3 tier (`s3://...`), as opposed to a directory.
    pub fn is_s3_url(s: &str) -> bool {
        s.starts_with("s3://")
    }

    /// The tier's URL, `s3://bucket/prefix`.
    pub fn url(&self) -> String {
        if self.prefix.is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{}", self.bucket, self.prefix)
        }
    }

    /// Sets the region.
    pub fn with_region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }

    /// Sets the endpoint URL of an S3-compatible server.
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }

    /// Sets the access key id and secret access key.
    pub fn with_credentials(mut self, access_key_id: impl Into<String>, secret_access_key: impl Into<String>) -> Self {
        self.access_key_id = Some(access_key_id.into());
        self.secret_access_key = Some(secret_access_key.into());
        self
    }

    /// Sets the session token.
    pub fn with_session_token(mut self, token: impl Into<String>) -> Self {
        self.session_token = Some(token.into());
        self
    }

    /// Allows (or forbids) plain `http://` endpoints.
    pub fn with_allow_http(mut self, allow: bool) -> Self {
        self.allow_http = Some(allow);
        self
    }

    /// Sets the part size in bytes (at least [`MIN_PART_SIZE`]).
    pub fn with_part_size(mut self, bytes: usize) -> Self {
        self.part_size = bytes;
        self
    }

    /// Sets how many parts of one object upload at once.
    pub fn with_upload_concurrency(mut self, n: usize) -> Self {
        self.upload_concurrency = n;
        self
    }

    /// Sets how many requests of one batch are in flight at once.
    pub fn with_read_concurrency(mut self, n: usize) -> Self {
        self.read_concurrency = n;
        self
    }

    /// Sets the largest object written with a single PUT.
    pub fn with_single_put_max(mut self, bytes: usize) -> Self {
        self.single_put_max = bytes;
        self
    }

    /// Sets the time limit of one request.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets the time limit to connect.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets how long temporary errors are retried.
    pub fn with_retry_deadline(mut self, deadline: Duration) -> Self {
        self.retry_deadline = deadline;
        self
    }

    /// Sets the first and the longest backoff between retries.
    pub fn with_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max;
        self
    }

    /// Sets the worker threads of the tier's I/O runtime.
    pub fn with_io_threads(mut self, n: usize) -> Self {
        self.io_threads = n;
        self
    }

    /// Sets the checksum every upload carries.
    pub fn with_checksum(mut self, checksum: UploadChecksum) -> Self {
        self.checksum = checksum;
        self
    }

    /// Sets how uploads are checked as stored (see [`UploadVerify`]).
    pub fn with_verify(mut self, verify: UploadVerify) -> Self {
        self.verify = verify;
        self
    }

    /// Turns the check of each upload on (the default, [`UploadVerify::Checksums`]) or off.
    pub fn with_verify_uploads(mut self, verify: bool) -> Self {
        self.verify = if verify { UploadVerify::Checksums } else { UploadVerify::Off };
        self
    }

    /// Sends every request's body unsigned (`true`) or signed (`false`) instead of the default
    /// (see [`unsigned_payload`](Self::unsigned_payload)).
    pub fn with_unsigned_payload(mut self, unsigned: bool) -> Self {
        self.unsigned_payload = Some(unsigned);
        self
    }

    /// Sets how long an unrenewed lease on the prefix lives (see
    /// [`lease_timeout`](Self::lease_timeout)).
    pub fn with_lease_timeout(mut self, timeout: Duration) -> Self {
        self.lease_timeout = timeout;
        self
    }

    /// Sets the largest answer body read into memory (see
    /// [`max_xml_bytes`](Self::max_xml_bytes)).
    pub fn with_max_xml_bytes(mut self, bytes: usize) -> Self {
        self.max_xml_bytes = bytes;
        self
    }

    /// Names the tier (errors, metrics).
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Checks the numbers: part size at least 5 MiB, concurrencies and threads at least 1,
    /// lease timeout at least 1 s, answer cap at least 64 KiB.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::new(ErrorKind::InvalidInput, m));
        if self.bucket.is_empty() {
            return bad("S3 tier without a bucket".into());
        }
        if self.part_size < MIN_PART_SIZE {
            return bad(format!("part size {} is below S3's minimum of {MIN_PART_SIZE} bytes", self.part_size));
        }
        if self.upload_concurrency == 0 || self.read_concurrency == 0 || self.io_threads == 0 {
            return bad("upload concurrency, read concurrency and I/O threads must be at least 1".into());
        }
        if self.lease_timeout < Duration::from_secs(1) {
            return bad(format!(
                "lease timeout {:?} is below 1 s (S3 times objects to the second)",
                self.lease_timeout
            ));
        }
        if self.max_xml_bytes < 64 << 10 {
            return bad(format!("max_xml_bytes {} is below 64 KiB", self.max_xml_bytes));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let c = S3Config::from_url("s3://bkt/a/b/").expect("url");
        assert_eq!((c.bucket.as_str(), c.prefix.as_str()), ("bkt", "a/b"));
        assert_eq!(c.url(), "s3://bkt/a/b");
        let c =
            S3Config::from_url("s3://bkt/p?endpoint=http://127.0.0.1:9000&region=eu-west-1&part_size=6000000&verify=0")
                .expect("url with settings");
        assert_eq!(c.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(
            (c.region.as_deref(), c.part_size, c.verify, c.prefix.as_str()),
            (Some("eu-west-1"), 6_000_000, UploadVerify::Off, "p")
        );
        assert_eq!(S3Config::from_url("s3://b/p").expect("default").verify, UploadVerify::Checksums);
        let c = S3Config::from_url("s3://b/p?verify=readback&unsigned_payload=0").expect("readback");
        assert_eq!((c.verify, c.unsigned_payload), (UploadVerify::ReadBack, Some(false)));
        assert_eq!(S3Config::from_url("s3://b/p?verify=1").expect("1").verify, UploadVerify::Checksums);
        assert!(S3Config::from_url("s3://bkt/p?secret=x").is_err());
        let c = S3Config::from_url("s3://b/p?retry_deadline=2.5&request_timeout=7&connect_timeout=0.5&io_threads=3")
            .expect("timeouts");
        assert_eq!(
            (c.retry_deadline, c.request_timeout, c.connect_timeout, c.io_threads),
            (Duration::from_millis(2500), Duration::from_secs(7), Duration::from_millis(500), 3)
        );
        let c = S3Config::from_url("s3://bkt").expect("url");
        assert_eq!((c.bucket.as_str(), c.prefix.as_str()), ("bkt", ""));
        for bad in [
            "/nvme/x",
            "s3://",
            "s3:///x",
            "s3://b/../x",
            "s3://b/a//c",
            "s3://b/p?part_size=x",
            "s3://b/p?verify=maybe",
            "s3://b/p?retry_deadline=-1",
            "s3://b/p?retry_deadline=inf",
            "s3://b/p?connect_timeout=1e9",
            "s3://b/p?endpoint",
        ] {
            assert_eq!(S3Config::from_url(bad).expect_err(bad).kind(), ErrorKind::InvalidInput, "{bad}");
        }
        assert!(S3Config::new("b", "").with_part_size(1 << 20).validate().is_err());
        let dbg = format!("{:?}", S3Config::new("b", "").with_credentials("id", "hunter2"));
        assert!(!dbg.contains("hunter2"), "{dbg}");
    }
}
