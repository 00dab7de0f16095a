//! Writes of a buffer's data window (short writes continued, under O_DIRECT from an aligned
//! position) and data fsyncs.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures_channel::oneshot;
use io_uring::{opcode, types};
use ringtier_core::buf::align_down;
use ringtier_core::error::{Error, ErrorKind, Result};
use ringtier_core::AlignedBuf;

use super::{is_retryable, Driver, MAX_IO_BYTES, MAX_RETRIES};
#[cfg(feature = "fail-points")]
use crate::fail::FailOp;

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

impl Driver {
    /// Submits the rest of a write. Returns false when the job cannot go on (it has then
    /// been completed with an error and must be released).
    pub(super) fn submit_write(&mut self, id: u32, w: &mut WriteJob) -> bool {
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

    pub(super) fn submit_fsync(&mut self, id: u32, f: &mut FsyncJob) {
        let sqe = opcode::Fsync::new(types::Fd(f.file.as_raw_fd()))
            .flags(types::FsyncFlags::DATASYNC)
            .build()
            .user_data((id as u64) << 32);
        // SAFETY: fsync takes no pointers; the job's Arc keeps the file open until the
        // completion is reaped.
        unsafe { self.push_raw(&sqe) };
        self.in_flight += 1;
    }

    /// Returns true when the write job is complete.
    pub(super) fn on_write_cqe(&mut self, id: u32, w: &mut WriteJob, res: i32) -> bool {
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

    /// Returns true when the fsync is resubmitted (EAGAIN, EINTR).
    pub(super) fn on_fsync_cqe(&mut self, id: u32, f: &mut FsyncJob, res: i32) -> bool {
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
}
