//! `ringtier.Loader`, its epochs, batches and samples. Samples reach Python through the
//! buffer protocol: a raw sample is the pooled buffer the file was read into, writable, handed
//! back to the pool when the last view of it (numpy array, torch tensor, memoryview) and the
//! `Sample` itself are gone.

use std::ffi::c_int;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use ringtier_core::error::{Error, ErrorKind};
use ringtier_core::{BufferPool, ListOptions};
use ringtier_dataset::manifest::MANIFEST_FILE;
use ringtier_dataset::OnBadSample;
use ringtier_decode::DecodeConfig;
use ringtier_loader::{LoaderConfig, SampleData};
use ringtier_uring::UringConfig;

use crate::buffer::{ExportedBytes, OwnedBytes};
use crate::engine::{engine, wait, wait_plain, Engine, ForkGuarded};
use crate::errors::{self, IntoPy};

/// The dataset directory of `path`: the directory itself, or the one holding a manifest file
/// (an `s3://` URL as it is: checked when its tier opens).
pub(crate) fn dataset_dir(path: &Path) -> PyResult<PathBuf> {
    if path.is_dir() || crate::tiers::s3_url(path).is_some() {
        return Ok(path.to_path_buf());
    }
    if path.is_file() && path.file_name().is_some_and(|n| n == MANIFEST_FILE) {
        if let Some(dir) = path.parent() {
            return Ok(if dir.as_os_str().is_empty() { PathBuf::from(".") } else { dir.to_path_buf() });
        }
    }
    let why = if path.exists() {
        format!("{} is neither a directory nor a {MANIFEST_FILE} file", path.display())
    } else {
        format!("dataset directory {} does not exist", path.display())
    };
    Err(errors::to_py(Error::new(ErrorKind::NotFound, why)))
}

/// The samples of a loader (for keys by index) and the path they were listed from.
#[derive(Debug, Clone)]
struct Keys {
    dataset: ringtier_dataset::Samples,
    /// What the listing left out, (key, reason), and the warning naming it.
    skipped: Arc<Vec<(String, String)>>,
    summary: Option<String>,
    /// How the samples were listed.
    listing: ListingInfo,
}

/// What `Loader.listing` reports.
#[derive(Debug, Clone)]
struct ListingInfo {
    samples: usize,
    bytes: usize,
    from_cache: bool,
    sizes: &'static str,
    buffer_bytes: u64,
}

/// Warns (a Python `RuntimeWarning`) with `msg`; a filter that turns warnings into errors
/// prints it instead of failing the call.
pub(crate) fn warn_runtime(py: Python<'_>, msg: &str) {
    let category = py.get_type::<pyo3::exceptions::PyRuntimeWarning>();
    let msg = std::ffi::CString::new(msg.replace('\0', " ")).unwrap_or_default();
    if let Err(e) = PyErr::warn(py, &category, &msg, 1) {
        e.print(py);
    }
}

/// Everything of a loader that must stay in its process.
#[derive(Debug)]
struct LoaderState {
    engine: Arc<Engine>,
    loader: Arc<ringtier_loader::Loader>,
    /// The samples (keys by index; shared with the loader, not copied).
    keys: Keys,
    /// Raw samples Python holds now.
    held: Arc<AtomicUsize>,
}

/// Reads a dataset in shuffled, sharded batches with a bounded prefetch (see the stub for the
/// Python documentation).
#[pyclass(module = "ringtier._ringtier", name = "Loader")]
#[derive(Debug)]
pub(crate) struct Loader {
    state: ForkGuarded<LoaderState>,
    batch_size: usize,
    decode: Option<u32>,
}

/// The settings Python passes, checked.
#[allow(clippy::too_many_arguments)]
fn loader_config(
    batch_size: usize,
    prefetch: usize,
    shuffle: bool,
    seed: u64,
    rank: usize,
    world_size: usize,
    drop_last: bool,
    decode: Option<u32>,
    decode_threads: usize,
    verify: bool,
    on_bad: &str,
) -> PyResult<LoaderConfig> {
    let on_bad = match on_bad {
        "skip" => OnBadSample::Skip,
        "fail" => OnBadSample::Fail,
        other => return Err(errors::invalid(format!("on_bad must be \"skip\" or \"fail\", not {other:?}"))),
    };
    if batch_size == 0 {
        return Err(errors::invalid("batch size must be at least 1".into()));
    }
    if decode == Some(0) {
        return Err(errors::invalid("decode size must be at least 1 pixel".into()));
    }
    Ok(LoaderConfig::default()
        .with_batch_size(batch_size)
        .with_prefetch(prefetch)
        .with_shuffle(shuffle)
        .with_seed(seed)
        .with_rank(rank)
        .with_world(world_size)
        .with_drop_last(drop_last)
        .with_decode(decode.map(|s| DecodeConfig::default().with_size(s).with_threads(decode_threads)))
        .with_verify(verify)
        .with_on_bad(on_bad))
}

#[pymethods]
impl Loader {
    #[new]
    #[pyo3(signature = (path, *, batch_size=64, prefetch=2, shuffle=true, seed=0, rank=0, world_size=1,
        drop_last=false, decode=None, decode_threads=2, verify=false, on_bad="skip", engine="auto", hold=None,
        keys=None, cache=None, materialize=None, materialize_size=None, materialize_for=None, lazy_pool=false,
        warn_skipped=true, stat_files=false, listing_cache=true))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        batch_size: usize,
        prefetch: usize,
        shuffle: bool,
        seed: u64,
        rank: usize,
        world_size: usize,
        drop_last: bool,
        decode: Option<u32>,
        decode_threads: usize,
        verify: bool,
        on_bad: &str,
        engine: &str,
        hold: Option<usize>,
        keys: Option<Vec<String>>,
        cache: Option<&Bound<'_, PyAny>>,
        materialize: Option<PathBuf>,
        materialize_size: Option<u32>,
        materialize_for: Option<PyRef<'_, crate::transforms::TransformPipeline>>,
        lazy_pool: bool,
        warn_skipped: bool,
        stat_files: bool,
        listing_cache: bool,
    ) -> PyResult<Self> {
        let mut cfg = loader_config(
            batch_size,
            prefetch,
            shuffle,
            seed,
            rank,
            world_size,
            drop_last,
            decode,
            decode_threads,
            verify,
            on_bad,
        )?;
        // The cache in front of the dataset and the split point (src/cache.rs, src/materialize.rs).
        if let Some(c) = cache {
            cfg = cfg.with_cache(crate::cache::cache_config(c)?);
        }
        let mut decode = decode;
        match (&materialize, materialize_for) {
            (Some(m), None) => {
                let m = crate::materialize::materialize(m, materialize_size, cfg.decode.as_ref(), engine)?;
                cfg = cfg.with_materialize(m);
            }
            // The split point of a transform chain: the loader yields the stored pixels, the
            // pipeline runs the rest on them (src/materialize.rs).
            (Some(m), Some(pipe)) => {
                if decode.is_some() {
                    return Err(errors::invalid(
                        "materialize_for= decodes to the transform's split point itself: leave decode=None".into(),
                    ));
                }
                let (m, d) =
                    crate::materialize::materialize_split(m, materialize_size, pipe.config(), decode_threads, engine)?;
                decode = Some(d.size);
                cfg = cfg.with_decode(Some(d)).with_materialize(m);
            }
            (None, Some(_)) => return Err(errors::invalid("materialize_for= without materialize=DIR".into())),
            (None, None) => {}
        }
        let dir = dataset_dir(&path)?;
        let engine = if crate::tiers::s3_url(&dir).is_some() { "uring" } else { crate::tiers::resolve_engine(engine)? };
        let eng = crate::engine::engine()?;
        let _enter = eng.handle().enter();
        // List (or read the manifest) through a tier without a pool, then open the tier the
        // loader reads through with a pool of the loader's shape plus `hold` buffers for the
        // samples Python keeps. The lister keeps the default ring depth: both tiers are open at
        // once, and without CAP_IPC_LOCK their rings share the locked-memory limit.
        let lister = crate::tiers::open_tier_with(&dir, engine, None, false, true, UringConfig::default())?;
        let alignment = lister.capabilities().alignment;
        // One bad entry (a dangling link, a loop, a directory that cannot be read) is left out
        // and named once under on_bad="skip", and an error naming it under "fail".
        let on_bad = cfg.on_bad;
        // Sizes are learned from the reads unless asked for (or needed: a cache plans by them, a
        // materialized store is named by them); the listing is cached beside the dataset.
        let stat_files = stat_files || cfg.cache.is_some() || cfg.materialize.is_some();
        let listing = ListOptions::default()
            .with_skip_bad(on_bad == OnBadSample::Skip)
            .with_stat_files(stat_files)
            .with_cache(listing_cache);
        let dataset = match keys {
            // Keys given (ImageFolder's): a stat each only where sizes are wanted or a key that
            // cannot be read must fail now; otherwise the reads learn sizes and skip bad keys.
            Some(keys) if !stat_files && on_bad == OnBadSample::Skip => {
                wait_plain(py, &eng, ringtier_dataset::Dataset::from_keys_unsized(lister, keys))?
            }
            Some(keys) => wait_plain(py, &eng, ringtier_dataset::Dataset::from_keys_with(lister, keys, on_bad))?,
            None => wait_plain(py, &eng, ringtier_dataset::Dataset::from_dir_with(lister, &dir, listing))?,
        }
        .py_err()?;
        let origin = dir.display().to_string();
        let skipped: Vec<(String, String)> =
            dataset.skipped().iter().map(|s| (s.key.clone(), s.error.to_string())).collect();
        let summary =
            (!skipped.is_empty()).then(|| ringtier_dataset::Dataset::skipped_summary(dataset.skipped(), &origin));
        if let (true, Some(msg)) = (warn_skipped, &summary) {
            warn_runtime(py, msg);
        }
        let sizes = if !dataset.sizes_known() {
            "learned"
        } else if dataset.sizes_are_hints() {
            "hints"
        } else {
            "exact"
        };
        let listing = ListingInfo {
            samples: dataset.len(),
            bytes: dataset.heap_bytes(),
            from_cache: dataset.from_cache(),
            sizes,
            buffer_bytes: dataset.max_size(),
        };
        if dataset.is_empty() {
            return Err(errors::invalid(format!("no samples in {}", dir.display())));
        }
        let largest = cfg.materialize.as_ref().map_or(dataset.max_size(), |m| dataset.max_size().max(m.sample_bytes()));
        let mut pool_cfg = ringtier_loader::Loader::pool_config(largest, alignment, &cfg);
        pool_cfg = pool_cfg.with_count(pool_cfg.count + hold.unwrap_or(batch_size));
        // A lazy pool (src/lazy_pool.rs) is neither touched nor registered now: set-up is free,
        // reads fault in the pages they fill.
        let pool = match (engine, lazy_pool) {
            ("uring", false) => Some(BufferPool::new(pool_cfg).py_err()?),
            ("uring", true) => Some(crate::lazy_pool::lazy_pool(&pool_cfg).py_err()?),
            _ => None,
        };
        let tier = if lazy_pool && crate::tiers::s3_url(&dir).is_none() && engine == "uring" {
            crate::tiers::open_tier_with(
                &dir,
                engine,
                pool,
                false,
                true,
                UringConfig::dataset().with_register_buffers(false),
            )?
        } else {
            crate::tiers::open_tier(&dir, engine, pool, false, true)?
        };
        let dataset = dataset.with_tier(tier);
        let keys = Keys { dataset: dataset.samples(), skipped: Arc::new(skipped), summary, listing };
        let loader = ringtier_loader::Loader::new(dataset, cfg).py_err()?;
        let state =
            LoaderState { engine: eng.clone(), loader: Arc::new(loader), keys, held: Arc::new(AtomicUsize::new(0)) };
        Ok(Loader { state: ForkGuarded::new("Loader", state), batch_size, decode })
    }

    /// Batches of `epoch` from `position` (samples of this rank already consumed) on.
    #[pyo3(signature = (epoch=0, position=0))]
    fn epoch(&self, epoch: u64, position: usize) -> PyResult<Epoch> {
        let st = self.state.get()?;
        let _enter = st.engine.handle().enter();
        let inner = st.loader.epoch(epoch, position).py_err()?;
        let state = EpochState {
            engine: Arc::clone(&st.engine),
            epoch: inner,
            pool: st.loader.buffer_pool().clone(),
            keys: st.keys.clone(),
            held: Arc::clone(&st.held),
        };
        Ok(Epoch {
            state: ForkGuarded::new("Epoch", state),
            epoch,
            position,
            batch_size: self.batch_size,
            decode: self.decode,
            done: false,
        })
    }

    /// The raw samples of `epoch` from `position` on, for TensorFlow's batch op: the epoch is
    /// kept in this process's table of TensorFlow epochs and its token returned; the op takes
    /// each batch's bytes and sample indices with no Python and no GIL (`ringtier_tf_next_records`).
    #[pyo3(signature = (epoch=0, position=0))]
    fn _tf_epoch(&self, epoch: u64, position: usize) -> PyResult<u64> {
        if self.decode.is_some() {
            return Err(errors::invalid("TensorFlow's batch op takes raw samples, not decoded ones".into()));
        }
        let st = self.state.get()?;
        let _enter = st.engine.handle().enter();
        let inner = st.loader.epoch(epoch, position).py_err()?;
        Ok(crate::tf_records::register_files(Arc::clone(&st.engine), inner))
    }

    /// Samples this rank reads per epoch.
    fn __len__(&self) -> PyResult<usize> {
        Ok(self.state.get()?.loader.samples_per_epoch())
    }

    /// The dataset's keys, indexed by sample index.
    fn keys(&self) -> PyResult<Vec<String>> {
        let ds = &self.state.get()?.keys.dataset;
        Ok((0..ds.len()).filter_map(|i| ds.key(i)).map(str::to_string).collect())
    }

    /// The entries the listing left out under on_bad="skip" (a dangling link, a link loop, a
    /// directory that cannot be read), as (key, reason) pairs.
    #[getter]
    fn skipped(&self) -> PyResult<Vec<(String, String)>> {
        Ok(self.state.get()?.keys.skipped.as_ref().clone())
    }

    /// The warning naming the entries the listing left out, or None when it left none out.
    #[getter]
    fn skipped_summary(&self) -> PyResult<Option<String>> {
        Ok(self.state.get()?.keys.summary.clone())
    }

    /// How the dataset was listed: samples, bytes its keys and sizes hold (the key's bytes
    /// plus 16 per sample), from_cache (the `.ringtier-listing` beside it was current), sizes
    /// ("exact": stat'd; "hints": from the cache; "learned": from the reads) and max_size (the
    /// largest size known or estimated, which the buffers are sized by).
    #[getter]
    fn listing<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let l = &self.state.get()?.keys.listing;
        let d = PyDict::new(py);
        d.set_item("samples", l.samples)?;
        d.set_item("bytes", l.bytes)?;
        d.set_item("from_cache", l.from_cache)?;
        d.set_item("sizes", l.sizes)?;
        d.set_item("max_size", l.buffer_bytes)?;
        Ok(d)
    }

    /// Buffers in the sample pool.
    #[getter]
    fn pool_buffers(&self) -> PyResult<usize> {
        Ok(self.state.get()?.loader.buffer_pool().count())
    }

    /// Bytes of the sample pool.
    #[getter]
    fn pool_bytes(&self) -> PyResult<usize> {
        Ok(self.state.get()?.loader.pool_bytes())
    }

    /// The cache's totals (hits, misses, prefetches, per level), or None without `cache=`.
    fn cache_stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        match self.state.get()?.loader.cache() {
            Some(c) => Ok(Some(crate::cache::stats_dict(py, &c.stats())?)),
            None => Ok(None),
        }
    }

    /// Raw samples Python holds now.
    #[getter]
    fn held(&self) -> PyResult<usize> {
        Ok(self.state.get()?.held.load(Ordering::Relaxed))
    }

    fn __repr__(&self) -> String {
        match self.state.get() {
            Ok(st) => format!(
                "ringtier.Loader(samples={}, per_epoch={}, batch_size={}, pool_buffers={})",
                st.keys.dataset.len(),
                st.loader.samples_per_epoch(),
                self.batch_size,
                st.loader.buffer_pool().count()
            ),
            Err(_) => "ringtier.Loader(<inherited through fork>)".into(),
        }
    }
}

#[derive(Debug)]
struct EpochState {
    engine: Arc<Engine>,
    epoch: ringtier_loader::Epoch,
    pool: BufferPool,
    keys: Keys,
    held: Arc<AtomicUsize>,
}

/// How long the reader may sit without a free buffer while Python holds the rest before
/// that is an error rather than a slow read.
const EXHAUSTED_AFTER: Duration = Duration::from_millis(500);

/// One epoch's batches: an iterator of [`Batch`].
#[pyclass(module = "ringtier._ringtier", name = "Epoch")]
#[derive(Debug)]
pub(crate) struct Epoch {
    state: ForkGuarded<EpochState>,
    epoch: u64,
    position: usize,
    batch_size: usize,
    decode: Option<u32>,
    done: bool,
}

#[pymethods]
impl Epoch {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<Batch>> {
        if self.done {
            return Ok(None);
        }
        let batch_size = self.batch_size;
        let st = self.state.get_mut()?;
        let (pool, held) = (st.pool.clone(), Arc::clone(&st.held));
        let stuck = |waited: Duration| -> PyResult<()> {
            let held_now = held.load(Ordering::Relaxed);
            if waited >= EXHAUSTED_AFTER && pool.in_use() >= pool.count() && held_now + batch_size > pool.count() {
                return Err(errors::pool_exhausted(format!(
                    "the loader cannot read the next batch: Python holds {held_now} of its {} sample buffers and \
                     a batch needs {batch_size}. Drop samples (and arrays or tensors viewing them) once used, copy \
                     the ones to keep (sample.to_bytes(), numpy.array(sample)), or create the Loader with a \
                     larger hold=",
                    pool.count(),
                )));
            }
            Ok(())
        };
        let engine = Arc::clone(&st.engine);
        let next = wait(py, &engine, st.epoch.next(), stuck)?;
        let batch = match next {
            None => {
                self.done = true;
                return Ok(None);
            }
            Some(Err(e)) => {
                self.done = true;
                return Err(errors::to_py(e));
            }
            Some(Ok(b)) => b,
        };
        self.position += batch.indices.len() + batch.skipped.len();
        let keys = st.keys.dataset.clone();
        let held = Arc::clone(&st.held);
        let shape = self.decode.map(|s| (s as usize, s as usize, 3usize));
        let mut samples = Vec::with_capacity(batch.samples.len());
        for (data, &index) in batch.samples.into_iter().zip(&batch.indices) {
            let counted = matches!(data, SampleData::Raw(_)).then(|| Arc::clone(&held));
            samples.push(Py::new(py, Sample::new(data, index, keys.clone(), counted, shape))?);
        }
        Ok(Some(Batch {
            epoch: batch.epoch,
            index: batch.index,
            indices: batch.indices,
            samples,
            skipped: batch.skipped,
            bytes: batch.bytes,
            read_seconds: batch.read_seconds,
            decode_seconds: batch.decode_seconds,
        }))
    }

    /// Samples of this rank consumed (delivered or skipped) since the start of the epoch: pass
    /// it to `Loader.epoch(epoch, position)` to resume after a restart.
    #[getter]
    fn position(&self) -> usize {
        self.position
    }

    /// The epoch number.
    #[getter]
    fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Totals so far: batches, samples, skipped, bytes, stall/read/decode seconds.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.state.get()?.epoch.stats();
        let d = PyDict::new(py);
        d.set_item("batches", s.batches)?;
        d.set_item("samples", s.samples)?;
        d.set_item("skipped", s.skipped)?;
        d.set_item("bytes", s.bytes)?;
        d.set_item("stall_seconds", s.stall_seconds)?;
        d.set_item("first_stall_seconds", s.first_stall_seconds)?;
        d.set_item("read_seconds", s.read_seconds)?;
        d.set_item("decode_seconds", s.decode_seconds)?;
        Ok(d)
    }
}

/// A batch of samples.
#[pyclass(module = "ringtier._ringtier", name = "Batch", frozen)]
#[derive(Debug)]
pub(crate) struct Batch {
    /// The epoch.
    #[pyo3(get)]
    epoch: u64,
    /// Index of the batch in this rank's epoch.
    #[pyo3(get)]
    index: usize,
    /// Dataset indices of the samples, in order.
    #[pyo3(get)]
    indices: Vec<u32>,
    samples: Vec<Py<Sample>>,
    /// Samples left out, with the reason.
    #[pyo3(get)]
    skipped: Vec<String>,
    /// Bytes read.
    #[pyo3(get)]
    bytes: u64,
    /// Seconds the read took.
    #[pyo3(get)]
    read_seconds: f64,
    /// Seconds decoding took.
    #[pyo3(get)]
    decode_seconds: f64,
}

#[pymethods]
impl Batch {
    /// The samples, in order.
    #[getter]
    fn samples(&self, py: Python<'_>) -> Vec<Py<Sample>> {
        self.samples.iter().map(|s| s.clone_ref(py)).collect()
    }

    fn __len__(&self) -> usize {
        self.samples.len()
    }

    fn __getitem__(&self, py: Python<'_>, i: isize) -> PyResult<Py<Sample>> {
        let n = self.samples.len() as isize;
        let j = if i < 0 { i + n } else { i };
        if j < 0 || j >= n {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!("batch index {i} out of range ({n} samples)")));
        }
        Ok(self.samples[j as usize].clone_ref(py))
    }

    fn __iter__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let list = pyo3::types::PyList::new(py, self.samples.iter().map(|s| s.clone_ref(py)))?;
        Ok(list.try_iter()?.into_any().unbind())
    }

    fn __repr__(&self) -> String {
        format!(
            "ringtier.Batch(epoch={}, index={}, samples={}, skipped={}, bytes={})",
            self.epoch,
            self.index,
            self.samples.len(),
            self.skipped.len(),
            self.bytes
        )
    }
}

impl OwnedBytes for SampleData {
    fn as_mut_bytes(&mut self) -> &mut [u8] {
        match self {
            SampleData::Raw(b) | SampleData::Decoded(b) => b.as_mut_slice(),
        }
    }
}

/// One sample: a pooled buffer (raw bytes) or decoded pixels, exposed through the buffer
/// protocol (writable, one-dimensional, unsigned bytes).
#[pyclass(module = "ringtier._ringtier", name = "Sample", frozen)]
#[derive(Debug)]
pub(crate) struct Sample {
    bytes: ExportedBytes<SampleData>,
    /// Dataset index.
    #[pyo3(get)]
    index: u32,
    /// The samples of its dataset (its key, by index).
    keys: ringtier_dataset::Samples,
    /// The loader's count of raw samples Python holds (raw samples only).
    counted: Option<Arc<AtomicUsize>>,
    /// (height, width, channels) of a decoded sample.
    #[pyo3(get)]
    shape: Option<(usize, usize, usize)>,
    /// The process that read it: a copy inherited through `fork()` is leaked there, not given
    /// back to a pool whose locks the parent's threads may have held at the fork.
    pid: u32,
}

impl Sample {
    fn new(
        data: SampleData,
        index: u32,
        keys: ringtier_dataset::Samples,
        counted: Option<Arc<AtomicUsize>>,
        shape: Option<(usize, usize, usize)>,
    ) -> Self {
        if let Some(c) = &counted {
            c.fetch_add(1, Ordering::Relaxed);
        }
        Sample { bytes: ExportedBytes::new(data), index, keys, counted, shape, pid: std::process::id() }
    }

    fn give_back(&self, data: Option<SampleData>) {
        if let Some(data) = data {
            if std::process::id() != self.pid {
                std::mem::forget(data);
                return;
            }
            drop(data);
            if let Some(c) = &self.counted {
                c.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

impl Drop for Sample {
    fn drop(&mut self) {
        let data = self.bytes.take_on_drop();
        self.give_back(data);
    }
}

#[pymethods]
impl Sample {
    /// The sample's key on its tier.
    #[getter]
    fn key(&self) -> String {
        self.keys.key(self.index as usize).unwrap_or_default().to_string()
    }

    fn __len__(&self) -> usize {
        self.bytes.len()
    }

    /// A copy of the bytes.
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        self.bytes.to_bytes(py).ok_or_else(|| errors::closed("this sample was released".into()))
    }

    /// Gives the buffer back to the loader's pool now, before the `Sample` is garbage.
    /// Fails while an array, tensor or memoryview still views it.
    fn release(&self) -> PyResult<()> {
        let data = self.bytes.take().map_err(|views| {
            PyBufferError::new_err(format!(
                "cannot release sample {}: {views} buffer view(s) (numpy arrays, tensors, memoryviews) still use it",
                self.index
            ))
        })?;
        self.give_back(data);
        Ok(())
    }

    /// True once released.
    #[getter]
    fn released(&self) -> bool {
        self.bytes.is_taken()
    }

    fn __repr__(&self) -> String {
        format!("ringtier.Sample(index={}, key={:?}, bytes={})", self.index, self.key(), self.__len__())
    }

    /// Exposes the bytes: one dimension, format `B`, writable.
    unsafe fn __getbuffer__(slf: PyRef<'_, Self>, view: *mut pyo3::ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        // SAFETY: `slf` is the object that owns `bytes`; its `__releasebuffer__` releases the view.
        unsafe { slf.bytes.get_buffer(slf.py(), slf.as_ptr(), view, flags, "this sample was released") }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {
        self.bytes.release_view();
    }
}

/// Starts this process's engine if it has none and returns the process id (tests use it to
/// check that a forked child gets an engine of its own).
#[pyfunction]
pub(crate) fn _engine_pid() -> PyResult<u32> {
    let _ = engine()?;
    Ok(std::process::id())
}
