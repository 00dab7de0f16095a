//! Prometheus metrics from Python: `ringtier.serve_metrics()` installs ringtier's exporter
//! (the same catalog and buckets as the CLI's `--metrics-addr`), `ringtier.metrics_text()`
//! renders what a scrape would return.

use std::net::SocketAddr;
use std::sync::Mutex;

use pyo3::prelude::*;
use ringtier_metrics::{ExporterConfig, MetricsExporter};

use crate::errors::{self, IntoPy};

static EXPORTER: Mutex<Option<MetricsExporter>> = Mutex::new(None);

/// Serves `/metrics` on `addr` (loopback unless `allow_remote`; port 0 picks a free one) from
/// a background thread, and returns the address served. Call it before creating loaders and
/// stores: their metrics are registered when they are built. A second call with the same
/// address returns it again.
#[pyfunction]
#[pyo3(signature = (addr="127.0.0.1:9464", allow_remote=false))]
pub(crate) fn serve_metrics(addr: &str, allow_remote: bool) -> PyResult<String> {
    let addr: SocketAddr =
        addr.parse().map_err(|e| errors::invalid(format!("metrics address {addr:?} is not HOST:PORT ({e})")))?;
    let cfg = ExporterConfig::default().with_addr(addr).with_allow_remote(allow_remote);
    let exporter = ringtier_metrics::install(&cfg).py_err()?;
    let served = exporter.addr().to_string();
    *EXPORTER.lock().unwrap_or_else(|p| p.into_inner()) = Some(exporter);
    Ok(served)
}

/// The Prometheus exposition text of every ringtier metric, as a scrape returns it (after
/// `serve_metrics`; before it, an error).
#[pyfunction]
pub(crate) fn metrics_text() -> PyResult<String> {
    match EXPORTER.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
        Some(e) => Ok(e.render()),
        None => Err(errors::invalid("no metrics exporter: call ringtier.serve_metrics() first".into())),
    }
}
