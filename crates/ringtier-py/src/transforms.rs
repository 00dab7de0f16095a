//! `ringtier.transforms` in Rust: a compiled chain (decode, crop, resize, flip, CHW layout,
//! dtype, normalization; `ringtier_decode::DecodeConfig`) run on a pool of threads over a
//! batch of encoded images, into one buffer per batch.
//!
//! Python compiles a `Compose` into a [`TransformPipeline`] (`python/ringtier/transforms.py`).
//! [`TransformPipeline::submit`] takes the encoded images of one batch (any objects with the
//! buffer protocol: loader samples, record fields, `bytes`), holds a buffer view of each until
//! the batch is done, and queues one job per image; the images of sample `i` land at
//! `i * sample_bytes` of the batch's buffer. That buffer is either the pipeline's own (from a
//! small free list, exported to torch through [`crate::buffer::ExportedBytes`] without a
//! copy), or one the caller passes (`out=`, e.g. a pinned torch tensor's memory). The random
//! crop and flip of a sample depend only on (seed, epoch, index).

use std::ffi::c_int;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

use pyo3::buffer::PyUntypedBuffer;
use pyo3::prelude::*;
use pyo3::types::PyList;
use ringtier_core::blocking::BlockingPool;
use ringtier_core::AlignedBuf;
use ringtier_decode::{Crop, DecodeConfig, JpegDecoder, Layout, Normalize, SampleRng};

use crate::buffer::{ExportedBytes, OwnedBytes};
use crate::engine::ForkGuarded;
use crate::errors::{self, IntoPy};

/// Alignment of a batch buffer (the page: no copy into it straddles a page boundary badly).
const BATCH_ALIGN: usize = 4096;

/// Batch buffers kept for reuse once torch lets go of them (page faults on fresh memory cost
/// about as much as a memcpy of it).
const FREE_BUFFERS: usize = 4;

/// The largest batch a pipeline takes (images); bounds the buffer allocated per batch.
const MAX_BATCH: usize = 1 << 16;

/// How often a wait wakes to run Python's signal handlers (Ctrl-C).
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// The output element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dtype {
    U8,
    F32,
}

impl Dtype {
    fn name(self) -> &'static str {
        match self {
            Dtype::U8 => "uint8",
            Dtype::F32 => "float32",
        }
    }
}

/// Batch buffers no longer viewed, for the next batches.
#[derive(Debug, Default)]
struct FreeList {
    bufs: Mutex<Vec<AlignedBuf>>,
}

impl FreeList {
    fn lock(&self) -> MutexGuard<'_, Vec<AlignedBuf>> {
        self.bufs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A batch's memory, owned by the pipeline: back to the free list when the last view goes.
#[derive(Debug)]
struct BatchBuf {
    buf: Option<AlignedBuf>,
    home: Weak<FreeList>,
    /// The process that allocated it: a copy inherited through `fork()` is leaked there.
    pid: u32,
}

impl OwnedBytes for BatchBuf {
    fn as_mut_bytes(&mut self) -> &mut [u8] {
        match self.buf.as_mut() {
            Some(b) => b.as_mut_slice(),
            None => &mut [],
        }
    }
}

impl Drop for BatchBuf {
    fn drop(&mut self) {
        let Some(buf) = self.buf.take() else { return };
        if std::process::id() != self.pid {
            std::mem::forget(buf);
            return;
        }
        if let Some(home) = self.home.upgrade() {
            let mut free = home.lock();
            if free.len() < FREE_BUFFERS {
                free.push(buf);
            }
        }
    }
}

/// Memory a batch's jobs read or write, valid until the batch is complete (see [`Job`]).
#[derive(Debug, Clone, Copy)]
struct RawSpan {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a span points into memory that its batch (`PendingBatch`) keeps alive (a held buffer
// view or an owned buffer) until every job using it has finished; output spans of one batch
// are disjoint, so no two threads write the same bytes.
unsafe impl Send for RawSpan {}

impl RawSpan {
    /// The span's memory as bytes to read.
    ///
    /// # Safety
    ///
    /// The memory is alive and not written by anyone else while the slice is used.
    unsafe fn bytes<'a>(self) -> &'a [u8] {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(self.ptr.cast_const(), self.len) }
    }

    /// `len` bytes at `offset` of the span, to write.
    ///
    /// # Safety
    ///
    /// `offset + len` is within the span, the memory is alive and no one else reads or writes
    /// those bytes while the slice is used.
    unsafe fn slice_mut<'a>(self, offset: usize, len: usize) -> &'a mut [u8] {
        debug_assert!(offset + len <= self.len);
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(offset), len) }
    }
}

/// One batch's progress: the jobs not finished yet and the failures so far.
#[derive(Debug)]
struct Job {
    state: Mutex<JobState>,
    done: Condvar,
}

#[derive(Debug)]
struct JobState {
    remaining: usize,
    /// (position in the batch, why) of each sample that failed.
    failed: Vec<(usize, String)>,
}

impl Job {
    fn lock(&self) -> MutexGuard<'_, JobState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn finish(&self, failed: Option<(usize, String)>) {
        let mut st = self.lock();
        st.remaining -= 1;
        if let Some(f) = failed {
            st.failed.push(f);
        }
        if st.remaining == 0 {
            self.done.notify_all();
        }
    }

    /// Blocks until every job finished (no GIL needed: the jobs never take it).
    fn wait_all(&self) {
        let mut st = self.lock();
        while st.remaining > 0 {
            st = self.done.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// The decode threads and the free list, in the process that made them.
#[derive(Debug)]
struct Workers {
    pool: BlockingPool,
    free: Arc<FreeList>,
}

/// A compiled transform chain and the threads that run it (see the stub for the Python
/// documentation).
#[pyclass(module = "ringtier._ringtier", name = "TransformPipeline", frozen)]
#[derive(Debug)]
pub(crate) struct TransformPipeline {
    cfg: DecodeConfig,
    dtype: Dtype,
    seed: u64,
    workers: ForkGuarded<Workers>,
}

impl TransformPipeline {
    /// The compiled chain.
    pub(crate) fn config(&self) -> &DecodeConfig {
        &self.cfg
    }

    fn sample_bytes(&self) -> usize {
        self.cfg.output_bytes()
    }

    /// A batch buffer of `n` samples from the free list, or a new one.
    fn batch_buffer(&self, free: &Arc<FreeList>, n: usize) -> PyResult<BatchBuf> {
        let bytes = n * self.sample_bytes();
        let reused = {
            let mut list = free.lock();
            list.iter().position(|b| b.capacity() >= bytes).map(|i| list.swap_remove(i))
        };
        let mut buf = match reused {
            Some(b) => b,
            None => AlignedBuf::new(bytes, BATCH_ALIGN).py_err()?,
        };
        buf.set_window(0, bytes).py_err()?;
        Ok(BatchBuf { buf: Some(buf), home: Arc::downgrade(free), pid: std::process::id() })
    }
}

/// A readable, C-contiguous buffer view of `obj`, or a clear TypeError.
fn input_view(obj: &Bound<'_, PyAny>, i: usize) -> PyResult<PyUntypedBuffer> {
    let view = PyUntypedBuffer::get(obj).map_err(|_| {
        errors::type_error(format!(
            "batch item {i} is a {}, not encoded image bytes (a ringtier Sample or RecordField, bytes, a uint8 \
             array or tensor.numpy())",
            obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
        ))
    })?;
    if !view.is_c_contiguous() {
        return Err(errors::type_error(format!("batch item {i} is not contiguous memory")));
    }
    Ok(view)
}

#[pymethods]
impl TransformPipeline {
    #[new]
    #[pyo3(signature = (size, *, crop="resize", resize=None, scale=(0.08, 1.0), ratio=(0.75, 4.0 / 3.0),
        flip=None, mean=None, std=None, dtype="float32", seed=0, threads=None, dct_scaling=true))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        size: u32,
        crop: &str,
        resize: Option<u32>,
        scale: (f64, f64),
        ratio: (f64, f64),
        flip: Option<f64>,
        mean: Option<[f32; 3]>,
        std: Option<[f32; 3]>,
        dtype: &str,
        seed: u64,
        threads: Option<usize>,
        dct_scaling: bool,
    ) -> PyResult<Self> {
        let crop = match (crop, resize) {
            ("resize", None) => Crop::Resize,
            ("center", Some(resize)) => Crop::Center { resize },
            ("center_crop", None) => Crop::CenterCrop,
            ("random_resized", None) => Crop::RandomResized { scale, ratio },
            ("center", None) => return Err(errors::invalid("crop \"center\" needs resize=".into())),
            (other, _) => {
                return Err(errors::invalid(format!(
                    "crop must be \"resize\", \"center\" (with resize=), \"center_crop\" or \"random_resized\", not \
                     {other:?}{}",
                    if resize.is_some() { " with resize=" } else { "" }
                )))
            }
        };
        let dtype = match dtype {
            "uint8" => Dtype::U8,
            "float32" => Dtype::F32,
            other => return Err(errors::invalid(format!("dtype must be \"uint8\" or \"float32\", not {other:?}"))),
        };
        let normalize = match (dtype, mean, std) {
            (Dtype::U8, None, None) => None,
            (Dtype::U8, _, _) => return Err(errors::invalid("mean/std need dtype \"float32\"".into())),
            (Dtype::F32, mean, std) => Some(Normalize { mean: mean.unwrap_or([0.0; 3]), std: std.unwrap_or([1.0; 3]) }),
        };
        let threads = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
        if threads == 0 {
            return Err(errors::invalid("threads must be at least 1".into()));
        }
        let mut cfg = DecodeConfig::default()
            .with_size(size)
            .with_threads(threads)
            .with_crop(crop)
            .with_flip(flip.is_some())
            .with_layout(Layout::Chw)
            .with_normalize(normalize)
            .with_dct_scaling(dct_scaling);
        if let Some(p) = flip {
            cfg = cfg.with_flip_probability(p);
        }
        cfg.validate().py_err()?;
        let workers =
            Workers { pool: BlockingPool::new("ringtier-transform", threads).py_err()?, free: Arc::default() };
        Ok(TransformPipeline { cfg, dtype, seed, workers: ForkGuarded::new("TransformPipeline", workers) })
    }

    /// Starts decoding and transforming `items` (encoded images) into one batch; sample `i`'s
    /// random draws come from (seed, `epoch`, `indices[i]`). `out`: a writable, contiguous
    /// buffer of exactly `len(items) * sample_bytes` bytes to fill instead of the pipeline's
    /// own (a pinned tensor's `.numpy()`). `pixels=SIDE`: the items are stored pixels of the
    /// split point (`SIDE` x `SIDE` x 3 `uint8`, from a loader with `materialize_for=` this
    /// pipeline), and only the steps after it run.
    #[pyo3(signature = (items, indices, epoch=0, out=None, pixels=None))]
    fn submit(
        &self,
        items: &Bound<'_, PyList>,
        indices: Vec<u64>,
        epoch: u64,
        out: Option<&Bound<'_, PyAny>>,
        pixels: Option<u32>,
    ) -> PyResult<PendingBatch> {
        let workers = self.workers.get()?;
        let n = items.len();
        if indices.len() != n {
            return Err(errors::invalid(format!("{n} items but {} indices", indices.len())));
        }
        if n > MAX_BATCH {
            return Err(errors::invalid(format!("a batch of {n} images is over the limit of {MAX_BATCH}")));
        }
        let stride = self.sample_bytes();
        let mut views = Vec::with_capacity(n);
        for (i, item) in items.iter().enumerate() {
            let view = input_view(&item, i)?;
            if let Some(side) = pixels {
                let want = side as usize * side as usize * 3;
                if view.len_bytes() != want {
                    return Err(errors::invalid(format!(
                        "batch item {i} is {} bytes, not {side}x{side}x3 stored pixels ({want} bytes)",
                        view.len_bytes()
                    )));
                }
            }
            views.push(view);
        }
        // After the split point: the random crop on the stored image, or a copy of a stored crop.
        let (cfg, side) = match pixels {
            Some(0) => return Err(errors::invalid("pixels= must be at least 1".into())),
            Some(side) => (crate::materialize::online_config(&self.cfg), Some(side)),
            None => (self.cfg, None),
        };
        let (output, out_span) = match out {
            Some(obj) => {
                let view = PyUntypedBuffer::get(obj)
                    .map_err(|_| errors::type_error("out= must support the buffer protocol".into()))?;
                if view.readonly() || !view.is_c_contiguous() || view.len_bytes() != n * stride {
                    return Err(errors::invalid(format!(
                        "out= must be writable, contiguous and {} bytes ({n} samples of {stride}); it is {} bytes{}{}",
                        n * stride,
                        view.len_bytes(),
                        if view.readonly() { ", read-only" } else { "" },
                        if view.is_c_contiguous() { "" } else { ", not contiguous" },
                    )));
                }
                let span = RawSpan { ptr: view.buf_ptr().cast::<u8>(), len: view.len_bytes() };
                (Output::External(view), span)
            }
            None => {
                let mut buf = self.batch_buffer(&workers.free, n)?;
                let bytes = buf.as_mut_bytes();
                let span = RawSpan { ptr: bytes.as_mut_ptr(), len: bytes.len() };
                (Output::Owned(buf), span)
            }
        };
        let job =
            Arc::new(Job { state: Mutex::new(JobState { remaining: n, failed: Vec::new() }), done: Condvar::new() });
        for (i, view) in views.iter().enumerate() {
            let input = RawSpan { ptr: view.buf_ptr().cast::<u8>(), len: view.len_bytes() };
            let (job, seed, index) = (Arc::clone(&job), self.seed, indices[i]);
            let run = move || {
                // SAFETY: `input` is a buffer view and `out_span` the batch's output, both held by
                // the `PendingBatch` until every job of it finished (its `wait` and `Drop` wait for
                // them); sample `i`'s slice `i * stride .. (i + 1) * stride` is within `out_span`
                // (its length is `n * stride`) and no other job writes it.
                let (src, dst) = unsafe { (input.bytes(), out_span.slice_mut(i * stride, stride)) };
                // A panic in a decoder must still count the job, or `wait` would never return.
                let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    JpegDecoder::with_thread_local(|dec| {
                        let mut rng = SampleRng::new(seed, epoch, index);
                        match side {
                            Some(s) => dec.transform_rgb(src, s, s, &cfg, &mut rng, dst).map(|_| ()),
                            None => dec.decode_into(src, &cfg, &mut rng, dst).map(|_| ()),
                        }
                    })
                }));
                let failed = match res {
                    Ok(Ok(_)) => None,
                    Ok(Err(e)) => Some((i, e.to_string())),
                    Err(_) => Some((i, "the decoder panicked on this image".to_string())),
                };
                job.finish(failed);
                Ok(())
            };
            // The job is queued now; its completion is counted in `job`, not in this future.
            drop(workers.pool.run(run));
        }
        let shape = (n, 3, self.cfg.size as usize, self.cfg.size as usize);
        Ok(PendingBatch {
            pid: std::process::id(),
            job,
            views: Some(views),
            output: Some(output),
            shape,
            stride,
            dtype: self.dtype,
            indices,
        })
    }

    /// Transforms one RGB image already decoded (`rgb`: height x width x 3 `uint8`, C order),
    /// as sample `index` of `epoch`: the same crop, flip and output as a decoded JPEG.
    #[pyo3(signature = (rgb, height, width, index=0, epoch=0))]
    fn apply_rgb(
        &self,
        py: Python<'_>,
        rgb: &Bound<'_, PyAny>,
        height: u32,
        width: u32,
        index: u64,
        epoch: u64,
    ) -> PyResult<TransformedBatch> {
        let workers = self.workers.get()?;
        let view = input_view(rgb, 0)?;
        let expected = height as usize * width as usize * 3;
        if view.len_bytes() != expected {
            return Err(errors::invalid(format!(
                "an RGB image of {height}x{width} is {expected} bytes, the buffer has {}",
                view.len_bytes()
            )));
        }
        let mut buf = self.batch_buffer(&workers.free, 1)?;
        let (cfg, seed) = (self.cfg, self.seed);
        let src = RawSpan { ptr: view.buf_ptr().cast::<u8>(), len: view.len_bytes() };
        let dst = buf.as_mut_bytes();
        py.detach(move || {
            // SAFETY: `view` holds the source's memory for this call; `dst` is ours.
            let src = unsafe { src.bytes() };
            JpegDecoder::with_thread_local(|dec| {
                dec.transform_rgb(src, width, height, &cfg, &mut SampleRng::new(seed, epoch, index), dst)
            })
        })
        .py_err()?;
        drop(view);
        let shape = (1, 3, self.cfg.size as usize, self.cfg.size as usize);
        Ok(TransformedBatch::owned(buf, shape, self.dtype, vec![index], Vec::new()))
    }

    /// Bytes of one output sample: 3 x size x size, times 4 for float32.
    #[getter(sample_bytes)]
    fn get_sample_bytes(&self) -> usize {
        self.sample_bytes()
    }

    /// The output side in pixels.
    #[getter]
    fn size(&self) -> u32 {
        self.cfg.size
    }

    /// `"uint8"` or `"float32"`.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.name()
    }

    /// Decode threads.
    #[getter]
    fn threads(&self) -> usize {
        self.cfg.threads
    }

    /// The seed of the random crop and flip.
    #[getter]
    fn seed(&self) -> u64 {
        self.seed
    }

    fn __repr__(&self) -> String {
        format!(
            "ringtier.TransformPipeline(size={}, crop={:?}, flip={}, dtype={:?}, normalize={:?}, seed={}, threads={})",
            self.cfg.size,
            self.cfg.crop,
            if self.cfg.flip { self.cfg.flip_probability } else { 0.0 },
            self.dtype.name(),
            self.cfg.normalize,
            self.seed,
            self.cfg.threads
        )
    }
}

/// Where a batch's pixels go.
#[derive(Debug)]
enum Output {
    Owned(BatchBuf),
    /// The caller's memory (`out=`), viewed until the batch is done.
    External(PyUntypedBuffer),
}

/// A batch being decoded: [`PendingBatch::wait`] gives the [`TransformedBatch`].
#[pyclass(module = "ringtier._ringtier", name = "PendingBatch")]
#[derive(Debug)]
pub(crate) struct PendingBatch {
    /// The process that submitted it: the jobs run on that process's threads only.
    pid: u32,
    job: Arc<Job>,
    /// The inputs' buffer views, released once the jobs are done.
    views: Option<Vec<PyUntypedBuffer>>,
    output: Option<Output>,
    shape: (usize, usize, usize, usize),
    stride: usize,
    dtype: Dtype,
    indices: Vec<u64>,
}

#[pymethods]
impl PendingBatch {
    /// Waits (GIL released) until every image is done; failed images are left out, the others
    /// moved up to keep the batch dense (see `TransformedBatch.failed`).
    fn wait(&mut self, py: Python<'_>) -> PyResult<TransformedBatch> {
        if std::process::id() != self.pid {
            return Err(errors::fork_error(format!(
                "this batch was submitted in process {} and inherited through fork(): its decode threads do not \
                 exist here",
                self.pid
            )));
        }
        loop {
            let finished = py.detach(|| {
                let st = self.job.lock();
                if st.remaining == 0 {
                    return true;
                }
                let (st, _) = self.job.done.wait_timeout(st, SIGNAL_POLL).unwrap_or_else(|p| p.into_inner());
                st.remaining == 0
            });
            if finished {
                break;
            }
            py.check_signals()?;
        }
        self.views = None;
        let Some(mut output) = self.output.take() else {
            return Err(errors::closed("this batch was already taken".into()));
        };
        let mut failed = std::mem::take(&mut self.job.lock().failed);
        failed.sort_by_key(|f| f.0);
        let n = self.shape.0;
        let mut kept = Vec::with_capacity(n);
        if !failed.is_empty() {
            // Move the good samples up, in order, over the failed ones.
            let bytes: &mut [u8] = match &mut output {
                Output::Owned(b) => b.as_mut_bytes(),
                Output::External(view) => {
                    // SAFETY: the caller's writable, contiguous buffer of `len_bytes`, viewed by
                    // `view` for this call; no job runs any more.
                    unsafe { std::slice::from_raw_parts_mut(view.buf_ptr().cast::<u8>(), view.len_bytes()) }
                }
            };
            let mut next = 0;
            for i in 0..n {
                if failed.iter().any(|f| f.0 == i) {
                    continue;
                }
                if next != i {
                    bytes.copy_within(i * self.stride..(i + 1) * self.stride, next * self.stride);
                }
                kept.push(self.indices[i]);
                next += 1;
            }
        } else {
            kept.clone_from(&self.indices);
        }
        let failed: Vec<(u64, String)> = failed.into_iter().map(|(i, why)| (self.indices[i], why)).collect();
        let shape = (kept.len(), self.shape.1, self.shape.2, self.shape.3);
        Ok(match output {
            Output::Owned(mut b) => {
                if let Some(buf) = b.buf.as_mut() {
                    buf.set_window(0, kept.len() * self.stride).py_err()?;
                }
                TransformedBatch::owned(b, shape, self.dtype, kept, failed)
            }
            Output::External(view) => {
                drop(view);
                TransformedBatch { bytes: None, shape, dtype: self.dtype, indices: kept, failed }
            }
        })
    }

    /// True once every image of the batch is done.
    #[getter]
    fn done(&self) -> bool {
        self.job.lock().remaining == 0
    }
}

impl Drop for PendingBatch {
    fn drop(&mut self) {
        if std::process::id() != self.pid {
            // Inherited through fork(): no thread here will finish the jobs; leak what they
            // would have used rather than wait forever.
            std::mem::forget(self.views.take());
            std::mem::forget(self.output.take());
            return;
        }
        // The jobs read the views and write the output: both stay until they finish.
        self.job.wait_all();
    }
}

/// The images of one batch, `(n, 3, size, size)` CHW, `uint8` or `float32` (native byte
/// order): the buffer protocol exposes the pipeline's buffer (one dimension, bytes) without a
/// copy; with `out=` the pixels are in the caller's buffer and this one is empty.
#[pyclass(module = "ringtier._ringtier", name = "TransformedBatch", frozen)]
#[derive(Debug)]
pub(crate) struct TransformedBatch {
    bytes: Option<ExportedBytes<BatchBuf>>,
    /// (samples, channels, height, width).
    #[pyo3(get)]
    shape: (usize, usize, usize, usize),
    dtype: Dtype,
    /// The indices of the samples in the batch, in order (the failed ones left out).
    #[pyo3(get)]
    indices: Vec<u64>,
    /// (index, why) of each sample that failed to decode, left out of the batch.
    #[pyo3(get)]
    failed: Vec<(u64, String)>,
}

impl TransformedBatch {
    fn owned(
        buf: BatchBuf,
        shape: (usize, usize, usize, usize),
        dtype: Dtype,
        indices: Vec<u64>,
        failed: Vec<(u64, String)>,
    ) -> Self {
        TransformedBatch { bytes: Some(ExportedBytes::new(buf)), shape, dtype, indices, failed }
    }
}

#[pymethods]
impl TransformedBatch {
    /// `"uint8"` or `"float32"`.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.name()
    }

    /// Bytes exported (0 when the pixels went to `out=`).
    fn __len__(&self) -> usize {
        self.bytes.as_ref().map_or(0, |b| b.len())
    }

    fn __repr__(&self) -> String {
        format!(
            "ringtier.TransformedBatch(shape={:?}, dtype={:?}, failed={})",
            self.shape,
            self.dtype.name(),
            self.failed.len()
        )
    }

    /// Exposes the pixels: one dimension, format `B`, writable.
    unsafe fn __getbuffer__(slf: PyRef<'_, Self>, view: *mut pyo3::ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let Some(bytes) = slf.bytes.as_ref() else {
            return Err(pyo3::exceptions::PyBufferError::new_err(
                "this batch's pixels are in the out= buffer it was given",
            ));
        };
        // SAFETY: `slf` is the object that owns `bytes`; its `__releasebuffer__` releases the view.
        unsafe { bytes.get_buffer(slf.py(), slf.as_ptr(), view, flags, "this batch was released") }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {
        if let Some(b) = self.bytes.as_ref() {
            b.release_view();
        }
    }
}
