//! Driver threads: each owns one io_uring, takes jobs from a channel and runs their state
//! machines (statx -> open -> read(s) -> close per file; writes; fsyncs) with at most
//! `queue_depth` requests in the kernel at once.
//!
//! Every unsafe block of the crate that submits to the kernel lives here. The invariants that
//! make submission sound:
//!
//! * every pointer placed in an SQE (buffer, path, statx, open_how) points into a job that the
//!   driver owns (boxed, so it does not move) until the matching completion has been reaped;
//!   jobs are only handed back to callers after that;
//! * every descriptor placed in an SQE belongs to a file the job keeps open (an `Arc` of the
//!   file or of the tier's root, see [`crate::fd`]) until then, so a caller that drops its
//!   future and its file cannot let the number be reused by another open while the request is
//!   still queued;
//! * the driver is dropped only after its last completion is reaped; if that cannot happen (a
//!   panic left the ring in an unknown state and cancellation did not finish in time), the
//!   memory the kernel might still write is leaked, never freed.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, TryRecvError};
use futures_channel::oneshot;
use io_uring::{opcode, types, IoUring};
use ringtier_core::buf::{align_down, direct_span};
use ringtier_core::catalog;
use ringtier_core::error::{Error, ErrorKind, Operation, Result};
use ringtier_core::fs::FsRoot;
use ringtier_core::{AlignedBuf, BufferPool, ReadBatch};

use crate::config::{DirectIoPolicy, UringConfig};
#[cfg(feature = "fail-points")]
use crate::fail::{FailOp, FailPoints};
use crate::fd::SharedFile;

/// Fixed-file slots registered per ring when `register_files` is on.
pub(crate) const FIXED_FILE_SLOTS: u32 = 256;
const WAKE: u64 = u64::MAX;
/// user_data of the cancellation the driver submits when it is dropped.
const CANCEL: u64 = u64::MAX - 1;
const MAX_RETRIES: u32 = 64;
/// Largest byte count one read or write SQE asks for: the SQE's length field is a `u32` and
/// the kernel caps one transfer at `MAX_RW_COUNT` (2 GiB less a page) anyway; longer requests
/// continue in further SQEs, like short completions.
const MAX_IO_BYTES: u64 = 1 << 30;
/// How long a dropped driver waits for the kernel to give back cancelled requests before it
/// leaks their memory instead of freeing it.
const DROP_DEADLINE: Duration = Duration::from_secs(10);
/// A request's file size is not known (whole-file reads that skip `statx`).
const SIZE_UNKNOWN: u64 = u64::MAX;

/// Counters shared by a tier's drivers.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub reads_direct: AtomicU64,
    pub reads_buffered: AtomicU64,
    pub dio_fallbacks: AtomicU64,
    pub fixed_buffer_reads: AtomicU64,
    pub fixed_file_reads: AtomicU64,
    pub submits: AtomicU64,
    pub sqes: AtomicU64,
    pub resubmits: AtomicU64,
    pub register_fallbacks: AtomicU64,
}

/// Per-tier state the drivers share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub name: String,
    pub fs_type: &'static str,
    pub policy: DirectIoPolicy,
    pub stats: Stats,
    pub fallback_counter: metrics::Counter,
    /// Direct-I/O alignment `(memory, offset)` of new files under the root, when known: whole-
    /// file reads then skip `statx` and let the kernel confirm the alignment (EINVAL sends the
    /// file through the `statx` path).
    pub root_align: Option<(u64, u64)>,
    /// Fail points rewriting this tier's completions (tests).
    #[cfg(feature = "fail-points")]
    pub fail: Option<Arc<FailPoints>>,
    warned_fallback: Once,
}

impl Shared {
    pub(crate) fn new(
        name: String,
        fs_type: &'static str,
        policy: DirectIoPolicy,
        root_align: Option<(u64, u64)>,
    ) -> Self {
        let fallback_counter = metrics::counter!(catalog::DIRECT_IO_FALLBACKS_TOTAL, "tier" => name.clone());
        Shared {
            name,
            fs_type,
            policy,
            stats: Stats::default(),
            fallback_counter,
            root_align,
            #[cfg(feature = "fail-points")]
            fail: None,
            warned_fallback: Once::new(),
        }
    }

    pub(crate) fn count_fallback(&self, why: &str) {
        self.stats.dio_fallbacks.fetch_add(1, Ordering::Relaxed);
        self.fallback_counter.increment(1);
        self.warned_fallback.call_once(|| {
            tracing::info!(tier = %self.name, "direct I/O not possible, reading buffered (counted from now on): {why}")
        });
    }
}

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    Statx,
    Open,
    Read,
    Close,
    Done,
}

struct EntryState {
    phase: Phase,
    fd: RawFd,
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
    /// Opened without statx (whole-file read, alignment from the root probe).
    fast: bool,
    /// After closing, restart through the statx path (the kernel refused the fast guess).
    restart: bool,
    /// Restarted once already: statx path only.
    no_fast: bool,
    /// The direct descriptor (fixed-file slot) the open returned, when files are registered.
    slot: Option<u32>,
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
    next: usize,
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
            let (buf, phase) = if entry.is_done() { (None, Phase::Done) } else { (entry.take_buf(), Phase::Idle) };
            let phase = if buf.is_none() { Phase::Done } else { phase };
            states.push(EntryState {
                phase,
                fd: -1,
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
                fast: false,
                restart: false,
                no_fast: false,
                slot: None,
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

    fn finish(mut self) {
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

/// What a finished write hands back: the result and the buffer (absent only when the job
/// lost it, which completes the job with an error instead of a hang).
pub(crate) type WriteDone = (Result<()>, Option<AlignedBuf>);

/// A write of a buffer's data window, looping over short writes.
pub(crate) struct WriteJob {
    /// Kept open until the last completion of this job is reaped.
    pub file: Arc<File>,
    pub offset: u64,
    /// Bytes to write from the start of the data window (may exceed `buf.len()` by padding).
    pub len: usize,
    /// The file's direct-I/O alignment (1 for buffered writes): a short write continues from
    /// an aligned position.
    pub align: u64,
    pub buf: Option<AlignedBuf>,
    pub written: usize,
    pub retries: u32,
    pub done: Option<oneshot::Sender<WriteDone>>,
    /// Whatever the caller needs to outlive the write (its in-flight count).
    pub _guard: Box<dyn Send>,
}

/// A data fsync.
pub(crate) struct FsyncJob {
    /// Kept open until the completion is reaped.
    pub file: Arc<File>,
    pub retries: u32,
    pub done: Option<oneshot::Sender<Result<()>>>,
}

/// Work for a driver.
pub(crate) enum Job {
    Batch(Box<BatchJob>),
    Write(Box<WriteJob>),
    Fsync(Box<FsyncJob>),
    RegisterFile { slot: u32, fd: RawFd, reply: oneshot::Sender<io::Result<()>> },
}

enum Active {
    Batch(Box<BatchJob>),
    Write(Box<WriteJob>),
    Fsync(Box<FsyncJob>),
}

/// The handle callers keep to a driver thread.
#[derive(Debug)]
pub(crate) struct DriverHandle {
    pub tx: Option<crossbeam_channel::Sender<Job>>,
    pub wake: Arc<OwnedFd>,
    pub parked: Arc<AtomicBool>,
    pub thread: Option<std::thread::JoinHandle<()>>,
}

impl DriverHandle {
    /// Queues a job and wakes the driver if it sleeps in the kernel.
    pub(crate) fn send(&self, job: Job) -> Result<()> {
        let tx = self.tx.as_ref().ok_or_else(|| Error::new(ErrorKind::Shutdown, "io_uring driver stopped"))?;
        tx.send(job).map_err(|_| Error::new(ErrorKind::Shutdown, "io_uring driver stopped"))?;
        if self.parked.load(Ordering::SeqCst) {
            wake(self.wake.as_raw_fd());
        }
        Ok(())
    }

    /// Stops the driver after its queued and in-flight work, and joins it.
    pub(crate) fn stop(&mut self) {
        self.tx.take();
        wake(self.wake.as_raw_fd());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn wake(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: fd is an eventfd we own; writing 8 bytes from a valid u64 is its protocol.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Starts one driver thread.
pub(crate) fn spawn(
    index: usize,
    config: &UringConfig,
    pool: Option<BufferPool>,
    shared: Arc<Shared>,
) -> Result<DriverHandle> {
    let setup = |e: io::Error, what: &str| {
        Error::from(e).with_operation(Operation::Setup).with_tier(&shared.name).with_key(what.to_string())
    };
    let depth = config.queue_depth.max(1);
    let entries = (depth + 2).next_power_of_two() * 2;
    let mut builder = IoUring::builder();
    if let Some(idle) = config.sqpoll_idle_ms {
        builder.setup_sqpoll(idle);
    }
    let ring = builder.build(entries).map_err(|e| setup(e, "io_uring_setup"))?;

    // SAFETY: eventfd takes no pointers.
    let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if efd < 0 {
        return Err(setup(io::Error::last_os_error(), "eventfd"));
    }
    // SAFETY: efd is a fresh descriptor nobody else owns.
    let wake_fd = Arc::new(unsafe { OwnedFd::from_raw_fd(efd) });

    let mut registered_pool = None;
    if let (Some(pool), true) = (&pool, config.register_buffers) {
        if pool.count() > 16_384 || pool.buf_size() > (1 << 30) {
            shared.stats.register_fallbacks.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(tier = %shared.name, "buffer pool too large to register as fixed buffers; using plain buffers");
        } else {
            let iovecs: Vec<libc::iovec> = (0..pool.count() as u32)
                .map(|i| libc::iovec { iov_base: pool.buffer_ptr(i).cast(), iov_len: pool.buf_size() })
                .collect();
            // SAFETY: every iovec points into the pool's slab, which stays allocated while the
            // driver holds its `pool` clone (dropped only after the ring).
            match unsafe { ring.submitter().register_buffers(&iovecs) } {
                Ok(()) => registered_pool = Some(pool.id()),
                Err(e) => {
                    shared.stats.register_fallbacks.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!(catalog::URING_REGISTER_FALLBACKS_TOTAL, "tier" => shared.name.clone(), "what" => "buffers")
                        .increment(1);
                    if index == 0 {
                        tracing::warn!(
                            tier = %shared.name,
                            "could not register {} bytes of buffers with io_uring ({e}); RLIMIT_MEMLOCK may be too low. \
                             Using plain buffers.",
                            pool.count() * pool.buf_size()
                        );
                    }
                }
            }
        }
    }
    let mut fixed_files = false;
    let mut direct_files = false;
    if config.register_files {
        // Slots [0, FIXED_FILE_SLOTS) for opened files (UringFile); the rest, one per request
        // in flight, for the kernel to allocate to per-file opens (direct descriptors).
        let per_file = depth + 64;
        match ring.submitter().register_files_sparse(FIXED_FILE_SLOTS + per_file) {
            Ok(()) => {
                fixed_files = true;
                direct_files = set_file_alloc_range(&ring, FIXED_FILE_SLOTS, per_file).is_ok();
            }
            Err(e) => {
                shared.stats.register_fallbacks.fetch_add(1, Ordering::Relaxed);
                metrics::counter!(catalog::URING_REGISTER_FALLBACKS_TOTAL, "tier" => shared.name.clone(), "what" => "files")
                    .increment(1);
                tracing::warn!(tier = %shared.name, "could not register a fixed-file table ({e}); using plain descriptors");
            }
        }
    }

    let (tx, rx) = crossbeam_channel::unbounded();
    let parked = Arc::new(AtomicBool::new(false));
    let in_flight_gauge = metrics::gauge!(catalog::URING_IN_FLIGHT, "tier" => shared.name.clone());
    let submits = metrics::counter!(catalog::URING_SUBMITS_TOTAL, "tier" => shared.name.clone());
    let sqes = metrics::counter!(catalog::URING_SQES_TOTAL, "tier" => shared.name.clone());
    let mut driver = Driver {
        ring,
        rx,
        wake_fd: Arc::clone(&wake_fd),
        parked: Arc::clone(&parked),
        depth: depth as usize,
        max_read: config.max_read_bytes as usize,
        jobs: Vec::new(),
        free_ids: Vec::new(),
        queue: VecDeque::new(),
        in_flight: 0,
        unsubmitted: 0,
        registered_pool,
        _pool: pool,
        fixed_files,
        direct_files,
        shared,
        wake_buf: Box::new(0),
        wake_armed: false,
        in_flight_gauge,
        submits,
        sqes,
    };
    let thread = std::thread::Builder::new()
        .name(format!("ringtier-uring-{index}"))
        .spawn(move || driver.run())
        .map_err(|e| Error::from(e).with_operation(Operation::Setup))?;
    Ok(DriverHandle { tx: Some(tx), wake: wake_fd, parked, thread: Some(thread) })
}

struct Driver {
    ring: IoUring,
    rx: Receiver<Job>,
    wake_fd: Arc<OwnedFd>,
    parked: Arc<AtomicBool>,
    depth: usize,
    max_read: usize,
    jobs: Vec<Option<Active>>,
    free_ids: Vec<u32>,
    /// Jobs with work not yet started, oldest first.
    queue: VecDeque<u32>,
    in_flight: usize,
    unsubmitted: usize,
    registered_pool: Option<u64>,
    _pool: Option<BufferPool>,
    fixed_files: bool,
    /// Per-file opens return direct descriptors (fixed-file slots allocated by the kernel).
    direct_files: bool,
    shared: Arc<Shared>,
    /// Where the armed eventfd read lands; boxed so that a driver which cannot confirm the
    /// read's cancellation can leak it.
    wake_buf: Box<u64>,
    /// The eventfd read is in the kernel.
    wake_armed: bool,
    in_flight_gauge: metrics::Gauge,
    submits: metrics::Counter,
    sqes: metrics::Counter,
}

impl Driver {
    fn run(&mut self) {
        self.arm_wake();
        let mut disconnected = false;
        loop {
            if !disconnected {
                loop {
                    match self.rx.try_recv() {
                        Ok(job) => self.accept(job),
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => {
                            disconnected = true;
                            break;
                        }
                    }
                }
            }
            self.fill();
            if self.in_flight == 0 && self.queue.is_empty() {
                if disconnected {
                    break;
                }
                match self.rx.recv() {
                    Ok(job) => {
                        self.accept(job);
                        continue;
                    }
                    Err(_) => break,
                }
            }
            self.parked.store(true, Ordering::SeqCst);
            std::sync::atomic::fence(Ordering::SeqCst);
            let must_wait = self.rx.is_empty() || disconnected;
            let want = usize::from(must_wait && self.in_flight > 0);
            let res = self.ring.submit_and_wait(want);
            self.parked.store(false, Ordering::SeqCst);
            match res {
                Ok(n) => {
                    if self.unsubmitted > 0 {
                        self.shared.stats.submits.fetch_add(1, Ordering::Relaxed);
                        // Counters, not a histogram: one atomic add each (a histogram sample per
                        // submit costs measurably at memory speed).
                        self.submits.increment(1);
                        self.sqes.increment(self.unsubmitted as u64);
                    }
                    let _ = n;
                    self.unsubmitted = 0;
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EBUSY) | Some(libc::EAGAIN)) => {}
                Err(e) => {
                    tracing::error!(tier = %self.shared.name, "io_uring_enter failed: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            self.reap();
            self.in_flight_gauge.set(self.in_flight as f64);
        }
        self.in_flight_gauge.set(0.0);
    }

    fn arm_wake(&mut self) {
        let buf: *mut u64 = &mut *self.wake_buf;
        let sqe = opcode::Read::new(types::Fd(self.wake_fd.as_raw_fd()), buf.cast(), 8).build().user_data(WAKE);
        // SAFETY: wake_buf is a box the driver owns; Drop frees it only after the read's
        // completion is reaped and leaks it otherwise. The eventfd is kept open by wake_fd.
        unsafe { self.push_raw(&sqe) };
        self.wake_armed = true;
    }

    /// The result the completion handling sees: the kernel's, or what a fail point makes of it.
    #[cfg(feature = "fail-points")]
    fn inject(&self, op: FailOp, res: i32) -> i32 {
        match &self.shared.fail {
            Some(f) => f.apply(op, res),
            None => res,
        }
    }

    fn accept(&mut self, job: Job) {
        let active = match job {
            Job::Batch(b) => Active::Batch(b),
            Job::Write(w) => Active::Write(w),
            Job::Fsync(f) => Active::Fsync(f),
            Job::RegisterFile { slot, fd, reply } => {
                let res = if self.fixed_files {
                    self.ring.submitter().register_files_update(slot, &[fd]).map(|_| ())
                } else {
                    Err(io::Error::from_raw_os_error(libc::ENXIO))
                };
                let _ = reply.send(res);
                return;
            }
        };
        let id = match self.free_ids.pop() {
            Some(id) => {
                self.jobs[id as usize] = Some(active);
                id
            }
            None => {
                self.jobs.push(Some(active));
                (self.jobs.len() - 1) as u32
            }
        };
        self.queue.push_back(id);
    }

    /// Pushes one SQE, submitting first if the queue is full.
    ///
    /// # Safety
    ///
    /// Every pointer in `sqe` must stay valid until its completion is reaped.
    unsafe fn push_raw(&mut self, sqe: &io_uring::squeue::Entry) {
        loop {
            // SAFETY: forwarded from the caller.
            let pushed = unsafe { self.ring.submission().push(sqe) };
            if pushed.is_ok() {
                self.unsubmitted += 1;
                self.shared.stats.sqes.fetch_add(1, Ordering::Relaxed);
                return;
            }
            let _ = self.ring.submit();
            self.unsubmitted = 0;
        }
    }

    /// Starts queued work while fewer than `depth` requests are in flight.
    fn fill(&mut self) {
        while self.in_flight < self.depth {
            let Some(&id) = self.queue.front() else {
                return;
            };
            let Some(job) = self.jobs[id as usize].take() else {
                self.queue.pop_front();
                continue;
            };
            let (job, goes_on) = self.guarded(id, job, |d, job| match job {
                Active::Batch(b) => {
                    d.start_next_entry(id, b);
                    let exhausted = b.next >= b.states.len();
                    if exhausted {
                        d.queue.pop_front();
                    }
                    !(exhausted && b.active == 0)
                }
                Active::Write(w) => {
                    d.queue.pop_front();
                    d.submit_write(id, w)
                }
                Active::Fsync(f) => {
                    d.queue.pop_front();
                    d.submit_fsync(id, f);
                    true
                }
            });
            self.settle(id, job, goes_on);
        }
    }

    /// Runs one step of job `id` (taken out of the table) under `catch_unwind`: if the step
    /// panics, the job goes back into the table before the panic goes on, so that `Drop` still
    /// owns the buffers and files the kernel may be using instead of an unwinding stack frame
    /// freeing them.
    fn guarded<R>(&mut self, id: u32, mut job: Active, step: impl FnOnce(&mut Self, &mut Active) -> R) -> (Active, R) {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| step(self, &mut job))) {
            Ok(r) => (job, r),
            Err(panic) => {
                self.jobs[id as usize] = Some(job);
                std::panic::resume_unwind(panic)
            }
        }
    }

    /// Puts a job back in the table when it goes on; otherwise frees its id and, for a batch,
    /// hands the batch back to its caller (writes and fsyncs answered when they ended).
    fn settle(&mut self, id: u32, job: Active, goes_on: bool) {
        if goes_on {
            self.jobs[id as usize] = Some(job);
            return;
        }
        self.release(id);
        if let Active::Batch(b) = job {
            b.finish();
        }
    }

    fn release(&mut self, id: u32) {
        self.jobs[id as usize] = None;
        self.free_ids.push(id);
    }

    /// Starts the next idle entry of a batch; entries needing no I/O finish on the spot.
    fn start_next_entry(&mut self, id: u32, b: &mut BatchJob) -> bool {
        while b.next < b.states.len() {
            let i = b.next;
            b.next += 1;
            if b.states[i].phase != Phase::Idle {
                continue;
            }
            b.active += 1;
            b.states[i].started = Some(Instant::now());
            let file = match &b.target {
                Target::File { file, direct, align, size, .. } => Some((file.fd(), *direct, *align, *size)),
                Target::Keys { .. } => None,
            };
            match (b.target.root_fd(), file) {
                (Some(root_fd), _) if self.try_fast_open(b, i) => self.submit_open(id, b, i, root_fd),
                (Some(root_fd), _) => {
                    let st = &mut b.states[i];
                    st.phase = Phase::Statx;
                    let path = b.paths[st.path..].as_ptr().cast::<libc::c_char>();
                    let sqe = opcode::Statx::new(types::Fd(root_fd), path, (&mut st.statx as *mut libc::statx).cast())
                        .flags(0)
                        .mask(libc::STATX_TYPE | libc::STATX_SIZE | libc::STATX_DIOALIGN)
                        .build()
                        .user_data(((id as u64) << 32) | i as u64);
                    // SAFETY: path and statx point into the boxed job, owned by the driver
                    // until this completion is reaped.
                    unsafe { self.push_raw(&sqe) };
                    self.in_flight += 1;
                }
                (None, Some((fd, direct, align, size))) => {
                    // The job's target keeps the file open: fd stays valid until the job ends.
                    b.states[i].fd = fd;
                    match self.plan_read(b, i, size, direct, align) {
                        Ok(true) => self.submit_read(id, b, i),
                        Ok(false) => self.entry_done(b, i),
                        Err(e) => {
                            let e = b.err(i, e);
                            b.states[i].result = Some(Err(e));
                            self.entry_done(b, i);
                        }
                    }
                }
                (None, None) => self.entry_done(b, i),
            }
            return true;
        }
        false
    }

    /// Whole-file reads (offset 0) skip statx when the policy is off or the root's direct-I/O
    /// alignment is known and the buffer fits it: open, read, close. The kernel has the last
    /// word: EINVAL on open or read sends the file through the statx path.
    fn try_fast_open(&self, b: &mut BatchJob, i: usize) -> bool {
        let (offset, len) = match b.batch.get(i) {
            Some((_, e)) => (e.offset(), e.len()),
            None => return false,
        };
        if offset != 0 || len == 0 || b.states[i].no_fast {
            return false;
        }
        let (direct, align) = match (self.shared.policy, self.shared.root_align) {
            (DirectIoPolicy::Off, _) => (false, 1),
            (_, None) => return false,
            (_, Some((mem, off))) => {
                let Some(buf) = b.states[i].buf.as_ref() else { return false };
                let align = mem.max(off);
                let fits = (buf.as_ptr() as u64) % mem == 0 && direct_span(0, len, align).1 <= buf.capacity();
                if !fits {
                    return false; // statx path: it decides and reports fallbacks or errors
                }
                (true, align)
            }
        };
        match self.plan_read(b, i, u64::MAX, direct, align) {
            Ok(true) => {
                b.states[i].fast = true;
                true
            }
            _ => false,
        }
    }

    /// Sends an entry back through the statx path (after its descriptor is closed).
    fn restart_slow(&mut self, id: u32, b: &mut BatchJob, i: usize) {
        let st = &mut b.states[i];
        st.fast = false;
        st.restart = false;
        st.no_fast = true;
        st.fd = -1;
        st.filled = 0;
        st.phase = Phase::Idle;
        b.next = b.next.min(i);
        b.active -= 1;
        self.requeue(id);
    }

    /// Works out the span to read. Returns false when no read is needed (empty range).
    fn plan_read(&self, b: &mut BatchJob, i: usize, size: u64, direct: bool, align: u64) -> Result<bool> {
        let (offset, len) = {
            let (_, entries) = b.batch.parts_mut();
            (entries[i].offset(), entries[i].len())
        };
        let st = &mut b.states[i];
        if offset > size {
            return Err(Error::new(ErrorKind::OutOfRange, format!("offset {offset} is past the end ({size} bytes)")));
        }
        let want = len.min((size - offset) as usize);
        st.want = want;
        let Some(buf) = st.buf.as_mut() else {
            return Err(Error::new(ErrorKind::InvalidInput, "request has no buffer"));
        };
        if want == 0 {
            buf.clear();
            st.result = Some(Ok(0));
            return Ok(false);
        }
        st.direct = direct;
        st.align = align.max(1);
        if direct {
            let (io_off, span, head) = direct_span(offset, want, st.align);
            if span > buf.capacity() {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "buffer of {} bytes is too small for the {span}-byte aligned span of this read",
                        buf.capacity()
                    ),
                ));
            }
            st.io_off = io_off;
            st.span = span;
            st.head = head;
        } else {
            if want > buf.capacity() {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!("buffer of {} bytes is too small for a {want}-byte read", buf.capacity()),
                ));
            }
            st.io_off = offset;
            st.span = want;
            st.head = 0;
        }
        st.size = size;
        st.filled = 0;
        st.high = 0;
        Ok(true)
    }

    fn submit_read(&mut self, id: u32, b: &mut BatchJob, i: usize) {
        let fixed_file = match &b.target {
            Target::File { file, .. } => file.fixed(),
            Target::Keys { .. } => b.states[i].slot,
        };
        let st = &mut b.states[i];
        st.phase = Phase::Read;
        let Some(buf) = st.buf.as_mut() else {
            // Cannot happen (entries without a buffer never start); if it does, the entry
            // fails instead of waiting for a completion that will never come.
            let e = b.err(i, Error::new(ErrorKind::InvalidInput, "request has no buffer"));
            return self.end_read(id, b, i, Err(e));
        };
        // SAFETY: filled < span <= capacity, so the pointer stays inside the buffer.
        let ptr = unsafe { buf.as_mut_ptr().add(st.filled) };
        let mut len = st.span - st.filled;
        let cap = if self.max_read > 0 { (self.max_read as u64).min(MAX_IO_BYTES) } else { MAX_IO_BYTES };
        if len as u64 > cap {
            // One read asks for at most `cap` bytes, kept a multiple of the direct-I/O
            // alignment; the rest follows as with a short read.
            len = (align_down(cap, st.align) as usize).max(st.align as usize).min(len);
        }
        st.last_len = len;
        let len = u32::try_from(len).unwrap_or(u32::MAX);
        let off = st.io_off + st.filled as u64;
        let fixed_buf = match (buf.pool_slot(), self.registered_pool) {
            (Some((pool, idx)), Some(reg)) if pool == reg && idx <= u16::MAX as u32 => Some(idx as u16),
            _ => None,
        };
        let user_data = ((id as u64) << 32) | i as u64;
        let sqe = match (fixed_buf, fixed_file) {
            (Some(bi), Some(slot)) => opcode::ReadFixed::new(types::Fixed(slot), ptr, len, bi).offset(off).build(),
            (Some(bi), None) => opcode::ReadFixed::new(types::Fd(st.fd), ptr, len, bi).offset(off).build(),
            (None, Some(slot)) => opcode::Read::new(types::Fixed(slot), ptr, len).offset(off).build(),
            (None, None) => opcode::Read::new(types::Fd(st.fd), ptr, len).offset(off).build(),
        }
        .user_data(user_data);
        if st.filled == 0 {
            let s = &self.shared.stats;
            if st.direct { &s.reads_direct } else { &s.reads_buffered }.fetch_add(1, Ordering::Relaxed);
            if fixed_buf.is_some() {
                s.fixed_buffer_reads.fetch_add(1, Ordering::Relaxed);
            }
            if fixed_file.is_some() {
                s.fixed_file_reads.fetch_add(1, Ordering::Relaxed);
            }
        }
        // SAFETY: the buffer is owned by the boxed job until this completion is reaped; a
        // fixed-buffer index is used only for buffers of the pool registered with this ring.
        unsafe { self.push_raw(&sqe) };
        self.in_flight += 1;
    }

    fn submit_open(&mut self, id: u32, b: &mut BatchJob, i: usize, root_fd: RawFd) {
        let st = &mut b.states[i];
        st.phase = Phase::Open;
        // Direct descriptors have no file-table entry, so O_CLOEXEC is meaningless there
        // (and the kernel refuses it).
        let mut flags = if self.direct_files { libc::O_RDONLY } else { libc::O_RDONLY | libc::O_CLOEXEC };
        if st.direct {
            flags |= libc::O_DIRECT;
        }
        st.how = types::OpenHow::new().flags(flags as u64).resolve(libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS);
        let path = b.paths[st.path..].as_ptr().cast::<libc::c_char>();
        let mut op = opcode::OpenAt2::new(types::Fd(root_fd), path, &st.how);
        if self.direct_files {
            op = op.file_index(Some(types::DestinationSlot::auto_target()));
        }
        let sqe = op.build().user_data(((id as u64) << 32) | i as u64);
        // SAFETY: path and how point into the boxed job, owned until the completion is reaped.
        unsafe { self.push_raw(&sqe) };
        self.in_flight += 1;
    }

    fn submit_close(&mut self, id: u32, b: &mut BatchJob, i: usize) {
        let st = &mut b.states[i];
        st.phase = Phase::Close;
        let sqe = match st.slot.take() {
            Some(slot) => opcode::Close::new(types::Fixed(slot)).build(),
            None => opcode::Close::new(types::Fd(st.fd)).build(),
        }
        .user_data(((id as u64) << 32) | i as u64);
        // SAFETY: close takes no pointers.
        unsafe { self.push_raw(&sqe) };
        self.in_flight += 1;
    }

    /// Submits the rest of a write. Returns false when the job cannot go on (it has then
    /// been completed with an error and must be released).
    fn submit_write(&mut self, id: u32, w: &mut WriteJob) -> bool {
        let Some(buf) = w.buf.as_mut() else {
            if let Some(done) = w.done.take() {
                let _ = done.send((Err(Error::new(ErrorKind::InvalidInput, "write request has no buffer")), None));
            }
            return false;
        };
        let head = buf.head();
        if head + w.len > buf.capacity() {
            let e = Error::new(
                ErrorKind::InvalidInput,
                format!("write of {} bytes does not fit the buffer's capacity {}", w.len, buf.capacity() - head),
            );
            if let Some(done) = w.done.take() {
                let _ = done.send((Err(e), w.buf.take()));
            }
            return false;
        }
        // SAFETY: head + written < head + len <= capacity (checked above).
        let ptr = unsafe { buf.as_mut_ptr().add(head + w.written) };
        let len = ((w.len - w.written) as u64).min(align_down(MAX_IO_BYTES, w.align.max(1)));
        let sqe = opcode::Write::new(types::Fd(w.file.as_raw_fd()), ptr, len as u32)
            .offset(w.offset + w.written as u64)
            .build()
            .user_data((id as u64) << 32);
        // SAFETY: the buffer is owned by the boxed job until this completion is reaped, and
        // the job's Arc keeps the file open until then.
        unsafe { self.push_raw(&sqe) };
        self.in_flight += 1;
        true
    }

    fn submit_fsync(&mut self, id: u32, f: &mut FsyncJob) {
        let sqe = opcode::Fsync::new(types::Fd(f.file.as_raw_fd()))
            .flags(types::FsyncFlags::DATASYNC)
            .build()
            .user_data((id as u64) << 32);
        // SAFETY: fsync takes no pointers; the job's Arc keeps the file open until the
        // completion is reaped.
        unsafe { self.push_raw(&sqe) };
        self.in_flight += 1;
    }

    /// Ends an entry's read with `res`: closes its file first when the entry opened one.
    fn end_read(&mut self, id: u32, b: &mut BatchJob, i: usize, res: Result<usize>) {
        b.states[i].result = Some(res);
        b.states[i].mark_latency();
        match b.target {
            Target::Keys { .. } => self.submit_close(id, b, i),
            Target::File { .. } => self.entry_done(b, i),
        }
    }

    /// Closes a descriptor (or direct descriptor) that a fail point pretends was never opened.
    #[cfg(feature = "fail-points")]
    fn close_now(&mut self, res: i32) {
        if self.direct_files {
            let _ = self.ring.submitter().register_files_update(res as u32, &[-1]);
        } else {
            // SAFETY: res is the descriptor the kernel just opened for this request; nothing
            // else knows its number.
            unsafe { libc::close(res) };
        }
    }

    fn entry_done(&mut self, b: &mut BatchJob, i: usize) {
        b.states[i].mark_latency();
        b.states[i].phase = Phase::Done;
        b.active -= 1;
    }

    fn reap(&mut self) {
        loop {
            let cqe = match self.ring.completion().next() {
                Some(c) => c,
                None => return,
            };
            let (ud, res) = (cqe.user_data(), cqe.result());
            if ud == WAKE {
                self.wake_armed = false;
                self.arm_wake();
                continue;
            }
            if ud == CANCEL {
                continue;
            }
            self.in_flight = self.in_flight.saturating_sub(1);
            let id = (ud >> 32) as u32;
            let idx = (ud & 0xffff_ffff) as usize;
            let Some(job) = self.jobs.get_mut(id as usize).and_then(Option::take) else {
                tracing::error!("completion for an unknown job {id}");
                continue;
            };
            let (job, goes_on) = self.guarded(id, job, |d, job| match job {
                Active::Batch(b) => {
                    d.on_batch_cqe(id, b, idx, res);
                    let done = b.next >= b.states.len() && b.active == 0;
                    if done {
                        d.queue.retain(|&q| q != id);
                    }
                    !done
                }
                Active::Write(w) => !d.on_write_cqe(id, w, res),
                Active::Fsync(f) => d.on_fsync_cqe(id, f, res),
            });
            self.settle(id, job, goes_on);
        }
    }

    /// Returns true when the fsync is resubmitted (EAGAIN, EINTR).
    fn on_fsync_cqe(&mut self, id: u32, f: &mut FsyncJob, res: i32) -> bool {
        #[cfg(feature = "fail-points")]
        let res = self.inject(FailOp::Fsync, res);
        if res < 0 && is_retryable(-res) && f.retries < MAX_RETRIES {
            f.retries += 1;
            self.submit_fsync(id, f);
            return true;
        }
        let out = if res < 0 { Err(Error::from_errno(-res, "fdatasync failed")) } else { Ok(()) };
        if let Some(done) = f.done.take() {
            let _ = done.send(out);
        }
        false
    }

    /// Returns true when the write job is complete.
    fn on_write_cqe(&mut self, id: u32, w: &mut WriteJob, res: i32) -> bool {
        #[cfg(feature = "fail-points")]
        let res = self.inject(FailOp::Write, res);
        let out = if res < 0 {
            let errno = -res;
            if is_retryable(errno) && w.retries < MAX_RETRIES {
                w.retries += 1;
                self.shared.stats.resubmits.fetch_add(1, Ordering::Relaxed);
                return !self.submit_write(id, w);
            }
            Err(Error::from_errno(errno, "write failed"))
        } else if res == 0 {
            Err(Error::from_errno(libc::EIO, "write made no progress"))
        } else {
            w.written += res as usize;
            if w.written < w.len {
                // A short write (or the rest of one longer than a single SQE takes): go on
                // from an aligned position, rewriting the few bytes past it under O_DIRECT.
                w.written = align_down(w.written as u64, w.align.max(1)) as usize;
                self.shared.stats.resubmits.fetch_add(1, Ordering::Relaxed);
                return !self.submit_write(id, w);
            }
            Ok(())
        };
        if let Some(done) = w.done.take() {
            let _ = done.send((out, w.buf.take()));
        }
        true
    }

    fn on_batch_cqe(&mut self, id: u32, b: &mut BatchJob, i: usize, res: i32) {
        let phase = b.states[i].phase;
        #[cfg(feature = "fail-points")]
        let res = match phase {
            Phase::Statx => self.inject(FailOp::Statx, res),
            Phase::Open => {
                let injected = self.inject(FailOp::Open, res);
                if injected < 0 && res >= 0 {
                    // The kernel did open the file: close it before pretending it did not.
                    self.close_now(res);
                }
                injected
            }
            Phase::Read => self.inject(FailOp::Read, res),
            Phase::Close => self.inject(FailOp::Close, res),
            Phase::Idle | Phase::Done => res,
        };
        match phase {
            Phase::Statx => {
                if res < 0 {
                    if is_retryable(-res) && b.states[i].retries < MAX_RETRIES {
                        b.states[i].retries += 1;
                        b.states[i].phase = Phase::Idle;
                        b.next = b.next.min(i);
                        b.active -= 1;
                        self.requeue(id);
                        return;
                    }
                    let e = b.err(i, Error::from_errno(-res, "statx failed"));
                    b.states[i].result = Some(Err(e));
                    return self.entry_done(b, i);
                }
                let Some(root_fd) = b.target.root_fd() else {
                    return self.entry_done(b, i);
                };
                let stx = &b.states[i].statx;
                if u32::from(stx.stx_mode) & libc::S_IFMT != libc::S_IFREG {
                    let e = b.err(i, Error::new(ErrorKind::NotFound, "not a regular file"));
                    b.states[i].result = Some(Err(e));
                    return self.entry_done(b, i);
                }
                let size = stx.stx_size;
                let (mem, off) = if stx.stx_mask & libc::STATX_DIOALIGN != 0 {
                    (stx.stx_dio_mem_align as u64, stx.stx_dio_offset_align as u64)
                } else {
                    (0, 0)
                };
                let decision = self.decide_direct(b, i, mem, off, size);
                match decision {
                    Err(e) => {
                        let e = b.err(i, e);
                        b.states[i].result = Some(Err(e));
                        self.entry_done(b, i)
                    }
                    Ok((direct, align)) => match self.plan_read(b, i, size, direct, align) {
                        Ok(true) => self.submit_open(id, b, i, root_fd),
                        Ok(false) => self.entry_done(b, i),
                        Err(e) => {
                            let e = b.err(i, e);
                            b.states[i].result = Some(Err(e));
                            self.entry_done(b, i)
                        }
                    },
                }
            }
            Phase::Open => {
                let Some(root_fd) = b.target.root_fd() else {
                    return self.entry_done(b, i);
                };
                if res < 0 {
                    let errno = -res;
                    if is_retryable(errno) && b.states[i].retries < MAX_RETRIES {
                        b.states[i].retries += 1;
                        return self.submit_open(id, b, i, root_fd);
                    }
                    if errno == libc::EINVAL && b.states[i].fast {
                        // The guess from the root probe was wrong for this file: ask statx.
                        return self.restart_slow(id, b, i);
                    }
                    if errno == libc::EINVAL && b.states[i].direct && self.shared.policy == DirectIoPolicy::Auto {
                        // The filesystem refused O_DIRECT at open: read buffered.
                        self.shared.count_fallback("open with O_DIRECT returned EINVAL");
                        let size = b.states[i].statx.stx_size;
                        if let Err(e) = self.plan_read(b, i, size, false, 1) {
                            let e = b.err(i, e);
                            b.states[i].result = Some(Err(e));
                            return self.entry_done(b, i);
                        }
                        return self.submit_open(id, b, i, root_fd);
                    }
                    let msg = if errno == libc::EXDEV { "path leads outside the tier root" } else { "open failed" };
                    let e = b.err(i, Error::from_errno(errno, msg));
                    b.states[i].result = Some(Err(e));
                    return self.entry_done(b, i);
                }
                if self.direct_files {
                    b.states[i].slot = Some(res as u32);
                } else {
                    b.states[i].fd = res;
                }
                self.submit_read(id, b, i)
            }
            Phase::Read => {
                let st = &mut b.states[i];
                if res < 0 {
                    let errno = -res;
                    if is_retryable(errno) && st.retries < MAX_RETRIES {
                        st.retries += 1;
                        self.shared.stats.resubmits.fetch_add(1, Ordering::Relaxed);
                        return self.submit_read(id, b, i);
                    }
                    if errno == libc::EINVAL && st.fast && st.direct {
                        // This file's direct-I/O alignment differs from the root's: close it,
                        // then go through statx.
                        st.restart = true;
                        return self.submit_close(id, b, i);
                    }
                    let e = if errno == libc::EISDIR {
                        Error::new(ErrorKind::NotFound, "not a regular file")
                    } else {
                        Error::from_errno(errno, "read failed")
                    };
                    let e = b.err(i, e);
                    b.states[i].result = Some(Err(e));
                } else {
                    let n = res as usize;
                    st.filled += n;
                    let need = st.head + st.want;
                    // End of file: a read that returns nothing, or, where the size is not
                    // known (whole-file reads that skip statx), an O_DIRECT read that ends
                    // off the alignment (the kernel ends one short of the block only at end
                    // of file). Where the size is known, a short read is continued whatever
                    // its length, unless reads stop making progress (the file shrank).
                    let unaligned_end = st.direct && st.filled % st.align as usize != 0;
                    let mut eof = n == 0 || (st.size == SIZE_UNKNOWN && unaligned_end);
                    if st.filled < need && !eof && n < st.last_len {
                        if st.filled <= st.high {
                            st.retries += 1;
                            eof = st.retries >= MAX_RETRIES;
                        }
                        st.high = st.high.max(st.filled);
                    }
                    if st.filled < need && !eof {
                        if n < st.last_len {
                            // Short read before the end: continue from an aligned position.
                            if st.direct {
                                st.filled = align_down(st.filled as u64, st.align) as usize;
                            }
                            self.shared.stats.resubmits.fetch_add(1, Ordering::Relaxed);
                        }
                        return self.submit_read(id, b, i);
                    }
                    let st = &mut b.states[i];
                    st.filled = st.filled.max(st.high);
                    let got = st.filled.saturating_sub(st.head).min(st.want);
                    let (head, want) = (st.head, st.want);
                    let _ = want;
                    let res = match st.buf.as_mut() {
                        Some(buf) => buf.set_window(head, got).map(|()| got),
                        None => Err(Error::new(ErrorKind::InvalidInput, "request has no buffer")),
                    };
                    b.states[i].result = Some(res);
                }
                b.states[i].mark_latency();
                match b.target {
                    Target::Keys { .. } => self.submit_close(id, b, i),
                    Target::File { .. } => self.entry_done(b, i),
                }
            }
            Phase::Close => {
                if res < 0 {
                    tracing::debug!("close failed: {}", io::Error::from_raw_os_error(-res));
                }
                if b.states[i].restart {
                    return self.restart_slow(id, b, i);
                }
                self.entry_done(b, i)
            }
            Phase::Idle | Phase::Done => {}
        }
    }

    /// Puts a job back at the front of the queue (an entry must be restarted).
    fn requeue(&mut self, id: u32) {
        if !self.queue.contains(&id) {
            self.queue.push_front(id);
        }
    }

    /// Decides O_DIRECT for one file from its statx DIO alignment and the request's buffer.
    fn decide_direct(&self, b: &BatchJob, i: usize, mem: u64, off: u64, size: u64) -> Result<(bool, u64)> {
        let policy = self.shared.policy;
        if policy == DirectIoPolicy::Off {
            return Ok((false, 1));
        }
        let key = b.batch.get(i).map(|(k, _)| k).unwrap_or("");
        if mem == 0 || off == 0 {
            if policy == DirectIoPolicy::Required {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "direct I/O is required but {key:?} on {} does not support it (statx reports no DIO alignment)",
                        self.shared.fs_type
                    ),
                ));
            }
            self.shared.count_fallback("the filesystem reports no direct-I/O alignment");
            return Ok((false, 1));
        }
        let st = &b.states[i];
        let Some(buf) = st.buf.as_ref() else {
            return Ok((false, 1));
        };
        let (offset, len) = b.batch.get(i).map(|(_, e)| (e.offset(), e.len())).unwrap_or((0, 0));
        let want = len.min(size.saturating_sub(offset) as usize);
        let align = off.max(mem);
        let (_, span, _) = direct_span(offset.min(size), want.max(1), align);
        let addr_ok = (buf.as_ptr() as u64) % mem == 0;
        let fits = span <= buf.capacity();
        if addr_ok && fits {
            return Ok((true, align));
        }
        let why = if addr_ok { "buffer too small for the aligned span" } else { "buffer address not aligned" };
        if policy == DirectIoPolicy::Required {
            return Err(Error::new(
                ErrorKind::Misaligned,
                format!(
                    "direct I/O is required but {key:?} on {} needs {mem}-byte aligned memory and a buffer of at \
                     least {span} bytes ({why})",
                    self.shared.fs_type
                ),
            ));
        }
        self.shared.count_fallback(why);
        Ok((false, 1))
    }
}

impl Drop for Driver {
    /// Normally reached after the last completion (the run loop ends only then), with just the
    /// eventfd read armed. After a panic anything may be in flight: everything is cancelled
    /// and reaped with a deadline, so the drop never blocks forever. Waiters of unfinished
    /// jobs see "io_uring driver stopped". Memory the kernel may still write (buffers, paths,
    /// the eventfd word) is leaked if the kernel has not given it back by the deadline.
    fn drop(&mut self) {
        // The eventfd read by its user_data (any kernel), then everything (Linux 5.19).
        let wake = opcode::AsyncCancel::new(WAKE).build().user_data(CANCEL);
        let any = opcode::AsyncCancel2::new(types::CancelBuilder::any()).build().user_data(CANCEL);
        // SAFETY: cancellations take no pointers.
        unsafe {
            self.push_raw(&wake);
            self.push_raw(&any);
        }
        let deadline = Instant::now() + DROP_DEADLINE;
        while (self.in_flight > 0 || self.wake_armed) && Instant::now() < deadline {
            let ts = types::Timespec::new().nsec(100_000_000);
            let args = types::SubmitArgs::new().timespec(&ts);
            if let Err(e) = self.ring.submitter().submit_with_args(1, &args) {
                if !matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR | libc::EBUSY | libc::EAGAIN)) {
                    break;
                }
            }
            while let Some(cqe) = self.ring.completion().next() {
                match cqe.user_data() {
                    WAKE => self.wake_armed = false,
                    CANCEL => {}
                    _ => self.in_flight = self.in_flight.saturating_sub(1),
                }
            }
        }
        self.in_flight_gauge.set(0.0);
        if self.in_flight == 0 && !self.wake_armed {
            // The kernel holds nothing: answer what is left (only after a panic) with its
            // buffers and close the files it opened.
            for job in self.jobs.iter_mut().filter_map(Option::take) {
                match job {
                    Active::Batch(mut b) => {
                        let keys = matches!(b.target, Target::Keys { .. });
                        for st in b.states.iter_mut().filter(|st| matches!(st.phase, Phase::Read | Phase::Close)) {
                            if let Some(slot) = st.slot.take() {
                                let _ = self.ring.submitter().register_files_update(slot, &[-1]);
                            } else if keys && st.fd >= 0 {
                                // SAFETY: the entry opened this descriptor and owns it.
                                unsafe { libc::close(st.fd) };
                            }
                            st.fd = -1;
                        }
                        b.finish();
                    }
                    Active::Write(mut w) => {
                        if let Some(done) = w.done.take() {
                            let _ = done
                                .send((Err(Error::new(ErrorKind::Shutdown, "io_uring driver stopped")), w.buf.take()));
                        }
                    }
                    Active::Fsync(f) => drop(f),
                }
            }
        } else {
            tracing::error!(
                tier = %self.shared.name,
                in_flight = self.in_flight,
                "io_uring driver stopped with requests the kernel has not returned; leaking their memory"
            );
            // Fail the waiters, keep the memory.
            for job in self.jobs.iter_mut().filter_map(Option::take) {
                match job {
                    Active::Batch(mut b) => {
                        b.done.take();
                        std::mem::forget(b);
                    }
                    Active::Write(mut w) => {
                        w.done.take();
                        std::mem::forget(w);
                    }
                    Active::Fsync(f) => drop(f),
                }
            }
            std::mem::forget(std::mem::replace(&mut self.wake_buf, Box::new(0)));
        }
    }
}

/// `IORING_REGISTER_FILE_ALLOC_RANGE`: the kernel allocates direct descriptors only from
/// `[off, off + len)` (Linux 6.0). The io-uring crate has no wrapper for it.
fn set_file_alloc_range(ring: &IoUring, off: u32, len: u32) -> io::Result<()> {
    #[repr(C)]
    struct FileIndexRange {
        off: u32,
        len: u32,
        resv: u64,
    }
    const IORING_REGISTER_FILE_ALLOC_RANGE: libc::c_long = 25;
    let range = FileIndexRange { off, len, resv: 0 };
    // SAFETY: io_uring_register on our ring's descriptor with a pointer to a correctly laid
    // out io_uring_file_index_range that lives across the call; nr_args must be 0.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_io_uring_register,
            ring.as_raw_fd(),
            IORING_REGISTER_FILE_ALLOC_RANGE,
            &range as *const FileIndexRange,
            0,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn is_retryable(errno: i32) -> bool {
    matches!(errno, libc::EAGAIN | libc::EINTR)
}
