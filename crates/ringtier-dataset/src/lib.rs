#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod dataset;
pub mod manifest;

/// The fuzz target of the manifest parser (`fuzz/fuzz_targets/dataset_manifest.rs`, and the
/// stable short run in the test kit). Not a stable API.
#[doc(hidden)]
pub mod fuzzing {
    use crate::manifest::Manifest;

    /// Parses `data` as a manifest; one that parses must parse back from its own text.
    pub fn manifest(data: &[u8]) {
        let text = String::from_utf8_lossy(data);
        if let Ok(m) = Manifest::parse(&text, "fuzz.tsv") {
            let again = Manifest::parse(&m.to_text(), "fuzz.tsv");
            assert_eq!(again.ok().as_ref(), Some(&m), "the manifest's text parses back to it");
        }
    }
}
mod sampler;

pub use dataset::{Dataset, Sample, SampleRef, Samples};
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
