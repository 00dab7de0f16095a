//! `ringtier.doctor(paths)` and `python -m ringtier doctor`: the same report as `ringtier
//! doctor` (`ringtier::doctor`), from the extension this Python actually loads (its decoder,
//! its io_uring, this process's memlock limit).

use std::path::PathBuf;

use pyo3::prelude::*;

/// The doctor's report over `paths` (the current and the temp directory when empty): one line
/// per finding then the verdict, or the JSON report with `json=True`.
#[pyfunction]
#[pyo3(signature = (paths=Vec::new(), json=false))]
pub(crate) fn doctor(py: Python<'_>, paths: Vec<PathBuf>, json: bool) -> String {
    let report = py.detach(|| ringtier::doctor::run(&paths));
    if json {
        report.to_json()
    } else {
        report.lines().join("\n")
    }
}
