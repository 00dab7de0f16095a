//! One writer per prefix: a lease object `PREFIX/.ringtier-lease-NAME`, taken with a
//! conditional create and kept alive by conditional rewrites (docs/S3.md, "One writer per
//! prefix").
//!
//! - **Take.** `PUT` with `If-None-Match: *`: only one of any number of writers racing for a
//!   free prefix gets it; the others are answered 412 (409 on AWS when two conditional writes
//!   cross) and read the lease.
//! - **Live or stale.** A lease is stale when it was last written more than its timeout ago,
//!   measured on the server's clock (the answer's `Date` minus the object's `Last-Modified`),
//!   so the holders' clocks do not matter. A live lease is an [`ErrorKind::Busy`] error naming
//!   its holder (host, pid, a random token). A lease a process finds under its own token
//!   that it no longer holds (a store dropped while the server was down) is stale at once.
//! - **Take-over.** `PUT` with `If-Match: ETAG` of the stale lease: two writers taking it over
//!   at once cannot both win.
//! - **Renewal.** Every quarter of the timeout the holder rewrites the lease with `If-Match`
//!   its last ETag (each body differs, a sequence number in it). A 412 or 404 means it was
//!   taken over: the lease is lost, logged, and the tier's commits and deletes fail with
//!   `Busy` from then on, until the guard is dropped.
//! - **Release.** Dropping the guard stops the renewal and deletes the lease with `If-Match`
//!   (best effort: a lease left behind goes stale after its timeout).
//!
//! A retried conditional write whose first attempt did land is answered 412; the lease is
//! then read back, and if it holds exactly what was sent, it is ours.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use object_store::path::Path;
use ringtier_core::{Error, ErrorKind, Operation, Result};

use crate::tier::Inner;

/// The lease's key component prefix (reserved: never listed as an object).
pub(crate) const LEASE_PREFIX: &str = ".ringtier-lease-";

/// Largest lease body read.
pub(crate) const MAX_LEASE_BYTES: usize = 4096;

/// What a lease object holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// Who holds it: `HOST/PID/TOKEN/N`.
    pub holder: String,
    /// Renewals so far (each write differs, so each has its own ETag).
    pub seq: u64,
    /// The holder's timeout: stale once not rewritten for this long.
    pub timeout: Duration,
    /// The holder's clock at the last write (shown to people; staleness uses the server's).
    pub written_unix_ms: u64,
}

impl LeaseRecord {
    fn body(&self) -> String {
        format!(
            "ringtier-lease 1\nholder {}\nseq {}\ntimeout_ms {}\nwritten_unix_ms {}\n",
            self.holder,
            self.seq,
            self.timeout.as_millis(),
            self.written_unix_ms
        )
    }
}

/// Parses a lease body; `None` when it is not one (then it is treated as held by an unknown
/// writer, with the reader's own timeout).
pub(crate) fn parse_lease(body: &[u8]) -> Option<LeaseRecord> {
    if body.len() > MAX_LEASE_BYTES {
        return None;
    }
    let text = std::str::from_utf8(body).ok()?;
    let mut lines = text.lines();
    if lines.next()? != "ringtier-lease 1" {
        return None;
    }
    let mut fields = HashMap::new();
    for line in lines.take(16) {
        let (k, v) = line.split_once(' ')?;
        fields.insert(k, v);
    }
    let holder = fields.get("holder")?;
    if holder.is_empty() || holder.len() > 512 || holder.chars().any(char::is_control) {
        return None;
    }
    let timeout_ms: u64 = fields.get("timeout_ms")?.parse().ok()?;
    Some(LeaseRecord {
        holder: holder.to_string(),
        seq: fields.get("seq")?.parse().ok()?,
        // Bounded: a lease claiming a year-long timeout does not lock a prefix for a year.
        timeout: Duration::from_millis(timeout_ms.clamp(1000, 24 * 3600 * 1000)),
        written_unix_ms: fields.get("written_unix_ms")?.parse().ok()?,
    })
}

/// Seconds since the epoch of an HTTP date (`Tue, 01 Dec 2026 15:15:41 GMT`, IMF-fixdate,
/// the form S3 sends); `None` for anything else.
pub(crate) fn parse_http_date(s: &str) -> Option<u64> {
    let s = s.trim();
    let rest = s.get(5..)?; // "Tue, "
    let mut it = rest.split(' ');
    let day: u64 = it.next()?.parse().ok()?;
    let month = match it.next()? {
        "Jan" => 1,
        "Feb" => 2,
        "Mar" => 3,
        "Apr" => 4,
        "May" => 5,
        "Jun" => 6,
        "Jul" => 7,
        "Aug" => 8,
        "Sep" => 9,
        "Oct" => 10,
        "Nov" => 11,
        "Dec" => 12,
        _ => return None,
    };
    let year: i64 = it.next()?.parse().ok()?;
    let mut hms = it.next()?.split(':');
    let (h, m, sec): (u64, u64, u64) =
        (hms.next()?.parse().ok()?, hms.next()?.parse().ok()?, hms.next()?.parse().ok()?);
    if it.next()? != "GMT" || !(1..=31).contains(&day) || h > 23 || m > 59 || sec > 60 || !(1970..=9999).contains(&year)
    {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let (y, mo) = if month <= 2 { (year - 1, month + 9) } else { (year, month - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * mo + 2) / 5 + day as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days).ok().map(|d| d * 86_400 + h * 3600 + m * 60 + sec)
}

/// `HOST/PID/TOKEN/`: this process, unique (the token is random per process).
fn process_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_default();
        let host: String = host
            .trim()
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
            .take(64)
            .collect();
        let host = if host.is_empty() { "unknown-host".to_string() } else { host };
        // RandomState is seeded from the OS's randomness.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
        h.write_u32(std::process::id());
        format!("{host}/{}/{:016x}/", std::process::id(), h.finish())
    })
}

/// Leases this process holds (`false`) or is releasing (`true`), by endpoint, bucket and
/// object path.
fn held() -> &'static Mutex<HashMap<String, bool>> {
    static HELD: OnceLock<Mutex<HashMap<String, bool>>> = OnceLock::new();
    HELD.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Holder ids of the leases this process holds or is releasing.
fn live_holders() -> &'static Mutex<std::collections::HashSet<String>> {
    static LIVE: OnceLock<Mutex<std::collections::HashSet<String>>> = OnceLock::new();
    LIVE.get_or_init(|| Mutex::new(std::collections::HashSet::new()))
}

/// `host H, pid P` of a holder id `H/P/TOKEN/N`, with the rest after it.
fn describe(holder: &str) -> String {
    let mut it = holder.splitn(3, '/');
    match (it.next(), it.next(), it.next()) {
        (Some(h), Some(p), Some(rest)) => format!("host {h}, pid {p} (lease {rest})"),
        _ => format!("{holder:?}"),
    }
}

/// A lease's place in [`held`] and its holder id in [`live_holders`], given up when dropped.
struct Held(String, String);

impl Drop for Held {
    fn drop(&mut self) {
        held().lock().unwrap_or_else(|p| p.into_inner()).remove(&self.0);
        live_holders().lock().unwrap_or_else(|p| p.into_inner()).remove(&self.1);
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// A lease held: renewed in the background until dropped, then deleted (best effort).
pub(crate) struct LeaseGuard {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    inner: Arc<Inner>,
    name: String,
    /// Its key in [`held`].
    place: String,
    /// Its holder id, in [`live_holders`].
    holder: String,
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        // Releasing: a lock taken again in this process at the same place waits for the
        // DELETE to end; the holder id no longer protects anything (a lease left behind
        // under it, the release failing, is this process's to take over).
        if let Some(r) = held().lock().unwrap_or_else(|p| p.into_inner()).get_mut(&self.place) {
            *r = true;
        }
        live_holders().lock().unwrap_or_else(|p| p.into_inner()).remove(&self.holder);
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.inner.lost_leases.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.name);
    }
}

/// The lease object, as the server answered a GET.
struct Seen {
    etag: Option<String>,
    body: Bytes,
    /// Seconds since its last write, on the server's clock (or ours, where it sends no Date).
    age: Option<u64>,
}

struct Lease {
    inner: Arc<Inner>,
    url: String,
    key: String,
}

impl Lease {
    fn fail(&self, kind: ErrorKind, m: String) -> Error {
        Error::new(kind, m).context(Operation::Open, &self.key, &self.inner.cfg.name)
    }

    /// A conditional PUT of `rec`: `Ok(Some(etag))` written, `Ok(None)` refused by the
    /// condition (412, 409, or 404 for `If-Match` of a gone object).
    async fn put(&self, rec: &LeaseRecord, condition: (&'static str, String)) -> Result<Option<String>> {
        let body = Bytes::from(rec.body());
        let headers = [condition];
        let me = &self.inner;
        let answer = me
            .retry
            .run(|| me.signed.send("PUT", &self.url, &headers, body.clone(), Operation::Open, &self.key))
            .await?;
        match answer.status {
            200..=299 => answer
                .etag()
                .map(Some)
                .ok_or_else(|| self.fail(ErrorKind::Io, format!("PUT {}: the answer has no ETag", self.url))),
            404 | 409 | 412 => Ok(None),
            s => Err(self.answer(s, &answer.body, "PUT")),
        }
    }

    /// The error for an error answer to `method` on the lease.
    fn answer(&self, status: u16, body: &[u8], method: &str) -> Error {
        let what = format!("{method} {}", self.url);
        self.inner.signed.answer_error(status, body, &what, Operation::Open, &self.key)
    }

    /// The lease as it is now; `None` when there is none.
    async fn get(&self) -> Result<Option<Seen>> {
        let me = &self.inner;
        let answer =
            me.retry.run(|| me.signed.send("GET", &self.url, &[], Bytes::new(), Operation::Open, &self.key)).await?;
        match answer.status {
            200 => {}
            404 if crate::xml::parse_error(&answer.body).0 != "NoSuchBucket" => return Ok(None),
            s => return Err(self.answer(s, &answer.body, "GET")),
        }
        let modified = answer.header(http::header::LAST_MODIFIED).and_then(|d| parse_http_date(&d));
        let now = answer.header(http::header::DATE).and_then(|d| parse_http_date(&d)).unwrap_or(now_ms() / 1000);
        let age = modified.map(|m| now.saturating_sub(m));
        Ok(Some(Seen { etag: answer.etag(), body: answer.body, age }))
    }

    /// Deletes the lease if it still has `etag` (`If-Match`; a server that ignores the
    /// condition on DELETE is asked only after the lease was read back as ours).
    async fn release(&self, etag: &str, holder: &str) {
        match self.get().await {
            Ok(Some(seen)) if parse_lease(&seen.body).is_some_and(|r| r.holder == holder) => {}
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(lease = %self.url, error = %e, "s3: cannot read the lease to release it (it goes stale after its timeout)");
                return;
            }
        }
        let me = &self.inner;
        let headers = [("if-match", etag.to_string())];
        let res = me
            .retry
            .run(|| me.signed.send("DELETE", &self.url, &headers, Bytes::new(), Operation::Open, &self.key))
            .await;
        match res {
            Ok(answer) if matches!(answer.status, 200..=299 | 404 | 412) => {}
            Ok(answer) => {
                let e = self.answer(answer.status, &answer.body, "DELETE");
                tracing::warn!(lease = %self.url, error = %e, "s3: cannot delete the lease (it goes stale after its timeout)");
            }
            Err(e) => {
                tracing::warn!(lease = %self.url, error = %e, "s3: cannot delete the lease (it goes stale after its timeout)")
            }
        }
    }
}

/// Takes the lease `name` on the tier's prefix, or fails with `Busy` naming its holder.
pub(crate) async fn acquire(inner: &Arc<Inner>, name: &str) -> Result<LeaseGuard> {
    let key = format!("{LEASE_PREFIX}{name}");
    let path = Path::parse(format!("{}{key}", inner.root)).map_err(|e| {
        Error::new(ErrorKind::InvalidKey, format!("lease path: {e}")).context(Operation::Open, name, &inner.cfg.name)
    })?;
    let url = inner.signed.object_url(&path);
    let place = format!("{}|{}|{path}", inner.endpoint.as_deref().unwrap_or("aws"), inner.cfg.bucket);
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let holder = format!("{}{}", process_id(), N.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let timeout = inner.cfg.lease_timeout;
    let lease = Lease { inner: Arc::clone(inner), url, key };
    let wait = inner.cfg.request_timeout * 2;
    let (etag, rec, lease, held_place) = inner
        .spawn(async move {
            // Held here already: Busy; being released by a guard just dropped: wait for the
            // release (its DELETE) to end first.
            let since = std::time::Instant::now();
            loop {
                let releasing = {
                    let mut h = held().lock().unwrap_or_else(|p| p.into_inner());
                    match h.get(&place) {
                        None => {
                            h.insert(place.clone(), false);
                            break;
                        }
                        Some(r) => *r,
                    }
                };
                if !releasing || since.elapsed() > wait {
                    return Err(lease.fail(
                        ErrorKind::Busy,
                        format!(
                            "the lease {} is held by this process already ({})",
                            lease.url,
                            describe(process_id().trim_end_matches('/'))
                        ),
                    ));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            live_holders().lock().unwrap_or_else(|p| p.into_inner()).insert(holder.clone());
            let held_place = Held(place, holder.clone());
            take(&lease, &holder, timeout).await.map(|(e, r)| (e, r, lease, held_place))
        })
        .await??;
    inner.lost_leases.lock().unwrap_or_else(|p| p.into_inner()).remove(name);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let guard = LeaseGuard {
        stop: Some(stop_tx),
        inner: Arc::clone(inner),
        name: name.to_string(),
        place: held_place.0.clone(),
        holder: held_place.1.clone(),
    };
    inner.io_handle().spawn(renew(lease, etag, rec, stop_rx, held_place, name.to_string()));
    Ok(guard)
}

/// Creates the lease, or takes over a stale one; returns its ETag and what it holds.
async fn take(lease: &Lease, holder: &str, timeout: Duration) -> Result<(String, LeaseRecord)> {
    let rec = LeaseRecord { holder: holder.to_string(), seq: 0, timeout, written_unix_ms: now_ms() };
    for _ in 0..8 {
        if let Some(etag) = lease.put(&rec, ("if-none-match", "*".to_string())).await? {
            return Ok((etag, rec));
        }
        let Some(seen) = lease.get().await? else {
            continue; // released in between: create again
        };
        let theirs = parse_lease(&seen.body);
        let etag = seen.etag.clone().unwrap_or_default();
        if theirs.as_ref() == Some(&rec) && !etag.is_empty() {
            return Ok((etag, rec)); // our own create, answered 412 on a retry
        }
        let their_timeout = theirs.as_ref().map_or(timeout, |r| r.timeout);
        let who = theirs.as_ref().map_or("an unknown writer (unreadable lease)".to_string(), |r| describe(&r.holder));
        // Left by this process, whose guard is gone (a store dropped while the server was
        // down): no live lease of this process has that holder id.
        let ours = theirs.as_ref().is_some_and(|r| {
            r.holder.starts_with(process_id())
                && !live_holders().lock().unwrap_or_else(|p| p.into_inner()).contains(&r.holder)
        });
        // Last-Modified and Date are to the second: stale past the timeout plus that second.
        // Where the server sends no Last-Modified, the holder's own clock in the lease.
        let age = seen.age.or_else(|| theirs.as_ref().map(|r| now_ms().saturating_sub(r.written_unix_ms) / 1000));
        let stale = age.is_some_and(|a| a > their_timeout.as_secs_f64().ceil() as u64);
        if !(stale || ours) {
            let age = age.map_or("at an unknown time".to_string(), |a| format!("{a} s ago"));
            return Err(lease.fail(
                ErrorKind::Busy,
                format!(
                    "the prefix s3://{}/{} is leased to {who} (written {age}, stale after {:.0} s without renewal): \
                     another writer has it open; if that writer is dead, its lease is taken over once stale",
                    lease.inner.cfg.bucket,
                    lease.inner.root,
                    their_timeout.as_secs_f64()
                ),
            ));
        }
        if etag.is_empty() {
            return Err(lease.fail(ErrorKind::Io, format!("GET {}: the answer has no ETag", lease.url)));
        }
        if let Some(new) = lease.put(&rec, ("if-match", etag)).await? {
            tracing::warn!(lease = %lease.url, previous = %who, age_s = ?age, "s3: took over a stale lease");
            return Ok((new, rec));
        }
        // Someone else took it over (or renewed it) first: look again.
    }
    Err(lease.fail(ErrorKind::Busy, format!("the lease {} changes hands too often to take", lease.url)))
}

/// Renews the lease until told to stop, then releases it.
async fn renew(
    lease: Lease,
    mut etag: String,
    mut rec: LeaseRecord,
    mut stop: tokio::sync::oneshot::Receiver<()>,
    _held: Held,
    name: String,
) {
    let inner = Arc::clone(&lease.inner);
    let every = rec.timeout / 4;
    let mut wait = every;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = &mut stop => {
                // Bounded: with the server down, the lease is left to go stale.
                let limit = inner.cfg.request_timeout.min(rec.timeout);
                if tokio::time::timeout(limit, lease.release(&etag, &rec.holder)).await.is_err() {
                    tracing::warn!(lease = %lease.url, "s3: no answer releasing the lease (it goes stale after its timeout)");
                }
                return;
            }
        }
        let next = LeaseRecord { seq: rec.seq + 1, written_unix_ms: now_ms(), ..rec.clone() };
        // One attempt, bounded by the renewal interval; a failure is tried again sooner.
        let attempt = async {
            let answer = inner
                .signed
                .send(
                    "PUT",
                    &lease.url,
                    &[("if-match", etag.clone())],
                    Bytes::from(next.body()),
                    Operation::Open,
                    &lease.key,
                )
                .await?;
            Ok::<_, Error>((answer.status, answer.etag(), answer.body))
        };
        match tokio::time::timeout(every, attempt).await {
            Ok(Ok((200..=299, Some(new), _))) => {
                etag = new;
                rec = next;
                wait = every;
            }
            Ok(Ok((404 | 409 | 412, _, _))) => {
                // Our own write retried, or the lease is gone: read it back.
                match lease.get().await {
                    Ok(Some(seen)) if parse_lease(&seen.body).as_ref() == Some(&next) => {
                        etag = seen.etag.unwrap_or(etag);
                        rec = next;
                        wait = every;
                    }
                    Ok(seen) => {
                        let by = seen
                            .and_then(|s| parse_lease(&s.body))
                            .map_or("deleted".to_string(), |r| format!("taken over by {}", describe(&r.holder)));
                        let why =
                            format!("the lease {} was lost ({by}) while held by {}", lease.url, describe(&rec.holder));
                        tracing::error!(lease = %lease.url, "s3: {why}; commits and deletes on this tier now fail");
                        inner.lost_leases.lock().unwrap_or_else(|p| p.into_inner()).insert(name.clone(), why);
                        let _ = stop.await;
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(lease = %lease.url, error = %e, "s3: cannot read the lease back");
                        wait = (every / 4).max(Duration::from_millis(100));
                    }
                }
            }
            other => {
                let why = match other {
                    Ok(Ok((status, _, body))) => lease.answer(status, &body, "PUT").to_string(),
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => format!("no answer within {every:?}"),
                };
                tracing::warn!(lease = %lease.url, error = %why, "s3: cannot renew the lease; trying again");
                wait = (every / 4).max(Duration::from_millis(100));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_bodies_round_trip_and_junk_is_refused() {
        let rec = LeaseRecord {
            holder: "h/1/abc/0".into(),
            seq: 3,
            timeout: Duration::from_secs(30),
            written_unix_ms: 1_700_000_000_000,
        };
        assert_eq!(parse_lease(rec.body().as_bytes()), Some(rec));
        for junk in ["", "ringtier-lease 1\n", "ringtier-lease 2\nholder x\nseq 1\ntimeout_ms 1\nwritten_unix_ms 1\n"] {
            assert_eq!(parse_lease(junk.as_bytes()), None, "{junk:?}");
        }
        let long = format!("ringtier-lease 1\nholder {}\nseq 1\ntimeout_ms 1\nwritten_unix_ms 1\n", "x".repeat(600));
        assert_eq!(parse_lease(long.as_bytes()), None);
        let huge = "ringtier-lease 1\nholder x\nseq 1\ntimeout_ms 99999999999999\nwritten_unix_ms 1\n";
        assert_eq!(parse_lease(huge.as_bytes()).map(|r| r.timeout), Some(Duration::from_secs(24 * 3600)));
    }

    #[test]
    fn http_dates() {
        assert_eq!(parse_http_date("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(parse_http_date("Tue, 01 Dec 2026 15:15:41 GMT"), Some(1_796_138_141));
        assert_eq!(parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"), Some(784_111_777));
        for bad in
            ["", "Tue, 01 Foo 2026 15:15:41 GMT", "Tue, 32 Dec 2026 15:15:41 GMT", "x", "Tue, 01 Dec 2026 15:15 GMT"]
        {
            assert_eq!(parse_http_date(bad), None, "{bad:?}");
        }
        assert!(process_id().ends_with('/') && process_id().contains(&format!("/{}/", std::process::id())));
    }
}
