//! `ringtier.RecordLoader`: TFRecord and WebDataset shards from Python, streamed (shards
//! shuffled and split across ranks and workers, a seeded shuffle buffer) or in a global order
//! through per-shard indexes. Each record's bytes are copied once, out of the pooled O_DIRECT
//! read buffers into the record (`ringtier_loader::records`); Python gets that memory through
//! the buffer protocol (numpy, torch, memoryview) without another copy.

use std::collections::VecDeque;
use std::ffi::c_int;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyBufferError, PyKeyError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use ringtier_cache::CachedTier;
use ringtier_core::error::{Error, ErrorKind};
use ringtier_core::Tier;
use ringtier_dataset::OnBadSample;
use ringtier_loader::records::{self, RecordConfig, RecordFormat, RecordIndex, Shard};
use ringtier_uring::UringConfig;

use crate::buffer::ExportedBytes;
use crate::engine::{wait_plain, Engine, ForkGuarded};
use crate::errors::{self, IntoPy};

/// Records moved to Python per wait at most (the GIL is released once per wait).
const FETCH: usize = 64;

/// Bytes of records moved to Python per wait at most (one record more may cross it).
const FETCH_BYTES: u64 = 1 << 20;

/// Slack above the largest indexed record for the read size of a global order (alignment at
/// both ends of a record's read).
const GLOBAL_SLACK: usize = 8192;

/// The tier over a directory of shards, links followed; an `s3://` URL's S3 tier, `depth`
/// range GETs in flight.
fn shard_tier(dir: &Path, engine: &str, depth: usize) -> PyResult<Arc<dyn Tier>> {
    if let Some(url) = crate::tiers::s3_url(dir) {
        return crate::tiers::open_s3(url, crate::tiers::S3Use::Dataset { depth });
    }
    let uring = UringConfig::default().with_queue_depth(depth.clamp(1, 4096) as u32);
    crate::tiers::open_tier_with(dir, engine, None, false, true, uring)
}

/// The index file of `shard`: `KEY.idx` (what `ringtier index` writes) or, as DALI's tools
/// name them, the shard's name up to its first dot plus `.idx`, in `dir`.
fn index_file(dir: &Path, shard: &Shard) -> Option<PathBuf> {
    let full = dir.join(format!("{}.idx", shard.key));
    if full.is_file() {
        return Some(full);
    }
    let (parent, name) = match shard.key.rsplit_once('/') {
        Some((p, n)) => (dir.join(p), n),
        None => (dir.to_path_buf(), shard.key.as_str()),
    };
    let stem = name.split('.').next().filter(|s| !s.is_empty())?;
    let short = parent.join(format!("{stem}.idx"));
    short.is_file().then_some(short)
}

/// Everything of a record loader that must stay in its process.
#[derive(Debug)]
struct RecordLoaderState {
    engine: Arc<Engine>,
    loader: records::RecordLoader,
    /// The per-shard indexes of a global order.
    indexes: Option<Arc<Vec<RecordIndex>>>,
    shards: Arc<Vec<Shard>>,
    /// The cache in front of the shards (`cache=`).
    cache: Option<CachedTier>,
}

/// Reads the records of TFRecord or WebDataset shards (see the stub for the Python
/// documentation).
#[pyclass(module = "ringtier._ringtier", name = "RecordLoader")]
#[derive(Debug)]
pub(crate) struct RecordLoader {
    state: ForkGuarded<RecordLoaderState>,
    format: RecordFormat,
    global: bool,
    /// Records this reader delivers per epoch in a global order (unknown when streaming).
    per_epoch: Option<usize>,
    read_size: usize,
    cfg: RecordConfig,
}

#[pymethods]
impl RecordLoader {
    #[new]
    #[pyo3(signature = (path, *, format="tfrecord", order="stream", read_size=4 << 20, depth=8,
        shuffle_buffer=1024, shuffle_bytes=64 << 20, shuffle_shards=true, seed=0, rank=0, world_size=1, worker=0,
        workers=1, prefetch=256, prefetch_bytes=16 << 20, on_bad="fail", engine="auto", index_dir=None, cache=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        format: &str,
        order: &str,
        read_size: usize,
        depth: usize,
        shuffle_buffer: usize,
        shuffle_bytes: usize,
        shuffle_shards: bool,
        seed: u64,
        rank: usize,
        world_size: usize,
        worker: usize,
        workers: usize,
        prefetch: usize,
        prefetch_bytes: usize,
        on_bad: &str,
        engine: &str,
        index_dir: Option<PathBuf>,
        cache: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let format = match format {
            "tfrecord" => RecordFormat::TfRecord,
            "wds" | "webdataset" => RecordFormat::WebDataset,
            other => return Err(errors::invalid(format!("format must be \"tfrecord\" or \"wds\", not {other:?}"))),
        };
        let global = match order {
            "stream" => false,
            "global" => true,
            other => return Err(errors::invalid(format!("order must be \"stream\" or \"global\", not {other:?}"))),
        };
        let on_bad = match on_bad {
            "skip" => OnBadSample::Skip,
            "fail" => OnBadSample::Fail,
            other => return Err(errors::invalid(format!("on_bad must be \"skip\" or \"fail\", not {other:?}"))),
        };
        if world_size == 0 || rank >= world_size {
            return Err(errors::invalid(format!("rank {rank} is not below world_size {world_size}")));
        }
        if !path.is_dir() && crate::tiers::s3_url(&path).is_none() {
            let why = if path.exists() { "is not a directory" } else { "does not exist" };
            return Err(errors::to_py(Error::new(
                ErrorKind::NotFound,
                format!("shard directory {} {why}", path.display()),
            )));
        }
        let cfg = RecordConfig::default()
            .with_read_size(read_size)
            .with_depth(depth)
            .with_shuffle_buffer(shuffle_buffer)
            .with_shuffle_bytes(shuffle_bytes)
            .with_shuffle_shards(shuffle_shards)
            .with_seed(seed)
            .with_rank(rank)
            .with_world(world_size)
            .with_worker(worker)
            .with_workers(workers)
            .with_prefetch(prefetch)
            .with_prefetch_bytes(prefetch_bytes)
            .with_on_bad(on_bad);
        let eng = crate::engine::engine()?;
        let _enter = eng.handle().enter();
        let tier = shard_tier(&path, engine, depth)?;
        let skip_bad = on_bad == OnBadSample::Skip;
        let (shards, skipped) =
            wait_plain(py, &eng, records::list_shards_with(tier.as_ref(), format, skip_bad))?.py_err()?;
        if !skipped.is_empty() {
            // A dangling link or an unreadable directory among the shards (on_bad="skip"):
            // named in one warning, the rest read.
            let origin = path.display().to_string();
            crate::loader::warn_runtime(py, &ringtier_dataset::Dataset::skipped_summary(&skipped, &origin));
        }
        // The cache in front of the shards (src/cache.rs): the loader reads through it.
        let (tier, cache) = match cache {
            Some(c) => {
                let c = crate::cache::cache_config(c)?;
                let (reader, readers) = (rank * workers + worker, world_size * workers);
                let cached =
                    crate::cache::record_cache(tier, &shards, c, global, seed, reader, readers, shuffle_shards)?;
                (Arc::new(cached.clone()) as Arc<dyn Tier>, Some(cached))
            }
            None => (tier, None),
        };
        let mut loader = records::RecordLoader::new(Arc::clone(&tier), shards.clone(), format, cfg.clone()).py_err()?;
        let mut indexes = None;
        let mut per_epoch = None;
        let mut read = read_size;
        if global {
            let dir = index_dir.unwrap_or_else(|| path.clone());
            let mut idx = Vec::with_capacity(shards.len());
            for (i, s) in shards.iter().enumerate() {
                let one = match index_file(&dir, s) {
                    // Bounded by the shard's size before it is read.
                    Some(file) => RecordIndex::load(&file, s.size).py_err()?,
                    // No index: one streaming pass over the shard builds it (in memory).
                    None => wait_plain(py, &eng, loader.build_index(i))?.py_err()?,
                };
                idx.push(one);
            }
            let max = idx.iter().map(RecordIndex::max_len).max().unwrap_or(0) as usize;
            if max + GLOBAL_SLACK > read_size {
                read = (max + GLOBAL_SLACK).next_multiple_of(4096);
                loader = records::RecordLoader::new(tier, shards.clone(), format, cfg.clone().with_read_size(read))
                    .py_err()?;
            }
            let total: usize = idx.iter().map(|i| i.entries.len()).sum();
            let readers = world_size * workers;
            let me = rank * workers + worker;
            per_epoch = Some(total / readers + usize::from(me < total % readers));
            indexes = Some(Arc::new(idx));
        }
        let state = RecordLoaderState { engine: eng.clone(), loader, indexes, shards: Arc::new(shards), cache };
        let cfg = cfg.with_read_size(read);
        Ok(RecordLoader {
            state: ForkGuarded::new("RecordLoader", state),
            format,
            global,
            per_epoch,
            read_size: read,
            cfg,
        })
    }

    /// The records of `epoch`, from `position` (records of this reader already delivered) on.
    #[pyo3(signature = (epoch=0, position=0))]
    fn epoch(&self, epoch: u64, position: u64) -> PyResult<RecordEpoch> {
        let state = self.epoch_state(epoch, position)?;
        Ok(RecordEpoch { state: ForkGuarded::new("RecordEpoch", state), epoch, done: false })
    }

    /// The records of `epoch` from `position` on, for TensorFlow's record op: the epoch is
    /// kept in this process's table of TensorFlow epochs and its token returned; the op takes
    /// its records a batch at a time with no Python and no GIL (`ringtier_tf_next_records`),
    /// and the entry goes at the end of the epoch, at its first error, or by `_tf_release`.
    #[pyo3(signature = (epoch=0, position=0))]
    fn _tf_epoch(&self, epoch: u64, position: u64) -> PyResult<u64> {
        if self.format != RecordFormat::TfRecord {
            return Err(errors::invalid("TensorFlow's record op reads TFRecord shards only".into()));
        }
        let state = self.epoch_state(epoch, position)?;
        Ok(crate::tf_records::register(state))
    }

    /// The shard keys, in the order `Record.shard` numbers them.
    fn shards(&self) -> PyResult<Vec<String>> {
        Ok(self.state.get()?.shards.iter().map(|s| s.key.clone()).collect())
    }

    /// Shards this reader streams in `epoch`, in order (every shard in a global order).
    #[pyo3(signature = (epoch=0))]
    fn epoch_shards(&self, epoch: u64) -> PyResult<Vec<String>> {
        let st = self.state.get()?;
        if self.global {
            return self.shards();
        }
        Ok(st.loader.epoch_shards(epoch).into_iter().map(|i| st.shards[i].key.clone()).collect())
    }

    /// The cache's totals (hits, misses, prefetches, per level; a shard is one object), or
    /// None without `cache=`.
    fn cache_stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        match &self.state.get()?.cache {
            Some(c) => Ok(Some(crate::cache::stats_dict(py, &c.stats())?)),
            None => Ok(None),
        }
    }

    /// `"tfrecord"` or `"wds"`.
    #[getter]
    fn format(&self) -> &'static str {
        self.format.as_str()
    }

    /// `"stream"` or `"global"`.
    #[getter]
    fn order(&self) -> &'static str {
        if self.global {
            "global"
        } else {
            "stream"
        }
    }

    /// Bytes per read request (raised to fit the largest record in a global order).
    #[getter]
    fn read_size(&self) -> usize {
        self.read_size
    }

    /// Bytes of the read buffer pool.
    #[getter]
    fn pool_bytes(&self) -> PyResult<usize> {
        Ok(self.state.get()?.loader.pool_bytes())
    }

    /// Byte bound of the shuffle buffer (0: none).
    #[getter]
    fn shuffle_bytes(&self) -> usize {
        self.cfg.shuffle_bytes
    }

    /// Byte bound of the prefetch queue (0: none).
    #[getter]
    fn prefetch_bytes(&self) -> usize {
        self.cfg.prefetch_bytes
    }

    /// The most bytes this loader holds at once for records of at most `max_record` bytes:
    /// the read pool, the records held in Rust (shuffle buffer, prefetch queue, one read
    /// buffer's records) and those taken into Python per wait; not what the caller keeps.
    /// `None` where a byte bound is off.
    #[pyo3(signature = (max_record))]
    fn memory_bound(&self, max_record: usize) -> PyResult<Option<usize>> {
        let cfg = if self.global { self.cfg.clone().with_shuffle_buffer(0) } else { self.cfg.clone() };
        let pool = self.pool_bytes()?;
        Ok(cfg.held_bound(max_record).map(|h| pool + h + FETCH_BYTES as usize + max_record))
    }

    /// Records this reader delivers per epoch in a global order (from the indexes).
    fn __len__(&self) -> PyResult<usize> {
        self.per_epoch.ok_or_else(|| {
            pyo3::exceptions::PyTypeError::new_err(
                "a streaming RecordLoader does not know its record count before reading; use order=\"global\" \
                 (indexes) for len()",
            )
        })
    }

    fn __repr__(&self) -> String {
        match self.state.get() {
            Ok(st) => format!(
                "ringtier.RecordLoader(format={:?}, order={:?}, shards={}, read_size={})",
                self.format.as_str(),
                self.order(),
                st.shards.len(),
                self.read_size
            ),
            Err(_) => "ringtier.RecordLoader(<inherited through fork>)".into(),
        }
    }
}

impl RecordLoader {
    /// The state of `epoch`'s records from `position` on (the clairvoyant cache moved to it).
    fn epoch_state(&self, epoch: u64, position: u64) -> PyResult<RecordEpochState> {
        let st = self.state.get()?;
        let _enter = st.engine.handle().enter();
        if let (Some(c), None) = (&st.cache, &st.indexes) {
            // The clairvoyant plan moves to this epoch's shard order (other policies: nothing).
            c.begin_epoch(epoch, 0).py_err()?;
        }
        let inner = match &st.indexes {
            Some(idx) => st.loader.global_epoch(Arc::clone(idx), epoch, position).py_err()?,
            None => st.loader.epoch(epoch, position),
        };
        Ok(RecordEpochState {
            engine: Arc::clone(&st.engine),
            epoch: inner,
            shards: Arc::clone(&st.shards),
            ready: VecDeque::new(),
            ready_bytes: 0,
            ready_peak: 0,
        })
    }
}

#[derive(Debug)]
pub(crate) struct RecordEpochState {
    engine: Arc<Engine>,
    epoch: records::RecordEpoch,
    shards: Arc<Vec<Shard>>,
    /// Records taken in the last wait, not yet handed out.
    ready: VecDeque<records::Record>,
    /// Their bytes, and the most they were.
    ready_bytes: u64,
    ready_peak: u64,
}

impl RecordEpochState {
    /// Up to `max_records` next records, waited for on the engine from a thread outside it
    /// (TensorFlow's, no GIL): empty at the end of the epoch. An error after some records ends
    /// the batch there and is returned by the next call.
    pub(crate) fn next_batch_blocking(&mut self, max_records: usize) -> Result<records::RecordBatch, Error> {
        let mut batch = records::RecordBatch::new();
        self.engine.handle().block_on(self.epoch.fill_batch(&mut batch, max_records, 0))?;
        Ok(batch)
    }
}

/// One epoch's records: an iterator of [`Record`].
#[pyclass(module = "ringtier._ringtier", name = "RecordEpoch")]
#[derive(Debug)]
pub(crate) struct RecordEpoch {
    state: ForkGuarded<RecordEpochState>,
    epoch: u64,
    done: bool,
}

#[pymethods]
impl RecordEpoch {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<Record>> {
        let st = self.state.get_mut()?;
        if st.ready.is_empty() && !self.done {
            let engine = Arc::clone(&st.engine);
            let (epoch, ready, ready_bytes) = (&mut st.epoch, &mut st.ready, &mut st.ready_bytes);
            // The first record waited for; those already parsed taken with it, up to FETCH.
            let fut = async move {
                let mut err = None;
                let mut end = false;
                fn take(ready: &mut VecDeque<records::Record>, bytes: &mut u64, r: records::Record) {
                    *bytes += r.bytes();
                    ready.push_back(r);
                }
                match epoch.next().await {
                    None => end = true,
                    Some(Err(e)) => err = Some(e),
                    Some(Ok(r)) => take(ready, ready_bytes, r),
                }
                while !end && err.is_none() && ready.len() < FETCH && *ready_bytes < FETCH_BYTES {
                    tokio::select! {
                        biased;
                        next = epoch.next() => match next {
                            None => end = true,
                            Some(Err(e)) => err = Some(e),
                            Some(Ok(r)) => take(ready, ready_bytes, r),
                        },
                        () = std::future::ready(()) => break,
                    }
                }
                (end, err)
            };
            let (end, err) = wait_plain(py, &engine, fut)?;
            if end {
                self.done = true;
            }
            st.ready_peak = st.ready_peak.max(st.ready_bytes);
            if let Some(e) = err {
                // Records parsed before the error are dropped: the epoch failed there.
                st.ready.clear();
                st.ready_bytes = 0;
                self.done = true;
                return Err(errors::to_py(e));
            }
        }
        let Some(r) = st.ready.pop_front() else { return Ok(None) };
        st.ready_bytes -= r.bytes();
        let key = st.shards.get(r.shard).map(|s| s.key.clone()).unwrap_or_default();
        Record::new(py, r, key).map(Some)
    }

    /// Up to `max_records` next records as one [`RecordBatch`] (and where `max_bytes` is not 0,
    /// no more once their bytes reach it: the record that reaches it ends the batch), waited
    /// for with the GIL released; `None` at the end of the epoch. No Python object is made per
    /// record: `RecordBatch.pack_into` copies them into a buffer. An error after some records
    /// of the batch ends the batch there and is raised by the next call.
    #[pyo3(signature = (max_records, max_bytes=0))]
    fn next_batch(&mut self, py: Python<'_>, max_records: usize, max_bytes: u64) -> PyResult<Option<RecordBatch>> {
        if max_records == 0 {
            return Err(errors::invalid("max_records must be at least 1".into()));
        }
        let st = self.state.get_mut()?;
        let mut batch = records::RecordBatch::new();
        // Records the last `__next__` wait took come first (already counted as delivered).
        while batch.has_room(max_records, max_bytes) {
            let Some(r) = st.ready.pop_front() else { break };
            st.ready_bytes -= r.bytes();
            batch.push(r);
        }
        if batch.has_room(max_records, max_bytes) && !self.done {
            let engine = Arc::clone(&st.engine);
            let (epoch, into) = (&mut st.epoch, &mut batch);
            let filled = wait_plain(py, &engine, epoch.fill_batch(into, max_records, max_bytes))?;
            if let Err(e) = filled {
                self.done = true;
                return Err(errors::to_py(e));
            }
        }
        if batch.is_empty() {
            self.done = true;
            return Ok(None);
        }
        Ok(Some(RecordBatch { batch, shards: Arc::clone(&st.shards) }))
    }

    /// Records of this reader delivered in this epoch, counting the resumed-from position:
    /// pass it to `RecordLoader.epoch(epoch, position)` to resume after a restart.
    #[getter]
    fn position(&self) -> PyResult<u64> {
        let st = self.state.get()?;
        Ok(st.epoch.position() - st.ready.len() as u64)
    }

    /// The epoch number.
    #[getter]
    fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Totals so far: records, bytes (of the fields), skipped; and the record bytes the
    /// loader holds that Python has not been handed (`held_bytes` now; `held_peak`: the most
    /// at once, the Rust side's peak plus the most taken into Python in one wait).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let st = self.state.get()?;
        let s = st.epoch.stats();
        let held = st.epoch.held();
        let d = PyDict::new(py);
        d.set_item("records", s.records - st.ready.len() as u64)?;
        d.set_item("bytes", s.bytes - st.ready_bytes)?;
        d.set_item("skipped", s.skipped)?;
        d.set_item("held_bytes", held.now + st.ready_bytes)?;
        d.set_item("held_peak", held.peak + st.ready_peak)?;
        Ok(d)
    }
}

/// Records of one epoch taken together (`RecordEpoch.next_batch`), held in Rust: no Python
/// object per record. `pack_into` copies a field of every record end to end into a buffer the
/// caller gives (a DataLoader worker's shared-memory slot) and returns the offsets.
#[pyclass(module = "ringtier._ringtier", name = "RecordBatch", frozen)]
#[derive(Debug)]
pub(crate) struct RecordBatch {
    batch: records::RecordBatch,
    shards: Arc<Vec<Shard>>,
}

#[pymethods]
impl RecordBatch {
    /// Records in the batch.
    fn __len__(&self) -> usize {
        self.batch.len()
    }

    /// The field names, each once, in the order they first appear (`[""]` for TFRecord).
    fn names(&self) -> Vec<String> {
        self.batch.field_names().into_iter().map(str::to_owned).collect()
    }

    /// Bytes `pack_into(out, field)` writes.
    #[pyo3(signature = (field=None))]
    fn nbytes(&self, field: Option<&str>) -> usize {
        self.batch.packed_len(field)
    }

    /// Each record's key: the WebDataset sample key, or `SHARD:OFFSET` (a TFRecord).
    fn keys(&self) -> Vec<String> {
        let shard_key = |i: usize| self.shards.get(i).map_or("", |s| s.key.as_str());
        self.batch
            .records()
            .iter()
            .map(|r| if r.key.is_empty() { format!("{}:{}", shard_key(r.shard), r.offset) } else { r.key.clone() })
            .collect()
    }

    /// Each record's `field` (`None`: all of its fields, end to end) as a `bytes`, in batch
    /// order; `b""` for a record without it. What `tf.data` takes as a `tf.string` batch, made in
    /// one call: one copy per record, from the record's memory into its `bytes`, with the GIL
    /// released (the `bytes` objects are allocated first, empty, while it is held).
    #[pyo3(signature = (field=None))]
    fn field_bytes<'py>(&self, py: Python<'py>, field: Option<&str>) -> PyResult<Bound<'py, PyList>> {
        let records = self.batch.records();
        let mut objects = Vec::with_capacity(records.len());
        let mut dests = Vec::with_capacity(records.len());
        for r in records {
            let len = match field {
                None => r.bytes() as usize,
                Some(name) => r.field(name).map_or(0, <[u8]>::len),
            };
            let size = isize::try_from(len).map_err(|_| errors::invalid(format!("a record of {len} bytes")))?;
            // SAFETY: a NULL source with a size asks CPython for a new bytes object of `size`
            // bytes, uninitialized; the result is checked for NULL (a MemoryError) just below.
            let raw = unsafe { pyo3::ffi::PyBytes_FromStringAndSize(std::ptr::null(), size) };
            // SAFETY: `raw` is a new (owned) reference or NULL with an exception set.
            let obj = unsafe { Bound::from_owned_ptr_or_err(py, raw)? };
            // SAFETY: `obj` is a bytes object (made above); its storage holds `len` bytes.
            let data = unsafe { pyo3::ffi::PyBytes_AsString(obj.as_ptr()) };
            if data.is_null() {
                return Err(PyErr::fetch(py));
            }
            dests.push(Dest(data.cast::<u8>(), len));
            objects.push(obj);
        }
        py.detach(|| {
            for (r, d) in records.iter().zip(&dests) {
                if d.1 == 0 {
                    continue; // the shared empty bytes object: never written
                }
                // SAFETY: `d` is the storage of a bytes object made above with exactly `d.1`
                // bytes; only `objects` references it (no Python code can reach it before the
                // list is returned) and it stays alive, unmoved, while `objects` does, which
                // outlives this closure. Nothing else writes it.
                let out = unsafe { std::slice::from_raw_parts_mut(d.0, d.1) };
                let mut at = 0;
                for f in r.fields.iter().filter(|f| field.is_none_or(|name| f.name == name)) {
                    out[at..at + f.data.len()].copy_from_slice(&f.data);
                    at += f.data.len();
                    if field.is_some() {
                        break; // the first field of that name, as Record::field finds it
                    }
                }
            }
        });
        PyList::new(py, objects)
    }

    /// Copies `field` of every record (`None`: all of each record's fields) end to end into
    /// the front of `out` (writable, contiguous, at least `nbytes(field)` bytes) and returns
    /// the offsets: record `i` is `out[offsets[i]:offsets[i + 1]]`.
    #[pyo3(signature = (out, field=None))]
    fn pack_into(&self, out: &Bound<'_, PyAny>, field: Option<&str>) -> PyResult<Vec<usize>> {
        let view =
            PyUntypedBuffer::get(out).map_err(|_| errors::type_error("out must support the buffer protocol".into()))?;
        if view.readonly() || !view.is_c_contiguous() {
            return Err(errors::invalid(format!(
                "out must be writable and contiguous; it is {}",
                if view.readonly() { "read-only" } else { "not contiguous" }
            )));
        }
        let len = view.len_bytes();
        let bytes: &mut [u8] = if len == 0 {
            &mut []
        } else {
            // SAFETY: `view` holds the exporter's writable, C-contiguous buffer of `len` bytes
            // for this call; the GIL is held throughout, so no Python code touches it while the
            // slice lives, and the slice is dropped before `view` is released.
            unsafe { std::slice::from_raw_parts_mut(view.buf_ptr().cast::<u8>(), len) }
        };
        self.batch.pack_into(field, bytes).py_err()
    }

    fn __repr__(&self) -> String {
        format!("ringtier.RecordBatch(records={}, bytes={})", self.batch.len(), self.batch.bytes())
    }
}

/// The storage of a new `bytes` object and its length, filled with the GIL released.
#[derive(Debug)]
struct Dest(*mut u8, usize);

// SAFETY: the pointer is into a bytes object that only the filling call references and keeps
// alive while the `Dest` is used; the memory is plain bytes, written by one thread.
unsafe impl Send for Dest {}
// SAFETY: as for `Send`: shared references to a `Dest` only read its address and length.
unsafe impl Sync for Dest {}

/// One field of a record (a WebDataset member, the data of a TFRecord), exposed through the
/// buffer protocol (writable, one-dimensional, unsigned bytes).
#[pyclass(module = "ringtier._ringtier", name = "RecordField", frozen)]
#[derive(Debug)]
pub(crate) struct Field {
    /// The member's extension (`jpg`, `cls`); empty for TFRecord.
    #[pyo3(get)]
    name: String,
    bytes: ExportedBytes<Vec<u8>>,
}

impl Field {
    fn new(name: String, data: Vec<u8>) -> Self {
        Field { name, bytes: ExportedBytes::new(data) }
    }

    /// Fills `view` for `owner` (this field's Python object).
    ///
    /// # Safety
    ///
    /// `owner` is this field's Python object; `view` as in [`ExportedBytes::get_buffer`].
    unsafe fn export(
        &self,
        py: Python<'_>,
        owner: *mut pyo3::ffi::PyObject,
        view: *mut pyo3::ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        // SAFETY: `owner` owns `self.bytes` (the function's contract), and the field class's
        // `__releasebuffer__` releases the view.
        unsafe { self.bytes.get_buffer(py, owner, view, flags, "this record field was released") }
    }
}

#[pymethods]
impl Field {
    fn __len__(&self) -> usize {
        self.bytes.len()
    }

    /// A copy of the bytes.
    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        // A field's bytes are never taken back.
        self.bytes.to_bytes(py).unwrap_or_else(|| PyBytes::new(py, &[]))
    }

    fn __repr__(&self) -> String {
        format!("ringtier.RecordField(name={:?}, bytes={})", self.name, self.bytes.len())
    }

    /// Exposes the bytes: one dimension, format `B`, writable.
    unsafe fn __getbuffer__(slf: PyRef<'_, Self>, view: *mut pyo3::ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        // SAFETY: `slf` is this field's object.
        unsafe { slf.export(slf.py(), slf.as_ptr(), view, flags) }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {
        self.bytes.release_view();
    }
}

/// One record of a shard: a TFRecord (one unnamed field) or a WebDataset sample (a field per
/// member sharing its key).
#[pyclass(module = "ringtier._ringtier", name = "Record", frozen)]
#[derive(Debug)]
pub(crate) struct Record {
    /// Index of its shard (see `RecordLoader.shards()`).
    #[pyo3(get)]
    shard: usize,
    /// Key of its shard.
    #[pyo3(get)]
    shard_key: String,
    /// Byte offset of the record (TFRecord) or of its first tar header (WebDataset).
    #[pyo3(get)]
    offset: u64,
    /// Bytes it takes in the shard, framing included.
    #[pyo3(get)]
    size: u64,
    /// The WebDataset sample key; empty for TFRecord.
    #[pyo3(get)]
    key: String,
    fields: Vec<Py<Field>>,
}

impl Record {
    fn new(py: Python<'_>, r: records::Record, shard_key: String) -> PyResult<Self> {
        let fields =
            r.fields.into_iter().map(|f| Py::new(py, Field::new(f.name, f.data))).collect::<PyResult<Vec<_>>>()?;
        Ok(Record { shard: r.shard, shard_key, offset: r.offset, size: r.len, key: r.key, fields })
    }

    fn only(&self) -> PyResult<&Py<Field>> {
        match self.fields.as_slice() {
            [one] => Ok(one),
            many => Err(PyBufferError::new_err(format!(
                "record {:?} of shard {} has {} fields ({}): take one with record[name]",
                self.key,
                self.shard_key,
                many.len(),
                self.names().join(", ")
            ))),
        }
    }
}

#[pymethods]
impl Record {
    /// The field names, in shard order.
    fn names(&self) -> Vec<String> {
        self.fields.iter().map(|f| f.get().name.clone()).collect()
    }

    /// The fields by name.
    #[getter]
    fn fields<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for f in &self.fields {
            d.set_item(f.get().name.as_str(), f.clone_ref(py))?;
        }
        Ok(d)
    }

    fn __getitem__(&self, py: Python<'_>, name: &str) -> PyResult<Py<Field>> {
        self.fields.iter().find(|f| f.get().name == name).map(|f| f.clone_ref(py)).ok_or_else(|| {
            PyKeyError::new_err(format!(
                "record {:?} of shard {} has no field {name:?} (it has: {})",
                self.key,
                self.shard_key,
                self.names().join(", ")
            ))
        })
    }

    fn __contains__(&self, name: &str) -> bool {
        self.fields.iter().any(|f| f.get().name == name)
    }

    /// Bytes of all fields.
    fn __len__(&self) -> usize {
        self.fields.iter().map(|f| f.get().bytes.len()).sum()
    }

    /// A copy of the bytes of a record with one field (a TFRecord).
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        Ok(self.only()?.get().to_bytes(py))
    }

    fn __repr__(&self) -> String {
        format!(
            "ringtier.Record(shard={:?}, offset={}, key={:?}, fields={:?}, bytes={})",
            self.shard_key,
            self.offset,
            self.key,
            self.names(),
            self.__len__()
        )
    }

    /// A record with one field (a TFRecord) exposes its bytes directly: the view belongs to
    /// the field.
    unsafe fn __getbuffer__(slf: PyRef<'_, Self>, view: *mut pyo3::ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let py = slf.py();
        let field = slf.only()?.bind(py);
        // SAFETY: `field` is the field's own object; the view references it, so the bytes
        // outlive the view, and its `__releasebuffer__` is the one called on release.
        unsafe { field.get().export(py, field.as_ptr(), view, flags) }
    }
}
