#![doc = include_str!("../README.md")]

mod manifest;
mod store;

pub use manifest::{CheckpointManifest, PartMeta, FORMAT, VERSION};
pub use store::{
    CheckpointInfo, CheckpointStore, DrainStats, OnFull, Part, PartData, Restored, SaveReport, SeekRead, StoreConfig,
};
