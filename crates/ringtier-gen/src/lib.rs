//! Synthetic datasets shaped like the paper's, deterministic from a seed, with a manifest
//! (key, size, CRC-32C) so readers need no directory walk: what `ringtier gen` writes and what
//! the benchmarks read.
//!
//! Sizes follow a log-normal distribution: `size = median * exp(sigma * N(0,1))`, clipped to
//! `[min, max]`. Presets:
//!
//! | preset | files | median | sigma | min | max | classes |
//! |---|---|---|---|---|---|---|
//! | `imagenet` | 16,384 | 112 KB | 0.6 | 2 KB | 1 MiB | 1,000 |
//! | `caltech101` | 9,144 | 12 KB | 0.5 | 1 KB | 256 KiB | 102 |
//! | `small` (demo) | 2,000 | 112 KB | 0.6 | 1 KB | 1 MiB | 16 |
//!
//! [`Format::Raw`] writes incompressible random bytes of exactly the drawn size.
//! [`Format::Jpeg`] writes real baseline JPEGs (gradient backgrounds, shapes and noise of
//! varied strength, quality 85) whose dimensions are chosen so the encoded size lands near the
//! drawn size; the manifest records the actual sizes. [`Format::Tfrecord`] and [`Format::Wds`]
//! write the samples as record shards ([`generate_shards`]).
//!
//! With the feature `clap`, `ShapeArgs` are the command-line flags of a shape; with the
//! feature `s3`, `upload_dir` copies a generated dataset to an S3 prefix.

#![forbid(unsafe_code)]

mod files;
mod jpeg;
mod rng;
mod shape;
mod shards;
#[cfg(feature = "s3")]
mod upload;
mod walk;

pub use files::generate;
#[cfg(feature = "clap")]
pub use shape::ShapeArgs;
pub use shape::{parse_size, sizes, DatasetSpec, Format, Preset};
pub use shards::generate_shards;
#[cfg(feature = "s3")]
pub use upload::upload_dir;
pub use walk::files_under;
