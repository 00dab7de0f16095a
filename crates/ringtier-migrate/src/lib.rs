#![doc = include_str!("../README.md")]

mod manifest;
mod store;

pub use manifest::{CheckpointManifest, PartMeta, FORMAT, VERSION};
pub use store::{
    BufferSink, CheckpointInfo, CheckpointStore, DrainStats, FnSink, OnFull, Part, PartData, PartInfo, RestoreEvent,
    RestoreOptions, RestoreReport, RestoreSink, Restored, SaveReport, SeekRead, StoreConfig, TierSink,
};
