#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod config;
mod loader;
mod materialize;
mod pieces;

/// The read-through cache tier and its policies: the crate `ringtier-cache`.
pub use ringtier_cache as cache;
/// Dataset manifests: the module `ringtier_dataset::manifest`.
pub use ringtier_dataset::manifest;
/// Sharded record datasets (TFRecord, WebDataset): the crate `ringtier-records`.
pub use ringtier_records as records;

pub use config::LoaderConfig;
pub use loader::{Batch, BlockingEpoch, Epoch, EpochStats, Loader, SampleData};
pub use materialize::{materialized_prefix, materialized_prefix_cropped, Materialize};
pub use pieces::DEFAULT_MAX_READ;
pub use ringtier_cache::{CacheConfig, CacheLevel, CacheMedium, CachePolicy, CacheStats, CachedTier};
pub use ringtier_dataset::Sampler;
pub use ringtier_dataset::{Dataset, OnBadSample, Sample, SampleRef, Samples};
pub use ringtier_decode::{
    center_crop_box, decode_jpeg_resized, random_resized_params, Crop, CropBox, DecodeConfig, DecodeInfo, JpegDecoder,
    Layout, Normalize, SampleRng, JPEG_DECODER, MAX_JPEG_DIMENSION,
};
