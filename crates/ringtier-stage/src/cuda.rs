//! The CUDA path (feature `cuda`): host registration, a stream, async copies and events.

use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtrMut};
use ringtier_core::blocking::BlockingPool;
use ringtier_core::error::{Error, ErrorKind, Operation, Result};

use crate::hooks::{Hooks, Probe};
use crate::inflight::{start_error, Completion, CopyItem, Fence, InFlight, Reaper, Span};

fn cuda_err(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::new(ErrorKind::Io, format!("CUDA {what} failed: {e:?}")).with_operation(Operation::Setup)
}

/// Whether the driver library (libcuda) loads; creates no context.
pub(crate) fn driver_present() -> bool {
    // SAFETY: only probes for the shared library.
    unsafe { sys::is_culib_present() }
}

/// Checks that the driver library is present (before any context is created: creating one
/// without it panics inside cudarc).
fn check_driver() -> Result<()> {
    if !driver_present() {
        return Err(Error::new(ErrorKind::Unsupported, "no CUDA driver (libcuda) on this machine")
            .with_operation(Operation::Setup));
    }
    Ok(())
}

/// The device's primary context, after checking the driver and the device index.
fn context(device: usize) -> Result<Arc<CudaContext>> {
    check_driver()?;
    let n = CudaContext::device_count().map_err(|e| cuda_err("device count", e))?;
    if device >= n.max(0) as usize {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("CUDA device {device} does not exist ({n} device(s))"),
        ));
    }
    CudaContext::new(device).map_err(|e| cuda_err("context creation", e))
}

/// An open device: a copy stream, and a thread that observes each batch's completion event
/// and only then releases what the batch's copies read.
pub(crate) struct Device {
    /// Dropped first: joining it waits for every queued batch's event.
    waiter: BlockingPool,
    stream: Arc<CudaStream>,
    hooks: Arc<Hooks>,
}

impl Device {
    pub(crate) fn open(device: usize, hooks: Arc<Hooks>) -> Result<Self> {
        let ctx = context(device)?;
        let stream = ctx.new_stream().map_err(|e| cuda_err("stream creation", e))?;
        let waiter = BlockingPool::new("ringtier-stage-cuda-wait", 1)?;
        Ok(Device { waiter, stream, hooks })
    }

    /// Starts one async host-to-device copy per item on the stream, records an event behind
    /// them and hands the batch's reaper to the waiter thread. If copy `k` cannot be started,
    /// the items from `k` on are released at once, the started ones after the event, and the
    /// error says so.
    pub(crate) fn launch(&self, items: Vec<CopyItem>, keep: bool) -> Result<InFlight<CudaSlice<u8>>> {
        let count = items.len();
        let completion = Completion::new(count);
        // Made before the first copy starts, fenced by the whole stream until the event is
        // recorded: from then on, whatever happens here (an early return, a panic) drops it,
        // and its drop waits for the started copies.
        let mut reaper = Reaper::new(
            CudaFence::Stream(Arc::clone(&self.stream)),
            Arc::clone(&completion),
            keep,
            Arc::clone(&self.hooks),
        );
        let mut failure = None;
        for (index, CopyItem { span, bufs, label }) in items.into_iter().enumerate() {
            // Held before the copy can start reading them.
            let held = bufs.len();
            reaper.hold(bufs);
            let ready = self.hooks.before_copy(&span).and_then(|probe| match self.alloc(span.len()) {
                Ok(d) => Ok((probe, d)),
                Err(e) => {
                    self.hooks.done_reading(&probe);
                    Err(e)
                }
            });
            let (probe, mut d) = match ready {
                Ok(r) => r,
                Err(e) => {
                    // Never started: released here, and so are the items after it.
                    drop(reaper.unhold(held));
                    failure = Some(start_error(e, index, count, index, &label));
                    break;
                }
            };
            let enqueued = self.enqueue(span, &mut d);
            reaper.hold_probe(probe);
            if let Err(e) = enqueued {
                // The driver refused the copy; its buffers stay held until the fence all the same.
                failure = Some(start_error(e, index, count, index + 1, &label));
                break;
            }
            reaper.hold_output(index, d);
        }
        if !reaper.is_empty() {
            // Blocking-sync: the waiter thread sleeps on the event instead of spinning a core
            // the loader's decode may need. Without an event the stream itself is the fence.
            match self.stream.record_event(Some(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC)) {
                Ok(event) => reaper.set_fence(CudaFence::Event(event)),
                Err(e) => tracing::warn!("recording a staging event ({e:?}); synchronising the stream instead"),
            }
        }
        // The waiter observes the fence, then releases. If the waiter is gone the job is
        // dropped unrun, which observes and releases on this thread.
        drop(self.waiter.run(move || {
            drop(reaper);
            Ok(())
        }));
        match failure {
            Some(e) => Err(e),
            None => Ok(InFlight::new(completion)),
        }
    }

    /// A device buffer for a copy of `len` bytes.
    fn alloc(&self, len: usize) -> Result<CudaSlice<u8>> {
        // SAFETY: the device memory is written by the copy before anyone reads it.
        unsafe { self.stream.alloc::<u8>(len.max(1)) }.map_err(|e| cuda_err("allocation", e))
    }

    /// Enqueues the copy of `span` into `d` on the stream.
    fn enqueue(&self, span: Span, d: &mut CudaSlice<u8>) -> Result<()> {
        let (ptr, _record) = d.device_ptr_mut(&self.stream);
        // SAFETY: the span's buffers are held by the batch's reaper, which keeps them until its
        // fence (behind this copy on the stream) has completed.
        let src = unsafe { span.bytes() };
        // SAFETY: as above; `d` holds at least `src.len()` bytes (`alloc(span.len())`).
        unsafe { result::memcpy_htod_async(ptr, src, self.stream.cu_stream()) }.map_err(|e| cuda_err("copy", e))
    }
}

/// What a CUDA batch's reaper waits on.
enum CudaFence {
    /// Everything enqueued on the stream (until the batch's event is recorded).
    Stream(Arc<CudaStream>),
    /// The batch's event, recorded behind its copies.
    Event(CudaEvent),
}

impl Fence<CudaSlice<u8>> for CudaFence {
    fn observe(&mut self) -> Result<()> {
        match self {
            CudaFence::Stream(s) => s.synchronize().map_err(|e| cuda_err("stream synchronize", e)),
            CudaFence::Event(e) => e.synchronize().map_err(|e| cuda_err("event synchronize", e)),
        }
    }

    fn after_observe(&self, outputs: &[(usize, CudaSlice<u8>)], probes: &[Probe], hooks: &Hooks) {
        if !hooks.wants_bytes() {
            return;
        }
        for ((_, d), p) in outputs.iter().zip(probes) {
            // Into pageable memory the copy is complete on return; synchronised all the same.
            match d.stream().memcpy_dtov(d).and_then(|v| d.stream().synchronize().map(|()| v)) {
                Ok(v) => hooks.verify(p, Some(&v)),
                Err(e) => tracing::warn!("reading back staged bytes: {e:?}"),
            }
        }
    }
}

/// Host memory registered with the driver. Holds the (primary) context: releasing the last
/// reference to it would reset the context and drop the registration with it.
pub(crate) struct Registration {
    ctx: Arc<CudaContext>,
    /// The registered address (kept as an integer: the allocation is owned elsewhere).
    addr: usize,
}

impl Registration {
    /// Unregisters the memory (call before freeing it), from any thread.
    pub(crate) fn unregister(self) {
        if let Err(e) = self.ctx.bind_to_thread() {
            tracing::warn!("binding the CUDA context to unregister staging memory: {e:?}");
        }
        // SAFETY: addr was registered by `register` in this context and is still allocated.
        let res = unsafe { sys::cuMemHostUnregister(self.addr as *mut std::ffi::c_void) }.result();
        if let Err(e) = res {
            tracing::warn!("unregistering staging memory: {e:?}");
        }
    }
}

/// Registers `len` bytes at `ptr` with the driver (portable, not write-combined).
pub(crate) fn register(device: usize, ptr: NonNull<u8>, len: usize) -> Result<Registration> {
    let ctx = context(device)?;
    ctx.bind_to_thread().map_err(|e| cuda_err("context binding", e))?;
    // SAFETY: ptr..ptr+len is our own live allocation; unregistered before it is freed.
    unsafe { sys::cuMemHostRegister_v2(ptr.as_ptr().cast(), len, sys::CU_MEMHOSTREGISTER_PORTABLE) }
        .result()
        .map_err(|e| cuda_err("host registration", e))?;
    Ok(Registration { ctx, addr: ptr.as_ptr() as usize })
}
