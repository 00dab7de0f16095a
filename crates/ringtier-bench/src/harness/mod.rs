//! The one harness every experiment uses: a cold pass with one rule, interleaved repeats,
//! min/median/max and pair-by-pair ratios, wall time, CPU (self and children) and peak RSS,
//! the machine and its storage, typed JSON reports, tables and SVG plots, and one way to build
//! a tokio runtime. An experiment says only what it measures.

pub(crate) mod blockdev;
pub(crate) mod cold;
pub(crate) mod machine;
pub(crate) mod plot;
pub(crate) mod repeat;
pub(crate) mod report;
pub(crate) mod rng;
pub(crate) mod runtime;
pub(crate) mod scripts;
pub(crate) mod summary;
pub(crate) mod usage;

pub(crate) use cold::{Cold, ColdMethod};
pub(crate) use machine::{filesystem, Machine, Storage};
pub(crate) use repeat::interleaved;
pub(crate) use report::{display, write_json, Table};
/// The one recursive file walk (the generator's, which uploads with it).
pub(crate) use ringtier::gen::files_under;
pub(crate) use rng::Rng;
pub(crate) use summary::Summary;
pub(crate) use usage::{peak_rss_bytes, process_cpu, reset_peak_rss, Meter, Usage};

/// Bytes in a GiB, for CPU seconds per GiB.
pub(crate) const GIB: f64 = (1u64 << 30) as f64;
