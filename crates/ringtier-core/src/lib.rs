#![doc = include_str!("../README.md")]
// Unsafe code lives in two modules: `sys` (every system call) and `buf` (aligned allocation).
#![deny(unsafe_code)]

pub mod blocking;
#[allow(unsafe_code)]
pub mod buf;
pub mod catalog;
pub mod error;
pub mod fs;
pub mod host;
pub mod key;
pub mod layers;
pub mod listing;
pub mod memory;
pub mod ops;
pub mod posix;
pub mod rng;
#[allow(unsafe_code)]
mod sys;
pub mod tier;
pub mod writes;

pub use buf::{AlignedBuf, BufferPool, PoolConfig};
pub use error::{Error, ErrorKind, Operation, Result};
pub use key::ObjectKey;
pub use layers::LayeredTier;
pub use listing::{ListOptions, Listing, Skipped, UNKNOWN_SIZE};
pub use memory::MemoryTier;
pub use posix::{PosixConfig, PosixTier};
pub use tier::{
    Adopted, Capabilities, ObjectMeta, ObjectReader, ObjectWriter, ReadBatch, ReadEntry, Space, Tier, TierLock,
};
