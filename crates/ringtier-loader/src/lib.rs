#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod config;
mod loader;
mod materialize;
mod pieces;
mod queue;
pub mod records;

pub use config::LoaderConfig;
pub use loader::{Batch, BlockingEpoch, Epoch, EpochStats, Loader, SampleData};
pub use materialize::{materialized_prefix, materialized_prefix_cropped, Materialize};
pub use pieces::{read_files, DEFAULT_MAX_READ};
