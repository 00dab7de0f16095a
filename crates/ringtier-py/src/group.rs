//! The group commit for Python (`ringtier_migrate::group`): the protocol's decisions in Rust,
//! the collectives (`all_gather_object`, `broadcast_object_list`) in Python, where
//! `torch.distributed` lives. `ringtier.torch.DistributedCheckpointStore` and the DCP
//! `StorageWriter`/`StorageReader` both use it.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use ringtier_migrate::group::{GroupCommit, GroupManifest as RustManifest, RankReport, RankShard};
use ringtier_migrate::{CheckpointStore as RustStore, Part};

use crate::engine::{engine, wait_plain};
use crate::errors::{self, IntoPy};
use crate::store::CheckpointStore;

/// Proves this rank's shard of `step` committed in `store` (its manifest read back) and returns
/// the report to send to the coordinator. `FileNotFoundError` when it is not committed.
#[pyfunction]
#[pyo3(signature = (store, rank, step, bytes, items=None))]
fn group_shard<'py>(
    py: Python<'py>,
    store: PyRef<'py, CheckpointStore>,
    rank: u32,
    step: u64,
    bytes: u64,
    items: Option<u64>,
) -> PyResult<Bound<'py, PyBytes>> {
    let eng = engine()?;
    let s = store.rust()?;
    let shard = wait_plain(py, &eng, RankShard::committed(s, rank, step, bytes, items))?.py_err()?;
    Ok(PyBytes::new(py, &shard.to_bytes()))
}

/// On the coordinator: commits `step` from every rank's report (`reports[r]`: rank `r`'s
/// bytes from `group_shard`, or its error as a str), writing the group manifest (and `extra`
/// parts, `[(name, bytes)]`) as `step` of `coordinator`, last. `ValueError` (nothing written)
/// when a rank failed or a report is not a committed shard's. Returns the manifest.
#[pyfunction]
#[pyo3(signature = (coordinator, step, reports, extra=Vec::new()))]
fn group_commit(
    py: Python<'_>,
    coordinator: PyRef<'_, CheckpointStore>,
    step: u64,
    reports: Vec<Bound<'_, PyAny>>,
    extra: Vec<(String, Bound<'_, PyBytes>)>,
) -> PyResult<GroupManifest> {
    let mut parsed = Vec::with_capacity(reports.len());
    for (rank, r) in (0u32..).zip(&reports) {
        if let Ok(b) = r.cast::<PyBytes>() {
            parsed.push(RankReport::Durable(RankShard::parse_report(b.as_bytes()).py_err()?));
        } else if let Ok(error) = r.extract::<String>() {
            parsed.push(RankReport::Failed { rank, error });
        } else {
            return Err(errors::type_error(format!("report {rank}: bytes (a shard) or str (an error) expected")));
        }
    }
    let eng = engine()?;
    let store = coordinator.rust()?;
    let parts: Vec<Part<'_>> = extra.iter().map(|(n, b)| Part::bytes(n.clone(), b.as_bytes())).collect();
    let m = wait_plain(py, &eng, GroupCommit::new(store).commit(step, parsed, parts))?.py_err()?;
    Ok(GroupManifest { inner: m })
}

/// The group manifest of committed `step` in `coordinator`: `FileNotFoundError` when the step
/// is not committed, `CorruptError` when its manifest is bad, `ValueError` when `world_size`
/// is given and differs.
#[pyfunction]
#[pyo3(signature = (coordinator, step, world_size=None))]
fn group_check(
    py: Python<'_>,
    coordinator: PyRef<'_, CheckpointStore>,
    step: u64,
    world_size: Option<u32>,
) -> PyResult<GroupManifest> {
    let eng = engine()?;
    let store = coordinator.rust()?;
    let m = wait_plain(py, &eng, GroupCommit::new(store).check(step, world_size))?.py_err()?;
    Ok(GroupManifest { inner: m })
}

/// A committed step's group manifest (world size, every rank's bytes and shard digest).
#[pyclass(module = "ringtier._ringtier", name = "GroupManifest", frozen)]
#[derive(Debug)]
pub(crate) struct GroupManifest {
    inner: RustManifest,
}

#[pymethods]
impl GroupManifest {
    /// Parses a manifest's bytes (as sent by the coordinator) for `step`; `CorruptError` when
    /// they are not one.
    #[staticmethod]
    fn from_bytes(step: u64, data: &[u8]) -> PyResult<Self> {
        Ok(GroupManifest { inner: RustManifest::parse(data, step).py_err()? })
    }

    /// The manifest's bytes.
    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.to_bytes())
    }

    /// The step.
    #[getter]
    fn step(&self) -> u64 {
        self.inner.step()
    }

    /// The number of ranks that saved the step.
    #[getter]
    fn world_size(&self) -> u32 {
        self.inner.world_size()
    }

    /// Every rank's entry: `[{"rank", "bytes", "items", "digest"}]`, by rank.
    #[getter]
    fn ranks<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for r in self.inner.ranks() {
            let d = PyDict::new(py);
            d.set_item("rank", r.rank())?;
            d.set_item("bytes", r.bytes())?;
            d.set_item("items", r.items())?;
            d.set_item("digest", r.digest())?;
            out.append(d)?;
        }
        Ok(out)
    }

    /// Checks that `rank`'s shard is committed in `store` and is the one named here:
    /// `FileNotFoundError` when it is not committed, `CorruptError` when it differs.
    fn verify_shard(&self, py: Python<'_>, rank: u32, store: PyRef<'_, CheckpointStore>) -> PyResult<()> {
        let eng = engine()?;
        let s = store.rust()?;
        wait_plain(py, &eng, self.inner.verify_shard(rank, s))?.py_err()
    }

    /// The ranks whose shard is not committed where this process looks (`stores[r]`: rank
    /// `r`'s store, or None where none opens); `CorruptError` for a shard that differs.
    fn missing(&self, py: Python<'_>, stores: Vec<Option<PyRef<'_, CheckpointStore>>>) -> PyResult<Vec<u32>> {
        let eng = engine()?;
        let rust: Vec<Option<&RustStore>> =
            stores.iter().map(|s| s.as_ref().map(|s| s.rust()).transpose()).collect::<PyResult<_>>()?;
        wait_plain(py, &eng, self.inner.missing(&rust))?.py_err()
    }

    fn __repr__(&self) -> String {
        format!("GroupManifest(step={}, world_size={})", self.inner.step(), self.inner.world_size())
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<GroupManifest>()?;
    m.add_function(wrap_pyfunction!(group_shard, m)?)?;
    m.add_function(wrap_pyfunction!(group_commit, m)?)?;
    m.add_function(wrap_pyfunction!(group_check, m)?)?;
    Ok(())
}
