//! The engine a process uses (a tokio runtime whose threads drive the io_uring tiers), created
//! lazily in that process, and the rules for objects inherited through `fork()`.
//!
//! A forked child has none of its parent's threads: an engine (or a loader or store built on
//! one) that crossed a `fork()` would wait forever on threads that do not exist. Every object
//! remembers the pid that created it and checks it on each call ([`ForkGuarded`]), raising
//! `ringtier.ForkError`; in the child, [`engine`] builds a new runtime instead of reusing the
//! parent's, and inherited objects are leaked, never dropped (dropping would join threads that
//! are not there).

use std::future::Future;
use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

use crate::errors;

/// A process's runtime and the pid that created it.
#[derive(Debug)]
pub(crate) struct Engine {
    pid: u32,
    rt: tokio::runtime::Runtime,
}

impl Engine {
    /// The runtime's handle.
    pub(crate) fn handle(&self) -> &tokio::runtime::Handle {
        self.rt.handle()
    }
}

static ENGINE: Mutex<Option<Arc<Engine>>> = Mutex::new(None);

/// Worker threads of the runtime: the futures it runs are thin (the rings have their own
/// driver threads), so two are plenty next to a training loop.
const WORKER_THREADS: usize = 2;

/// The environment variable that sets the runtime's worker threads (1 to 64), read once when a
/// process's engine starts: `ringtier.torch` datasets set it in a DataLoader worker to the
/// worker's share of the cores (at most [`WORKER_THREADS`]) unless the user did.
pub(crate) const THREADS_ENV: &str = "RINGTIER_ENGINE_THREADS";

/// The runtime's worker threads: [`THREADS_ENV`] when it holds a number from 1 to 64, else
/// [`WORKER_THREADS`].
fn worker_threads() -> usize {
    std::env::var(THREADS_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| (1..=64).contains(n))
        .unwrap_or(WORKER_THREADS)
}

/// This process's engine, created on first use (also in a forked child, where the parent's
/// one is leaked: its threads do not exist there).
pub(crate) fn engine() -> PyResult<Arc<Engine>> {
    let pid = std::process::id();
    let mut slot = ENGINE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = slot.as_ref() {
        if e.pid == pid {
            return Ok(Arc::clone(e));
        }
    }
    if let Some(inherited) = slot.take() {
        std::mem::forget(inherited);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(worker_threads())
        .thread_name("ringtier-py")
        .enable_all()
        .build()
        .map_err(|e| errors::from_io("starting the ringtier runtime", e))?;
    let e = Arc::new(Engine { pid, rt });
    *slot = Some(Arc::clone(&e));
    Ok(e)
}

/// A value that belongs to the process that created it: [`ForkGuarded::get`] fails in any
/// other process, and a forked child leaks it instead of dropping it.
#[derive(Debug)]
pub(crate) struct ForkGuarded<T> {
    pid: u32,
    what: &'static str,
    value: ManuallyDrop<T>,
}

impl<T> ForkGuarded<T> {
    /// Guards `value`, a `what` (the Python class name, for the error).
    pub(crate) fn new(what: &'static str, value: T) -> Self {
        ForkGuarded { pid: std::process::id(), what, value: ManuallyDrop::new(value) }
    }

    /// The value, in the process that created it.
    pub(crate) fn get(&self) -> PyResult<&T> {
        self.check()?;
        Ok(&self.value)
    }

    /// The value, mutably, in the process that created it.
    pub(crate) fn get_mut(&mut self) -> PyResult<&mut T> {
        self.check()?;
        Ok(&mut self.value)
    }

    fn check(&self) -> PyResult<()> {
        let now = std::process::id();
        if now == self.pid {
            return Ok(());
        }
        Err(errors::fork_error(format!(
            "this ringtier.{} was created in process {} and inherited through fork() by process {now}: its I/O \
             threads do not exist here. Create it in the process that uses it (in a DataLoader worker: inside the \
             dataset's __iter__ or a worker_init_fn; ringtier.torch.IterableDataset does this for you)",
            self.what, self.pid
        )))
    }
}

impl<T> Drop for ForkGuarded<T> {
    fn drop(&mut self) {
        if std::process::id() == self.pid {
            // SAFETY: dropped once, here; `value` is not used after.
            unsafe { ManuallyDrop::drop(&mut self.value) }
        }
        // In a forked child the value is leaked: dropping it would wait for the parent's
        // threads.
    }
}

/// How often a wait wakes up to look for Ctrl-C (and other signals Python handles).
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// Runs `fut` to completion on `engine` with the GIL released, waking every 50 ms to run
/// Python's signal handlers: Ctrl-C raises `KeyboardInterrupt` here and drops (cancels) the
/// future. `stuck` is asked on each wake-up with the time waited so far; an error it returns
/// ends the wait (and drops the future) the same way.
pub(crate) fn wait<F, S>(py: Python<'_>, engine: &Engine, fut: F, mut stuck: S) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
    S: FnMut(Duration) -> PyResult<()>,
{
    let mut fut = Box::pin(fut);
    let start = Instant::now();
    loop {
        let polled = py
            .detach(|| engine.handle().block_on(async { tokio::time::timeout(SIGNAL_POLL, fut.as_mut()).await.ok() }));
        if let Some(out) = polled {
            return Ok(out);
        }
        py.check_signals()?;
        stuck(start.elapsed())?;
    }
}

/// [`wait`] without a stuck check.
pub(crate) fn wait_plain<F>(py: Python<'_>, engine: &Engine, fut: F) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    wait(py, engine, fut, |_| Ok(()))
}
