//! Tiers named from Python by URL: `s3://bucket/prefix?endpoint=URL&region=R` wherever Python
//! takes a tier directory (checkpoint stores, datasets, record shards). The URL is parsed by
//! `ringtier_s3::S3Config::from_url`, the parser the CLI uses; credentials come from the
//! `AWS_*` environment variables. Built with the default feature `s3`; without it an S3 URL is
//! an `UnsupportedError` naming the feature.

use std::path::Path;
use std::sync::Arc;

use pyo3::prelude::*;
use ringtier_core::Tier;

/// The S3 URL `path` holds, if it names an S3 tier (`s3://...`) rather than a directory
/// (`ringtier::open::Location`, the one parser).
pub(crate) fn s3_url(path: &Path) -> Option<&str> {
    if ringtier::open::is_s3_url(path) {
        path.to_str()
    } else {
        None
    }
}

/// Whether `path` names an S3 tier rather than a directory (`ringtier.is_s3_url` in Python:
/// the package recognises URLs where the engine does).
#[pyfunction]
pub(crate) fn _is_s3_url(path: &str) -> bool {
    ringtier::open::is_s3_url(Path::new(path))
}

/// What the tier is opened for: it decides the checks made at open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum S3Use {
    /// A checkpoint store's tier (written through its lease).
    Store,
    /// A dataset read by a loader: `depth` range GETs in flight.
    Dataset {
        /// Requests of one batch in flight at once (the URL's `read_concurrency` wins).
        depth: usize,
    },
}

/// How long opening an S3 tier retries an endpoint that does not answer (connection refused,
/// 503) before it fails: a mistyped endpoint is an error in seconds, not after the tier's
/// two-minute retry deadline (which the tier's own operations keep). A URL's
/// `retry_deadline` below this shortens it.
#[cfg(feature = "s3")]
const OPEN_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// Opens the S3 tier `url` through the front door (`ringtier::open`) and checks, with one
/// LIST, that its bucket exists and the credentials work: a missing bucket is a
/// `NotFoundError` naming it, refused credentials an error saying so, an endpoint that does
/// not answer an error after at most 10 s.
#[cfg(feature = "s3")]
pub(crate) fn open_s3(url: &str, usage: S3Use) -> PyResult<Arc<dyn Tier>> {
    use crate::errors::IntoPy;
    let options = match usage {
        S3Use::Dataset { depth } => ringtier::OpenOptions::dataset().with_read_depth(depth.max(1)),
        S3Use::Store => ringtier::OpenOptions::store(),
    };
    let tier = ringtier::open::s3_tier(url, &options).py_err()?;
    let engine = crate::engine::engine()?;
    Python::attach(|py| crate::engine::wait_plain(py, &engine, tier.check_within(OPEN_DEADLINE)))?.map_err(|e| {
        // The URL in full (its endpoint and settings; it never holds a credential).
        let what = format!("opening the S3 tier {url}: {}", e.message());
        crate::errors::to_py(ringtier_core::Error::new(e.kind(), what).set_temporary(e.is_temporary()))
    })?;
    Ok(Arc::new(tier))
}

/// Without the feature `s3`: an S3 URL is refused, naming the feature.
#[cfg(not(feature = "s3"))]
pub(crate) fn open_s3(url: &str, _usage: S3Use) -> PyResult<Arc<dyn Tier>> {
    Err(crate::errors::to_py(ringtier_core::Error::new(
        ringtier_core::ErrorKind::Unsupported,
        format!("{url}: this build of ringtier has no S3 tier (build ringtier-py with its default feature `s3`)"),
    )))
}
