#![doc = include_str!("../README.md")]

mod dataset;
mod decode;
mod loader;
mod pieces;
pub mod manifest;
mod sampler;

pub use dataset::{Dataset, Sample};
pub use decode::{decode_jpeg_resized, DecodeConfig};
pub use loader::{Batch, BlockingEpoch, Epoch, EpochStats, Loader, LoaderConfig, OnBadSample, SampleData};
pub use pieces::DEFAULT_MAX_READ;
pub use sampler::Sampler;
