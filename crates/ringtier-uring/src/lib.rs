#![doc = include_str!("../README.md")]

mod config;
mod driver;
pub mod engine;
#[cfg(feature = "fail-points")]
pub mod fail;
mod fd;
mod probe;
mod tier;

pub use config::{BufferedWrites, DirectIoPolicy, UringConfig};
pub use engine::{open_dir_tier, uring_availability, DirTier, DirTierOptions, Engine, EngineUsed, UringRefusal};
pub use probe::{probe_kernel, KernelFeatures};
pub use tier::{UringFile, UringStats, UringTier, UringTierOptions};
