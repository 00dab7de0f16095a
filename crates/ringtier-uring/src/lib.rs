#![doc = include_str!("../README.md")]

mod config;
mod driver;
mod tier;

pub use config::{BufferedWrites, DirectIoPolicy, UringConfig};
pub use tier::{UringFile, UringStats, UringTier, UringTierOptions};
