#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod dataset;
pub mod manifest;
mod sampler;

pub use dataset::{Dataset, Sample};
pub use sampler::Sampler;

/// What a reader does with a sample it cannot use (unreadable, wrong size, bad checksum,
/// corrupt framing, not a JPEG when decoding).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnBadSample {
    /// Leave it out of its batch and count it.
    Skip,
    /// End the epoch with an error naming it.
    Fail,
}
