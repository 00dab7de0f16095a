#![doc = include_str!("../README.md")]

mod dataset;
mod decode;
mod loader;
pub mod manifest;
mod sampler;

pub use dataset::{Dataset, Sample};
pub use decode::{decode_jpeg_resized, DecodeConfig};
pub use loader::{Batch, BlockingEpoch, Epoch, EpochStats, Loader, LoaderConfig, OnBadSample, SampleData};
pub use sampler::Sampler;
