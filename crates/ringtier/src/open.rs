//! The front door: [`open()`] turns a path or URL plus [`OpenOptions`] into a tier. It is the
//! one place a string becomes a tier: the CLI, the benchmarks and the Python package all call
//! it, so every opener has the same defaults.
//!
//! - a directory opens a file tier with the engine asked for (`Engine::Auto` by default:
//!   io_uring where the kernel allows it, the thread pool where it is refused, with one
//!   warning and `ringtier_engine_fallbacks_total`);
//! - `s3://bucket/prefix[?endpoint=URL&region=R&...]` opens the S3 tier (feature `s3`; the
//!   URL is parsed once, by `ringtier_s3::S3Config::from_url`).
//!
//! The role decides what may differ between a dataset and a store: a dataset is read through
//! the links it holds and its S3 reads keep `read_depth` range GETs in flight; a store never
//! follows a link (docs/SECURITY.md).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ringtier_core::layers::{Metered, Throttle, Throttled};
use ringtier_core::{BufferPool, Error, ErrorKind, Result, Tier};

#[cfg(all(feature = "uring", target_os = "linux"))]
pub use ringtier_uring::engine::{Engine, EngineUsed, UringRefusal};
#[cfg(all(feature = "uring", target_os = "linux"))]
use ringtier_uring::{open_dir_tier, DirTierOptions, UringConfig};

/// The scheme of an S3 tier URL.
const S3_SCHEME: &str = "s3://";

/// What a tier is opened for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    /// Read-only samples or shards: links under the root are followed.
    Dataset,
    /// A checkpoint store's tier (written): links are never followed.
    #[default]
    Store,
}

/// How [`open()`] opens a tier. Defaults: engine `auto`, role store, no pool, not created,
/// not throttled, metered, named after the path.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// The engine of a file tier (default `auto`).
    #[cfg(all(feature = "uring", target_os = "linux"))]
    pub engine: Engine,
    /// The io_uring engine's settings (queue depth, Direct-I/O policy, ...).
    #[cfg(all(feature = "uring", target_os = "linux"))]
    pub uring: UringConfig,
    /// Dataset or store.
    pub role: Role,
    /// The pool reads land in (file tiers).
    pub pool: Option<BufferPool>,
    /// Creates a missing directory (file tiers).
    pub create: bool,
    /// Throttles the tier to this many bytes per second (an emulated slow tier).
    pub throttle: Option<u64>,
    /// The tier's name (metric label, errors); default: the path or URL.
    pub name: Option<String>,
    /// Range GETs in flight per batch on an S3 dataset, unless the URL's `read_concurrency`
    /// says otherwise (default 64).
    pub read_depth: usize,
    /// Wraps the tier in the metrics layer (default true).
    pub metered: bool,
    /// Threads of the thread-pool engine (0: its default).
    pub posix_threads: usize,
    /// Whether the thread-pool engine fsyncs what it commits (default true).
    pub posix_sync: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            #[cfg(all(feature = "uring", target_os = "linux"))]
            engine: Engine::Auto,
            #[cfg(all(feature = "uring", target_os = "linux"))]
            uring: UringConfig::default(),
            role: Role::Store,
            pool: None,
            create: false,
            throttle: None,
            name: None,
            read_depth: 64,
            metered: true,
            posix_threads: 0,
            posix_sync: true,
        }
    }
}

impl OpenOptions {
    /// Threads of the thread-pool engine for a dataset (where io_uring is refused): many small
    /// files want many opens at once, as [`UringConfig::dataset`]'s depth does.
    pub const DATASET_POSIX_THREADS: usize = 32;

    /// Options for reading a dataset: links followed, many files in progress
    /// ([`UringConfig::dataset`], [`Self::DATASET_POSIX_THREADS`] where io_uring is refused).
    pub fn dataset() -> Self {
        OpenOptions {
            role: Role::Dataset,
            #[cfg(all(feature = "uring", target_os = "linux"))]
            uring: UringConfig::dataset(),
            posix_threads: Self::DATASET_POSIX_THREADS,
            ..OpenOptions::default()
        }
    }

    /// Options for a checkpoint store's tier (links never followed).
    pub fn store() -> Self {
        OpenOptions::default()
    }

    /// Sets the engine.
    #[cfg(all(feature = "uring", target_os = "linux"))]
    pub fn with_engine(mut self, engine: Engine) -> Self {
        self.engine = engine;
        self
    }

    /// Sets the io_uring engine's settings.
    #[cfg(all(feature = "uring", target_os = "linux"))]
    pub fn with_uring(mut self, uring: UringConfig) -> Self {
        self.uring = uring;
        self
    }

    /// Sets the role.
    pub fn with_role(mut self, role: Role) -> Self {
        self.role = role;
        self
    }

    /// Sets the pool reads land in.
    pub fn with_pool(mut self, pool: impl Into<Option<BufferPool>>) -> Self {
        self.pool = pool.into();
        self
    }

    /// Creates a missing directory.
    pub fn with_create(mut self, create: bool) -> Self {
        self.create = create;
        self
    }

    /// Throttles the tier to `bytes_per_sec` (None: not throttled).
    pub fn with_throttle(mut self, bytes_per_sec: Option<u64>) -> Self {
        self.throttle = bytes_per_sec;
        self
    }

    /// Names the tier.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Range GETs in flight per batch on an S3 dataset.
    pub fn with_read_depth(mut self, depth: usize) -> Self {
        self.read_depth = depth.max(1);
        self
    }

    /// Whether the tier is wrapped in the metrics layer.
    pub fn with_metered(mut self, metered: bool) -> Self {
        self.metered = metered;
        self
    }

    /// Threads of the thread-pool engine (0: its default).
    pub fn with_posix_threads(mut self, threads: usize) -> Self {
        self.posix_threads = threads;
        self
    }

    /// Whether the thread-pool engine fsyncs what it commits.
    pub fn with_posix_sync(mut self, sync: bool) -> Self {
        self.posix_sync = sync;
        self
    }
}

/// What backs an opened tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// A directory, through this engine.
    #[cfg(all(feature = "uring", target_os = "linux"))]
    Files(EngineUsed),
    /// A directory, through the thread pool (a build without io_uring).
    #[cfg(not(all(feature = "uring", target_os = "linux")))]
    Files,
    /// An S3 bucket and prefix.
    S3,
}

/// A tier [`open()`] opened, and what backs it.
#[derive(Debug, Clone)]
pub struct Opened {
    /// The tier (throttled and metered as asked).
    pub tier: Arc<dyn Tier>,
    /// What backs it.
    pub backend: Backend,
}

/// Where a tier lives: a directory, or an S3 URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A local directory.
    Dir(PathBuf),
    /// An `s3://` URL, as given.
    S3(String),
}

impl Location {
    /// `s3://...` is an S3 URL; anything else a directory. A URL whose `//` was collapsed
    /// (`Path::new("s3://b/p")` normalised to `s3:/b/p`) is refused, naming what happened.
    pub fn parse(path_or_url: &Path) -> Result<Location> {
        match path_or_url.to_str() {
            Some(s) if s.starts_with(S3_SCHEME) => Ok(Location::S3(s.to_string())),
            Some(s) if s.starts_with("s3:/") => Err(Error::new(
                ErrorKind::InvalidInput,
                format!("{s:?} looks like an S3 URL whose '//' was collapsed: pass s3://bucket/prefix?endpoint=..."),
            )),
            _ => Ok(Location::Dir(path_or_url.to_path_buf())),
        }
    }

    /// Whether this is an S3 URL.
    pub fn is_s3(&self) -> bool {
        matches!(self, Location::S3(_))
    }
}

/// Whether `path_or_url` names an S3 tier rather than a directory.
pub fn is_s3_url(path_or_url: &Path) -> bool {
    matches!(Location::parse(path_or_url), Ok(Location::S3(_)))
}

/// Opens `path_or_url` as a tier with `options`: the one place a string becomes a tier.
pub fn open(path_or_url: impl AsRef<Path>, options: &OpenOptions) -> Result<Opened> {
    let (tier, backend) = match Location::parse(path_or_url.as_ref())? {
        Location::S3(url) => (open_s3(&url, options)?, Backend::S3),
        Location::Dir(dir) => open_dir(&dir, options)?,
    };
    let tier: Arc<dyn Tier> = match options.throttle {
        Some(bps) => Arc::new(Throttled::new(tier, Throttle::bandwidth(bps))),
        None => tier,
    };
    let tier: Arc<dyn Tier> = if options.metered { Arc::new(Metered::new(tier)) } else { tier };
    Ok(Opened { tier, backend })
}

#[cfg(all(feature = "uring", target_os = "linux"))]
fn open_dir(dir: &Path, o: &OpenOptions) -> Result<(Arc<dyn Tier>, Backend)> {
    let mut options = DirTierOptions::default()
        .with_engine(o.engine)
        .with_uring(o.uring.clone())
        .with_pool(o.pool.clone())
        .with_create(o.create)
        .with_follow_links(o.role == Role::Dataset)
        .with_posix_threads(o.posix_threads)
        .with_posix_sync(o.posix_sync);
    if let Some(name) = &o.name {
        options = options.with_name(name.clone());
    }
    let opened = open_dir_tier(dir, options)?;
    Ok((opened.tier, Backend::Files(opened.engine)))
}

#[cfg(not(all(feature = "uring", target_os = "linux")))]
fn open_dir(dir: &Path, o: &OpenOptions) -> Result<(Arc<dyn Tier>, Backend)> {
    let mut cfg = ringtier_core::PosixConfig::new(dir)
        .with_create(o.create)
        .with_follow_links(o.role == Role::Dataset)
        .with_sync(o.posix_sync);
    if let Some(name) = &o.name {
        cfg = cfg.with_name(name.clone());
    }
    if o.posix_threads > 0 {
        cfg = cfg.with_threads(o.posix_threads);
    }
    Ok((Arc::new(ringtier_core::PosixTier::new(cfg)?), Backend::Files))
}

#[cfg(feature = "s3")]
fn open_s3(url: &str, o: &OpenOptions) -> Result<Arc<dyn Tier>> {
    Ok(Arc::new(s3_tier(url, o)?))
}

/// The S3 tier `url` names, configured by `options` as [`open()`] does it (neither throttled
/// nor metered): for callers that need the S3 tier itself (its bucket check,
/// `S3Tier::check_within`).
#[cfg(feature = "s3")]
pub fn s3_tier(url: &str, o: &OpenOptions) -> Result<ringtier_s3::S3Tier> {
    let had_concurrency =
        url.split_once('?').is_some_and(|(_, q)| q.split('&').any(|kv| kv.starts_with("read_concurrency=")));
    let mut cfg = ringtier_s3::S3Config::from_url(url)?;
    if o.role == Role::Dataset && !had_concurrency {
        cfg = cfg.with_read_concurrency(o.read_depth.max(1));
    }
    if let Some(name) = &o.name {
        cfg = cfg.named(name.clone());
    }
    ringtier_s3::S3Tier::new(cfg)
}

#[cfg(not(feature = "s3"))]
fn open_s3(url: &str, _o: &OpenOptions) -> Result<Arc<dyn Tier>> {
    Err(Error::new(
        ErrorKind::Unsupported,
        format!("{url}: this build of ringtier has no S3 tier (build it with the feature `s3`)"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations() {
        assert_eq!(Location::parse(Path::new("/data/x")).ok(), Some(Location::Dir("/data/x".into())));
        assert!(Location::parse(Path::new("s3://b/p?endpoint=http://127.0.0.1:9")).is_ok_and(|l| l.is_s3()));
        let e = Location::parse(Path::new("s3:/b/p")).expect_err("collapsed");
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(is_s3_url(Path::new("s3://b")) && !is_s3_url(Path::new("./s3")));
    }

    #[test]
    fn a_directory_opens_metered_and_throttled_as_asked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let opened = open(dir.path(), &OpenOptions::store().with_name("t").with_throttle(Some(1 << 20))).expect("open");
        assert_eq!(opened.tier.name(), "t");
        let missing = dir.path().join("missing");
        let e = open(&missing, &OpenOptions::store()).expect_err("missing");
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        open(&missing, &OpenOptions::store().with_create(true)).expect("created");
        assert!(missing.is_dir());
    }
}
