//! `ringtier.FileReader`: reads any list of a dataset's files, whole, into one pool of read
//! buffers, with one batched read per call: what a random-access data source (grain's
//! `ringtier.grain.FileSource`) needs, where a [`crate::loader::Loader`] reads an epoch's
//! order. A process makes one reader and reuses it for every call: one engine, one tier (one
//! ring), one pool, no listing, no epoch, no statistics. Like every object holding the
//! engine's threads, it belongs to the process that made it (`ForkGuarded`): a forked grain
//! worker makes its own.
//!
//! The pool is lazy (`lazy_pool.rs`): a private mapping faulted in as reads fill it, not
//! registered. A file goes into a free pooled buffer where there is one and into a buffer of
//! its own where Python still holds them all (grain keeps elements in its prefetch buffers
//! for as long as it likes), so a read never waits for Python; a file larger than a buffer is
//! read in pieces and assembled (`ringtier_loader::read_files`).

use std::ffi::c_int;
use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use ringtier_core::buf::AlignedBuf;
use ringtier_core::{BufferPool, Tier, UNKNOWN_SIZE};
use ringtier_uring::UringConfig;

use crate::buffer::{ExportedBytes, OwnedBytes};
use crate::engine::{wait_plain, Engine, ForkGuarded};
use crate::errors::{self, IntoPy};

/// Everything of a reader that must stay in its process.
#[derive(Debug)]
struct ReaderState {
    engine: Arc<Engine>,
    tier: Arc<dyn Tier>,
    pool: BufferPool,
}

/// Reads any files of a dataset into one pool of buffers (see the stub for the Python
/// documentation).
#[pyclass(module = "ringtier._ringtier", name = "FileReader", frozen)]
#[derive(Debug)]
pub(crate) struct FileReader {
    state: ForkGuarded<ReaderState>,
    engine: &'static str,
}

#[pymethods]
impl FileReader {
    #[new]
    #[pyo3(signature = (path, *, buffer_size=1 << 20, buffers=1024, engine="auto"))]
    fn new(path: PathBuf, buffer_size: usize, buffers: usize, engine: &str) -> PyResult<Self> {
        if buffer_size == 0 || buffers == 0 {
            return Err(errors::invalid(format!(
                "buffer_size and buffers must be at least 1, not {buffer_size} and {buffers}"
            )));
        }
        let dir = crate::loader::dataset_dir(&path)?;
        let s3 = crate::tiers::s3_url(&dir).is_some();
        let engine = if s3 { "uring" } else { crate::tiers::resolve_engine(engine)? };
        let eng = crate::engine::engine()?;
        let _enter = eng.handle().enter();
        // The file system's direct-I/O alignment, from a tier without a pool (as Loader).
        let alignment = crate::tiers::open_tier(&dir, engine, None, false, true)?.capabilities().alignment;
        let cfg = ringtier_loader::LoaderConfig::default().with_batch_size(1).with_prefetch(0);
        let pool_cfg = ringtier_loader::Loader::pool_config(buffer_size as u64, alignment, &cfg).with_count(buffers);
        let pool = crate::lazy_pool::lazy_pool(&pool_cfg).py_err()?;
        let tier = if engine == "uring" && !s3 {
            // Not registered: registering would fault in the whole pool now.
            let uring = UringConfig::dataset().with_register_buffers(false);
            crate::tiers::open_tier_with(&dir, engine, Some(pool.clone()), false, true, uring)?
        } else {
            crate::tiers::open_tier(&dir, engine, None, false, true)?
        };
        let state = ReaderState { engine: eng.clone(), tier, pool };
        Ok(FileReader { state: ForkGuarded::new("FileReader", state), engine })
    }

    /// The files `keys` (paths under the dataset, in any order, repeats allowed), read whole
    /// in one batched read with the GIL released: per key, a [`FileBuffer`] or, where that
    /// file could not be read, the exception (a `ringtier.RingtierError` of its kind), not
    /// raised. `sizes` (optional, per key): the size to expect, as a hint (the file wins).
    #[pyo3(signature = (keys, sizes=None))]
    fn read<'py>(&self, py: Python<'py>, keys: Vec<String>, sizes: Option<Vec<u64>>) -> PyResult<Bound<'py, PyList>> {
        let st = self.state.get()?;
        if sizes.as_ref().is_some_and(|s| s.len() != keys.len()) {
            return Err(errors::invalid("sizes must give one size per key".into()));
        }
        let files: Vec<(&str, u64)> =
            keys.iter().enumerate().map(|(i, k)| (k.as_str(), sizes.as_ref().map_or(UNKNOWN_SIZE, |s| s[i]))).collect();
        let (tier, pool) = (st.tier.as_ref(), &st.pool);
        let read = wait_plain(py, &st.engine, ringtier_loader::read_files(tier, pool, &files))?;
        let mut out = Vec::with_capacity(read.len());
        for r in read {
            out.push(match r {
                Ok(buf) => Bound::new(py, FileBuffer::new(buf))?.into_any(),
                Err(e) => errors::to_py(e).into_value(py).into_bound(py).into_any(),
            });
        }
        PyList::new(py, out)
    }

    /// Buffers in the pool (more are allocated, one per file, while Python holds them all).
    #[getter]
    fn buffers(&self) -> PyResult<usize> {
        Ok(self.state.get()?.pool.count())
    }

    /// Bytes of one pooled buffer (a larger file is read in pieces of about this size).
    #[getter]
    fn buffer_size(&self) -> PyResult<usize> {
        Ok(self.state.get()?.pool.buf_size())
    }

    /// Pooled buffers in use now (held by Python or by a read).
    #[getter]
    fn in_use(&self) -> PyResult<usize> {
        Ok(self.state.get()?.pool.in_use())
    }

    /// `"uring"` or `"posix"`: the engine this reader uses.
    #[getter]
    fn engine(&self) -> &'static str {
        self.engine
    }

    fn __repr__(&self) -> String {
        match self.state.get() {
            Ok(st) => format!(
                "ringtier.FileReader(engine={:?}, buffers={}, buffer_size={})",
                self.engine,
                st.pool.count(),
                st.pool.buf_size()
            ),
            Err(_) => "ringtier.FileReader(<inherited through fork>)".into(),
        }
    }
}

impl OwnedBytes for AlignedBuf {
    fn as_mut_bytes(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

/// One file's bytes, read by a [`FileReader`]: a pooled read buffer (or one of its own),
/// exposed through the buffer protocol (writable, one-dimensional, unsigned bytes) and given
/// back to the pool when the last view of it and the object itself are gone.
#[pyclass(module = "ringtier._ringtier", name = "FileBuffer", frozen)]
#[derive(Debug)]
pub(crate) struct FileBuffer {
    bytes: ExportedBytes<AlignedBuf>,
    /// The process that read it: a copy inherited through `fork()` is leaked there, not given
    /// back to a pool whose lock the parent's threads may have held at the fork.
    pid: u32,
}

impl FileBuffer {
    fn new(buf: AlignedBuf) -> Self {
        FileBuffer { bytes: ExportedBytes::new(buf), pid: std::process::id() }
    }
}

impl Drop for FileBuffer {
    fn drop(&mut self) {
        if let Some(buf) = self.bytes.take_on_drop() {
            if std::process::id() != self.pid {
                std::mem::forget(buf);
            }
        }
    }
}

#[pymethods]
impl FileBuffer {
    fn __len__(&self) -> usize {
        self.bytes.len()
    }

    /// A copy of the bytes.
    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        // The bytes are never taken back before the object is dropped.
        self.bytes.to_bytes(py).unwrap_or_else(|| PyBytes::new(py, &[]))
    }

    fn __repr__(&self) -> String {
        format!("ringtier.FileBuffer(bytes={})", self.bytes.len())
    }

    /// Exposes the bytes: one dimension, format `B`, writable.
    unsafe fn __getbuffer__(slf: PyRef<'_, Self>, view: *mut pyo3::ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        // SAFETY: `slf` is the object that owns `bytes`; its `__releasebuffer__` releases the view.
        unsafe { slf.bytes.get_buffer(slf.py(), slf.as_ptr(), view, flags, "this buffer was released") }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {
        self.bytes.release_view();
    }
}
