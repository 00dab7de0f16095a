//! `ringtier`: read a generated dataset through every storage tier, and benchmark the io_uring
//! engine against fio and a thread pool. Run with no arguments for the demo on embedded
//! defaults (a generated dataset in a temp dir, no configuration).

mod ckpt;
mod dataset;
mod paper;
mod passes;
mod randread;
mod readbench;
mod stagebench;
mod stats;
mod train;

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use ringtier_uring::{BufferedWrites, DirectIoPolicy};

use crate::dataset::{Dataset, DatasetSpec, Format, Preset};
use crate::passes::{Engine, Knobs, OnError, Order};

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
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Serve Prometheus metrics on this address while the command runs, e.g. 127.0.0.1:9464.
    #[arg(long, global = true)]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Allow a metrics address that is not loopback (serving to the network).
    #[arg(long, global = true)]
    metrics_allow_remote: bool,
    /// Keep serving metrics this many seconds after the command finishes (for a last scrape).
    #[arg(long, global = true, default_value_t = 0.0)]
    metrics_linger: f64,
    /// Options of `paper`, which runs when no command is given.
    #[command(flatten)]
    paper: PaperArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Generate a dataset in a temp dir and read it, cold, through every tier.
    Demo(DemoArgs),
    /// Generate a synthetic dataset with a manifest (deterministic from a seed).
    Gen(GenArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Checkpoints in a burst-buffer store: save, ls, restore, verify, drain.
    Ckpt(CkptArgs),
    /// The paper's three experiments (read sweep, mini-app with and without prefetch,
    /// checkpoints burst versus direct) on generated data, with a report directory (the
    /// default).
    Paper(PaperArgs),
    /// The metric catalog.
    #[command(subcommand)]
    Metrics(MetricsCommand),
}

#[derive(Subcommand, Debug)]
enum MetricsCommand {
    /// Print the catalog as Markdown (docs/METRICS.md).
    Catalog,
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
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
    /// Storage to accelerator (or pinned host memory) through pinned buffers, against raw reads,
    /// pageable buffers plus copy, and pinned buffers without overlap.
    Stage(StageArgs),
}

#[derive(Args, Debug)]
struct StageArgs {
    /// The dataset directory.
    #[arg(long)]
    dir: PathBuf,
    /// host, cuda or cuda:N (cuda needs the `cuda` feature and a driver).
    #[arg(long, default_value = "host", value_parser = stagebench::parse_target)]
    target: ringtier_stage::Target,
    /// Samples per batch.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Batches in flight (2 = double buffering).
    #[arg(long, default_value_t = 2)]
    depth: usize,
    /// Repeats (interleaved).
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct PaperArgs {
    /// Report directory (created; default ./ringtier-report).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Work directory for generated data (default: a new directory in the temp dir, or in the
    /// current directory when the temp dir has no direct I/O (tmpfs); removed after).
    #[arg(long)]
    work: Option<PathBuf>,
    /// The paper's sizes (16,384 and 9,144 files, 600 MB checkpoints) instead of the quick ones.
    #[arg(long)]
    full: bool,
    /// Repeats per point.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Tiny sizes, for tests of the command itself (not meaningful figures).
    #[arg(long, hide = true)]
    tiny: bool,
}

#[derive(Args, Debug)]
struct TrainArgs {
    /// The dataset directory (JPEGs for --decode; from `ringtier gen --format jpeg`).
    #[arg(long)]
    dir: PathBuf,
    /// Samples per batch.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Epochs per run.
    #[arg(long, default_value_t = 1)]
    epochs: usize,
    /// Prefetch depths to compare (0 = no prefetch).
    #[arg(long, value_delimiter = ',', default_value = "2,0")]
    prefetch: Vec<usize>,
    /// Emulated accelerator compute per batch in ms (default: 1.2 ms per image, AlexNet on a
    /// K80-class GPU).
    #[arg(long)]
    compute_ms: Option<f64>,
    /// Do not decode (read raw bytes only).
    #[arg(long)]
    no_decode: bool,
    /// Decode threads.
    #[arg(long, default_value_t = 2)]
    decode_threads: usize,
    /// Save a checkpoint every K steps (0: none).
    #[arg(long, default_value_t = 0)]
    ckpt_every: usize,
    /// Checkpoint size (default AlexNet, 244 MB).
    #[arg(long, default_value = "244000000", value_parser = parse_size)]
    ckpt_size: u64,
    /// Fast and slow checkpoint directories, comma-separated (default: under the work dir).
    #[arg(long, value_delimiter = ',')]
    ckpt_tiers: Option<Vec<PathBuf>>,
    /// Throttle the slow checkpoint tier to this many bytes per second.
    #[arg(long, value_parser = parse_size)]
    ckpt_slow_bw: Option<u64>,
    /// Repeats (interleaved).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct CkptArgs {
    /// Tier directories, fastest first, comma-separated (created when missing).
    #[arg(long, value_delimiter = ',', required = true)]
    tiers: Vec<PathBuf>,
    /// Throttle the last tier to this many bytes per second (an emulated slow disk), e.g. 100M.
    #[arg(long, value_parser = parse_size)]
    throttle_last: Option<u64>,
    /// Key prefix of the store on every tier.
    #[arg(long, default_value = "ckpt")]
    prefix: String,
    /// Drained checkpoints kept on each faster tier.
    #[arg(long, default_value_t = 2)]
    keep_last: usize,
    /// Drain bandwidth cap in bytes per second, e.g. 200M.
    #[arg(long, value_parser = parse_size)]
    drain_bw: Option<u64>,
    /// Bytes the fastest tier may hold, e.g. 10G.
    #[arg(long, value_parser = parse_size)]
    fast_capacity: Option<u64>,
    /// When the fast tier is full: wait for the drain, or write through to the next tier.
    #[arg(long, value_enum, default_value = "wait")]
    on_full: OnFullArg,
    #[command(subcommand)]
    action: CkptAction,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum OnFullArg {
    Wait,
    WriteThrough,
}

#[derive(Subcommand, Debug)]
enum CkptAction {
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
    /// Restore a checkpoint (default: the latest) into a directory, one file per part.
    Restore {
        /// The step (default: the latest).
        #[arg(long)]
        step: Option<u64>,
        /// Directory to write the parts into.
        #[arg(long)]
        out: PathBuf,
    },
    /// Verify every copy of a checkpoint (default: all checkpoints).
    Verify {
        /// The step (default: all).
        #[arg(long)]
        step: Option<u64>,
    },
    /// Recover and drain everything queued to the slowest tier.
    Drain,
    /// Crash-test child: save until killed, printing each step once durable.
    #[command(hide = true)]
    CrashHelper {
        #[arg(long, default_value_t = 1)]
        start: u64,
        #[arg(long, default_value_t = 1000)]
        count: u64,
        #[arg(long, default_value_t = 200_000)]
        size: usize,
    },
}

#[derive(Args, Debug)]
struct BenchCkptArgs {
    /// Working directory (default: a new directory under the current one, removed after).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Fast tier directory (default: DIR/fast), e.g. on /dev/shm for a tmpfs fast tier.
    #[arg(long)]
    fast_dir: Option<PathBuf>,
    /// Slow tier directory (default: DIR/slow), e.g. a cgroup-throttled loop mount
    /// (bench/ckpt_blkio.sh).
    #[arg(long)]
    slow_dir: Option<PathBuf>,
    /// The slow directory is throttled by the kernel at this many bytes per second (cgroup
    /// blkio): no throttled layer is added and `--ratios` is replaced by the one slowdown this
    /// gives.
    #[arg(long, value_parser = parse_size)]
    slow_kernel_bw: Option<u64>,
    /// Checkpoints per run.
    #[arg(long, default_value_t = 3)]
    count: usize,
    /// Drained checkpoints kept on the fast tier (older ones are evicted once drained).
    #[arg(long, default_value_t = 1)]
    keep_last: usize,
    /// Checkpoint size (default: AlexNet, 61M fp32 parameters, 244 MB).
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    /// Size preset: alexnet (244 MB) or paper (600 MB, the paper's checkpoints).
    #[arg(long, value_enum, default_value = "alexnet")]
    preset: CkptPreset,
    /// Seconds of emulated compute between checkpoints.
    #[arg(long, default_value_t = 1.0)]
    compute: f64,
    /// Slow-tier slowdowns relative to the fast tier's raw write bandwidth.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    ratios: Vec<f64>,
    /// Repeats (interleaved).
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// How the store's tiers issue writes to files without O_DIRECT (e.g. a tmpfs fast tier):
    /// `threads` (pwrite on the tier's threads) or `ring` (io_uring, which hands them to its
    /// io-wq workers).
    #[arg(long, default_value = "threads")]
    buffered_writes: BufferedWrites,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum CkptPreset {
    Alexnet,
    Paper,
}

#[derive(Args, Debug, Clone)]
struct ShapeArgs {
    /// Number of files (default: the preset's).
    #[arg(long)]
    files: Option<usize>,
    /// Median file size (log-normal sizes), e.g. 112000 or 12k (default: the preset's).
    #[arg(long, value_parser = parse_size)]
    median: Option<u64>,
    /// Log-normal sigma of the sizes (default: the preset's).
    #[arg(long)]
    sigma: Option<f64>,
    /// Smallest file size (default: the preset's).
    #[arg(long, value_parser = parse_size)]
    min_size: Option<u64>,
    /// Largest file size (default: the preset's).
    #[arg(long, value_parser = parse_size)]
    max_size: Option<u64>,
    /// Class directories (default: the preset's).
    #[arg(long)]
    classes: Option<usize>,
    /// Seed of sizes and contents.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// File contents: raw random bytes or real JPEG images.
    #[arg(long, value_enum, default_value = "raw")]
    format: Format,
    /// Round every size up to a multiple of this (raw format), e.g. 128k for a comparison
    /// with fio at that block size: fio reads only whole blocks of each file.
    #[arg(long, default_value = "1", value_parser = parse_size)]
    size_multiple: u64,
}

impl ShapeArgs {
    fn spec(&self, preset: Preset) -> Result<DatasetSpec> {
        let d = DatasetSpec::preset(preset);
        let spec = DatasetSpec {
            files: self.files.unwrap_or(d.files),
            median_bytes: self.median.unwrap_or(d.median_bytes),
            sigma: self.sigma.unwrap_or(d.sigma),
            min_bytes: self.min_size.unwrap_or(d.min_bytes.min(self.median.unwrap_or(d.median_bytes))),
            max_bytes: self.max_size.unwrap_or(d.max_bytes.max(self.median.unwrap_or(d.median_bytes))),
            classes: self.classes.unwrap_or(d.classes),
            seed: self.seed,
            format: self.format,
            size_multiple: self.size_multiple,
        };
        spec.validate()?;
        Ok(spec)
    }
}

#[derive(Args, Debug)]
struct GenArgs {
    /// Directory to write the dataset into (created).
    #[arg(long)]
    dir: PathBuf,
    /// Dataset shape: imagenet (16,384 files, median 112 KB), caltech101 (9,144, median 12 KB).
    #[arg(long, value_enum, default_value = "imagenet")]
    preset: Preset,
    #[command(flatten)]
    shape: ShapeArgs,
    /// Regenerate over an existing dataset.
    #[arg(long)]
    force: bool,
}

#[derive(Args, Debug, Clone)]
struct IoArgs {
    /// io_uring rings (driver threads); a list sweeps it.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    rings: Vec<usize>,
    /// Kernel submission polling (SQPOLL); it costs a core while busy.
    #[arg(long)]
    sqpoll: bool,
    /// Do not register the buffer pool as fixed buffers.
    #[arg(long)]
    no_register_buffers: bool,
    /// Registered files: each open returns a direct descriptor (io_uring fixed-file slot).
    #[arg(long)]
    register_files: bool,
    /// Largest single read (fio's --bs), e.g. 128k; 0 reads each file with one read.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    read_size: u64,
    /// Check every file's CRC-32C against the manifest (costs CPU).
    #[arg(long)]
    verify: bool,
    /// What to do with a file that cannot be read as the manifest says.
    #[arg(long, value_enum, default_value = "fail")]
    on_error: OnError,
    /// Order of the files in a pass: shuffled (seeded, per pass), manifest, or readdir (fio's
    /// --opendir order, for comparisons with fio).
    #[arg(long, value_enum, default_value = "shuffled")]
    order: Order,
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
    /// Write a plot of bandwidth against concurrency here (SVG).
    #[arg(long)]
    plot: Option<PathBuf>,
}

impl IoArgs {
    /// A read sweep over these settings.
    fn read_bench(
        &self,
        engines: Vec<Engine>,
        threads: Vec<usize>,
        depths: Vec<usize>,
        seed: u64,
    ) -> readbench::ReadBenchConfig {
        readbench::ReadBenchConfig {
            engines,
            threads,
            depths,
            rings: self.rings.clone(),
            repeats: self.repeats,
            warm: self.warm,
            drop_caches: self.drop_caches,
            knobs: self.knobs(),
            json: self.json.clone(),
            plot: self.plot.clone(),
            seed,
        }
    }

    fn knobs(&self) -> Knobs {
        Knobs {
            read_size: self.read_size as usize,
            sqpoll: self.sqpoll,
            register_buffers: !self.no_register_buffers,
            register_files: self.register_files,
            verify: self.verify,
            on_error: self.on_error,
            order: self.order,
        }
    }
}

#[derive(Args, Debug)]
struct DemoArgs {
    #[command(flatten)]
    shape: ShapeArgs,
    #[command(flatten)]
    io: IoArgs,
    /// Directory for the dataset (default: a new temp dir, removed afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Threads of the posix tier.
    #[arg(long, default_value_t = 8)]
    threads: usize,
    /// Requests in flight on the io_uring tier.
    #[arg(long, default_value_t = 32)]
    depth: usize,
}

#[derive(Args, Debug)]
struct ReadArgs {
    /// The dataset directory (from `ringtier gen`, or any directory of files).
    #[arg(long)]
    dir: PathBuf,
    #[command(flatten)]
    io: IoArgs,
    /// Engines, comma-separated: memory, posix-threads, uring-direct, uring-buffered.
    #[arg(long, value_delimiter = ',', default_value = "posix-threads,uring-direct,uring-buffered")]
    engines: Vec<Engine>,
    /// Concurrency sweep: threads for posix-threads, queue depth for the uring engines.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64")]
    concurrency: Vec<usize>,
    /// Thread counts for posix-threads, instead of --concurrency.
    #[arg(long, value_delimiter = ',')]
    threads: Option<Vec<usize>>,
    /// Queue depths for the uring engines, instead of --concurrency.
    #[arg(long, value_delimiter = ',')]
    depths: Option<Vec<usize>>,
    /// Seed of the read order.
    #[arg(long, default_value_t = 1000)]
    seed: u64,
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
    /// Direct-I/O policy: off, auto (direct where the file system has it, else buffered; the
    /// report says which) or required.
    #[arg(long, default_value = "auto")]
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

fn main() -> std::process::ExitCode {
    match run_cli() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line with the whole chain of causes, and no backtrace even when RUST_BACKTRACE
            // is set: an error here is the user's input or the machine's state, not a bug (bugs
            // panic, and panics keep their backtraces).
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run_cli() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("RINGTIER_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    if let Some(addr) = cli.metrics_addr {
        // Before any tier exists: metric handles bind to the recorder when tiers are built.
        let cfg =
            ringtier_metrics::ExporterConfig::default().with_addr(addr).with_allow_remote(cli.metrics_allow_remote);
        let exporter = ringtier_metrics::install(&cfg)?;
        eprintln!("serving Prometheus metrics on http://{}/metrics", exporter.addr());
    }
    let result = run(cli.command.unwrap_or(Command::Paper(cli.paper)));
    if cli.metrics_addr.is_some() && cli.metrics_linger > 0.0 {
        eprintln!("done; serving metrics for {} more seconds", cli.metrics_linger);
        std::thread::sleep(std::time::Duration::from_secs_f64(cli.metrics_linger));
    }
    result
}

fn run(command: Command) -> Result<()> {
    match command {
        Command::Ckpt(a) => {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
            rt.block_on(ckpt_command(a))
        }
        Command::Paper(a) => {
            let tmp;
            let (work, work_note) = match a.work {
                Some(w) => (w, None),
                None => {
                    let (dir, note) = paper::temp_work_dir()?;
                    tmp = dir;
                    (tmp.path().to_path_buf(), note)
                }
            };
            let cfg = paper::PaperConfig {
                out: a.out.unwrap_or_else(paper::default_out),
                work,
                work_note,
                full: a.full,
                tiny: a.tiny,
                repeats: a.repeats.max(1),
            };
            paper::run(&cfg)
        }
        Command::Bench(BenchCommand::Train(a)) => {
            let tmp;
            let ckpt_dirs = match (a.ckpt_every, a.ckpt_tiers) {
                (0, _) => None,
                (_, Some(t)) if t.len() == 2 => Some((t[0].clone(), t[1].clone())),
                (_, Some(_)) => anyhow::bail!("--ckpt-tiers takes two directories: FAST,SLOW"),
                (_, None) => {
                    tmp = tempfile::Builder::new().prefix("ringtier-train-").tempdir_in(".")?;
                    Some((tmp.path().join("fast"), tmp.path().join("slow")))
                }
            };
            let cfg = train::TrainConfig {
                dir: a.dir,
                batch: a.batch,
                epochs: a.epochs,
                prefetch: a.prefetch,
                compute_ms: a.compute_ms.unwrap_or(train::DEFAULT_COMPUTE_MS_PER_IMAGE * a.batch as f64),
                decode: !a.no_decode,
                decode_threads: a.decode_threads,
                ckpt_every: a.ckpt_every,
                ckpt_bytes: a.ckpt_size,
                ckpt_dirs,
                ckpt_slow_bytes_per_sec: a.ckpt_slow_bw,
                repeats: a.repeats,
                json: a.json,
            };
            train::run(&cfg).map(|_| ())
        }
        Command::Bench(BenchCommand::Stage(a)) => {
            let cfg = stagebench::StageBenchConfig {
                dir: a.dir,
                target: a.target,
                batch: a.batch,
                depth: a.depth,
                repeats: a.repeats,
                json: a.json,
            };
            stagebench::run(&cfg).map(|_| ())
        }
        Command::Bench(BenchCommand::Ckpt(a)) => {
            let tmp;
            let base = match a.dir {
                Some(d) => d,
                None => {
                    tmp = tempfile::Builder::new().prefix("ringtier-bench-ckpt-").tempdir_in(".")?;
                    tmp.path().to_path_buf()
                }
            };
            let size = a.size.unwrap_or(match a.preset {
                CkptPreset::Alexnet => 61_000_000 * 4,
                CkptPreset::Paper => 600_000_000,
            });
            let cfg = ckpt::CkptBenchConfig {
                base,
                fast_dir: a.fast_dir,
                slow_dir: a.slow_dir,
                slow_kernel_bps: a.slow_kernel_bw,
                keep_last: a.keep_last,
                count: a.count,
                size,
                compute_secs: a.compute,
                ratios: a.ratios,
                repeats: a.repeats,
                buffered_writes: a.buffered_writes,
                json: a.json,
            };
            ckpt::bench(&cfg).map(|_| ())
        }
        Command::Metrics(MetricsCommand::Catalog) => {
            print!("{}", ringtier_metrics::catalog_markdown());
            Ok(())
        }
        Command::Demo(a) => demo(a),
        Command::Gen(a) => {
            let spec = a.shape.spec(a.preset)?;
            let t0 = std::time::Instant::now();
            let ds = dataset::generate(&a.dir, &spec, a.force, std::io::stderr().is_terminal())?;
            println!(
                "wrote {} files, {:.1} MB (median {:.0} KB, max {:.0} KB), manifest {} in {:.1} s",
                ds.len(),
                ds.total_bytes() as f64 / 1e6,
                ds.median_size() as f64 / 1e3,
                ds.max_size() as f64 / 1e3,
                a.dir.join(ringtier_core::manifest::MANIFEST_FILE).display(),
                t0.elapsed().as_secs_f64()
            );
            Ok(())
        }
        Command::Bench(BenchCommand::Read(a)) => {
            let ds = Dataset::open(&a.dir)?;
            let threads = a.threads.unwrap_or_else(|| a.concurrency.clone());
            let cfg = a.io.read_bench(a.engines, threads, a.depths.unwrap_or(a.concurrency), a.seed);
            readbench::run(&cfg, &ds)?;
            Ok(())
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
            stats::write_json(a.json.as_deref(), &v)?;
            Ok(())
        }
    }
}

async fn ckpt_command(a: CkptArgs) -> Result<()> {
    let cfg = ringtier_migrate::StoreConfig::default()
        .with_prefix(a.prefix.clone())
        .with_keep_last(a.keep_last)
        .with_drain_bytes_per_sec(a.drain_bw)
        .with_fast_capacity_bytes(a.fast_capacity)
        .with_on_full(match a.on_full {
            OnFullArg::Wait => ringtier_migrate::OnFull::Wait,
            OnFullArg::WriteThrough => ringtier_migrate::OnFull::WriteThrough,
        });
    // Looking (ls, restore, verify) opens read-only: it works next to a training process that
    // has the store open, and never runs recovery under that process's feet.
    let read_only = matches!(a.action, CkptAction::Ls | CkptAction::Restore { .. } | CkptAction::Verify { .. });
    let store = ckpt::open_store(&a.tiers, a.throttle_last, BufferedWrites::default(), cfg, read_only).await?;
    match a.action {
        CkptAction::Save { step, parts, direct, no_drain } => {
            let mut files = Vec::new();
            for p in &parts {
                let Some((name, path)) = p.split_once('=') else {
                    anyhow::bail!("--part takes NAME=PATH, got {p:?}");
                };
                let f = std::fs::File::open(path).with_context(|| format!("part {name}: opening {path}"))?;
                let size = f.metadata()?.len();
                files.push((name.to_string(), f, size));
            }
            let parts = files
                .into_iter()
                // Seekable: a fast tier that fills up part-way is retried elsewhere from the start.
                .map(|(n, f, size)| ringtier_migrate::Part::seekable(n, std::io::BufReader::new(f), Some(size)))
                .collect();
            let r = if direct { store.save_direct(step, parts).await? } else { store.save(step, parts).await? };
            println!(
                "saved step {} ({:.1} MB) on {} in {:.3} s{}",
                r.step,
                r.bytes as f64 / 1e6,
                r.tier,
                r.blocking.as_secs_f64(),
                if r.wrote_through { " (fast tier full: written through)" } else { "" }
            );
            if !no_drain {
                let t = std::time::Instant::now();
                store.drain().await?;
                println!("drained to the slowest tier in {:.3} s", t.elapsed().as_secs_f64());
            }
        }
        CkptAction::Ls => {
            println!("{:>20}  {:>12}  tiers", "step", "MB");
            for c in store.list().await? {
                println!("{:>20}  {:>12.1}  {}", c.step, c.bytes as f64 / 1e6, c.tiers.join(", "));
            }
            let backlog = store.drain_backlog_bytes();
            if backlog > 0 {
                println!("drain backlog: {:.1} MB (run `ringtier ckpt ... drain`)", backlog as f64 / 1e6);
            }
        }
        CkptAction::Restore { step, out } => {
            let step = match step {
                Some(s) => s,
                None => store.latest().await?.context("no checkpoint to restore")?,
            };
            let r = store.load(step).await?;
            for f in &r.fallbacks {
                eprintln!("warning: checkpoint {step}: {f}");
            }
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            for (name, data) in &r.parts {
                let tmp = out.join(format!(".{name}.tmp"));
                std::fs::write(&tmp, data).with_context(|| format!("writing {}", tmp.display()))?;
                std::fs::rename(&tmp, out.join(name))?;
            }
            println!("restored step {step} from {} ({} parts) into {}", r.tier, r.parts.len(), out.display());
        }
        CkptAction::Verify { step } => {
            let steps: Vec<u64> = match step {
                Some(s) => vec![s],
                None => store.list().await?.iter().map(|c| c.step).collect(),
            };
            let mut bad = 0;
            for s in steps {
                for (tier, res) in store.verify(s).await? {
                    match res {
                        Ok(()) => println!("step {s} on {tier}: ok"),
                        Err(e) => {
                            bad += 1;
                            println!("step {s} on {tier}: BAD: {e}");
                        }
                    }
                }
            }
            if bad > 0 {
                anyhow::bail!("{bad} bad cop{}", if bad == 1 { "y" } else { "ies" });
            }
        }
        CkptAction::Drain => {
            let backlog = store.drain_backlog_bytes();
            store.drain().await?;
            println!("drained {:.1} MB to the slowest tier", backlog as f64 / 1e6);
        }
        CkptAction::CrashHelper { start, count, size } => {
            let start = start.max(store.latest().await?.map_or(0, |s| s + 1));
            ckpt::crash_helper(&store, start, count, size).await?;
        }
    }
    Ok(())
}

/// The demo: a small generated dataset, read through every tier.
fn demo(a: DemoArgs) -> Result<()> {
    let spec = a.shape.spec(Preset::Small)?;
    let tmp;
    let root = match &a.dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::Builder::new().prefix("ringtier-demo-").tempdir().context("creating a temp dir")?;
            tmp.path().to_path_buf()
        }
    };
    eprintln!(
        "generating {} files (median {} KB, seed {}) in {}",
        spec.files,
        spec.median_bytes / 1000,
        spec.seed,
        root.display()
    );
    let ds = dataset::generate(&root, &spec, true, std::io::stderr().is_terminal())?;
    let cfg = a.io.read_bench(Engine::ALL.to_vec(), vec![a.threads], vec![a.depth], 1000);
    let result = readbench::run(&cfg, &ds);
    if a.dir.is_some() {
        for f in &ds.manifest.entries {
            let _ = std::fs::remove_file(ds.root.join(&f.key));
        }
        let _ = std::fs::remove_file(ds.root.join(ringtier_core::manifest::MANIFEST_FILE));
    }
    result.map(|_| ())
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
