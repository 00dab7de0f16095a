//! The CUDA path (feature `cuda`): host registration, a stream, async copies and events.

use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtrMut};
use ringtier_core::error::{Error, ErrorKind, Operation, Result};
use ringtier_core::AlignedBuf;

use crate::Staged;

fn cuda_err(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::new(ErrorKind::Io, format!("CUDA {what} failed: {e:?}")).with_operation(Operation::Setup)
}

/// Checks that the driver library is present (before any context is created: creating one
/// without it panics inside cudarc).
fn check_driver() -> Result<()> {
    // SAFETY: only probes for the shared library.
    if !unsafe { sys::is_culib_present() } {
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

/// An open device: its context and a copy stream.
pub(crate) struct Device {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
}

impl Device {
    pub(crate) fn open(device: usize) -> Result<Self> {
        let ctx = context(device)?;
        let stream = ctx.new_stream().map_err(|e| cuda_err("stream creation", e))?;
        Ok(Device { ctx, stream })
    }

    /// Launches one async host-to-device copy per buffer and records an event.
    pub(crate) fn copy(&self, bufs: Vec<AlignedBuf>) -> Result<InFlight> {
        let mut dst = Vec::with_capacity(bufs.len());
        for b in &bufs {
            // SAFETY: the device memory is written by the copy before anyone reads it.
            let mut d: CudaSlice<u8> =
                unsafe { self.stream.alloc::<u8>(b.len().max(1)) }.map_err(|e| cuda_err("allocation", e))?;
            {
                let (ptr, _record) = d.device_ptr_mut(&self.stream);
                // SAFETY: the source is registered page-locked memory that stays alive (in
                // `InFlight::bufs`) until the event recorded below has completed.
                unsafe { result::memcpy_htod_async(ptr, b.as_slice(), self.stream.cu_stream()) }
                    .map_err(|e| cuda_err("copy", e))?;
            }
            dst.push(d);
        }
        // Blocking-sync: a thread waiting on the event sleeps instead of spinning a core the
        // loader's decode may need.
        let event = self
            .stream
            .record_event(Some(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC))
            .map_err(|e| cuda_err("event", e))?;
        let _ = &self.ctx;
        Ok(InFlight { bufs, dst, event })
    }
}

impl Device {
    /// One copy of `len` bytes at `src` (registered memory) to a fresh device buffer, waited.
    pub(crate) fn copy_one(&self, src: *const u8, len: usize) -> Result<()> {
        // SAFETY: written by the copy before any read.
        let mut d: CudaSlice<u8> =
            unsafe { self.stream.alloc::<u8>(len.max(1)) }.map_err(|e| cuda_err("allocation", e))?;
        {
            let (ptr, _record) = d.device_ptr_mut(&self.stream);
            // SAFETY: the caller's `len` bytes at `src` are registered memory it keeps alive and
            // unwritten until this function returns, after the stream synchronised.
            let slice = unsafe { std::slice::from_raw_parts(src, len) };
            // SAFETY: as above; the device buffer holds at least `len` bytes.
            unsafe { result::memcpy_htod_async(ptr, slice, self.stream.cu_stream()) }
                .map_err(|e| cuda_err("copy", e))?;
        }
        self.stream.synchronize().map_err(|e| cuda_err("synchronize", e))
    }

    /// Copies synchronously from (pageable) buffers: the baseline without pinning or overlap.
    pub(crate) fn copy_sync(&self, bufs: &[AlignedBuf]) -> Result<()> {
        for b in bufs {
            // SAFETY: written by the copy before any read.
            let mut d: CudaSlice<u8> =
                unsafe { self.stream.alloc::<u8>(b.len().max(1)) }.map_err(|e| cuda_err("allocation", e))?;
            self.stream.memcpy_htod(b.as_slice(), &mut d).map_err(|e| cuda_err("copy", e))?;
        }
        self.stream.synchronize().map_err(|e| cuda_err("synchronize", e))
    }
}

/// A batch's copies in flight: the pinned buffers are held until the event completes.
pub(crate) struct InFlight {
    bufs: Vec<AlignedBuf>,
    dst: Vec<CudaSlice<u8>>,
    event: CudaEvent,
}

impl InFlight {
    /// Waits for the batch's event: a completed one is seen at once; otherwise a blocking
    /// thread synchronises on it (polling on the runtime's timer would add up to a
    /// millisecond, its granularity, to every batch).
    async fn done(self) -> Result<Self> {
        if self.event.is_complete() {
            return Ok(self);
        }
        tokio::task::spawn_blocking(move || {
            self.event.synchronize().map_err(|e| cuda_err("event synchronize", e))?;
            Ok(self)
        })
        .await
        .map_err(|e| Error::new(ErrorKind::Io, format!("CUDA event wait: {e}")))?
    }

    /// Waits, then hands the pinned buffers back (for the copy benchmark).
    pub(crate) async fn wait_keep(self) -> Result<Vec<AlignedBuf>> {
        Ok(self.done().await?.bufs)
    }

    pub(crate) async fn wait(self) -> Result<Vec<Staged>> {
        let done = self.done().await?;
        drop(done.bufs);
        Ok(done.dst.into_iter().map(Staged::Device).collect())
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
