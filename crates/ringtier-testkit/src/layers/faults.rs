use ringtier_core::rng::SplitMix64;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use ringtier_core::buf::align_down;
use ringtier_core::catalog;
use ringtier_core::layers::LayeredTier;
use ringtier_core::listing::{ListOptions, Listing};
use ringtier_core::tier::read_one_at_a_time;
use ringtier_core::{
    AlignedBuf, Capabilities, Error, ObjectMeta, ObjectReader, ObjectWriter, Operation, ReadBatch, Result, Tier,
};

/// Which operations a [`FaultRule`] applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultOp {
    /// Positional reads (including each request of a batch).
    Read,
    /// Positional writes into staged objects.
    Write,
    /// Commits of staged objects.
    Commit,
    /// Stat, list, delete and create.
    Metadata,
    /// Every operation.
    Any,
}

/// What a [`FaultRule`] injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Fail with `EIO`; nothing reaches the inner tier.
    Eio,
    /// Fail with `ENOSPC`; nothing reaches the inner tier.
    Enospc,
    /// Fail with `EAGAIN` (a temporary error); nothing reaches the inner tier.
    Eagain,
    /// Reads: return about half of the bytes asked for, as a short read before the end.
    ShortRead,
    /// Writes: write the first half (aligned down), then fail with `EIO`.
    TornWrite,
}

impl Fault {
    fn label(self) -> &'static str {
        match self {
            Fault::Eio => "eio",
            Fault::Enospc => "enospc",
            Fault::Eagain => "eagain",
            Fault::ShortRead => "short_read",
            Fault::TornWrite => "torn_write",
        }
    }

    fn error(self, op: Operation) -> Error {
        let errno = match self {
            Fault::Enospc => libc::ENOSPC,
            Fault::Eagain => libc::EAGAIN,
            _ => libc::EIO,
        };
        Error::from_errno(errno, format!("injected fault {}", self.label())).with_operation(op)
    }
}

/// When a [`FaultRule`] fires.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Trigger {
    /// On the n-th matching operation (1-based), once.
    AtOp(u64),
    /// On every matching operation from the n-th (1-based) on.
    FromOp(u64),
    /// On each matching operation with this probability, from the seeded generator.
    Probability(f64),
}

/// One fault to inject.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultRule {
    /// Operations it applies to.
    pub op: FaultOp,
    /// What it injects.
    pub fault: Fault,
    /// When it fires.
    pub trigger: Trigger,
}

struct RuleState {
    rule: FaultRule,
    seen: AtomicU64,
}

struct Shared {
    name: String,
    rules: Vec<RuleState>,
    rng: Mutex<SplitMix64>,
    injected: AtomicU64,
}

impl Shared {
    fn next_f64(&self) -> f64 {
        self.rng.lock().unwrap_or_else(|p| p.into_inner()).uniform()
    }

    /// The fault to inject for this operation, if any. Every matching rule counts the op.
    fn check(&self, op: FaultOp) -> Option<Fault> {
        let mut chosen = None;
        for st in &self.rules {
            if st.rule.op != op && st.rule.op != FaultOp::Any {
                continue;
            }
            let n = st.seen.fetch_add(1, Ordering::Relaxed) + 1;
            let fire = match st.rule.trigger {
                Trigger::AtOp(at) => n == at,
                Trigger::FromOp(from) => n >= from,
                Trigger::Probability(p) => self.next_f64() < p,
            };
            if fire && chosen.is_none() {
                chosen = Some(st.rule.fault);
            }
        }
        if let Some(f) = chosen {
            self.injected.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(catalog::FAULTS_INJECTED_TOTAL, "tier" => self.name.clone(), "fault" => f.label())
                .increment(1);
        }
        chosen
    }
}

/// Injects faults into any tier, by rule, reproducibly from a seed: the layer the reliability
/// tests use to show that callers retry temporary errors, report permanent ones, and lose no
/// committed data.
///
/// Every read goes through the rules, one request at a time (a batch's requests each count;
/// no reader of the inner tier is handed out). Locks, space and the buffer pool are the inner
/// tier's, never faulted.
pub struct FaultInjecting {
    inner: Arc<dyn Tier>,
    shared: Arc<Shared>,
}

impl fmt::Debug for FaultInjecting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rules: Vec<_> = self.shared.rules.iter().map(|r| r.rule).collect();
        f.debug_struct("FaultInjecting").field("inner", &self.inner).field("rules", &rules).finish()
    }
}

impl FaultInjecting {
    /// Wraps `inner` with `rules`; `seed` drives the probability triggers.
    pub fn new(inner: Arc<dyn Tier>, rules: Vec<FaultRule>, seed: u64) -> Self {
        let shared = Shared {
            name: inner.name().to_string(),
            rules: rules.into_iter().map(|rule| RuleState { rule, seen: AtomicU64::new(0) }).collect(),
            rng: Mutex::new(SplitMix64::new(seed)),
            injected: AtomicU64::new(0),
        };
        FaultInjecting { inner, shared: Arc::new(shared) }
    }

    /// Faults injected so far.
    pub fn injected(&self) -> u64 {
        self.shared.injected.load(Ordering::Relaxed)
    }

    fn fail(&self, fault: Fault, op: Operation, key: &str) -> Error {
        fault.error(op).with_key(key).with_tier(&self.shared.name)
    }
}

#[async_trait]
impl LayeredTier for FaultInjecting {
    fn inner(&self) -> &dyn Tier {
        self.inner.as_ref()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { native_batch: false, ..self.inner.capabilities() }
    }

    async fn stat(&self, key: &str) -> Result<ObjectMeta> {
        if let Some(f) = self.shared.check(FaultOp::Metadata) {
            return Err(self.fail(f, Operation::Stat, key));
        }
        self.inner.stat(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        if let Some(f) = self.shared.check(FaultOp::Metadata) {
            return Err(self.fail(f, Operation::List, prefix));
        }
        self.inner.list(prefix).await
    }

    async fn list_with(&self, prefix: &str, options: ListOptions) -> Result<Listing> {
        if let Some(f) = self.shared.check(FaultOp::Metadata) {
            return Err(self.fail(f, Operation::List, prefix));
        }
        self.inner.list_with(prefix, options).await
    }

    async fn remove_empty_dirs(&self, prefix: &str) -> Result<()> {
        if let Some(f) = self.shared.check(FaultOp::Metadata) {
            return Err(self.fail(f, Operation::Delete, prefix));
        }
        self.inner.remove_empty_dirs(prefix).await
    }

    async fn delete(&self, key: &str) -> Result<()> {
        if let Some(f) = self.shared.check(FaultOp::Metadata) {
            return Err(self.fail(f, Operation::Delete, key));
        }
        self.inner.delete(key).await
    }

    async fn read_at(&self, key: &str, offset: u64, len: usize, buf: AlignedBuf) -> (Result<usize>, AlignedBuf) {
        match self.shared.check(FaultOp::Read) {
            None => self.inner.read_at(key, offset, len, buf).await,
            Some(Fault::ShortRead) if len > 1 => self.inner.read_at(key, offset, len / 2, buf).await,
            Some(Fault::ShortRead) | Some(Fault::TornWrite) => self.inner.read_at(key, offset, len, buf).await,
            Some(f) => (Err(self.fail(f, Operation::Read, key)), buf),
        }
    }

    async fn create(&self, key: &str) -> Result<Box<dyn ObjectWriter>> {
        if let Some(f) = self.shared.check(FaultOp::Metadata) {
            return Err(self.fail(f, Operation::Create, key));
        }
        let align = self.inner.capabilities().alignment.max(1) as u64;
        let inner = self.inner.create(key).await?;
        Ok(Box::new(FaultyWriter { inner, shared: Arc::clone(&self.shared), align }))
    }

    /// Reads by key, so that each goes through the rules.
    async fn open_read(&self, key: &str) -> Result<Option<Arc<dyn ObjectReader>>> {
        let _ = key;
        Ok(None)
    }

    /// Each request through [`LayeredTier::read_at`], so that each counts and may fault.
    async fn read_batch(&self, batch: ReadBatch) -> ReadBatch {
        read_one_at_a_time(self, batch).await
    }
}

struct FaultyWriter {
    inner: Box<dyn ObjectWriter>,
    shared: Arc<Shared>,
    align: u64,
}

impl fmt::Debug for FaultyWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyWriter").field("inner", &self.inner).finish()
    }
}

#[async_trait]
impl ObjectWriter for FaultyWriter {
    fn key(&self) -> &str {
        self.inner.key()
    }

    async fn write_at(&mut self, offset: u64, mut buf: AlignedBuf) -> (Result<()>, AlignedBuf) {
        let key = self.inner.key().to_string();
        let err = |f: Fault| f.error(Operation::Write).with_key(key.clone()).with_tier(&self.shared.name);
        match self.shared.check(FaultOp::Write) {
            None | Some(Fault::ShortRead) => self.inner.write_at(offset, buf).await,
            Some(Fault::TornWrite) => {
                let (head, len) = (buf.head(), buf.len());
                let torn = align_down((len / 2) as u64, self.align) as usize;
                if torn > 0 && buf.set_window(head, torn).is_ok() {
                    let (_, b) = self.inner.write_at(offset, buf).await;
                    buf = b;
                    let _ = buf.set_window(head, len);
                }
                (Err(err(Fault::TornWrite)), buf)
            }
            Some(f) => (Err(err(f)), buf),
        }
    }

    async fn commit(self: Box<Self>) -> Result<ObjectMeta> {
        if let Some(f) = self.shared.check(FaultOp::Commit) {
            let e = f.error(Operation::Commit).with_key(self.inner.key()).with_tier(&self.shared.name);
            let _ = self.inner.abort().await;
            return Err(e);
        }
        self.inner.commit().await
    }

    async fn abort(self: Box<Self>) -> Result<()> {
        self.inner.abort().await
    }
}
