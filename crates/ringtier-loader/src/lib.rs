#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

pub mod cache;
mod dataset;
mod loader;
pub mod manifest;
mod materialize;
mod pieces;
pub mod records;
mod sampler;

pub use cache::{CacheConfig, CacheLevel, CacheMedium, CachePolicy, CacheStats, CachedTier};
pub use dataset::{Dataset, Sample};
pub use loader::{Batch, BlockingEpoch, Epoch, EpochStats, Loader, LoaderConfig, OnBadSample, SampleData};
pub use materialize::{materialized_prefix, Materialize};
pub use pieces::DEFAULT_MAX_READ;
pub use ringtier_decode::{
    center_crop_box, decode_jpeg_resized, random_resized_params, Crop, CropBox, DecodeConfig, DecodeInfo, JpegDecoder,
    Layout, Normalize, SampleRng, JPEG_DECODER, MAX_JPEG_DIMENSION,
};
pub use sampler::Sampler;
