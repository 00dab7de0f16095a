//! Every tier Python names, opened through the front door (`ringtier::open`): a directory
//! with the engine asked for (`"auto"`: io_uring where the kernel allows it, the thread pool
//! where it refuses, with one `RuntimeWarning`), or `s3://bucket/prefix?endpoint=URL&region=R`
//! wherever Python takes a tier directory (checkpoint stores, datasets, record shards; the URL
//! parsed once, credentials from the `AWS_*` environment variables). Built with the default
//! feature `s3`; without it an S3 URL is an `UnsupportedError` naming the feature.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use pyo3::prelude::*;
use ringtier_core::{BufferPool, Tier};
use ringtier_uring::UringConfig;

use crate::errors::{self, IntoPy};

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

/// The engine `name` asks for (`"auto"`, `"uring"` or `"posix"`), resolved for this process:
/// `"auto"` is `"uring"` where this process may set up an io_uring and `"posix"` (the thread
/// pool) where the kernel refuses it, with one `RuntimeWarning` per process naming why.
pub(crate) fn resolve_engine(name: &str) -> PyResult<&'static str> {
    let engine: ringtier_uring::Engine = name
        .parse()
        .map_err(|_| errors::invalid(format!("engine must be \"auto\", \"uring\" or \"posix\", not {name:?}")))?;
    Ok(match engine {
        ringtier_uring::Engine::Posix => "posix",
        ringtier_uring::Engine::Uring => "uring",
        ringtier_uring::Engine::Auto => match ringtier_uring::uring_availability() {
            Ok(()) => "uring",
            Err(why) => {
                warn_fallback(&why);
                "posix"
            }
        },
    })
}

/// Warns once per process (a Python `RuntimeWarning`) that io_uring was refused and the
/// thread pool reads and writes instead.
pub(crate) fn warn_fallback(why: &ringtier_uring::UringRefusal) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if WARNED.swap(true, Ordering::Relaxed) {
        return;
    }
    let msg = format!(
        "ringtier: {why}; using the thread-pool engine instead (same files, same formats; slower at one \
         thread). To use io_uring: {}. `python -m ringtier doctor` says more; engine=\"posix\" silences this.",
        why.remedy()
    );
    Python::attach(|py| {
        let category = py.get_type::<pyo3::exceptions::PyRuntimeWarning>();
        let msg = std::ffi::CString::new(msg).unwrap_or_default();
        if let Err(e) = PyErr::warn(py, &category, &msg, 1) {
            // A filter that turns warnings into errors: shown, not raised from an open that worked.
            e.print(py);
        }
    });
}

/// One engine's tier over `dir`, reading into `pool` where given. A dataset (`dataset`
/// true) is read-only and read through the links it holds; a store's directory never follows
/// a link (docs/SECURITY.md). An `s3://` URL opens the S3 tier (`tiers.rs`). `engine_name`
/// `"auto"` opens io_uring where the kernel allows it and the thread pool where it does not
/// (`ringtier_uring::open_dir_tier`), warning once.
pub(crate) fn open_tier(
    dir: &Path,
    engine_name: &str,
    pool: Option<BufferPool>,
    create: bool,
    dataset: bool,
) -> PyResult<Arc<dyn Tier>> {
    open_dir(dir, engine_name, pool, create, dataset, None)
}

/// [`open_tier`] with the io_uring engine's settings `uring` instead of the role's own
/// ([`ringtier::OpenOptions::dataset`]'s or [`ringtier::OpenOptions::store`]'s).
pub(crate) fn open_tier_with(
    dir: &Path,
    engine_name: &str,
    pool: Option<BufferPool>,
    create: bool,
    dataset: bool,
    uring: UringConfig,
) -> PyResult<Arc<dyn Tier>> {
    open_dir(dir, engine_name, pool, create, dataset, Some(uring))
}

fn open_dir(
    dir: &Path,
    engine_name: &str,
    pool: Option<BufferPool>,
    create: bool,
    dataset: bool,
    uring: Option<UringConfig>,
) -> PyResult<Arc<dyn Tier>> {
    if let Some(url) = crate::tiers::s3_url(dir) {
        let usage = if dataset { crate::tiers::S3Use::Dataset { depth: 64 } } else { crate::tiers::S3Use::Store };
        return crate::tiers::open_s3(url, usage);
    }
    let engine: ringtier_uring::Engine = engine_name.parse().map_err(|_| {
        errors::invalid(format!("engine must be \"auto\", \"uring\" or \"posix\", not {engine_name:?}"))
    })?;
    let base = if dataset { ringtier::OpenOptions::dataset() } else { ringtier::OpenOptions::store() };
    let base = match uring {
        Some(uring) => base.with_uring(uring),
        None => base,
    };
    let options = base.with_engine(engine).with_pool(pool).with_create(create).with_metered(false);
    let opened = ringtier::open(dir, &options).py_err()?;
    if let ringtier::open::Backend::Files(ringtier_uring::EngineUsed::PosixFallback(why)) = &opened.backend {
        warn_fallback(why);
    }
    Ok(opened.tier)
}
