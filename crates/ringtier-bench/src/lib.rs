//! ringtier's benchmarks (`publish = false`): one harness and the experiments that use it.
//!
//! The harness (`harness/`) holds everything two experiments would otherwise each write: the
//! cold pass (one rule, and the report says which way it ran), interleaved repeats,
//! min/median/max and pair-by-pair ratios against a baseline measured in the same run, wall
//! time, CPU (self and children), peak RSS, the machine and the file system of each path,
//! typed JSON reports with a schema version, tables, SVG plots, the tokio runtime, and the
//! baselines' helper scripts (built in, written to the run's directory). Each experiment is a
//! module that says only what it measures. The `ringtier` binary dispatches here:
//! [`bench()`], [`paper`], [`demo`] and [`tune`].

#![forbid(unsafe_code)]

mod cache;
mod ckpt;
mod dataset;
mod decode;
mod harness;
mod paper;
mod randread;
mod read;
mod restore;
mod s3;
pub mod s3server;
mod scale;
mod stage;
pub mod tiers;
mod train;
mod tune;

use anyhow::Result;
use clap::Subcommand;

pub use cache::CacheBenchArgs;
pub use ckpt::BenchCkptArgs;
pub use decode::DecodeBenchArgs;
pub use harness::runtime::runtime;
pub use paper::PaperArgs;
pub use randread::RandReadArgs;
pub use read::args::{DemoArgs, ReadArgs};
pub use s3::S3BenchArgs;
pub use scale::ScaleBenchArgs;
pub use stage::StageArgs;
pub use train::TrainArgs;
pub use tune::TuneArgs;

/// `ringtier bench ...`: the benchmarks.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// The paper's read micro-benchmark: cold shuffled epochs through each engine over a
    /// concurrency sweep.
    Read(ReadArgs),
    /// Random reads of one file at a fixed block size and depth (compare with fio).
    Randread(RandReadArgs),
    /// The paper's burst-buffer experiment: checkpoint blocking time, burst buffer versus
    /// writing straight to slow storage, over a range of slow-tier speeds.
    Ckpt(BenchCkptArgs),
    /// The AlexNet mini-app: loader batches, emulated compute, checkpoints; prefetch on and off.
    Train(TrainArgs),
    /// JPEG decode and transforms (resize, center crop, random-resized crop + flip, normalize)
    /// against Pillow on the same files, side by side: images/s and images per CPU second.
    Decode(DecodeBenchArgs),
    /// Storage to accelerator (or pinned host memory) through pinned buffers, against raw reads,
    /// pageable buffers plus copy, and pinned buffers without overlap.
    Stage(StageArgs),
    /// The S3 tier against boto3 on one S3 server on loopback: checkpoint drain versus
    /// upload_file, small-object reads versus a thread pool, and a latency-throttled file tier.
    S3(S3BenchArgs),
    /// Cache policies (none, LRU, static, clairvoyant) in front of a slow tier, each with the
    /// same in-flight read budget: warm-epoch time, slow-tier bytes per warm epoch, stall share
    /// and hit ratio per policy, one rank and several (the ranks of a node sharing one node
    /// cache, or one cache per rank; the same seed), caches of 10% and 25% of the dataset.
    Cache(CacheBenchArgs),
    /// Input at scale from the Rust loader: over a directory of small files, cold, R ranks each
    /// a process reading its shard for one epoch (batches of 256): time to the first batch with
    /// the listing cache and without it (and with a stat per file), the node's samples/s, CPU
    /// per 1,000 samples, peak RSS per rank; --verify checks every file was read exactly once.
    Scale(ScaleBenchArgs),
}

/// Runs one benchmark.
pub fn bench(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Read(a) => read::command(a),
        BenchCommand::Randread(a) => randread::command(a),
        BenchCommand::Ckpt(a) => ckpt::command(a),
        BenchCommand::Train(a) => train::command(a),
        BenchCommand::Decode(a) => decode::command(a),
        BenchCommand::Stage(a) => stage::command(a),
        BenchCommand::S3(a) => s3::command(a),
        BenchCommand::Cache(a) => cache::command(a),
        BenchCommand::Scale(a) => scale::command(a),
    }
}

/// `ringtier paper`: the paper's experiments and the report.
pub fn paper(args: PaperArgs) -> Result<()> {
    paper::command(args)
}

/// `ringtier tune`: the kernel I/O tuning lab (`docs/TUNE.md`).
pub fn tune(args: TuneArgs) -> Result<()> {
    tune::command(args)
}

/// `ringtier demo`: a generated dataset read, cold, through every tier.
pub fn demo(args: DemoArgs) -> Result<()> {
    read::demo(args)
}

/// Parses sizes such as `4096`, `128k`, `1M`, `2G` (binary multiples): the generator's.
pub use ringtier::gen::parse_size;
