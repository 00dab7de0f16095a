//! `ringtier`: read a generated dataset through every storage tier, and benchmark the io_uring
//! engine against fio and a thread pool. Run with no arguments for the demo on embedded
//! defaults (a generated dataset in a temp dir, no configuration).

mod dataset;
mod passes;
mod randread;
mod stats;
mod tiers;

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, Parser, Subcommand};
use ringtier_uring::DirectIoPolicy;

use crate::dataset::DatasetSpec;
use crate::passes::{Engine, UringKnobs};

#[derive(Parser, Debug)]
#[command(
    name = "ringtier",
    version,
    about = "io_uring storage engine for deep-learning I/O",
    long_about = "io_uring storage engine for deep-learning I/O.\n\nWith no command, runs the demo: \
                  `ringtier [DEMO OPTIONS]` is `ringtier demo [DEMO OPTIONS]`.",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Options of the demo, which runs when no command is given.
    #[command(flatten)]
    demo: DemoArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Generate a dataset in a temp dir and read it, cold, through every tier (the default).
    Demo(DemoArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Read a generated dataset through chosen engines over a sweep of concurrency.
    Tiers(TiersArgs),
    /// Random reads of one file at a fixed block size and depth (compare with fio).
    Randread(RandReadArgs),
}

#[derive(Args, Debug, Clone)]
struct DatasetArgs {
    /// Number of files to generate.
    #[arg(long, default_value_t = 2000)]
    files: usize,
    /// Median file size (log-normal sizes), e.g. 112k.
    #[arg(long, default_value = "112000", value_parser = parse_size)]
    median: u64,
    /// Largest file size.
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    max_size: u64,
    /// Seed of sizes, contents and read order.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Directory for the dataset (default: a new temp dir, removed afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the generated files in --dir.
    #[arg(long)]
    keep: bool,
}

#[derive(Args, Debug, Clone)]
struct UringArgs {
    /// io_uring rings (driver threads).
    #[arg(long, default_value_t = 1)]
    rings: usize,
    /// Kernel submission polling (SQPOLL); it costs a core while busy.
    #[arg(long)]
    sqpoll: bool,
    /// Do not register the buffer pool as fixed buffers.
    #[arg(long)]
    no_register_buffers: bool,
}

impl UringArgs {
    fn knobs(&self) -> UringKnobs {
        UringKnobs { rings: self.rings.max(1), sqpoll: self.sqpoll, register_buffers: !self.no_register_buffers }
    }
}

#[derive(Args, Debug)]
struct DemoArgs {
    #[command(flatten)]
    dataset: DatasetArgs,
    #[command(flatten)]
    uring: UringArgs,
    /// Passes per tier (interleaved).
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// Threads of the posix tier.
    #[arg(long, default_value_t = 8)]
    threads: usize,
    /// Requests in flight on the io_uring tier.
    #[arg(long, default_value_t = 32)]
    depth: usize,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct TiersArgs {
    #[command(flatten)]
    dataset: DatasetArgs,
    #[command(flatten)]
    uring: UringArgs,
    /// Engines, comma-separated: memory, posix-threads, uring-direct, uring-buffered.
    #[arg(long, value_delimiter = ',', default_value = "posix-threads,uring-direct")]
    engines: Vec<Engine>,
    /// Thread counts for posix-threads (and tasks for memory).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32")]
    threads: Vec<usize>,
    /// Queue depths for the uring engines.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64")]
    depths: Vec<usize>,
    /// Passes per point (interleaved).
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// Warm passes (no eviction).
    #[arg(long)]
    warm: bool,
    /// Also drop the whole page cache before each pass (root only).
    #[arg(long)]
    drop_caches: bool,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct RandReadArgs {
    /// The file to read (created with random data when it is missing or of another size).
    #[arg(long)]
    file: PathBuf,
    /// File size, e.g. 2G.
    #[arg(long, default_value = "2G", value_parser = parse_size)]
    size: u64,
    /// Block size, e.g. 128k.
    #[arg(long, default_value = "128k", value_parser = parse_size)]
    bs: u64,
    /// Requests in flight.
    #[arg(long, default_value_t = 32)]
    depth: u32,
    /// Seconds per run.
    #[arg(long, default_value_t = 10.0)]
    runtime: f64,
    /// Runs.
    #[arg(long, default_value_t = 1)]
    repeats: usize,
    /// Direct-I/O policy: off, auto or required.
    #[arg(long, default_value = "required")]
    direct: DirectIoPolicy,
    /// Register the file as a fixed file.
    #[arg(long)]
    register_files: bool,
    /// Do not register buffers.
    #[arg(long)]
    no_register_buffers: bool,
    /// Kernel submission polling (SQPOLL).
    #[arg(long)]
    sqpoll: bool,
    /// Seed of the offsets.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the result as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Parses sizes such as `4096`, `128k`, `1M`, `2G` (binary multiples).
fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let m = match s[i..].to_ascii_lowercase().trim_end_matches("ib").trim_end_matches('b') {
                "" => 1,
                "k" => 1 << 10,
                "m" => 1 << 20,
                "g" => 1 << 30,
                "t" => 1u64 << 40,
                other => return Err(format!("unknown size suffix {other:?} in {s:?}")),
            };
            (&s[..i], m)
        }
        None => (s, 1),
    };
    let n: u64 = num.trim().parse().map_err(|_| format!("not a size: {s:?}"))?;
    n.checked_mul(mult).ok_or_else(|| format!("size {s:?} overflows"))
}

fn spec(d: &DatasetArgs) -> Result<DatasetSpec> {
    if d.files == 0 {
        bail!("--files must be at least 1");
    }
    if d.median == 0 || d.max_size < d.median {
        bail!("--median must be positive and at most --max-size");
    }
    Ok(DatasetSpec {
        files: d.files,
        median_bytes: d.median,
        max_bytes: d.max_size,
        min_bytes: 1024.min(d.median),
        seed: d.seed,
        ..DatasetSpec::default()
    })
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("RINGTIER_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Command::Demo(cli.demo));
    match command {
        Command::Demo(a) => {
            let cfg = tiers::TiersConfig {
                dir: a.dataset.dir.clone(),
                keep: a.dataset.keep,
                spec: spec(&a.dataset)?,
                engines: Engine::ALL.to_vec(),
                threads: vec![a.threads],
                depths: vec![a.depth],
                repeats: a.repeats,
                warm: false,
                drop_caches: false,
                knobs: a.uring.knobs(),
                json: a.json,
            };
            tiers::run(&cfg)?;
        }
        Command::Bench(BenchCommand::Tiers(a)) => {
            let cfg = tiers::TiersConfig {
                dir: a.dataset.dir.clone(),
                keep: a.dataset.keep,
                spec: spec(&a.dataset)?,
                engines: a.engines,
                threads: a.threads,
                depths: a.depths,
                repeats: a.repeats,
                warm: a.warm,
                drop_caches: a.drop_caches,
                knobs: a.uring.knobs(),
                json: a.json,
            };
            if cfg.threads.contains(&0) || cfg.depths.contains(&0) {
                bail!("thread counts and depths must be at least 1");
            }
            tiers::run(&cfg)?;
        }
        Command::Bench(BenchCommand::Randread(a)) => {
            let cfg = randread::RandReadConfig {
                file: a.file,
                size: a.size,
                block_size: a.bs as usize,
                depth: a.depth,
                runtime_secs: a.runtime,
                repeats: a.repeats,
                direct: a.direct,
                register_files: a.register_files,
                register_buffers: !a.no_register_buffers,
                sqpoll: a.sqpoll,
                seed: a.seed,
            };
            let v = randread::run(&cfg)?;
            if let Some(path) = a.json {
                std::fs::write(&path, serde_json::to_string_pretty(&v)?)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("128k"), Ok(128 << 10));
        assert_eq!(parse_size("128KiB"), Ok(128 << 10));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert!(parse_size("12x").is_err());
        assert!(parse_size("k").is_err());
    }

    #[test]
    fn cli_parses() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
