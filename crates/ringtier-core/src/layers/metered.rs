use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use metrics::{Counter, Histogram};

use super::LayeredTier;
use crate::buf::AlignedBuf;
use crate::catalog;
use crate::error::Result;
use crate::listing::{ListOptions, Listing};
use crate::tier::{Adopted, ObjectMeta, ObjectReader, ObjectWriter, ReadBatch, Tier};

#[derive(Clone, Copy)]
#[repr(usize)]
enum Op {
    Stat,
    List,
    Delete,
    Read,
    Write,
    Create,
    Commit,
    Abort,
    ReadBatch,
    Open,
}

const OP_NAMES: [&str; 10] =
    ["stat", "list", "delete", "read", "write", "create", "commit", "abort", "read_batch", "open"];

struct OpHandles {
    ok: Counter,
    error: Counter,
    bytes: Counter,
    duration: Histogram,
}

struct Handles {
    ops: Vec<OpHandles>,
}

impl Handles {
    fn new(tier: &str) -> Self {
        let ops = OP_NAMES
            .iter()
            .map(|&op| OpHandles {
                ok: metrics::counter!(catalog::TIER_OPS_TOTAL, "tier" => tier.to_string(), "op" => op, "result" => "ok"),
                error: metrics::counter!(catalog::TIER_OPS_TOTAL, "tier" => tier.to_string(), "op" => op, "result" => "error"),
                bytes: metrics::counter!(catalog::TIER_BYTES_TOTAL, "tier" => tier.to_string(), "op" => op),
                duration: metrics::histogram!(catalog::TIER_OP_DURATION_SECONDS, "tier" => tier.to_string(), "op" => op),
            })
            .collect();
        Handles { ops }
    }

    #[inline]
    fn record<T>(&self, op: Op, start: Instant, res: &Result<T>, bytes: u64) {
        let h = &self.ops[op as usize];
        h.duration.record(start.elapsed().as_secs_f64());
        match res {
            Ok(_) => {
                h.ok.increment(1);
                if bytes > 0 {
                    h.bytes.increment(bytes);
                }
            }
            Err(_) => h.error.increment(1),
        }
    }
}

/// Records every operation of the wrapped tier through the `metrics` facade: operations by
/// result, bytes, and latency, labelled with the tier's name and the operation.
///
/// A batch read counts each request (operations, bytes) under `op="read"` and records the
/// batch's duration once under `op="read_batch"`: a histogram sample per request costs
/// measurable throughput at memory speed (`docs/BENCHMARKS.md`, "Metrics overhead"). Per-request service
/// times are in each [`ReadEntry::latency`](crate::ReadEntry::latency) (and in `bench read`'s
/// p50/p99).
///
/// Metric handles are registered when the layer is built, so install the recorder (for
/// example the Prometheus exporter) first. Recording allocates nothing per operation.
/// Locks, space, empty directories and the buffer pool are the inner tier's, unmetered.
pub struct Metered {
    inner: Arc<dyn Tier>,
    handles: Arc<Handles>,
}

impl fmt::Debug for Metered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metered").field("inner", &self.inner).finish()
    }
}

impl Metered {
    /// Wraps `inner`, labelling its metrics with `inner.name()`.
    pub fn new(inner: Arc<dyn Tier>) -> Self {
        let handles = Arc::new(Handles::new(inner.name()));
        Metered { inner, handles }
    }
}

#[async_trait]
impl LayeredTier for Metered {
    fn inner(&self) -> &dyn Tier {
        self.inner.as_ref()
    }

    async fn stat(&self, key: &str) -> Result<ObjectMeta> {
        let start = Instant::now();
        let res = self.inner.stat(key).await;
        self.handles.record(Op::Stat, start, &res, 0);
        res
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        let start = Instant::now();
        let res = self.inner.list(prefix).await;
        self.handles.record(Op::List, start, &res, 0);
        res
    }

    async fn list_with(&self, prefix: &str, options: ListOptions) -> Result<Listing> {
        let start = Instant::now();
        let res = self.inner.list_with(prefix, options).await;
        self.handles.record(Op::List, start, &res, 0);
        res
    }

    async fn delete(&self, key: &str) -> Result<()> {
        let start = Instant::now();
        let res = self.inner.delete(key).await;
        self.handles.record(Op::Delete, start, &res, 0);
        res
    }

    async fn read_at(&self, key: &str, offset: u64, len: usize, buf: AlignedBuf) -> (Result<usize>, AlignedBuf) {
        let start = Instant::now();
        let (res, buf) = self.inner.read_at(key, offset, len, buf).await;
        let n = *res.as_ref().unwrap_or(&0) as u64;
        self.handles.record(Op::Read, start, &res, n);
        (res, buf)
    }

    async fn create(&self, key: &str) -> Result<Box<dyn ObjectWriter>> {
        let start = Instant::now();
        let res = self.inner.create(key).await;
        self.handles.record(Op::Create, start, &res, 0);
        Ok(Box::new(MeteredWriter { inner: res?, handles: Arc::clone(&self.handles) }))
    }

    /// Forwarded, and counted as a commit of no bytes: adopting writes nothing.
    async fn adopt(&self, from: &str, key: &str) -> Result<Option<Adopted>> {
        let start = Instant::now();
        let res = self.inner.adopt(from, key).await;
        if !matches!(res, Ok(None)) {
            self.handles.record(Op::Commit, start, &res, 0);
        }
        res
    }

    async fn open_read(&self, key: &str) -> Result<Option<Arc<dyn ObjectReader>>> {
        let start = Instant::now();
        let res = self.inner.open_read(key).await;
        if !matches!(res, Ok(None)) {
            self.handles.record(Op::Open, start, &res, 0);
        }
        Ok(res?.map(|inner| {
            Arc::new(MeteredReader { inner, handles: Arc::clone(&self.handles) }) as Arc<dyn ObjectReader>
        }))
    }

    async fn read_batch(&self, batch: ReadBatch) -> ReadBatch {
        let start = Instant::now();
        let batch = self.inner.read_batch(batch).await;
        let h = &self.handles.ops[Op::Read as usize];
        let (mut ok, mut err, mut bytes) = (0u64, 0u64, 0u64);
        for (_, e) in batch.iter() {
            match e.result() {
                Some(Ok(n)) => {
                    ok += 1;
                    bytes += *n as u64;
                }
                _ => err += 1,
            }
        }
        h.ok.increment(ok);
        h.error.increment(err);
        h.bytes.increment(bytes);
        let hb = &self.handles.ops[Op::ReadBatch as usize];
        hb.duration.record(start.elapsed().as_secs_f64());
        if err == 0 {
            hb.ok.increment(1)
        } else {
            hb.error.increment(1)
        }
        batch
    }
}

struct MeteredReader {
    inner: Arc<dyn ObjectReader>,
    handles: Arc<Handles>,
}

impl fmt::Debug for MeteredReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MeteredReader").field("inner", &self.inner).finish()
    }
}

#[async_trait]
impl ObjectReader for MeteredReader {
    fn size(&self) -> u64 {
        self.inner.size()
    }

    async fn read_at(&self, offset: u64, len: usize, buf: AlignedBuf) -> (Result<usize>, AlignedBuf) {
        let start = Instant::now();
        let (res, buf) = self.inner.read_at(offset, len, buf).await;
        let n = *res.as_ref().unwrap_or(&0) as u64;
        self.handles.record(Op::Read, start, &res, n);
        (res, buf)
    }
}

struct MeteredWriter {
    inner: Box<dyn ObjectWriter>,
    handles: Arc<Handles>,
}

impl fmt::Debug for MeteredWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MeteredWriter").field("inner", &self.inner).finish()
    }
}

#[async_trait]
impl ObjectWriter for MeteredWriter {
    fn key(&self) -> &str {
        self.inner.key()
    }

    async fn write_at(&mut self, offset: u64, buf: AlignedBuf) -> (Result<()>, AlignedBuf) {
        let start = Instant::now();
        let n = buf.len() as u64;
        let (res, buf) = self.inner.write_at(offset, buf).await;
        self.handles.record(Op::Write, start, &res, n);
        (res, buf)
    }

    fn crc_block(&self) -> Option<usize> {
        self.inner.crc_block()
    }

    async fn write_at_crcs(&mut self, offset: u64, buf: AlignedBuf, crcs: &[u32]) -> (Result<()>, AlignedBuf) {
        let start = Instant::now();
        let n = buf.len() as u64;
        let (res, buf) = self.inner.write_at_crcs(offset, buf, crcs).await;
        self.handles.record(Op::Write, start, &res, n);
        (res, buf)
    }

    async fn commit(self: Box<Self>) -> Result<ObjectMeta> {
        let start = Instant::now();
        let handles = self.handles;
        let res = self.inner.commit().await;
        handles.record(Op::Commit, start, &res, 0);
        res
    }

    async fn abort(self: Box<Self>) -> Result<()> {
        let start = Instant::now();
        let handles = self.handles;
        let res = self.inner.abort().await;
        handles.record(Op::Abort, start, &res, 0);
        res
    }
}
