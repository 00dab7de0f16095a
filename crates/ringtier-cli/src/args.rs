//! The command line: the top-level commands and the arguments of the product's commands
//! (`ckpt`, `gen`, `index`, `doctor`), which run on the facade `ringtier`. The experiments'
//! arguments (`bench`, `paper`, `tune`, `demo`) live with their code in `ringtier-bench`;
//! `main.rs` dispatches.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use ringtier::gen::{parse_size, Preset, ShapeArgs};
#[cfg(feature = "lab")]
use ringtier_bench::{BenchCommand, DemoArgs, PaperArgs, TuneArgs};

#[derive(Parser, Debug)]
#[command(
    name = "ringtier",
    version,
    about = "io_uring storage engine for deep-learning I/O",
    long_about = "io_uring storage engine for deep-learning I/O.\n\nWith no command, runs the paper's three \
                  experiments on generated data (about 5 minutes) and writes a report: `ringtier [OPTIONS]` is \
                  `ringtier paper [OPTIONS]`.",
    args_conflicts_with_subcommands = true
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Option<Command>,
    /// Serve Prometheus metrics on this address while the command runs, e.g. 127.0.0.1:9464.
    #[arg(long, global = true)]
    pub(crate) metrics_addr: Option<std::net::SocketAddr>,
    /// Allow a metrics address that is not loopback (serving to the network).
    #[arg(long, global = true)]
    pub(crate) metrics_allow_remote: bool,
    /// Keep serving metrics this many seconds after the command finishes (for a last scrape).
    #[arg(long, global = true, default_value_t = 0.0)]
    pub(crate) metrics_linger: f64,
    /// Options of `paper`, which runs when no command is given.
    #[cfg(feature = "lab")]
    #[command(flatten)]
    pub(crate) paper: PaperArgs,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Generate a dataset in a temp dir and read it, cold, through every tier.
    #[cfg(feature = "lab")]
    Demo(DemoArgs),
    /// Generate a synthetic dataset with a manifest (deterministic from a seed).
    Gen(GenArgs),
    /// Index record shards (TFRecord, WebDataset): `SHARD.idx` beside each shard, one
    /// `offset size` line per record (DALI's tfrecord2idx format), for a global shuffle.
    Index(IndexArgs),
    /// Benchmarks.
    #[cfg(feature = "lab")]
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Checkpoints in a burst-buffer store: save, ls, restore, verify, drain.
    Ckpt(CkptArgs),
    /// The paper's three experiments (read sweep, mini-app with and without prefetch,
    /// checkpoints burst versus direct) on generated data, with a report directory (the
    /// default); --remote adds the remote-storage regime (S3 on loopback against boto3).
    #[cfg(feature = "lab")]
    Paper(PaperArgs),
    /// The kernel I/O tuning lab: sweeps io_uring and block-layer settings (every pass
    /// cold), reports the Pareto front of bandwidth, CPU and p99, the best configuration,
    /// a tracepoint latency breakdown, fio at the same settings and MLPerf-Storage-style
    /// presets (docs/TUNE.md). It changes kernel settings (sysfs) while it runs and always
    /// restores them, also after Ctrl-C.
    ///
    /// What it writes, where the kernel lets it (root): the block-queue settings of the device
    /// under --dir (/sys/block/DEV/queue/*), per configuration, and the transparent huge page
    /// mode (/sys/kernel/mm/transparent_hugepage/enabled) while fio runs. Each original value
    /// is recorded before the first write and put back between configurations, at the end, on
    /// an error or a panic, and on Ctrl-C, SIGTERM or SIGHUP: nothing stays applied (the
    /// report gives the best configuration's settings as shell lines). A setting it may not
    /// write is a note in the report. --no-block leaves the device's settings alone,
    /// --fio-small-pages the huge page mode.
    #[cfg(feature = "lab")]
    Tune(TuneArgs),
    /// The metric catalog.
    #[command(subcommand)]
    Metrics(MetricsCommand),
    /// What this machine gives the engine and what it will fall back to: io_uring (set-up
    /// flags, opcodes) or why it is refused, the locked-memory limit, each path's file system
    /// (O_DIRECT and alignment, durability, free space), THP, the CUDA driver, the JPEG
    /// decoder. One line per finding, then a verdict naming the engine `auto` uses; exits 0.
    Doctor(DoctorArgs),
}

#[derive(Args, Debug)]
pub(crate) struct DoctorArgs {
    /// Directories (or files) to examine: dataset and checkpoint directories; a missing one is
    /// looked at where it would be created. Default: the current directory and the temp dir.
    pub(crate) paths: Vec<PathBuf>,
    /// Print the findings as JSON (findings, verdict, and the measured values by topic).
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Subcommand, Debug)]
pub(crate) enum MetricsCommand {
    /// Print the catalog as Markdown (docs/METRICS.md).
    Catalog,
}

/// Arguments of `ringtier gen`.
#[derive(Args, Debug)]
pub(crate) struct GenArgs {
    /// Directory to write the dataset into (created); or an S3 prefix,
    /// `s3://bucket/prefix[?endpoint=URL]` (credentials from AWS_* variables): the dataset is
    /// generated in a temporary directory and uploaded there, one object per file.
    #[arg(long)]
    pub(crate) dir: PathBuf,
    /// Dataset shape: imagenet (16,384 files, median 112 KB), caltech101 (9,144, median 12 KB).
    #[arg(long, value_enum, default_value = "imagenet")]
    pub(crate) preset: Preset,
    #[command(flatten)]
    pub(crate) shape: ShapeArgs,
    /// Regenerate over an existing dataset.
    #[arg(long)]
    pub(crate) force: bool,
    /// Shards of `--format tfrecord|wds` (sample i goes to shard i mod shards).
    #[arg(long, default_value_t = 16)]
    pub(crate) shards: usize,
}

#[derive(Args, Debug)]
pub(crate) struct IndexArgs {
    /// The directory of shards.
    #[arg(long)]
    pub(crate) dir: PathBuf,
    /// The shards' format: tfrecord (`*.tfrecord`, `*.tfrecords`) or wds (`*.tar`).
    #[arg(long, value_enum)]
    pub(crate) format: IndexFormat,
    /// Engine reading the shards: `auto` (io_uring where the kernel allows it, the thread pool
    /// where it is refused), `uring` or `posix`.
    #[arg(long, default_value = "auto")]
    pub(crate) engine: ringtier::open::Engine,
}

/// Record shard formats `ringtier index` reads.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum IndexFormat {
    /// TFRecord shards.
    Tfrecord,
    /// WebDataset tar shards.
    Wds,
}

#[derive(Args, Debug)]
pub(crate) struct CkptArgs {
    /// Tier directories, fastest first, comma-separated (created when missing); a tier may be
    /// an S3 URL, `s3://bucket/prefix[?endpoint=URL&region=R]`, credentials from AWS_* variables.
    #[arg(long, value_delimiter = ',', required = true)]
    pub(crate) tiers: Vec<PathBuf>,
    /// Throttle the last tier to this many bytes per second (an emulated slow disk), e.g. 100M.
    #[arg(long, value_parser = parse_size)]
    pub(crate) throttle_last: Option<u64>,
    /// Key prefix of the store on every tier.
    #[arg(long, default_value = "ckpt")]
    pub(crate) prefix: String,
    /// Drained checkpoints kept on each faster tier.
    #[arg(long, default_value_t = 2)]
    pub(crate) keep_last: usize,
    /// Drain bandwidth cap in bytes per second, e.g. 200M.
    #[arg(long, value_parser = parse_size)]
    pub(crate) drain_bw: Option<u64>,
    /// Bytes the fastest tier may hold, e.g. 10G.
    #[arg(long, value_parser = parse_size)]
    pub(crate) fast_capacity: Option<u64>,
    /// When the fast tier is full: wait for the drain, or write through to the next tier.
    #[arg(long, value_enum, default_value = "wait")]
    pub(crate) on_full: OnFullArg,
    /// Engine of the file tiers: `auto` (io_uring where the kernel allows it, the thread pool
    /// where it is refused, with a warning), `uring` (an error where refused) or `posix`. The
    /// files are the same whichever engine wrote them.
    #[arg(long, default_value = "auto")]
    pub(crate) engine: ringtier::open::Engine,
    #[command(subcommand)]
    pub(crate) action: CkptAction,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum OnFullArg {
    Wait,
    WriteThrough,
}

#[derive(Subcommand, Debug)]
pub(crate) enum CkptAction {
    /// Save files as the parts of a checkpoint; waits for the drain unless --no-drain.
    Save {
        /// The training step.
        #[arg(long)]
        step: u64,
        /// A part as NAME=PATH (repeat for several).
        #[arg(long = "part", required = true)]
        parts: Vec<String>,
        /// Write straight to the slowest tier.
        #[arg(long)]
        direct: bool,
        /// Return once the checkpoint is durable on the fast tier (the drain resumes the next
        /// time the store is opened).
        #[arg(long)]
        no_drain: bool,
    },
    /// List checkpoints and the tiers holding them.
    Ls,
    /// Restore a checkpoint (default: the latest) into a directory, one file per part: parts
    /// streamed with many reads in flight, checksums checked on the fly, written with O_DIRECT
    /// where the directory allows, each file fsynced and renamed into place only once whole.
    /// A bad fast copy of a part is read again from a slower tier (a warning says why).
    /// With --no-sync the files are written through the page cache and renamed without
    /// fsyncs, as `cp` does: whole or absent if the process dies, but a power cut may lose
    /// them (the checkpoint itself stays durable in the store).
    Restore {
        /// The step (default: the latest).
        #[arg(long)]
        step: Option<u64>,
        /// Directory to write the parts into (created when missing).
        #[arg(long)]
        out: PathBuf,
        /// Restore only this part (repeat for several; default: all).
        #[arg(long = "part")]
        parts: Vec<String>,
        /// Read requests in flight.
        #[arg(long, default_value_t = ringtier_migrate::RestoreOptions::default().depth)]
        depth: usize,
        /// Bytes per read request, e.g. 1M.
        #[arg(long, value_parser = parse_size, default_value_t = ringtier_migrate::RestoreOptions::default().chunk_bytes as u64)]
        chunk: u64,
        /// Write through the page cache and rename without fsync (`cp`'s durability, at its
        /// speed); default: O_DIRECT writes, each file fsynced before its rename.
        #[arg(long)]
        no_sync: bool,
    },
    /// Verify every copy of a checkpoint (default: all checkpoints).
    Verify {
        /// The step (default: all).
        #[arg(long)]
        step: Option<u64>,
    },
    /// Recover and drain everything queued to the slowest tier. Steps with no intact copy
    /// are quarantined (named in a warning, shown by `ls` and `verify`) and the drain goes on.
    Drain,
    /// Remove a checkpoint from every tier (quarantined copies included), each copy manifest
    /// first, as eviction does.
    Rm {
        /// The step.
        #[arg(long)]
        step: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_parses() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
