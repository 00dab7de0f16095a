use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

// tokio's clock, so paused test time and the timer agree.
use tokio::time::Instant;

use async_trait::async_trait;

use super::LayeredTier;
use crate::buf::AlignedBuf;
use crate::catalog;
use crate::error::Result;
use crate::listing::{ListOptions, Listing};
use crate::tier::{Capabilities, ObjectMeta, ObjectReader, ObjectWriter, ReadBatch, Tier};

/// Settings of a [`Throttled`] layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Throttle {
    /// Read bandwidth cap in bytes per second; `None` for no cap.
    pub read_bytes_per_sec: Option<u64>,
    /// Write bandwidth cap in bytes per second; `None` for no cap.
    pub write_bytes_per_sec: Option<u64>,
    /// Latency added to every operation (concurrent operations wait in parallel, as on a
    /// parallel filesystem). Default zero.
    pub latency: Duration,
    /// Bytes a caller may take at once before the rate applies. Default: 50 ms of bandwidth.
    pub burst_bytes: Option<u64>,
}

impl Throttle {
    /// The same cap for reads and writes.
    pub fn bandwidth(bytes_per_sec: u64) -> Self {
        Throttle {
            read_bytes_per_sec: Some(bytes_per_sec),
            write_bytes_per_sec: Some(bytes_per_sec),
            latency: Duration::ZERO,
            burst_bytes: None,
        }
    }

    /// Adds a per-operation latency.
    pub fn with_latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }
}

/// A token bucket: `rate` bytes per second, at most `burst` bytes banked. Callers take tokens
/// in arrival order; a deficit is paid by waiting, so the long-run rate never exceeds `rate`.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    /// A bucket of `rate` bytes per second banking at most `burst` bytes (default 50 ms worth).
    pub fn new(rate: u64, burst: Option<u64>) -> Self {
        let rate = rate.max(1) as f64;
        let burst = burst.map(|b| b as f64).unwrap_or(rate / 20.0).max(1.0);
        TokenBucket { rate, burst, state: Mutex::new((burst, Instant::now())) }
    }

    /// Takes `bytes` tokens and returns how long the caller must wait for them.
    pub fn take(&self, bytes: u64) -> Duration {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let refill = now.duration_since(st.1).as_secs_f64() * self.rate;
        st.0 = (st.0 + refill).min(self.burst) - bytes as f64;
        st.1 = now;
        if st.0 >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-st.0 / self.rate)
        }
    }
}

#[derive(Debug)]
struct Shared {
    throttle: Throttle,
    read: Option<TokenBucket>,
    write: Option<TokenBucket>,
    waited: metrics::Histogram,
}

impl Shared {
    async fn pace(&self, bucket: Option<&TokenBucket>, bytes: u64) {
        let mut wait = self.throttle.latency;
        if let Some(b) = bucket {
            wait += b.take(bytes);
        }
        if !wait.is_zero() {
            self.waited.record(wait.as_secs_f64());
            tokio::time::sleep(wait).await;
        }
    }
}

/// Emulates slow storage over any tier: token-bucket bandwidth caps for reads and writes plus
/// a fixed latency per operation. Needs a tokio runtime with the time driver enabled.
/// Each wait is recorded in the `ringtier_throttle_wait_seconds` histogram. Locks, space,
/// empty directories and the buffer pool are the inner tier's, unpaced; objects are never
/// opened for reading past the layer ([`Tier::open_read`] answers `Ok(None)`).
pub struct Throttled {
    inner: Arc<dyn Tier>,
    shared: Arc<Shared>,
}

impl fmt::Debug for Throttled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Throttled").field("inner", &self.inner).field("throttle", &self.shared.throttle).finish()
    }
}

impl Throttled {
    /// Wraps `inner` with `throttle`.
    pub fn new(inner: Arc<dyn Tier>, throttle: Throttle) -> Self {
        let waited = metrics::histogram!(catalog::THROTTLE_WAIT_SECONDS, "tier" => inner.name().to_string());
        let shared = Shared {
            read: throttle.read_bytes_per_sec.map(|r| TokenBucket::new(r, throttle.burst_bytes)),
            write: throttle.write_bytes_per_sec.map(|r| TokenBucket::new(r, throttle.burst_bytes)),
            throttle,
            waited,
        };
        Throttled { inner, shared: Arc::new(shared) }
    }

    /// The settings.
    pub fn throttle(&self) -> Throttle {
        self.shared.throttle
    }
}

#[async_trait]
impl LayeredTier for Throttled {
    fn inner(&self) -> &dyn Tier {
        self.inner.as_ref()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { native_batch: false, ..self.inner.capabilities() }
    }

    async fn stat(&self, key: &str) -> Result<ObjectMeta> {
        self.shared.pace(None, 0).await;
        self.inner.stat(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        self.shared.pace(None, 0).await;
        self.inner.list(prefix).await
    }

    async fn list_with(&self, prefix: &str, options: ListOptions) -> Result<Listing> {
        self.shared.pace(None, 0).await;
        self.inner.list_with(prefix, options).await
    }

    async fn delete(&self, key: &str) -> Result<()> {
        self.shared.pace(None, 0).await;
        self.inner.delete(key).await
    }

    async fn read_at(&self, key: &str, offset: u64, len: usize, buf: AlignedBuf) -> (Result<usize>, AlignedBuf) {
        self.shared.pace(self.shared.read.as_ref(), len as u64).await;
        self.inner.read_at(key, offset, len, buf).await
    }

    async fn create(&self, key: &str) -> Result<Box<dyn ObjectWriter>> {
        self.shared.pace(None, 0).await;
        let inner = self.inner.create(key).await?;
        Ok(Box::new(ThrottledWriter { inner, shared: Arc::clone(&self.shared) }))
    }

    /// Every read is paced by the layer: no reader of the inner tier is handed out.
    async fn open_read(&self, key: &str) -> Result<Option<Arc<dyn ObjectReader>>> {
        let _ = key;
        Ok(None)
    }

    async fn read_batch(&self, batch: ReadBatch) -> ReadBatch {
        // One latency for the batch (its requests are concurrent) and its bytes through the
        // bucket, then the inner tier's own batch path.
        self.shared.pace(self.shared.read.as_ref(), batch.requested_bytes()).await;
        self.inner.read_batch(batch).await
    }
}

struct ThrottledWriter {
    inner: Box<dyn ObjectWriter>,
    shared: Arc<Shared>,
}

impl fmt::Debug for ThrottledWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottledWriter").field("inner", &self.inner).finish()
    }
}

#[async_trait]
impl ObjectWriter for ThrottledWriter {
    fn key(&self) -> &str {
        self.inner.key()
    }

    async fn write_at(&mut self, offset: u64, buf: AlignedBuf) -> (Result<()>, AlignedBuf) {
        self.shared.pace(self.shared.write.as_ref(), buf.len() as u64).await;
        self.inner.write_at(offset, buf).await
    }

    fn crc_block(&self) -> Option<usize> {
        self.inner.crc_block()
    }

    async fn write_at_crcs(&mut self, offset: u64, buf: AlignedBuf, crcs: &[u32]) -> (Result<()>, AlignedBuf) {
        self.shared.pace(self.shared.write.as_ref(), buf.len() as u64).await;
        self.inner.write_at_crcs(offset, buf, crcs).await
    }

    async fn commit(self: Box<Self>) -> Result<ObjectMeta> {
        self.shared.pace(None, 0).await;
        self.inner.commit().await
    }

    async fn abort(self: Box<Self>) -> Result<()> {
        self.inner.abort().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_rate_holds_over_time() {
        let b = TokenBucket::new(1000, Some(100));
        // The burst covers the first 100 bytes; the next 1000 cost one second of waiting.
        assert_eq!(b.take(100), Duration::ZERO);
        let w = b.take(1000);
        assert!(w >= Duration::from_millis(990) && w <= Duration::from_millis(1010), "{w:?}");
        // Debt accumulates: the next caller waits behind the first.
        let w2 = b.take(500);
        assert!(w2 >= Duration::from_millis(1450), "{w2:?}");
    }
}
