//! Mapping `object_store` errors onto ringtier's one [`Error`] type, and the retry loop.

use std::error::Error as StdError;
use std::future::Future;
use std::time::{Duration, Instant};

use object_store::client::{HttpError, HttpErrorKind};
use ringtier_core::{Error, ErrorKind, Operation, Result};

/// The HTTP status an `object_store` error carries, found in its source chain.
///
/// `object_store` keeps the status in a private type; its message always reads
/// `... status code: NNN ...` or `... error response: ...` with the status elsewhere, so the
/// status is read from the text of the chain.
pub(crate) fn http_status(err: &(dyn StdError + 'static)) -> Option<u16> {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = cur {
        let text = e.to_string();
        for marker in ["status code: ", "status: "] {
            if let Some(at) = text.find(marker) {
                let digits: String = text[at + marker.len()..].chars().take_while(|c| c.is_ascii_digit()).collect();
                if let Ok(code) = digits.parse::<u16>() {
                    if (100..600).contains(&code) {
                        return Some(code);
                    }
                }
            }
        }
        cur = e.source();
    }
    None
}

/// The transport failure (connect, timeout, reset) in the chain, if any.
fn transport_kind(err: &(dyn StdError + 'static)) -> Option<HttpErrorKind> {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(h) = e.downcast_ref::<HttpError>() {
            return Some(h.kind());
        }
        cur = e.source();
    }
    None
}

/// True when the text of the chain names a missing bucket (`NoSuchBucket`).
fn names_missing_bucket(err: &(dyn StdError + 'static)) -> bool {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = cur {
        if e.to_string().contains("NoSuchBucket") {
            return true;
        }
        cur = e.source();
    }
    false
}

/// Classifies an `object_store` error: kind, and whether retrying may help.
pub(crate) fn classify(err: &object_store::Error) -> (ErrorKind, bool) {
    use object_store::Error as E;
    match err {
        E::NotFound { .. } => (ErrorKind::NotFound, false),
        E::AlreadyExists { .. } => (ErrorKind::AlreadyExists, false),
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => (ErrorKind::PermissionDenied, false),
        E::InvalidPath { .. } => (ErrorKind::InvalidKey, false),
        E::NotSupported { .. } | E::NotImplemented { .. } => (ErrorKind::Unsupported, false),
        E::Precondition { .. } | E::NotModified { .. } => (ErrorKind::Busy, false),
        E::UnknownConfigurationKey { .. } => (ErrorKind::InvalidInput, false),
        _ => {
            let status = http_status(err);
            match status {
                Some(403) | Some(401) => (ErrorKind::PermissionDenied, false),
                Some(404) => (ErrorKind::NotFound, false),
                Some(416) => (ErrorKind::OutOfRange, false),
                Some(408) | Some(429) => (ErrorKind::Io, true),
                Some(s) if s >= 500 => (ErrorKind::Io, true),
                Some(_) => (ErrorKind::Io, false),
                None => match transport_kind(err) {
                    Some(HttpErrorKind::Connect | HttpErrorKind::Timeout | HttpErrorKind::Interrupted) => {
                        (ErrorKind::Io, true)
                    }
                    Some(HttpErrorKind::Request) => (ErrorKind::Io, true),
                    Some(_) => (ErrorKind::Io, false),
                    None => (ErrorKind::Io, false),
                },
            }
        }
    }
}

/// A one-line cause: the HTTP status with the S3 error code and message where the server sent
/// them, else the innermost error of the chain (a refused connection, a timeout).
fn cause(err: &(dyn StdError + 'static)) -> String {
    let mut texts = Vec::new();
    let mut cur: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = cur {
        texts.push(e.to_string());
        cur = e.source();
    }
    let all = texts.join(" ");
    let tag = |t: &str| -> Option<String> {
        let open = format!("<{t}>");
        let i = all.find(&open)? + open.len();
        let j = all[i..].find("</")? + i;
        Some(all[i..j].to_string())
    };
    match (http_status(err), tag("Code")) {
        (Some(s), Some(code)) => match tag("Message") {
            Some(m) => format!("HTTP {s} {code}: {m}"),
            None => format!("HTTP {s} {code}"),
        },
        (Some(s), None) => format!("HTTP {s}"),
        _ => texts.last().cloned().unwrap_or_default(),
    }
}

/// Converts an `object_store` error, naming the bucket and key in the message.
pub(crate) fn map_err(err: object_store::Error, tier: &str, bucket: &str, op: Operation, key: &str) -> Error {
    let (mut kind, temporary) = classify(&err);
    let why = cause(&err);
    let mut message = match kind {
        ErrorKind::NotFound => format!("no such object s3://{bucket}/{key}"),
        ErrorKind::PermissionDenied => format!(
            "access to s3://{bucket}/{key} denied ({why}; check the credentials: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
        ),
        _ => format!("s3://{bucket}/{key}: {why}"),
    };
    if names_missing_bucket(&err) {
        kind = ErrorKind::NotFound;
        message = format!("bucket {bucket:?} does not exist (while accessing s3://{bucket}/{key})");
    }
    // The chain's text is in the message already: no source, so it is not printed twice.
    Error::new(kind, message).set_temporary(temporary).context(op, key, tier)
}

/// Retry policy of one operation: backoff doubling from `initial` up to `max`, until
/// `deadline` has passed since the first attempt.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Retry {
    pub(crate) initial: Duration,
    pub(crate) max: Duration,
    pub(crate) deadline: Duration,
}

impl Retry {
    /// Runs `attempt` until it succeeds, fails with a permanent error, or the deadline passes
    /// (the last temporary error is returned, saying how long it was retried).
    pub(crate) async fn run<T, F, Fut>(&self, mut attempt: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let start = Instant::now();
        let mut backoff = self.initial;
        let mut tries = 0u32;
        loop {
            tries += 1;
            match attempt().await {
                Ok(v) => return Ok(v),
                Err(e) if e.is_temporary() => {
                    let waited = start.elapsed();
                    if waited + backoff > self.deadline {
                        let msg = format!(
                            "{} (gave up after {tries} attempts over {:.1} s, retry deadline {:.1} s)",
                            e.message(),
                            waited.as_secs_f64(),
                            self.deadline.as_secs_f64()
                        );
                        let mut out = Error::new(e.kind(), msg).set_temporary(true);
                        if let Some(op) = e.operation() {
                            out = out.with_operation(op);
                        }
                        if let Some(k) = e.key() {
                            out = out.with_key(k);
                        }
                        if let Some(t) = e.tier() {
                            out = out.with_tier(t);
                        }
                        return Err(out);
                    }
                    // Jitter: between half and all of the backoff, from the clock's low bits.
                    let nanos = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.subsec_nanos() as u64)
                        .unwrap_or(0);
                    let half = backoff / 2;
                    let jitter = Duration::from_nanos(nanos % (half.as_nanos().max(1) as u64));
                    tracing::debug!(error = %e, tries, "s3: temporary error, retrying");
                    tokio::time::sleep(half + jitter).await;
                    backoff = (backoff * 2).min(self.max);
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn status_from_text() {
        #[derive(Debug)]
        struct E(&'static str);
        impl std::fmt::Display for E {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.0)
            }
        }
        impl StdError for E {}
        assert_eq!(http_status(&E("Server returned non-2xx status code: 503 Service Unavailable: ")), Some(503));
        assert_eq!(http_status(&E("nothing here")), None);
    }

    #[tokio::test]
    async fn retries_until_deadline_then_names_it() {
        let n = AtomicU32::new(0);
        let r = Retry {
            initial: Duration::from_millis(1),
            max: Duration::from_millis(4),
            deadline: Duration::from_millis(50),
        };
        let res: Result<()> = r
            .run(|| {
                n.fetch_add(1, Ordering::SeqCst);
                async { Err(Error::new(ErrorKind::Io, "503").set_temporary(true)) }
            })
            .await;
        let e = res.expect_err("always fails");
        assert!(e.is_temporary() && e.to_string().contains("gave up after"), "{e}");
        assert!(n.load(Ordering::SeqCst) > 2);
        n.store(0, Ordering::SeqCst);
        let res: Result<()> = r
            .run(|| {
                n.fetch_add(1, Ordering::SeqCst);
                async { Err(Error::new(ErrorKind::PermissionDenied, "403")) }
            })
            .await;
        assert_eq!(res.expect_err("permanent").kind(), ErrorKind::PermissionDenied);
        assert_eq!(n.load(Ordering::SeqCst), 1, "a permanent error is not retried");
    }
}
