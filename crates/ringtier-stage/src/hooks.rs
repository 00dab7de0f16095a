//! Test hooks of the copy engines: fail points and observers, compiled in for this crate's
//! tests only. Outside tests [`Hooks`] and [`Probe`] are empty and every method is an inlined
//! no-op, so the engines call them unconditionally at no cost.

pub(crate) use imp::{Hooks, Probe};

#[cfg(not(test))]
mod imp {
    use ringtier_core::error::{Error, Result};

    use crate::inflight::Span;

    /// No hooks outside tests.
    #[derive(Debug, Default)]
    pub(crate) struct Hooks;

    /// Nothing recorded outside tests.
    #[derive(Debug)]
    pub(crate) struct Probe;

    impl Hooks {
        /// Before a copy of `span` is started.
        #[inline(always)]
        pub(crate) fn before_copy(&self, _span: &Span) -> Result<Probe> {
            Ok(Probe)
        }

        /// A copy engine's own failure, part-way through (the host copy thread).
        #[inline(always)]
        pub(crate) fn copy_fault(&self) -> Option<Error> {
            None
        }

        /// Between two chunks of a host copy.
        #[inline(always)]
        pub(crate) fn between_chunks(&self) {}

        /// Whether `verify` wants the destination bytes (a device read-back).
        #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
        #[inline(always)]
        pub(crate) fn wants_bytes(&self) -> bool {
            false
        }

        /// The copy of `probe` wrote `dst` (when known).
        #[inline(always)]
        pub(crate) fn verify(&self, _probe: &Probe, _dst: Option<&[u8]>) {}

        /// The copy of `probe` no longer reads its source (finished, or dropped unstarted).
        #[inline(always)]
        pub(crate) fn done_reading(&self, _probe: &Probe) {}

        /// A batch completed after its handle was dropped.
        #[inline(always)]
        pub(crate) fn orphan_completed(&self) {}
    }
}

#[cfg(test)]
mod imp {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::sync::Mutex;

    use ringtier_core::error::{Error, ErrorKind, Result};

    use crate::inflight::Span;

    /// Fail points and observers shared by a stager's copy engine and a test.
    #[derive(Debug, Default)]
    pub(crate) struct Hooks {
        /// 0: off; n: the n-th copy started from now on fails before it starts.
        pub(crate) fail_start_in: AtomicUsize,
        /// 0: off; n: the n-th host copy run from now on fails (the copy thread's own error).
        pub(crate) fail_copy_in: AtomicUsize,
        /// Pause between 16 KiB chunks of a host copy, in nanoseconds (a slow copy engine).
        pub(crate) chunk_delay_ns: AtomicU64,
        /// Source ranges (start, len) whose copy is queued or running.
        reading: Mutex<Vec<(usize, usize)>>,
        /// Copies whose destination matched the source as it was when the copy started.
        pub(crate) verified: AtomicUsize,
        /// Copies whose destination did not (a source reused while it was being copied).
        pub(crate) mismatches: AtomicUsize,
        /// Batches that completed with no handle left to wait for them.
        pub(crate) orphans: AtomicUsize,
    }

    /// What a copy read when it started.
    #[derive(Debug)]
    pub(crate) struct Probe {
        start: usize,
        expected: Vec<u8>,
    }

    /// Counts `a` down; true on the step that reaches zero.
    fn fires(a: &AtomicUsize) -> bool {
        a.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1)) == Ok(1)
    }

    impl Hooks {
        pub(crate) fn before_copy(&self, span: &Span) -> Result<Probe> {
            if fires(&self.fail_start_in) {
                return Err(Error::new(ErrorKind::Io, "injected copy error (test fail point)"));
            }
            // SAFETY: called by the engines while the span's buffers are held by the batch.
            let bytes = unsafe { span.bytes() };
            let start = bytes.as_ptr() as usize;
            self.reading.lock().unwrap_or_else(|p| p.into_inner()).push((start, bytes.len()));
            Ok(Probe { start, expected: bytes.to_vec() })
        }

        pub(crate) fn copy_fault(&self) -> Option<Error> {
            fires(&self.fail_copy_in)
                .then(|| Error::new(ErrorKind::Io, "injected failure of the copy engine (test fail point)"))
        }

        pub(crate) fn between_chunks(&self) {
            let ns = self.chunk_delay_ns.load(Ordering::Relaxed);
            if ns > 0 {
                std::thread::sleep(std::time::Duration::from_nanos(ns));
            }
        }

        #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
        pub(crate) fn wants_bytes(&self) -> bool {
            true
        }

        pub(crate) fn verify(&self, probe: &Probe, dst: Option<&[u8]>) {
            match dst {
                Some(d) if d == probe.expected.as_slice() => self.verified.fetch_add(1, Ordering::SeqCst),
                Some(_) => self.mismatches.fetch_add(1, Ordering::SeqCst),
                None => 0,
            };
        }

        pub(crate) fn done_reading(&self, probe: &Probe) {
            let mut r = self.reading.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(i) = r.iter().position(|&(s, l)| s == probe.start && l == probe.expected.len()) {
                r.swap_remove(i);
            }
        }

        pub(crate) fn orphan_completed(&self) {
            self.orphans.fetch_add(1, Ordering::SeqCst);
        }

        /// Whether a copy that is queued or running reads any of [start, start + len).
        pub(crate) fn is_read(&self, start: usize, len: usize) -> bool {
            let r = self.reading.lock().unwrap_or_else(|p| p.into_inner());
            r.iter().any(|&(s, l)| s < start + len && start < s + l)
        }

        /// Copies queued or running.
        pub(crate) fn reading(&self) -> usize {
            self.reading.lock().unwrap_or_else(|p| p.into_inner()).len()
        }
    }
}
