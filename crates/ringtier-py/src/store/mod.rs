//! `ringtier.CheckpointStore` (the Rust half): saves parts given as lists of Python buffers
//! (each part the concatenation of its buffers, written from their memory), an asynchronous
//! save from one staging copy, and loads whose parts come back as writable buffers. The
//! Python half (`ringtier/checkpoint.py`) turns state dicts into parts and back.

use std::ffi::c_int;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::PyTimeoutError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use ringtier_core::buf::AlignedBuf;
use ringtier_migrate::{
    CheckpointStore as RustStore, FnSink, OnFull, Part, RestoreEvent, RestoreOptions, SaveReport, StoreConfig,
};

use crate::buffer::ExportedBytes;
use crate::engine::{wait, wait_plain, Engine, ForkGuarded};
use crate::errors::{self, IntoPy};
use crate::tiers::open_tier;

mod parts;
pub(crate) use parts::PartBuffer;
use parts::{Chain, Exported, PyParts};

/// Reads in flight of a direct load (`load`): 16 of 4 MiB, 64 MiB of the destination being
/// read at once.
const DIRECT_DEPTH: usize = 16;

/// Bytes per read of a direct load.
const DIRECT_CHUNK: usize = 4 << 20;

/// The part of a Python checkpoint holding its tree and plain values (`ringtier/_state_dict_codec.py`).
const STATE_JSON: &str = "state.json";

/// The most bytes of a checkpoint's `state.json` read for Python (1 GiB): it holds the
/// state's tree, tensor metadata and plain values, never tensor data, and Python parses it
/// whole. A larger one is refused from its manifest size, before it is read.
const MAX_STATE_JSON_BYTES: u64 = 1 << 30;

/// Refuses a `state.json` part of `size` bytes over [`MAX_STATE_JSON_BYTES`].
fn check_state_json(name: &str, size: u64) -> ringtier_core::Result<()> {
    if name == STATE_JSON && size > MAX_STATE_JSON_BYTES {
        return Err(ringtier_core::Error::new(
            ringtier_core::ErrorKind::Corrupt,
            format!("part {name:?} of {size} bytes is larger than a Python state can be ({MAX_STATE_JSON_BYTES})"),
        ));
    }
    Ok(())
}

fn report_dict<'py>(py: Python<'py>, r: &SaveReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("step", r.step)?;
    d.set_item("bytes", r.bytes)?;
    d.set_item("tier", &r.tier)?;
    d.set_item("blocking_seconds", r.blocking.as_secs_f64())?;
    d.set_item("wrote_through", r.wrote_through)?;
    d.set_item("adopted_bytes", r.adopted_bytes)?;
    Ok(d)
}

#[derive(Debug)]
struct StoreState {
    engine: Arc<Engine>,
    store: RustStore,
    /// The staging buffer of the last finished `async_save`, kept for the next one (its pages
    /// are already faulted in).
    staging: Arc<Mutex<Option<AlignedBuf>>>,
}

/// The checkpoint store over directories, fastest first.
#[pyclass(module = "ringtier._ringtier", name = "CheckpointStore")]
#[derive(Debug)]
pub(crate) struct CheckpointStore {
    state: Option<ForkGuarded<StoreState>>,
    tiers: Vec<String>,
}

impl CheckpointStore {
    fn st(&self) -> PyResult<&StoreState> {
        match &self.state {
            Some(s) => s.get(),
            None => Err(errors::closed(format!("the checkpoint store over {:?} is closed", self.tiers))),
        }
    }

    /// The Rust store under this one (for the group commit, `crate::group`).
    pub(crate) fn rust(&self) -> PyResult<&RustStore> {
        Ok(&self.st()?.store)
    }
}

/// Staging buffers are allocated in multiples of this (so that one is reused for a checkpoint
/// that grew a little).
const STAGING_GRANULE: usize = 2 << 20;

#[pymethods]
impl CheckpointStore {
    #[new]
    #[pyo3(signature = (tiers, *, prefix="ckpt".to_string(), chunk_bytes=32<<20, keep_last=2, drain_concurrency=1,
        save_parallelism=1, drain_bytes_per_sec=None, fast_capacity_bytes=None, on_full="wait", engine="auto", read_only=false,
        create=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        tiers: Vec<PathBuf>,
        prefix: String,
        chunk_bytes: usize,
        keep_last: usize,
        drain_concurrency: usize,
        save_parallelism: usize,
        drain_bytes_per_sec: Option<u64>,
        fast_capacity_bytes: Option<u64>,
        on_full: &str,
        engine: &str,
        read_only: bool,
        create: bool,
    ) -> PyResult<Self> {
        if tiers.is_empty() {
            return Err(errors::invalid("a checkpoint store needs at least one tier directory".into()));
        }
        let on_full = match on_full {
            "wait" => OnFull::Wait,
            "write_through" | "write-through" => OnFull::WriteThrough,
            other => {
                return Err(errors::invalid(format!("on_full must be \"wait\" or \"write_through\", not {other:?}")))
            }
        };
        let names: Vec<String> = tiers.iter().map(|p| p.display().to_string()).collect();
        for dir in &tiers {
            if !create && !dir.is_dir() && crate::tiers::s3_url(dir).is_none() {
                return Err(errors::to_py(ringtier_core::Error::new(
                    ringtier_core::ErrorKind::NotFound,
                    format!(
                        "checkpoint tier directory {} does not exist (create it, or pass create=True)",
                        dir.display()
                    ),
                )));
            }
        }
        let eng = crate::engine::engine()?;
        let _enter = eng.handle().enter();
        let opened: Vec<_> =
            tiers.iter().map(|d| open_tier(d, engine, None, create, false)).collect::<PyResult<Vec<_>>>()?;
        let cfg = StoreConfig::default()
            .with_prefix(prefix)
            .with_chunk_bytes(chunk_bytes)
            .with_keep_last(keep_last)
            .with_drain_concurrency(drain_concurrency)
            .with_save_parallelism(save_parallelism)
            .with_drain_bytes_per_sec(drain_bytes_per_sec)
            .with_fast_capacity_bytes(fast_capacity_bytes)
            .with_on_full(on_full);
        let store = if read_only {
            wait_plain(py, &eng, RustStore::open_read_only(opened, cfg))?
        } else {
            wait_plain(py, &eng, RustStore::open(opened, cfg))?
        }
        .py_err()?;
        let state = StoreState { engine: eng.clone(), store, staging: Arc::default() };
        Ok(CheckpointStore { state: Some(ForkGuarded::new("CheckpointStore", state)), tiers: names })
    }

    /// Saves `parts` (`[(name, [buffer, ...]), ...]`, each part its buffers end to end) as
    /// checkpoint `step`; returns once durable on the fast tier.
    fn save<'py>(&self, py: Python<'py>, step: u64, parts: PyParts<'py>) -> PyResult<Bound<'py, PyDict>> {
        let st = self.st()?;
        let exported = Exported::new(parts)?;
        let slices = exported.slices();
        let rust_parts: Vec<Part<'_>> = exported
            .names
            .iter()
            .zip(slices)
            .map(|(name, s)| {
                let chain = Chain::new(s);
                let len = chain.len;
                Part::seekable(name.clone(), chain, Some(len))
            })
            .collect();
        let report = wait_plain(py, &st.engine, st.store.save(step, rust_parts))?.py_err()?;
        drop(exported);
        report_dict(py, &report)
    }

    /// Commits the files `dir/NAME` (`dir` a directory under the fast tier, relative to its
    /// root, `/`-separated) as the parts of checkpoint `step` without writing them again where
    /// the fast tier adopts them (`CheckpointStore::commit_files`); returns once durable on the
    /// fast tier, the report's `adopted_bytes` saying how much was not copied.
    fn commit_files<'py>(
        &self,
        py: Python<'py>,
        step: u64,
        dir: String,
        names: Vec<String>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let st = self.st()?;
        let report = wait_plain(py, &st.engine, st.store.commit_files(step, &dir, &names))?.py_err()?;
        report_dict(py, &report)
    }

    /// Copies `parts` into a staging buffer (the caller may change its tensors as soon as this
    /// returns) and saves them in the background; returns a `SaveFuture`.
    fn async_save(&self, py: Python<'_>, step: u64, parts: PyParts<'_>) -> PyResult<SaveFuture> {
        let st = self.st()?;
        let exported = Exported::new(parts)?;
        let slices = exported.slices();
        let total: usize = slices.iter().flatten().map(|s| s.len()).sum();
        let cached = st.staging.lock().unwrap_or_else(|p| p.into_inner()).take();
        let mut staging = match cached {
            Some(b) if b.capacity() >= total => b,
            _ => AlignedBuf::new(total.max(1).next_multiple_of(STAGING_GRANULE), 4096).py_err()?,
        };
        let mut layout = Vec::with_capacity(slices.len());
        py.detach(|| {
            let dst = staging.capacity_mut();
            let mut off = 0;
            for (name, part) in exported.names.iter().zip(&slices) {
                let start = off;
                for s in part {
                    dst[off..off + s.len()].copy_from_slice(s);
                    off += s.len();
                }
                layout.push((name.clone(), start..off));
            }
        });
        drop(slices);
        drop(exported);
        let shared = Arc::new(FutureShared::default());
        let (store, done, cache) = (st.store.clone(), Arc::clone(&shared), Arc::clone(&st.staging));
        st.engine.handle().spawn(async move {
            let res = {
                let bytes = staging.capacity_mut();
                let parts: Vec<Part<'_>> =
                    layout.iter().map(|(n, r)| Part::bytes(n.clone(), &bytes[r.clone()])).collect();
                store.save(step, parts).await
            };
            *cache.lock().unwrap_or_else(|p| p.into_inner()) = Some(staging);
            *done.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(res);
            done.notify.notify_waiters();
        });
        Ok(SaveFuture { shared, engine: ForkGuarded::new("SaveFuture", Arc::clone(&st.engine)), step })
    }

    /// Loads checkpoint `step` (the newest intact one when None): `(step, tier, [(name,
    /// PartBuffer)], fallbacks, skipped)`, `skipped` the newer steps passed over as `[(step,
    /// reason)]`; or None when the store holds no checkpoint.
    #[pyo3(signature = (step=None))]
    fn load<'py>(&self, py: Python<'py>, step: Option<u64>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let st = self.st()?;
        // Direct first: every chunk read straight into the memory the tensors will share
        // (`direct.rs`); where the targets decline (a copy shorter than its manifest says),
        // the copying load below, with its truncation checks and fallbacks.
        let targets = Arc::new(crate::direct::MappedParts::default());
        let opts = RestoreOptions::default().with_depth(DIRECT_DEPTH).with_chunk_bytes(DIRECT_CHUNK);
        let shared: Arc<dyn ringtier_migrate::ReadTargets> = targets.clone();
        let (direct, declined_step, mut skipped) = match step {
            Some(s) => (wait_plain(py, &st.engine, st.store.load_direct(s, &opts, shared))?.py_err()?, s, Vec::new()),
            None => match wait_plain(py, &st.engine, st.store.load_latest_direct(&opts, shared))?.py_err()? {
                None => return Ok(None),
                Some((s, r, skipped)) => (r, s, skipped),
            },
        };
        if let Some(r) = direct {
            let sizes: Vec<u64> = r.parts.iter().map(|(_, n)| *n).collect();
            let maps = targets.take(&sizes).ok_or_else(|| {
                errors::to_py(ringtier_core::Error::new(
                    ringtier_core::ErrorKind::Shutdown,
                    "a read of the restore is still in flight",
                ))
            })?;
            let parts = PyList::empty(py);
            for ((name, size), map) in r.parts.into_iter().zip(maps) {
                check_state_json(&name, size).py_err()?;
                parts.append((name, PartBuffer::mapped(map)))?;
            }
            return Ok(Some((r.step, r.tier, parts, r.fallbacks, r.skipped).into_pyobject(py)?.into_any()));
        }
        let step = Some(declined_step);
        let restored = match step {
            Some(s) => wait_plain(py, &st.engine, st.store.load(s))?.py_err()?,
            None => match wait_plain(py, &st.engine, st.store.load_latest())?.py_err()? {
                Some(r) => r,
                None => return Ok(None),
            },
        };
        let parts = PyList::empty(py);
        for (name, data) in restored.parts {
            check_state_json(&name, data.len() as u64).py_err()?;
            parts.append((name, PartBuffer::new(data)))?;
        }
        skipped.extend(restored.skipped);
        Ok(Some((restored.step, restored.tier, parts, restored.fallbacks, skipped).into_pyobject(py)?.into_any()))
    }

    /// Reads part `name` of checkpoint `step` (checksum verified) into a new `PartBuffer`. A
    /// `state.json` larger than [`MAX_STATE_JSON_BYTES`] is refused before it is read.
    fn read_part(&self, py: Python<'_>, step: u64, name: String) -> PyResult<PartBuffer> {
        let st = self.st()?;
        let mut data = Vec::new();
        let mut sink = FnSink(|ev: RestoreEvent<'_>| {
            match ev {
                RestoreEvent::Begin(part) => {
                    check_state_json(&part.name, part.size)?;
                    data.clear();
                    let n = usize::try_from(part.end - part.start).unwrap_or(usize::MAX);
                    data.try_reserve_exact(n).map_err(|e| {
                        let why = format!("part {:?} ({n} bytes) does not fit in memory: {e}", part.name);
                        ringtier_core::Error::new(ringtier_core::ErrorKind::ResourceExhausted, why)
                    })?;
                }
                RestoreEvent::Data { bytes, .. } => data.extend_from_slice(bytes),
                RestoreEvent::Discard(_) => data.clear(),
                RestoreEvent::Finish(_) => {}
            }
            Ok(())
        });
        let opts = RestoreOptions::default().with_parts(Some(vec![name]));
        wait_plain(py, &st.engine, st.store.restore(step, &mut sink, &opts))?.py_err()?;
        Ok(PartBuffer::new(data))
    }

    /// Streams part `name` of checkpoint `step` and copies each chunk straight into the
    /// `targets` it overlaps (`[(offset in the part, writable C-contiguous buffer)]`, not
    /// overlapping each other): an in-place load without a buffer of the whole part. The
    /// part's checksum is checked as it streams; a bad copy is read again from a slower tier.
    fn load_scatter(
        &self,
        py: Python<'_>,
        step: u64,
        name: String,
        targets: Vec<(u64, Bound<'_, PyAny>)>,
    ) -> PyResult<u64> {
        let st = self.st()?;
        let mut held = Vec::with_capacity(targets.len());
        let mut spans: Vec<(u64, u64, SendPtr)> = Vec::with_capacity(targets.len());
        for (i, (offset, obj)) in targets.iter().enumerate() {
            let buf = PyUntypedBuffer::get(obj)
                .map_err(|e| errors::type_error(format!("load target {i} does not export a buffer: {e}")))?;
            if buf.readonly() || !buf.is_c_contiguous() {
                return Err(errors::invalid(format!("load target {i} is read-only or not C-contiguous")));
            }
            let len = buf.len_bytes() as u64;
            if len > 0 {
                spans.push((*offset, offset + len, SendPtr(buf.buf_ptr().cast::<u8>())));
            }
            held.push(buf);
        }
        spans.sort_by_key(|s| s.0);
        if spans.windows(2).any(|w| w[0].1 > w[1].0) {
            return Err(errors::invalid("load targets overlap".into()));
        }
        let mut copied = 0u64;
        let mut sink = FnSink(|ev: RestoreEvent<'_>| {
            if let RestoreEvent::Data { offset, bytes, .. } = ev {
                let end = offset + bytes.len() as u64;
                let first = spans.partition_point(|s| s.1 <= offset);
                for &(start, stop, ptr) in spans[first..].iter().take_while(|s| s.0 < end) {
                    let from = start.max(offset);
                    let to = stop.min(end);
                    let src = &bytes[(from - offset) as usize..(to - offset) as usize];
                    // SAFETY: `ptr..ptr + (stop - start)` is a writable buffer exported by an
                    // object `held` keeps alive until this function returns, after the
                    // restore; `from - start + src.len() <= stop - start`; spans do not
                    // overlap, and the source is the restore's own chunk buffer.
                    unsafe {
                        std::ptr::copy_nonoverlapping(src.as_ptr(), ptr.0.add((from - start) as usize), src.len())
                    };
                    copied += src.len() as u64;
                }
            }
            Ok(())
        });
        let opts = RestoreOptions::default().with_parts(Some(vec![name]));
        wait_plain(py, &st.engine, st.store.restore(step, &mut sink, &opts))?.py_err()?;
        drop(held);
        Ok(copied)
    }

    /// Every checkpoint with a committed copy: `[{"step", "bytes", "tiers"}]`, by step.
    fn list<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let st = self.st()?;
        let infos = wait_plain(py, &st.engine, st.store.list())?.py_err()?;
        let out = PyList::empty(py);
        for c in infos {
            let d = PyDict::new(py);
            d.set_item("step", c.step)?;
            d.set_item("bytes", c.bytes)?;
            d.set_item("tiers", c.tiers)?;
            out.append(d)?;
        }
        Ok(out)
    }

    /// Deletes checkpoint `step` from every tier (quarantined copies included), each copy
    /// manifest first. A save of it in progress makes this a `BusyError`.
    fn delete(&self, py: Python<'_>, step: u64) -> PyResult<()> {
        let st = self.st()?;
        wait_plain(py, &st.engine, st.store.delete(step))?.py_err()
    }

    /// Copies set aside because no intact copy of their step exists: `[{"step", "tier",
    /// "reason", "unix_ms"}]`, by step.
    fn quarantined<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let st = self.st()?;
        let copies = wait_plain(py, &st.engine, st.store.quarantined())?.py_err()?;
        let out = PyList::empty(py);
        for q in copies {
            let d = PyDict::new(py);
            d.set_item("step", q.step)?;
            d.set_item("tier", q.tier)?;
            d.set_item("reason", q.reason)?;
            d.set_item("unix_ms", q.unix_ms)?;
            out.append(d)?;
        }
        Ok(out)
    }

    /// The newest committed step, or None.
    fn latest(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        let st = self.st()?;
        wait_plain(py, &st.engine, st.store.latest())?.py_err()
    }

    /// Verifies every committed copy of `step`: `[(tier, None or the reason)]`.
    fn verify(&self, py: Python<'_>, step: u64) -> PyResult<Vec<(String, Option<String>)>> {
        let st = self.st()?;
        let res = wait_plain(py, &st.engine, st.store.verify(step))?.py_err()?;
        Ok(res.into_iter().map(|(t, r)| (t, r.err().map(|e| e.to_string()))).collect())
    }

    /// Waits until every committed checkpoint is copied to the slowest tier.
    fn drain(&self, py: Python<'_>) -> PyResult<()> {
        let st = self.st()?;
        wait_plain(py, &st.engine, st.store.drain())?.py_err()
    }

    /// Drain totals: checkpoints, bytes, busy_seconds, paused_seconds, backlog_bytes.
    fn drain_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let st = self.st()?;
        let s = st.store.drain_stats();
        let d = PyDict::new(py);
        d.set_item("checkpoints", s.checkpoints)?;
        d.set_item("bytes", s.bytes)?;
        d.set_item("busy_seconds", s.busy_seconds)?;
        d.set_item("paused_seconds", s.paused_seconds)?;
        d.set_item("backlog_bytes", st.store.drain_backlog_bytes())?;
        Ok(d)
    }

    /// The tier directories, fastest first.
    #[getter]
    fn tiers(&self) -> Vec<String> {
        self.tiers.clone()
    }

    /// True once closed.
    #[getter]
    fn closed(&self) -> bool {
        self.state.is_none()
    }

    /// Closes the store (its lock is released once its drain task ends); `drain=True` first
    /// waits for the drain. Closing twice is allowed.
    #[pyo3(signature = (drain=false))]
    fn close(&mut self, py: Python<'_>, drain: bool) -> PyResult<()> {
        if drain && self.state.is_some() {
            self.drain(py)?;
        }
        if let Some(state) = self.state.take() {
            // Dropping the store may wait for its drain task: without the GIL.
            py.detach(move || drop(state));
        }
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!("ringtier.CheckpointStore({:?}{})", self.tiers, if self.state.is_none() { ", closed" } else { "" })
    }
}

/// A load target's address, carried into the restore's sink.
#[derive(Debug, Clone, Copy)]
struct SendPtr(*mut u8);

// SAFETY: points into a buffer exported by a Python object that `load_scatter` keeps alive
// (its `PyUntypedBuffer`) until the restore writing through it has finished.
unsafe impl Send for SendPtr {}
// SAFETY: as above; the spans written through it do not overlap.
unsafe impl Sync for SendPtr {}

#[derive(Debug, Default)]
struct FutureShared {
    result: Mutex<Option<ringtier_core::Result<SaveReport>>>,
    notify: tokio::sync::Notify,
}

/// The result of an `async_save`, available once the checkpoint is durable on the fast tier.
#[pyclass(module = "ringtier._ringtier", name = "SaveFuture", frozen)]
#[derive(Debug)]
pub(crate) struct SaveFuture {
    shared: Arc<FutureShared>,
    engine: ForkGuarded<Arc<Engine>>,
    /// The step being saved.
    #[pyo3(get)]
    step: u64,
}

impl SaveFuture {
    fn is_done(&self) -> bool {
        self.shared.result.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }
}

#[pymethods]
impl SaveFuture {
    /// True once the save finished (durable or failed).
    fn done(&self) -> bool {
        self.is_done()
    }

    /// Waits (at most `timeout` seconds) and returns the save's report, or raises its error.
    /// Ctrl-C interrupts the wait, not the save.
    #[pyo3(signature = (timeout=None))]
    fn result<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Bound<'py, PyDict>> {
        let engine = self.engine.get()?;
        let shared = Arc::clone(&self.shared);
        let limit = timeout.map(Duration::from_secs_f64);
        let step = self.step;
        let finished = {
            let shared = Arc::clone(&shared);
            async move {
                loop {
                    let notified = shared.notify.notified();
                    if shared.result.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
                        return;
                    }
                    notified.await;
                }
            }
        };
        wait(py, engine, finished, |waited| match limit {
            Some(l) if waited >= l => {
                Err(PyTimeoutError::new_err(format!("checkpoint {step} not durable after {:.3} s", l.as_secs_f64())))
            }
            _ => Ok(()),
        })?;
        let guard = shared.result.lock().unwrap_or_else(|p| p.into_inner());
        match guard.as_ref() {
            Some(Ok(r)) => report_dict(py, r),
            Some(Err(e)) => Err(errors::to_py(ringtier_core::Error::new(e.kind(), e.to_string()))),
            None => Err(errors::invalid("the save finished without a result".into())),
        }
    }

    fn __repr__(&self) -> String {
        format!("ringtier.SaveFuture(step={}, done={})", self.step, self.is_done())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_reads_its_slices_end_to_end_and_rewinds() {
        let (a, b, c) = (vec![1u8; 5000], Vec::new(), (0..=255u8).cycle().take(70_000).collect::<Vec<_>>());
        let want: Vec<u8> = a.iter().chain(&b).chain(&c).copied().collect();
        let mut chain = Chain::new(vec![&a[..], &b[..], &c[..]]);
        assert_eq!(chain.len, want.len() as u64);
        for step in [1usize, 7, 4096, 65_536, 1 << 20] {
            chain.seek(SeekFrom::Start(0)).expect("rewind");
            let mut got = Vec::new();
            let mut buf = vec![0u8; step];
            loop {
                let n = chain.read(&mut buf).expect("read");
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            assert_eq!(got, want, "reads of {step} bytes");
        }
        chain.seek(SeekFrom::Start(4999)).expect("seek");
        let mut two = [0u8; 2];
        assert_eq!(chain.read(&mut two).expect("read"), 2);
        assert_eq!(two, [1, 0]);
        assert!(chain.seek(SeekFrom::Current(-10_000)).is_err());
        assert_eq!(chain.seek(SeekFrom::End(0)).expect("end"), want.len() as u64);
        assert_eq!(chain.read(&mut two).expect("read at end"), 0);
    }

    #[test]
    fn empty_chain() {
        let mut chain = Chain::new(Vec::new());
        let mut buf = [0u8; 8];
        assert_eq!(chain.read(&mut buf).expect("read"), 0);
    }
}
