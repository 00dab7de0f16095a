//! Driver threads: each owns one io_uring, takes jobs from a channel and runs their state
//! machines (statx -> open -> read(s) -> close per file; writes; fsyncs) with at most
//! `queue_depth` requests in the kernel at once.
//!
//! * this module: the job table, the run loop (accept, fill, submit, reap), shutdown;
//! * [`ring`]: setting a ring up (registered buffers and files);
//! * [`read`]: batch reads and the per-request read state machine;
//! * [`write`]: writes and data fsyncs.
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
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, TryRecvError};
use futures_channel::oneshot;
use io_uring::{opcode, types, IoUring};
use ringtier_core::catalog;
use ringtier_core::error::{Error, ErrorKind, Result};
use ringtier_core::BufferPool;

use crate::config::DirectIoPolicy;
#[cfg(feature = "fail-points")]
use crate::fail::{FailOp, FailPoints};

mod read;
mod ring;
mod write;

pub(crate) use read::{BatchJob, Target};
pub(crate) use ring::spawn;
pub(crate) use write::{FsyncJob, WriteJob};

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
                    if b.exhausted() {
                        d.queue.pop_front();
                    }
                    !b.is_finished()
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
                    let done = b.is_finished();
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

    /// Puts a job back at the front of the queue (an entry must be restarted).
    fn requeue(&mut self, id: u32) {
        if !self.queue.contains(&id) {
            self.queue.push_front(id);
        }
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
                    Active::Batch(b) => b.abandon(&self.ring),
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
                        b.forget_caller();
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

fn is_retryable(errno: i32) -> bool {
    matches!(errno, libc::EAGAIN | libc::EINTR)
}
