//! The CPU path's copy engine: a thread that stands in for the DMA engine, with the same
//! contract as a CUDA stream. Copies run in the order they were started; a batch's reaper is
//! queued behind its copies, and its fence (every copy of the batch finished or dropped
//! unstarted) is what it observes before releasing the pinned buffers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use ringtier_core::error::{Error, ErrorKind, Operation, Result};

use crate::hooks::{Hooks, Probe};
use crate::inflight::{start_error, Completion, CopyItem, Fence, InFlight, Reaper, Span};
use crate::{HostBuf, HostFree};

/// Bytes copied between two looks at the test hooks (a slow copy engine in tests).
const CHUNK: usize = 16 << 10;

/// One batch's copies on the host stream.
#[derive(Debug)]
struct HostBatch {
    completion: Arc<Completion<HostBuf>>,
    /// Copies of the batch not yet finished or dropped.
    pending: Mutex<usize>,
    settled: Condvar,
    /// A copy of the batch failed: the later ones are skipped (never started).
    failed: AtomicBool,
}

impl HostBatch {
    fn settle_one(&self) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        *p = p.saturating_sub(1);
        if *p == 0 {
            self.settled.notify_all();
        }
    }
}

/// The fence of a host batch: every copy of it finished or dropped unstarted.
#[derive(Debug)]
struct HostFence(Arc<HostBatch>);

impl Fence<HostBuf> for HostFence {
    fn observe(&mut self) -> Result<()> {
        let mut p = self.0.pending.lock().unwrap_or_else(|e| e.into_inner());
        while *p > 0 {
            p = self.0.settled.wait(p).unwrap_or_else(|e| e.into_inner());
        }
        Ok(())
    }
}

/// A copy on the host stream. Settles its batch when dropped: after it ran, or unstarted.
struct CopyOp {
    index: usize,
    span: Span,
    label: String,
    dst: Vec<u8>,
    batch: Arc<HostBatch>,
    probe: Probe,
    free: HostFree,
    hooks: Arc<Hooks>,
}

impl CopyOp {
    fn run(mut self) {
        if self.batch.failed.load(Ordering::SeqCst) {
            return;
        }
        if let Some(e) = self.hooks.copy_fault() {
            self.batch.failed.store(true, Ordering::SeqCst);
            self.batch.completion.fail(
                Error::new(
                    e.kind(),
                    format!("staging copy {} ({}) failed: {}", self.index + 1, self.label, e.message()),
                )
                .with_key(self.label.clone()),
            );
            return;
        }
        // SAFETY: the span's buffers are held by this batch's reaper, which releases them only
        // after its fence has seen this op settle (dropped, below or when the run ends).
        let src = unsafe { self.span.bytes() };
        let mut data = std::mem::take(&mut self.dst);
        data.clear();
        data.reserve(src.len());
        for chunk in src.chunks(CHUNK) {
            self.hooks.between_chunks();
            data.extend_from_slice(chunk);
        }
        self.hooks.verify(&self.probe, Some(&data));
        self.batch.completion.put_output(self.index, HostBuf { data, free: Arc::clone(&self.free) });
    }
}

impl Drop for CopyOp {
    fn drop(&mut self) {
        self.hooks.done_reading(&self.probe);
        self.batch.settle_one();
    }
}

enum Op {
    Copy(CopyOp),
    /// Dropped by the stream thread once reached: observes the fence, then releases.
    Reap(Reaper<HostBuf, HostFence>),
}

/// The host copy engine: one thread running copies in order.
pub(crate) struct HostStream {
    tx: Option<mpsc::Sender<Op>>,
    thread: Option<JoinHandle<()>>,
    free: HostFree,
    hooks: Arc<Hooks>,
}

impl std::fmt::Debug for HostStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostStream").finish_non_exhaustive()
    }
}

impl HostStream {
    pub(crate) fn new(free: HostFree, hooks: Arc<Hooks>) -> Result<Self> {
        let (tx, rx) = mpsc::channel::<Op>();
        let thread = std::thread::Builder::new()
            .name("ringtier-stage-copy".into())
            .spawn(move || {
                while let Ok(op) = rx.recv() {
                    match op {
                        Op::Copy(c) => c.run(),
                        Op::Reap(r) => drop(r),
                    }
                }
            })
            .map_err(|e| Error::from(e).with_operation(Operation::Setup))?;
        Ok(HostStream { tx: Some(tx), thread: Some(thread), free, hooks })
    }

    /// Queues `op`; false if the thread is gone, and then `op` has been dropped here (a copy
    /// settles unstarted, a reaper observes and releases).
    fn send(&self, op: Op) -> bool {
        match &self.tx {
            Some(tx) => tx.send(op).is_ok(),
            None => false,
        }
    }

    /// Starts one copy per item into host memory, in order, and queues the batch's reaper
    /// behind them. If copy `k` cannot be started, the items from `k` on are released at
    /// once, the started ones by the reaper after they finish, and the error says so.
    pub(crate) fn launch(&self, items: Vec<CopyItem>, keep: bool) -> Result<InFlight<HostBuf>> {
        let count = items.len();
        let completion = Completion::new(count);
        let batch = Arc::new(HostBatch {
            completion: Arc::clone(&completion),
            pending: Mutex::new(0),
            settled: Condvar::new(),
            failed: AtomicBool::new(false),
        });
        // Made before the first copy starts: from then on, whatever happens here (an early
        // return, a panic) drops it, and its drop waits for the started copies.
        let mut reaper = Reaper::new(HostFence(Arc::clone(&batch)), Arc::clone(&completion), keep, self.hooks.clone());
        let mut failure = None;
        for (index, CopyItem { span, bufs, label }) in items.into_iter().enumerate() {
            // Held before the copy can start reading them.
            let held = bufs.len();
            reaper.hold(bufs);
            if let Err(e) = self.start(index, span, &label, &batch) {
                // Never started: released here, and so are the items after it.
                drop(reaper.unhold(held));
                failure = Some(start_error(e, index, count, index, &label));
                break;
            }
        }
        // If the thread is gone, and with it every copy it had, the reaper is dropped (so
        // observed and released) right here.
        self.send(Op::Reap(reaper));
        match failure {
            Some(e) => Err(e),
            None => Ok(InFlight::new(completion)),
        }
    }

    fn start(&self, index: usize, span: Span, label: &str, batch: &Arc<HostBatch>) -> Result<()> {
        let probe = self.hooks.before_copy(&span)?;
        let dst = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop().unwrap_or_default();
        *batch.pending.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        let op = CopyOp {
            index,
            span,
            label: label.to_string(),
            dst,
            batch: Arc::clone(batch),
            probe,
            free: Arc::clone(&self.free),
            hooks: Arc::clone(&self.hooks),
        };
        if self.send(Op::Copy(op)) {
            Ok(())
        } else {
            Err(Error::new(ErrorKind::Shutdown, "the host copy thread has stopped"))
        }
    }
}

impl Drop for HostStream {
    fn drop(&mut self) {
        // The thread runs what is queued (copies, then their reapers), then ends.
        self.tx.take();
        if let Some(t) = self.thread.take() {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}
