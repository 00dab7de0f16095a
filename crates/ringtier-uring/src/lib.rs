#![doc = include_str!("../README.md")]

mod config;
mod driver;
mod tier;

pub use config::{DirectIoPolicy, UringConfig};
pub use tier::{UringFile, UringStats, UringTier, UringTierOptions};
