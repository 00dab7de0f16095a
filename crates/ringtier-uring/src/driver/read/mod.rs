//! Batch reads: per request `statx` -> `openat2` -> read(s) -> `close` for reads by key, or
//! reads of one open file, with O_DIRECT decided per file and short reads continued.

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_channel::oneshot;
use io_uring::{opcode, types};
use ringtier_core::buf::{align_down, direct_span};
use ringtier_core::error::{Error, ErrorKind, Operation, Result};
use ringtier_core::fs::FsRoot;
use ringtier_core::{AlignedBuf, ReadBatch};

use super::{is_retryable, Driver, Shared, MAX_IO_BYTES, MAX_RETRIES, SIZE_UNKNOWN};
use crate::config::DirectIoPolicy;
#[cfg(feature = "fail-points")]
use crate::fail::FailOp;
use crate::fd::SharedFile;

mod steps;

/// What a batch reads from. Both variants keep their descriptor open for as long as the job
/// lives.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    /// Keys relative to a root directory: statx, open, read, close per request.
    Keys { root: Arc<FsRoot> },
    /// One open file.
    File { file: Arc<SharedFile>, key: String, direct: bool, align: u64, size: u64 },
}

impl Target {
    fn root_fd(&self) -> Option<RawFd> {
        match self {
            Target::Keys { root } => Some(root.root_fd()),
            Target::File { .. } => None,
        }
    }
}

/// The file a request reads from.
#[derive(Debug, Clone, Copy)]
enum Opened {
    /// A plain descriptor: one this request opened, or the target file's.
    Fd(RawFd),
    /// A fixed-file slot: a direct descriptor this request opened, or the target file's
    /// registered slot.
    Fixed(u32),
}

/// Where one request of a batch is, with what that step needs.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Not started. `statx_only`: the root's alignment guess failed for this file once, so it
    /// goes through `statx`.
    Idle { statx_only: bool },
    /// `statx` in flight.
    Statx,
    /// `openat2` in flight. `guessed`: opened on the root's alignment guess, without `statx`.
    Open { guessed: bool },
    /// Reads in flight on `file`.
    Read { file: Opened, guessed: bool },
    /// `close` in flight. `then_statx`: the guess was wrong; go through `statx` next.
    Close { then_statx: bool },
    /// Finished: the result is set, or there was nothing to do.
    Done,
}

/// One request of a batch: its phase and its read plan.
struct EntryState {
    phase: Phase,
    direct: bool,
    align: u64,
    /// File size from statx or the open file ([`SIZE_UNKNOWN`] on the fast path).
    size: u64,
    io_off: u64,
    span: usize,
    head: usize,
    want: usize,
    filled: usize,
    /// The most bytes `filled` has reached: a read that keeps ending short of it makes no
    /// progress.
    high: usize,
    retries: u32,
    path: usize,
    statx: libc::statx,
    how: types::OpenHow,
    buf: Option<AlignedBuf>,
    result: Option<Result<usize>>,
    started: Option<Instant>,
    latency: Option<Duration>,
    last_len: usize,
}

impl EntryState {
    fn mark_latency(&mut self) {
        if self.latency.is_none() {
            self.latency = self.started.map(|s| s.elapsed());
        }
    }
}

/// A batch read handed to a driver.
pub(crate) struct BatchJob {
    batch: ReadBatch,
    target: Target,
    shared: Arc<Shared>,
    paths: Vec<u8>,
    states: Vec<EntryState>,
    /// The next request to start.
    next: usize,
    /// Requests started and not done.
    active: usize,
    done: Option<oneshot::Sender<ReadBatch>>,
}

impl BatchJob {
    pub(crate) fn new(
        mut batch: ReadBatch,
        target: Target,
        shared: Arc<Shared>,
        done: oneshot::Sender<ReadBatch>,
    ) -> Box<Self> {
        let (keys, entries) = batch.parts_mut();
        let mut paths = Vec::new();
        if matches!(target, Target::Keys { .. }) {
            paths.reserve(keys.len() + entries.len());
        }
        let mut states = Vec::with_capacity(entries.len());
        for entry in entries.iter_mut() {
            let path = paths.len();
            if matches!(target, Target::Keys { .. }) {
                paths.extend_from_slice(entry.key(keys).as_bytes());
                paths.push(0);
            }
            let buf = if entry.is_done() { None } else { entry.take_buf() };
            let phase = if buf.is_none() { Phase::Done } else { Phase::Idle { statx_only: false } };
            states.push(EntryState {
                phase,
                direct: false,
                align: 1,
                size: SIZE_UNKNOWN,
                io_off: 0,
                span: 0,
                head: 0,
                want: 0,
                filled: 0,
                high: 0,
                retries: 0,
                path,
                // SAFETY: statx is a plain C struct; all-zero is valid.
                statx: unsafe { std::mem::zeroed() },
                how: types::OpenHow::new(),
                buf,
                result: None,
                started: None,
                latency: None,
                last_len: 0,
            });
        }
        Box::new(BatchJob { batch, target, shared, paths, states, next: 0, active: 0, done: Some(done) })
    }

    fn err(&self, i: usize, e: Error) -> Error {
        let key = match &self.target {
            Target::File { key, .. } => key.as_str(),
            Target::Keys { .. } => self.batch.get(i).map(|(k, _)| k).unwrap_or(""),
        };
        e.context(Operation::Read, key, &self.shared.name)
    }

    /// Every request has been started.
    pub(super) fn exhausted(&self) -> bool {
        self.next >= self.states.len()
    }

    /// Every request is done: the batch can go back to its caller.
    pub(super) fn is_finished(&self) -> bool {
        self.exhausted() && self.active == 0
    }

    /// Stops waiting for the caller: it will hear "io_uring driver stopped".
    pub(super) fn forget_caller(&mut self) {
        self.done.take();
    }

    /// Hands the batch back after the driver stopped with nothing in the kernel (a panic):
    /// files the requests opened are closed, unfinished requests fail.
    pub(super) fn abandon(mut self, ring: &io_uring::IoUring) {
        if matches!(self.target, Target::Keys { .. }) {
            for st in self.states.iter_mut() {
                if let Phase::Read { file, .. } = st.phase {
                    match file {
                        Opened::Fixed(slot) => {
                            let _ = ring.submitter().register_files_update(slot, &[-1]);
                        }
                        // SAFETY: the request opened this descriptor and owns it; no close
                        // was submitted for it (the request is in its read phase).
                        Opened::Fd(fd) => unsafe {
                            libc::close(fd);
                        },
                    }
                    st.phase = Phase::Done;
                }
            }
        }
        self.finish();
    }

    /// Hands the batch back to its caller, failing requests that never ran.
    pub(super) fn finish(mut self) {
        let (_, entries) = self.batch.parts_mut();
        for (entry, st) in entries.iter_mut().zip(self.states.iter_mut()) {
            if let Some(l) = st.latency {
                entry.set_latency(l);
            }
            match (st.buf.take(), st.result.take()) {
                (Some(buf), Some(res)) => entry.finish(res, buf),
                (Some(buf), None) => entry.finish(Err(Error::new(ErrorKind::Shutdown, "request not executed")), buf),
                (None, Some(res)) => entry.set_result(res),
                (None, None) => {}
            }
        }
        if let Some(done) = self.done.take() {
            let batch = std::mem::take(&mut self.batch);
            let _ = done.send(batch);
        }
    }
}
