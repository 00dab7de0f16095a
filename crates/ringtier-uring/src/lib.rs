#![doc = include_str!("../README.md")]

mod config;
mod driver;
#[cfg(feature = "fail-points")]
pub mod fail;
mod fd;
mod tier;

pub use config::{BufferedWrites, DirectIoPolicy, UringConfig};
pub use tier::{UringFile, UringStats, UringTier, UringTierOptions};
