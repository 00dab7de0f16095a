#![doc = include_str!("../README.md")]

mod config;
mod driver;
#[cfg(feature = "fail-points")]
pub mod fail;
mod fd;
mod probe;
mod tier;

pub use config::{BufferedWrites, DirectIoPolicy, UringConfig};
pub use probe::{probe_kernel, KernelFeatures};
pub use tier::{UringFile, UringStats, UringTier, UringTierOptions};
