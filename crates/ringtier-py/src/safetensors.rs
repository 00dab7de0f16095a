//! `ringtier.safetensors` underneath: safetensors files read and written by the engine
//! (`ringtier_safetensors`), from a directory (io_uring, the thread pool where it is refused) or
//! an `s3://` URL. Python (`python/ringtier/safetensors.py`) turns what these return into torch
//! tensors.
//!
//! A whole-file read lands without a copy: each file's data span is one anonymous mapping,
//! page-aligned and faulted in ahead of the reads (`crate::direct::MappedParts`, the direct
//! checkpoint load's destinations), lent to the chunk reads in windows; once every window is
//! back, the mapping becomes the memory of a `SafetensorsBuffer` that the tensors are views of.

use std::collections::BTreeMap;
use std::ffi::c_int;
use std::path::Path;
use std::sync::Arc;

use pyo3::buffer::PyUntypedBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use ringtier_core::error::{Error, ErrorKind, Result};
use ringtier_core::{AlignedBuf, Tier};
use ringtier_migrate::{PartInfo, ReadTargets};
use ringtier_safetensors::{
    read_chunks_of, read_into_targets, save, save_sharded, DataTargets, Dtype, Layout, Model, ReadOptions, SaveOptions,
    TensorRef, TensorSpec,
};

use crate::buffer::{ExportedBytes, OwnedBytes};
use crate::direct::{MappedParts, Mapping};
use crate::engine::{wait_plain, Engine, ForkGuarded};
use crate::errors::{self, IntoPy};
use crate::filemap::FileMap;
use crate::tiers::open_tier;

/// Reads in flight of a whole-model read by default: 16 of 8 MiB, over all its files.
const DEFAULT_DEPTH: usize = 16;

/// Reads in flight by default from an S3 tier: range GETs are bound by each request's
/// latency and the server's per-request rate, not by a device queue, so more of them
/// (the S3 tier's own `read_concurrency` default) keep the bytes coming; 8 GiB from s3s-fs on
/// loopback took 115 s at 16 and a third of that at 64.
const DEFAULT_REMOTE_DEPTH: usize = 64;

/// Bytes per read by default.
const DEFAULT_CHUNK: usize = 8 << 20;

/// [`MappedParts`] as the destinations of a safetensors read: one mapping per file's span.
struct MappedSpans(Arc<MappedParts>);

impl DataTargets for MappedSpans {
    fn prepare(&self, spans: &[u64], align: usize) -> Result<()> {
        let parts: Vec<PartInfo> = spans
            .iter()
            .enumerate()
            .map(|(index, &size)| PartInfo { index, name: String::new(), size, crc32c: 0, start: 0, end: size })
            .collect();
        if self.0.prepare(&parts, spans, align)? {
            Ok(())
        } else {
            Err(Error::new(ErrorKind::Unsupported, format!("cannot map the files' data for reads aligned to {align}")))
        }
    }

    fn window(&self, file: usize, offset: u64, len: usize, align: usize) -> Result<AlignedBuf> {
        self.0.window(file, offset, len, align)
    }
}

/// One tensor's bytes read alone (lazy access): the buffer's window.
#[derive(Debug)]
struct WindowBytes(AlignedBuf);

impl OwnedBytes for WindowBytes {
    fn as_mut_bytes(&mut self) -> &mut [u8] {
        self.0.as_mut_slice()
    }
}

/// Where a `SafetensorsBuffer`'s bytes live.
#[derive(Debug)]
enum FileBytes {
    /// A file's data span, read straight into a mapping of its own.
    Mapped(Mapping),
    /// One tensor, read on its own.
    Window(WindowBytes),
    /// A file's data span, mapped from the page cache (`map_all`).
    File(FileMap),
}

impl OwnedBytes for FileBytes {
    fn as_mut_bytes(&mut self) -> &mut [u8] {
        match self {
            FileBytes::Mapped(m) => m.as_mut_bytes(),
            FileBytes::Window(w) => w.as_mut_bytes(),
            FileBytes::File(f) => f.as_mut_bytes(),
        }
    }
}

/// Bytes read from a safetensors file, exposed through the buffer protocol (writable, format
/// `B`): the tensors `ringtier.safetensors` returns are views of it, and keep it alive.
#[pyclass(module = "ringtier._ringtier", name = "SafetensorsBuffer", frozen)]
#[derive(Debug)]
pub(crate) struct SafetensorsBuffer {
    bytes: ExportedBytes<FileBytes>,
}

#[pymethods]
impl SafetensorsBuffer {
    fn __len__(&self) -> usize {
        self.bytes.len()
    }

    /// Buffer views alive now.
    #[getter]
    fn views(&self) -> usize {
        self.bytes.views()
    }

    unsafe fn __getbuffer__(slf: PyRef<'_, Self>, view: *mut pyo3::ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        // SAFETY: `slf` is the object that owns `bytes`; its `__releasebuffer__` releases the view.
        unsafe { slf.bytes.get_buffer(slf.py(), slf.as_ptr(), view, flags, "this buffer was released") }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {
        self.bytes.release_view();
    }
}

/// What a model holds in its process.
#[derive(Debug)]
struct ModelState {
    engine: Arc<Engine>,
    model: Model,
    /// Opened from an S3 URL: reads default to [`DEFAULT_REMOTE_DEPTH`] in flight.
    remote: bool,
    /// The directory the keys are files under (None for an S3 URL).
    root: Option<std::path::PathBuf>,
}

/// A safetensors model opened by the engine: one file, or a sharded model's index and shards;
/// the headers read and checked (see the stub for the Python documentation).
#[pyclass(module = "ringtier._ringtier", name = "SafetensorsModel", frozen)]
#[derive(Debug)]
pub(crate) struct SafetensorsModel {
    st: ForkGuarded<ModelState>,
}

fn read_options(depth: Option<usize>, chunk_bytes: Option<usize>, remote: bool) -> PyResult<ReadOptions> {
    let opts = ReadOptions::default()
        .with_depth(depth.unwrap_or(if remote { DEFAULT_REMOTE_DEPTH } else { DEFAULT_DEPTH }))
        .with_chunk_bytes(chunk_bytes.unwrap_or(DEFAULT_CHUNK));
    if opts.depth == 0 || opts.chunk_bytes == 0 {
        return Err(errors::invalid("depth and chunk_bytes must be at least 1".into()));
    }
    Ok(opts)
}

fn metadata_dict<'py>(py: Python<'py>, m: Option<&BTreeMap<String, String>>) -> PyResult<Option<Bound<'py, PyDict>>> {
    let Some(m) = m else { return Ok(None) };
    let d = PyDict::new(py);
    for (k, v) in m {
        d.set_item(k, v)?;
    }
    Ok(Some(d))
}

/// One tensor as Python gets it: `(name, file, dtype, shape, begin, end)`.
type TensorRow = (String, usize, &'static str, Vec<u64>, u64, u64);

/// A writable, C-contiguous buffer of `want` bytes, its pointer taken once.
struct Dest {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the pointer is into memory that a `PyUntypedBuffer` held by the caller keeps alive
// and locked for the whole call; only the one task of the read writes through it.
unsafe impl Send for Dest {}
// SAFETY: as above; shared references never write.
unsafe impl Sync for Dest {}

#[pymethods]
impl SafetensorsModel {
    /// Opens `key` (a `.safetensors` file, or a `.json` shard index) on the tier at `root` (a
    /// directory, or an `s3://bucket/prefix?endpoint=...` URL) with `engine`.
    #[new]
    #[pyo3(signature = (root, key, engine="auto"))]
    fn new(py: Python<'_>, root: String, key: String, engine: &str) -> PyResult<Self> {
        let tier: Arc<dyn Tier> = open_tier(Path::new(&root), engine, None, false, true)?;
        let engine = crate::engine::engine()?;
        let model = wait_plain(py, &engine, Model::open(tier, &key))?.py_err()?;
        let remote = ringtier::open::is_s3_url(Path::new(&root));
        let dir = (!remote).then(|| std::path::PathBuf::from(&root));
        Ok(SafetensorsModel {
            st: ForkGuarded::new("SafetensorsModel", ModelState { engine, model, remote, root: dir }),
        })
    }

    /// The files' keys, in order.
    #[getter]
    fn files(&self) -> PyResult<Vec<String>> {
        Ok(self.st.get()?.model.files.iter().map(|f| f.key().to_string()).collect())
    }

    /// Whether the model was opened through a shard index.
    #[getter]
    fn sharded(&self) -> PyResult<bool> {
        Ok(self.st.get()?.model.index.is_some())
    }

    /// The `__metadata__` of file `file` (None where it has none).
    fn metadata<'py>(&self, py: Python<'py>, file: usize) -> PyResult<Option<Bound<'py, PyDict>>> {
        let st = self.st.get()?;
        let f = st.model.files.get(file).ok_or_else(|| errors::invalid(format!("no file {file}")))?;
        metadata_dict(py, f.header().metadata())
    }

    /// Every tensor as `(name, file, dtype, shape, begin, end)`: file by file, in data order;
    /// `begin`/`end` count from the file's data region.
    fn tensors(&self) -> PyResult<Vec<TensorRow>> {
        let st = self.st.get()?;
        Ok(st
            .model
            .tensors()
            .map(|(i, t)| (t.name.clone(), i, t.dtype.as_str(), t.shape.clone(), t.data_offsets.0, t.data_offsets.1))
            .collect())
    }

    /// Reads every file's data at depth into one page-aligned buffer per file, without a copy:
    /// `[(buffer, data_offset)]` in file order, tensor bytes at `data_offset + begin`.
    #[pyo3(signature = (depth=None, chunk_bytes=None))]
    fn read_all<'py>(
        &self,
        py: Python<'py>,
        depth: Option<usize>,
        chunk_bytes: Option<usize>,
    ) -> PyResult<Vec<(SafetensorsBuffer, u64)>> {
        let st = self.st.get()?;
        let opts = read_options(depth, chunk_bytes, st.remote)?;
        let parts = Arc::new(MappedParts::default());
        let targets = MappedSpans(Arc::clone(&parts));
        let spans = wait_plain(py, &st.engine, read_into_targets(&st.model.files, &targets, &opts))?.py_err()?;
        let sizes: Vec<u64> = spans.iter().map(|s| s.len).collect();
        let maps = parts
            .take(&sizes)
            .ok_or_else(|| errors::to_py(Error::new(ErrorKind::Shutdown, "a read of the model is still in flight")))?;
        Ok(maps
            .into_iter()
            .zip(spans)
            .map(|(m, s)| (SafetensorsBuffer { bytes: ExportedBytes::new(FileBytes::Mapped(m)) }, s.data_offset))
            .collect())
    }

    /// Maps every file's data from the page cache (private, copy-on-write), read ahead by
    /// `threads` threads taking `chunk_bytes` at a time (`MADV_POPULATE_READ`): `[(buffer,
    /// 0)]` in file order, tensor bytes at `begin` (the buffer starts at the file's data).
    /// Files only (not S3).
    #[pyo3(signature = (threads=None, chunk_bytes=None))]
    fn map_all(
        &self,
        py: Python<'_>,
        threads: Option<usize>,
        chunk_bytes: Option<usize>,
    ) -> PyResult<Vec<(SafetensorsBuffer, u64)>> {
        let st = self.st.get()?;
        let Some(root) = st.root.as_ref() else {
            return Err(errors::to_py(Error::new(
                ErrorKind::Unsupported,
                "mmap=True maps files: an s3:// model is read with mmap=False",
            )));
        };
        let threads = threads.unwrap_or(DEFAULT_DEPTH / 2);
        let chunk = chunk_bytes.unwrap_or(DEFAULT_CHUNK);
        if threads == 0 || chunk == 0 {
            return Err(errors::invalid("depth and chunk_bytes must be at least 1".into()));
        }
        let mut out = Vec::with_capacity(st.model.files.len());
        for f in &st.model.files {
            let h = f.header();
            let path = root.join(f.key());
            let map = py
                .detach(|| -> Result<FileMap> {
                    let m = FileMap::open(&path, h.file_size(), h.data_start(), h.data_len())?;
                    m.populate(threads, chunk)?;
                    Ok(m)
                })
                .py_err()?;
            out.push((SafetensorsBuffer { bytes: ExportedBytes::new(FileBytes::File(map)) }, 0));
        }
        Ok(out)
    }

    /// Reads tensor `name` alone (lazy access): a buffer of exactly its bytes.
    fn read_tensor(&self, py: Python<'_>, name: &str) -> PyResult<SafetensorsBuffer> {
        let st = self.st.get()?;
        let (i, _) = st.model.find(name).ok_or_else(|| {
            errors::to_py(Error::new(ErrorKind::NotFound, format!("no tensor {name:?} in this model")))
        })?;
        let file = &st.model.files[i];
        let buf = wait_plain(py, &st.engine, file.read_tensor(name))?.py_err()?;
        Ok(SafetensorsBuffer { bytes: ExportedBytes::new(FileBytes::Window(WindowBytes(buf))) })
    }

    /// Reads the tensors named in `targets` (`[(name, writable C-contiguous buffer of its byte
    /// count)]`) into those buffers: chunks read at depth into `depth` buffers of one chunk,
    /// each copied into the targets it overlaps (memory beyond the targets: `depth` chunks).
    #[pyo3(signature = (targets, depth=None, chunk_bytes=None))]
    fn read_into(
        &self,
        py: Python<'_>,
        targets: Vec<(String, Bound<'_, PyAny>)>,
        depth: Option<usize>,
        chunk_bytes: Option<usize>,
    ) -> PyResult<()> {
        let st = self.st.get()?;
        let opts = read_options(depth, chunk_bytes, st.remote)?;
        let files = &st.model.files;
        // Per file: (begin, end, destination) in data order.
        let mut per_file: Vec<Vec<(u64, u64, Dest)>> = files.iter().map(|_| Vec::new()).collect();
        let mut held = Vec::with_capacity(targets.len());
        for (name, obj) in &targets {
            let (i, info) = st.model.find(name).ok_or_else(|| {
                errors::to_py(Error::new(ErrorKind::NotFound, format!("no tensor {name:?} in this model")))
            })?;
            let buf = PyUntypedBuffer::get(obj)
                .map_err(|e| errors::type_error(format!("into[{name:?}] does not export a buffer: {e}")))?;
            if buf.readonly() || !buf.is_c_contiguous() {
                return Err(errors::invalid(format!("into[{name:?}] must be writable and C-contiguous")));
            }
            if buf.len_bytes() as u64 != info.byte_len() {
                return Err(errors::invalid(format!(
                    "into[{name:?}] holds {} bytes, the file's tensor {}",
                    buf.len_bytes(),
                    info.byte_len()
                )));
            }
            let dest = Dest { ptr: buf.buf_ptr().cast::<u8>(), len: buf.len_bytes() };
            per_file[i].push((info.data_offsets.0, info.data_offsets.1, dest));
            held.push(buf);
        }
        for v in &mut per_file {
            v.sort_by_key(|d| d.0);
        }
        let align = files.iter().map(|f| ringtier_safetensors::read_alignment(f.tier().as_ref())).max().unwrap_or(4096);
        let data_offsets: Vec<u64> = files.iter().map(|f| f.data_span(align).data_offset).collect();
        let per_file = &per_file;
        let sink = move |i: usize, at: u64, bytes: &[u8]| -> Result<()> {
            // The chunk's range in the data region (the span starts up to one block earlier).
            let start = at as i128 - data_offsets[i] as i128;
            let end = start + bytes.len() as i128;
            let dests = &per_file[i];
            let first = dests.partition_point(|d| (d.1 as i128) <= start);
            for (b, e, dest) in &dests[first..] {
                let (b, e) = (*b as i128, *e as i128);
                if b >= end {
                    break;
                }
                let (lo, hi) = (b.max(start), e.min(end));
                if lo >= hi {
                    continue;
                }
                let src = &bytes[(lo - start) as usize..(hi - start) as usize];
                let off = (lo - b) as usize;
                debug_assert!(off + src.len() <= dest.len);
                // SAFETY: `[off, off + src.len())` lies inside the destination's `len` bytes
                // (the tensor's range clipped to the chunk), which its `PyUntypedBuffer` keeps
                // alive for this call; no other code writes it meanwhile (the GIL is released,
                // Python was told not to touch `into` while it loads).
                unsafe { std::slice::from_raw_parts_mut(dest.ptr.add(off), src.len()) }.copy_from_slice(src);
            }
            Ok(())
        };
        // Only the part of each file the targets cover is read.
        let wanted: Vec<std::ops::Range<u64>> = per_file
            .iter()
            .map(|v| match (v.iter().map(|d| d.0).min(), v.iter().map(|d| d.1).max()) {
                (Some(b), Some(e)) => b..e,
                _ => 0..0,
            })
            .collect();
        let res = wait_plain(py, &st.engine, read_chunks_of(files, &wanted, &opts, sink))?;
        drop(held);
        res.py_err()
    }
}

/// Saves `tensors` (`[(name, dtype, shape, buffer)]`, the buffer C-contiguous bytes: a uint8
/// view of the tensor) as `key` on the tier at `root` (created if missing), or, with
/// `max_shard_bytes`, as a sharded model `{prefix}-0000i-of-0000N.safetensors` plus
/// `model.safetensors.index.json` under `root`. Returns the keys written, the index last.
#[pyfunction]
#[pyo3(signature = (root, key, tensors, metadata=None, engine="auto", max_shard_bytes=None, prefix="model", chunk_bytes=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn safetensors_save<'py>(
    py: Python<'py>,
    root: String,
    key: String,
    tensors: Vec<(String, String, Vec<u64>, Bound<'_, PyAny>)>,
    metadata: Option<BTreeMap<String, String>>,
    engine: &str,
    max_shard_bytes: Option<u64>,
    prefix: &str,
    chunk_bytes: Option<usize>,
) -> PyResult<Bound<'py, PyList>> {
    let tier: Arc<dyn Tier> = open_tier(Path::new(&root), engine, None, true, false)?;
    let mut held = Vec::with_capacity(tensors.len());
    let mut dtypes = Vec::with_capacity(tensors.len());
    for (name, dtype, _, obj) in &tensors {
        let d: Dtype = dtype.parse().map_err(|e: String| errors::invalid(format!("tensor {name:?}: {e}")))?;
        let buf = PyUntypedBuffer::get(obj)
            .map_err(|e| errors::type_error(format!("tensor {name:?} does not export a buffer: {e}")))?;
        if !buf.is_c_contiguous() {
            return Err(errors::invalid(format!("tensor {name:?}: the buffer is not C-contiguous")));
        }
        dtypes.push(d);
        held.push(buf);
    }
    let slices: Vec<&[u8]> = held
        .iter()
        .map(|b| {
            let len = b.len_bytes();
            if len == 0 {
                return &[][..];
            }
            // SAFETY: a C-contiguous buffer of `len` bytes at `buf_ptr`, exported by an object
            // the `PyUntypedBuffer` keeps alive (and locked against resizing) while `held`
            // lives, which outlives the slices.
            unsafe { std::slice::from_raw_parts(b.buf_ptr().cast::<u8>().cast_const(), len) }
        })
        .collect();
    let refs: Vec<TensorRef<'_>> = tensors
        .iter()
        .zip(&slices)
        .zip(&dtypes)
        .map(|(((name, _, shape, _), data), &dtype)| TensorRef { name, dtype, shape, data })
        .collect();
    let mut opts = SaveOptions::default();
    if let Some(c) = chunk_bytes {
        opts = opts.with_chunk_bytes(c.max(1));
    }
    let engine = crate::engine::engine()?;
    let written: Vec<String> = match max_shard_bytes {
        None => {
            wait_plain(py, &engine, save(tier.as_ref(), &key, &refs, metadata.as_ref(), &opts))?.py_err()?;
            vec![key]
        }
        Some(max) => {
            let dir = if key.is_empty() || key.ends_with('/') { key.clone() } else { format!("{key}/") };
            let s = wait_plain(
                py,
                &engine,
                save_sharded(tier.as_ref(), &dir, prefix, &refs, metadata.as_ref(), max.max(1), &opts),
            )?
            .py_err()?;
            s.files.into_iter().chain(s.index).collect()
        }
    };
    drop(refs);
    drop(slices);
    drop(held);
    PyList::new(py, written)
}

/// Lays out a safetensors file for `tensors` (`[(name, dtype, shape, byte count)]`) and the
/// free-form `metadata`, as [`save`] does (the `safetensors` package's order: dtype, widest
/// first, then name): `(the file's first bytes, order)`, `order[i]` the index in `tensors` of
/// the `i`-th tensor's data after those bytes. For callers that write the file themselves (the
/// checkpoint store's safetensors format writes header and tensors as one part, from the
/// tensors' memory). A duplicate or reserved name, or a byte count that dtype and shape do not
/// make, is a `ringtier.InvalidInputError`.
#[pyfunction]
#[pyo3(signature = (tensors, metadata=None))]
pub(crate) fn safetensors_layout<'py>(
    py: Python<'py>,
    tensors: Vec<(String, String, Vec<u64>, u64)>,
    metadata: Option<BTreeMap<String, String>>,
) -> PyResult<(Bound<'py, PyBytes>, Vec<usize>)> {
    let mut specs = Vec::with_capacity(tensors.len());
    for (name, dtype, shape, byte_len) in tensors {
        let dtype: Dtype = dtype.parse().map_err(|e: String| errors::invalid(format!("tensor {name:?}: {e}")))?;
        specs.push(TensorSpec { name, dtype, shape, byte_len });
    }
    let layout = Layout::plan(&specs, metadata.as_ref()).py_err()?;
    Ok((PyBytes::new(py, &layout.prefix), layout.order))
}

/// Parses the header of the safetensors file whose bytes `data` exports (the whole file: its
/// size is checked against the header), as hostile input (`Header::parse`: bounded lengths,
/// offsets contiguous to the end of the file): `(data_start, metadata or None, [(name, dtype,
/// shape, begin, end)])` in data order, `begin`/`end` counted from `data_start`. Anything
/// inconsistent is a `ringtier.CorruptError`.
#[pyfunction]
#[allow(clippy::type_complexity)]
pub(crate) fn safetensors_parse<'py>(
    py: Python<'py>,
    data: Bound<'py, PyAny>,
) -> PyResult<(u64, Option<Bound<'py, PyDict>>, Vec<(String, &'static str, Vec<u64>, u64, u64)>)> {
    let buf = PyUntypedBuffer::get(&data)
        .map_err(|e| errors::type_error(format!("safetensors_parse takes a buffer: {e}")))?;
    if !buf.is_c_contiguous() {
        return Err(errors::invalid("safetensors_parse: the buffer is not C-contiguous".into()));
    }
    let len = buf.len_bytes();
    let bytes: &[u8] = if len == 0 {
        &[]
    } else {
        // SAFETY: a C-contiguous buffer of `len` bytes at `buf_ptr`, exported by `data`, which
        // `buf` keeps alive (and locked against resizing) until the end of this function; the
        // slice is dropped before it.
        unsafe { std::slice::from_raw_parts(buf.buf_ptr().cast::<u8>().cast_const(), len) }
    };
    let header = ringtier_safetensors::Header::parse(bytes, len as u64).py_err()?;
    let rows = header
        .tensors()
        .iter()
        .map(|t| (t.name.clone(), t.dtype.as_str(), t.shape.clone(), t.data_offsets.0, t.data_offsets.1))
        .collect();
    let meta = metadata_dict(py, header.metadata())?;
    Ok((header.data_start(), meta, rows))
}

/// Registers the classes and functions of `ringtier.safetensors` in the extension module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<SafetensorsModel>()?;
    m.add_class::<SafetensorsBuffer>()?;
    m.add_function(wrap_pyfunction!(safetensors_save, m)?)?;
    m.add_function(wrap_pyfunction!(safetensors_layout, m)?)?;
    m.add_function(wrap_pyfunction!(safetensors_parse, m)?)?;
    Ok(())
}
