#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

// The tier trait, its types, buffers and errors: what every part of ringtier speaks.
pub use ringtier_core::{
    AlignedBuf, BufferPool, Capabilities, Error, ErrorKind, MemoryTier, ObjectKey, ObjectMeta, ObjectReader,
    ObjectWriter, Operation, PoolConfig, PosixConfig, PosixTier, ReadBatch, ReadEntry, Result, Space, Tier, TierLock,
};

// The modules of ringtier-core that users reach into: the layers that wrap any tier, the
// whole-object helpers, buffer alignment helpers, key validation and the dataset manifest.
pub use ringtier_core::{buf, key, layers, ops};
pub use ringtier_dataset::manifest;

// The most used names of the other crates, at the top level.
pub use ringtier_cache::{CacheConfig, CacheLevel, CachePolicy, CachedTier};
pub use ringtier_dataset::Dataset;
pub use ringtier_loader::{Batch, Epoch, Loader, LoaderConfig};
pub use ringtier_migrate::{CheckpointStore, Part, StoreConfig};
pub use ringtier_stage::{PinnedPool, Stager};
#[cfg(all(feature = "uring", target_os = "linux"))]
pub use ringtier_uring::{DirectIoPolicy, UringConfig, UringTier};

/// The O_DIRECT io_uring file tier: [`UringTier`], its knobs ([`UringConfig`]) and the
/// Direct-I/O policy (feature `uring`, on by default; Linux only). This is the crate
/// `ringtier-uring`.
#[cfg(all(feature = "uring", target_os = "linux"))]
pub mod uring {
    pub use ringtier_uring::*;
}

/// The input pipeline: [`Dataset`], the seeded sharded [`Sampler`](loader::Sampler),
/// [`Loader`] with bounded prefetch, record shards ([`records`](loader::records): TFRecord,
/// WebDataset), an optional JPEG decode stage and an optional cache in front of a slow tier
/// ([`CachedTier`]: LRU, static or clairvoyant). The crates `ringtier-loader`,
/// `ringtier-dataset` (datasets, manifests, the sampler), `ringtier-decode` (JPEG decode and
/// augmentation) and `ringtier-cache` (the cache tier, also [`cache`](loader::cache)).
pub mod loader {
    pub use ringtier_cache::{CacheConfig, CacheLevel, CacheMedium, CachePolicy, CacheStats, CachedTier};
    pub use ringtier_dataset::{manifest, Dataset, OnBadSample, Sample, SampleRef, Sampler, Samples};
    pub use ringtier_decode::{
        center_crop_box, decode_jpeg_resized, random_resized_params, Crop, CropBox, DecodeConfig, DecodeInfo,
        JpegDecoder, Layout, Normalize, SampleRng, JPEG_DECODER, MAX_JPEG_DIMENSION,
    };
    pub use ringtier_loader::*;

    /// The read-through cache tier and its policies: the crate `ringtier-cache`.
    pub mod cache {
        pub use ringtier_cache::*;
    }
}

/// The crash-consistent checkpoint store with its burst buffer: [`CheckpointStore`] saves to
/// the fastest tier and drains to slower ones in the background. This is the crate
/// `ringtier-migrate`.
pub mod checkpoint {
    pub use ringtier_migrate::*;
}

/// Pinned host buffers and staging to an accelerator: [`PinnedPool`] and [`Stager`] (CUDA
/// with feature `cuda`, page-locked host memory without). This is the crate `ringtier-stage`.
pub mod stage {
    pub use ringtier_stage::*;
}

/// Synthetic datasets, deterministic from a seed: [`DatasetSpec`](gen::DatasetSpec) and its
/// presets, files or real JPEGs ([`generate`](gen::generate)), TFRecord and WebDataset shards
/// ([`generate_shards`](gen::generate_shards)), each with a manifest; the flags of a shape
/// (`ShapeArgs`, feature `clap`) and the upload to S3 (`upload_dir`, feature `s3`). What
/// `ringtier gen` runs. This is the crate `ringtier-gen`.
pub mod gen {
    pub use ringtier_gen::*;
}

/// The front door: [`open()`] turns a path or URL plus [`OpenOptions`] into a tier (a
/// directory through io_uring or the thread pool, `s3://` through the S3 tier): the one place
/// a string becomes a tier.
pub mod open;
pub use open::{open, Location, OpenOptions, Opened, Role};

/// Checkpoint stores over paths or URLs and restores into a directory, opened through
/// [`open()`] (what `ringtier ckpt` runs).
pub mod store;

// What this machine gives the engine and what it falls back to: the report of `ringtier
// doctor` (documented in the module itself).
pub mod doctor;

/// The S3 capacity tier: [`S3Tier`](s3::S3Tier) over an S3 bucket and prefix
/// (`s3://bucket/prefix`), configured by [`S3Config`](s3::S3Config) and the standard AWS
/// environment variables (feature `s3`). This is the crate `ringtier-s3`.
#[cfg(feature = "s3")]
pub mod s3 {
    pub use ringtier_s3::*;
}

/// The metric catalog and the Prometheus exporter ([`install`](metrics::install)); feature
/// `metrics`, on by default. This is the crate `ringtier-metrics`.
#[cfg(feature = "metrics")]
pub mod metrics {
    pub use ringtier_core::catalog::{self, MetricDef, CATALOG};
    pub use ringtier_metrics::*;
}

/// The facade exports no test layer: the fault-injecting and power-cut layers are in the
/// test kit (`ringtier-testkit`), which never ships.
///
/// ```compile_fail
/// use ringtier::layers::FaultInjecting;
/// ```
///
/// ```compile_fail
/// use ringtier::layers::PowerCutTier;
/// ```
///
/// ```
/// use ringtier::layers::{Metered, Throttle, Throttled, TokenBucket};
/// ```
#[cfg(doctest)]
pub struct NoTestLayers;
