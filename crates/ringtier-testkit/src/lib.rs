#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

pub mod crash;
