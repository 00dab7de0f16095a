//! What a batch's copies own while they run, and how their completion is observed.
//!
//! Both copy engines (the CUDA stream and the host copy thread) follow one rule: from the
//! moment the first copy of a batch is started until the engine's completion of that copy
//! has been observed, every pinned buffer the batch's copies read (and every destination they
//! write) is owned by the batch's [`Reaper`], never by the caller's handle. The reaper's `Drop`
//! observes completion first (its [`Fence`]) and releases second, so however a reaper ends
//! (run by the engine's completion thread, dropped unrun because that thread is gone, dropped
//! while unwinding) nothing is released while a copy may still read it. If completion cannot
//! be observed (a CUDA error while waiting on the event) the buffers are leaked, never
//! reused. The caller's [`InFlight`] only shares the [`Completion`] slot the reaper fills;
//! dropping it, or the future waiting on it, at any point releases nothing early.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use ringtier_core::error::{Error, ErrorKind, Result};
use ringtier_core::AlignedBuf;

use crate::hooks::{Hooks, Probe};

/// A byte range one copy reads: inside the pinned buffers of the same [`CopyItem`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    ptr: *const u8,
    len: usize,
}

// SAFETY: a span is an address range; it is only dereferenced (`bytes`) under the contract
// that the buffers holding it are alive, whichever thread does it.
unsafe impl Send for Span {}

impl Span {
    /// The valid bytes of `buf`.
    pub(crate) fn of(buf: &AlignedBuf) -> Span {
        let s = buf.as_slice();
        Span { ptr: s.as_ptr(), len: s.len() }
    }

    /// `len` bytes at `ptr`.
    ///
    /// # Safety
    ///
    /// The range must lie inside memory owned by the buffers the span is copied with (the
    /// `bufs` of its [`CopyItem`]) and nothing may write it while those buffers are held.
    pub(crate) unsafe fn raw(ptr: *const u8, len: usize) -> Span {
        Span { ptr, len }
    }

    /// Bytes in the range.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The bytes.
    ///
    /// # Safety
    ///
    /// The buffers the span was made from must still be alive (held by a batch or reaper)
    /// for as long as the returned slice is used.
    pub(crate) unsafe fn bytes<'a>(&self) -> &'a [u8] {
        // SAFETY: the caller keeps the memory alive; `Span::of` and `Span::raw` guarantee it is
        // initialised and unwritten while held.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// One copy of a batch: what it reads and the buffers that hold those bytes.
#[derive(Debug)]
pub(crate) struct CopyItem {
    pub(crate) span: Span,
    pub(crate) bufs: Vec<AlignedBuf>,
    /// Names the copy in errors (the object key, or what the range is).
    pub(crate) label: String,
}

impl CopyItem {
    /// A copy of one buffer's valid bytes.
    pub(crate) fn of(buf: AlignedBuf, label: impl Into<String>) -> CopyItem {
        CopyItem { span: Span::of(&buf), bufs: vec![buf], label: label.into() }
    }
}

/// The error of a batch whose copy `index` (0-based) of `count` could not be started;
/// `held` copies (those before it, and it if it may have started) keep their buffers.
pub(crate) fn start_error(e: Error, index: usize, count: usize, held: usize, label: &str) -> Error {
    Error::new(
        e.kind(),
        format!(
            "staging copy {} of {count} ({label}) could not be started: {}; the {held} copies already \
             started keep their pinned buffers until they complete, the other {} buffers were released",
            index + 1,
            e.message(),
            count - held,
        ),
    )
    .with_key(label)
}

/// Blocks until no copy enqueued before it can still read its source.
pub(crate) trait Fence<D>: Send + 'static {
    /// Waits (synchronously, for device or host copies already running). An error means
    /// completion could not be observed: the reaper then leaks the sources.
    fn observe(&mut self) -> Result<()>;

    /// After a successful `observe`: lets the test hooks check what the copies wrote.
    fn after_observe(&self, _outputs: &[(usize, D)], _probes: &[Probe], _hooks: &Hooks) {}
}

/// Where a batch's results land once its copies completed.
#[derive(Debug)]
pub(crate) struct Completion<D> {
    slot: Mutex<Slot<D>>,
    notify: tokio::sync::Notify,
    /// False once the caller's handle is gone (for the test hooks' accounting).
    handle_alive: AtomicBool,
}

#[derive(Debug)]
struct Slot<D> {
    done: bool,
    error: Option<Error>,
    outputs: Vec<Option<D>>,
    kept: Vec<AlignedBuf>,
}

impl<D> Completion<D> {
    pub(crate) fn new(count: usize) -> Arc<Self> {
        Arc::new(Completion {
            slot: Mutex::new(Slot {
                done: false,
                error: None,
                outputs: (0..count).map(|_| None).collect(),
                kept: Vec::new(),
            }),
            notify: tokio::sync::Notify::new(),
            handle_alive: AtomicBool::new(true),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slot<D>> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores the result of copy `index` (its copy has finished).
    pub(crate) fn put_output(&self, index: usize, d: D) {
        if let Some(o) = self.lock().outputs.get_mut(index) {
            *o = Some(d);
        }
    }

    /// Records an error of the batch (the first one wins).
    pub(crate) fn fail(&self, e: Error) {
        let mut s = self.lock();
        if s.error.is_none() {
            s.error = Some(e);
        }
    }

    fn finish(&self, kept: Vec<AlignedBuf>, error: Option<Error>, hooks: &Hooks) {
        let mut s = self.lock();
        s.done = true;
        s.kept = kept;
        if s.error.is_none() {
            s.error = error;
        }
        drop(s);
        if !self.handle_alive.load(Ordering::SeqCst) {
            hooks.orphan_completed();
        }
        self.notify.notify_waiters();
    }
}

/// Owns what a batch's copies read and write until their completion has been observed.
pub(crate) struct Reaper<D: Send + 'static, F: Fence<D>> {
    fence: F,
    sources: Vec<AlignedBuf>,
    outputs: Vec<(usize, D)>,
    probes: Vec<Probe>,
    completion: Arc<Completion<D>>,
    keep: bool,
    hooks: Arc<Hooks>,
}

impl<D: Send + 'static, F: Fence<D>> std::fmt::Debug for Reaper<D, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reaper").field("sources", &self.sources.len()).field("keep", &self.keep).finish()
    }
}

impl<D: Send + 'static, F: Fence<D>> Reaper<D, F> {
    /// A reaper for a batch, made before its first copy starts. With `keep`, the sources are
    /// handed back by [`InFlight::wait`] instead of returning to their pool.
    pub(crate) fn new(fence: F, completion: Arc<Completion<D>>, keep: bool, hooks: Arc<Hooks>) -> Self {
        Reaper { fence, sources: Vec::new(), outputs: Vec::new(), probes: Vec::new(), completion, keep, hooks }
    }

    /// Takes the buffers of a copy about to be started.
    pub(crate) fn hold(&mut self, bufs: Vec<AlignedBuf>) {
        self.sources.extend(bufs);
    }

    /// Gives back the last `n` buffers taken by `hold`, for a copy that was never started.
    pub(crate) fn unhold(&mut self, n: usize) -> Vec<AlignedBuf> {
        let at = self.sources.len().saturating_sub(n);
        self.sources.split_off(at)
    }

    /// Takes the destination of copy `index` (written by the engine until completion).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn hold_output(&mut self, index: usize, d: D) {
        self.outputs.push((index, d));
    }

    /// Takes what the test hooks recorded for a started copy (checked after completion).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn hold_probe(&mut self, probe: Probe) {
        self.probes.push(probe);
    }

    /// Replaces the fence (a narrower one recorded after the copies were enqueued).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn set_fence(&mut self, fence: F) {
        self.fence = fence;
    }

    /// True when no copy was started (nothing to wait for).
    pub(crate) fn is_empty(&self) -> bool {
        self.sources.is_empty() && self.outputs.is_empty() && self.probes.is_empty()
    }
}

impl<D: Send + 'static, F: Fence<D>> Drop for Reaper<D, F> {
    fn drop(&mut self) {
        if self.is_empty() {
            // No copy was started: nothing to wait for.
            self.completion.finish(Vec::new(), None, &self.hooks);
            return;
        }
        let sources = std::mem::take(&mut self.sources);
        match self.fence.observe() {
            Ok(()) => {
                self.fence.after_observe(&self.outputs, &self.probes, &self.hooks);
                for p in &self.probes {
                    self.hooks.done_reading(p);
                }
                for (i, d) in self.outputs.drain(..) {
                    self.completion.put_output(i, d);
                }
                // Released (or handed back) only now, after the fence, and before the waiter
                // is told: when `wait` returns, the buffers are back in their pool.
                let kept = if self.keep {
                    sources
                } else {
                    drop(sources);
                    Vec::new()
                };
                self.completion.finish(kept, None, &self.hooks);
            }
            Err(e) => {
                tracing::error!(
                    "could not observe the completion of a staging batch ({e}); its {} pinned buffers are \
                     leaked (never reused) rather than released while a copy may still read them",
                    sources.len()
                );
                // Never dropped: a buffer that is not dropped never returns to its pool, and the
                // pool's slab (its registration, its mapping) outlives it.
                std::mem::forget(sources);
                let e = Error::new(e.kind(), format!("waiting for the staging copies: {}", e.message()));
                self.completion.finish(Vec::new(), Some(e), &self.hooks);
            }
        }
    }
}

/// The caller's handle on a batch in flight. Dropping it releases nothing: the reaper owns
/// the buffers until the copies completed.
#[derive(Debug)]
pub(crate) struct InFlight<D> {
    completion: Arc<Completion<D>>,
}

impl<D> InFlight<D> {
    pub(crate) fn new(completion: Arc<Completion<D>>) -> Self {
        InFlight { completion }
    }

    /// Waits for the batch's completion: its outputs in order, and its sources if they were
    /// kept. Cancel-safe: dropping this future at its await leaves the reaper in charge.
    pub(crate) async fn wait(self) -> Result<(Vec<D>, Vec<AlignedBuf>)> {
        loop {
            let notified = self.completion.notify.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the check: a completion after it wakes us.
            notified.as_mut().enable();
            {
                let mut s = self.completion.lock();
                if s.done {
                    if let Some(e) = s.error.take() {
                        return Err(e);
                    }
                    let count = s.outputs.len();
                    let outputs: Vec<D> = s.outputs.drain(..).flatten().collect();
                    if outputs.len() != count {
                        return Err(Error::new(
                            ErrorKind::Shutdown,
                            format!("{} of {count} staging copies never ran", count - outputs.len()),
                        ));
                    }
                    return Ok((outputs, std::mem::take(&mut s.kept)));
                }
            }
            notified.await;
        }
    }
}

impl<D> Drop for InFlight<D> {
    fn drop(&mut self) {
        self.completion.handle_alive.store(false, Ordering::SeqCst);
    }
}
