#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

pub mod bins;
pub mod conformance;
pub mod crash;
pub mod crash_child;
pub mod layers;
mod rng;
pub mod s3;
mod snapshot;
mod tmpfs;

pub use rng::{pattern, SeededRng};
pub use snapshot::snapshot;
pub use tmpfs::SmallTmpfs;
