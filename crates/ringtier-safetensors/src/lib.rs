#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod dtype;
pub mod fuzzing;
mod header;
mod index;
mod model;
mod read;
mod write;

pub use dtype::Dtype;
pub use header::{Header, Layout, TensorInfo, TensorSpec, LEN_BYTES, MAX_HEADER_BYTES, METADATA_KEY};
pub use index::{ShardIndex, MAX_INDEX_BYTES};
pub use model::Model;
pub use read::{
    read_alignment, read_chunks, read_chunks_of, read_into_targets, DataSpan, DataTargets, ReadOptions, SafetensorsFile,
};
pub use write::{plan_shards, save, save_sharded, SaveOptions, ShardedSave, TensorRef, INDEX_FILE};
