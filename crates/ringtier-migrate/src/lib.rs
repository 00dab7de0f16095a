#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod manifest;
mod store;

pub use manifest::{CheckpointManifest, PartMeta, FORMAT, MAX_MANIFEST_BYTES, VERSION};
pub use store::{
    is_bad_copy, BufferSink, CheckpointInfo, CheckpointStore, DirectRestored, DrainStats, FnSink, OnFull, Part,
    PartData, PartInfo, QuarantinedCopy, ReadTargets, RestoreEvent, RestoreOptions, RestoreReport, RestoreSink,
    Restored, SaveReport, SeekRead, StoreConfig, TierSink, QUARANTINE_FILE, QUARANTINE_LOG_TARGET,
};
