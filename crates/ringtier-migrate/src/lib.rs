#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

pub mod group;
mod manifest;
mod store;

pub use manifest::{CheckpointManifest, PartMeta, FORMAT, MAX_MANIFEST_BYTES, VERSION};
pub use store::{
    is_bad_copy, BufferSink, CheckpointInfo, CheckpointStore, DirectRestored, DrainStats, FnSink, OnFull, Part,
    PartData, PartInfo, QuarantinedCopy, ReadTargets, RestoreEvent, RestoreOptions, RestoreReport, RestoreSink,
    Restored, SaveReport, SeekRead, StoreConfig, TierSink, QUARANTINE_FILE, QUARANTINE_LOG_TARGET,
};

/// The fuzz target of the checkpoint manifest parser (`fuzz/fuzz_targets/ckpt_manifest.rs`,
/// and the stable short run in the test kit). Not a stable API.
#[doc(hidden)]
pub mod fuzzing {
    use crate::CheckpointManifest;

    /// Parses `data` as a manifest (its first byte the step the store expects); one that
    /// parses must parse back from its own bytes.
    pub fn manifest(data: &[u8]) {
        let (step, bytes) = match data.split_first() {
            Some((&s, rest)) => (u64::from(s), rest),
            None => (0, data),
        };
        if let Ok(m) = CheckpointManifest::parse(bytes, step, "fuzz/MANIFEST.json") {
            let again = CheckpointManifest::parse(&m.to_bytes(), step, "fuzz/MANIFEST.json");
            assert_eq!(again.ok().as_ref(), Some(&m), "the manifest's bytes parse back to it");
        }
    }
}
