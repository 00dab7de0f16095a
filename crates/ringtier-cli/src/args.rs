//! The command line: every command's arguments (clap), with their documented defaults. Each
//! command's logic lives with the command (`paper.rs`, `train.rs`, `ckpt.rs`, ...); `main.rs`
//! dispatches.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use ringtier_uring::{BufferedWrites, DirectIoPolicy};

use crate::dataset::{DatasetSpec, Format, Preset};
use crate::passes::{Engine, Knobs, OnError, Order};
use anyhow::Result;

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
    #[command(flatten)]
    pub(crate) paper: PaperArgs,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Generate a dataset in a temp dir and read it, cold, through every tier.
    Demo(DemoArgs),
    /// Generate a synthetic dataset with a manifest (deterministic from a seed).
    Gen(GenArgs),
    /// Index record shards (TFRecord, WebDataset): `SHARD.idx` beside each shard, one
    /// `offset size` line per record (DALI's tfrecord2idx format), for a global shuffle.
    Index(IndexArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Checkpoints in a burst-buffer store: save, ls, restore, verify, drain.
    Ckpt(CkptArgs),
    /// The paper's three experiments (read sweep, mini-app with and without prefetch,
    /// checkpoints burst versus direct) on generated data, with a report directory (the
    /// default); --remote adds the remote-storage regime (S3 on loopback against boto3).
    Paper(PaperArgs),
    /// The metric catalog.
    #[command(subcommand)]
    Metrics(MetricsCommand),
}

#[derive(Subcommand, Debug)]
pub(crate) enum MetricsCommand {
    /// Print the catalog as Markdown (docs/METRICS.md).
    Catalog,
}

#[derive(Subcommand, Debug)]
pub(crate) enum BenchCommand {
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
    Decode(crate::decodebench::DecodeBenchArgs),
    /// Storage to accelerator (or pinned host memory) through pinned buffers, against raw reads,
    /// pageable buffers plus copy, and pinned buffers without overlap.
    Stage(StageArgs),
    /// The S3 tier against boto3 on one S3 server on loopback: checkpoint drain versus
    /// upload_file, small-object reads versus a thread pool, and a latency-throttled file tier.
    S3(crate::s3bench::S3BenchArgs),
    /// Cache policies (none, LRU, static, clairvoyant) in front of a slow tier: epoch time,
    /// stall share and hit ratio per policy, one rank and several (processes, each with its own
    /// cache and shard, the same seed), caches of 10% and 25% of the dataset.
    Cache(crate::cachebench::CacheBenchArgs),
}

#[derive(Args, Debug)]
pub(crate) struct StageArgs {
    /// The dataset directory.
    #[arg(long)]
    pub(crate) dir: PathBuf,
    /// host, cuda or cuda:N (cuda needs the `cuda` feature and a driver).
    #[arg(long, default_value = "host", value_parser = crate::stagebench::parse_target)]
    pub(crate) target: ringtier_stage::Target,
    /// Samples per batch.
    #[arg(long, default_value_t = 64)]
    pub(crate) batch: usize,
    /// Batches in flight (2 = double buffering).
    #[arg(long, default_value_t = 2)]
    pub(crate) depth: usize,
    /// Repeats (interleaved).
    #[arg(long, default_value_t = 5)]
    pub(crate) repeats: usize,
    /// Write the report as JSON here.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub(crate) struct PaperArgs {
    /// Report directory (created; default ./ringtier-report).
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// Work directory for generated data (default: a new directory in the temp dir, or in the
    /// current directory when the temp dir has no direct I/O (tmpfs); removed after).
    #[arg(long)]
    pub(crate) work: Option<PathBuf>,
    /// The paper's sizes (16,384 and 9,144 files, 600 MB checkpoints) instead of the quick ones.
    #[arg(long)]
    pub(crate) full: bool,
    /// Repeats per point.
    #[arg(long, default_value_t = 3)]
    pub(crate) repeats: usize,
    /// Tiny sizes, for tests of the command itself (not meaningful figures).
    #[arg(long, hide = true)]
    pub(crate) tiny: bool,
    /// Also the remote-storage experiment (a fourth report section): small objects read from
    /// an S3 server on loopback by ringtier's S3 tier (one driver thread, requests in flight
    /// swept) and by a boto3 thread pool (threads swept), and from a file tier with 4 ms per
    /// request (the latency-bound regime of a parallel file system). Needs python3 with boto3.
    #[arg(long)]
    pub(crate) remote: bool,
}

#[derive(Args, Debug)]
pub(crate) struct TrainArgs {
    /// The dataset directory (JPEGs for --decode; from `ringtier gen --format jpeg`).
    #[arg(long)]
    pub(crate) dir: PathBuf,
    /// Samples per batch.
    #[arg(long, default_value_t = 64)]
    pub(crate) batch: usize,
    /// Epochs per run.
    #[arg(long, default_value_t = 1)]
    pub(crate) epochs: usize,
    /// Prefetch depths to compare (0 = no prefetch).
    #[arg(long, value_delimiter = ',', default_value = "2,0")]
    pub(crate) prefetch: Vec<usize>,
    /// Emulated accelerator compute per batch in ms (default: 1.2 ms per image, AlexNet on a
    /// K80-class GPU).
    #[arg(long)]
    pub(crate) compute_ms: Option<f64>,
    /// Do not decode (read raw bytes only).
    #[arg(long)]
    pub(crate) no_decode: bool,
    /// Decode threads.
    #[arg(long, default_value_t = 2)]
    pub(crate) decode_threads: usize,
    /// Save a checkpoint every K steps (0: none).
    #[arg(long, default_value_t = 0)]
    pub(crate) ckpt_every: usize,
    /// Checkpoint size (default AlexNet, 244 MB).
    #[arg(long, default_value = "244000000", value_parser = parse_size)]
    pub(crate) ckpt_size: u64,
    /// Fast and slow checkpoint directories, comma-separated (default: under the work dir).
    #[arg(long, value_delimiter = ',')]
    pub(crate) ckpt_tiers: Option<Vec<PathBuf>>,
    /// Throttle the slow checkpoint tier to this many bytes per second.
    #[arg(long, value_parser = parse_size)]
    pub(crate) ckpt_slow_bw: Option<u64>,
    /// Repeats (interleaved).
    #[arg(long, default_value_t = 3)]
    pub(crate) repeats: usize,
    /// Write the report as JSON here.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
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
pub(crate) struct BenchCkptArgs {
    /// Working directory (default: a new directory under the current one, removed after).
    #[arg(long)]
    pub(crate) dir: Option<PathBuf>,
    /// Fast tier directory (default: DIR/fast), e.g. on /dev/shm for a tmpfs fast tier.
    #[arg(long)]
    pub(crate) fast_dir: Option<PathBuf>,
    /// Slow tier directory (default: DIR/slow), e.g. a cgroup-throttled loop mount
    /// (bench/ckpt_blkio.sh).
    #[arg(long)]
    pub(crate) slow_dir: Option<PathBuf>,
    /// The slow directory is throttled by the kernel at this many bytes per second (cgroup
    /// blkio): no throttled layer is added and `--ratios` is replaced by the one slowdown this
    /// gives.
    #[arg(long, value_parser = parse_size)]
    pub(crate) slow_kernel_bw: Option<u64>,
    /// Checkpoints per run.
    #[arg(long, default_value_t = 3)]
    pub(crate) count: usize,
    /// Drained checkpoints kept on the fast tier (older ones are evicted once drained).
    #[arg(long, default_value_t = 1)]
    pub(crate) keep_last: usize,
    /// Checkpoint size (default: AlexNet, 61M fp32 parameters, 244 MB).
    #[arg(long, value_parser = parse_size)]
    pub(crate) size: Option<u64>,
    /// Size preset: alexnet (244 MB) or paper (600 MB, the paper's checkpoints).
    #[arg(long, value_enum, default_value = "alexnet")]
    pub(crate) preset: CkptPreset,
    /// Seconds of emulated compute between checkpoints.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) compute: f64,
    /// Slow-tier slowdowns relative to the fast tier's raw write bandwidth.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    pub(crate) ratios: Vec<f64>,
    /// Repeats (interleaved).
    #[arg(long, default_value_t = 5)]
    pub(crate) repeats: usize,
    /// How the store's tiers issue writes to files without O_DIRECT (e.g. a tmpfs fast tier):
    /// `threads` (pwrite on the tier's threads) or `ring` (io_uring, which hands them to its
    /// io-wq workers).
    #[arg(long, default_value = "threads")]
    pub(crate) buffered_writes: BufferedWrites,
    /// Write the report as JSON here.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Size of the checkpoint the restore half restores (after the save experiment): cold
    /// loads into memory and restores into a directory, against `cat` and `cp` of its part
    /// files, from the fast copy and from the slow one.
    #[arg(long, value_parser = parse_size, default_value = "2G")]
    pub(crate) restore_size: u64,
    /// Parts of the restored checkpoint.
    #[arg(long, default_value_t = 4)]
    pub(crate) restore_parts: usize,
    /// Read requests in flight of the restores.
    #[arg(long, default_value_t = ringtier_migrate::RestoreOptions::default().depth)]
    pub(crate) restore_depth: usize,
    /// Bytes per read request of the restores, e.g. 1M.
    #[arg(long, value_parser = parse_size, default_value_t = ringtier_migrate::RestoreOptions::default().chunk_bytes as u64)]
    pub(crate) restore_chunk: u64,
    /// Run only the restore half.
    #[arg(long, conflicts_with = "no_restore")]
    pub(crate) restore_only: bool,
    /// Skip the restore half.
    #[arg(long)]
    pub(crate) no_restore: bool,
    /// Write the restore half's report as JSON here.
    #[arg(long)]
    pub(crate) restore_json: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum CkptPreset {
    Alexnet,
    Paper,
}

#[derive(Args, Debug, Clone)]
pub(crate) struct ShapeArgs {
    /// Number of files (default: the preset's).
    #[arg(long)]
    pub(crate) files: Option<usize>,
    /// Median file size (log-normal sizes), e.g. 112000 or 12k (default: the preset's).
    #[arg(long, value_parser = parse_size)]
    pub(crate) median: Option<u64>,
    /// Log-normal sigma of the sizes (default: the preset's).
    #[arg(long)]
    pub(crate) sigma: Option<f64>,
    /// Smallest file size (default: the preset's).
    #[arg(long, value_parser = parse_size)]
    pub(crate) min_size: Option<u64>,
    /// Largest file size (default: the preset's).
    #[arg(long, value_parser = parse_size)]
    pub(crate) max_size: Option<u64>,
    /// Class directories (default: the preset's).
    #[arg(long)]
    pub(crate) classes: Option<usize>,
    /// Seed of sizes and contents.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// File contents: raw random bytes or real JPEG images.
    #[arg(long, value_enum, default_value = "raw")]
    pub(crate) format: Format,
    /// Round every size up to a multiple of this (raw format), e.g. 128k for a comparison
    /// with fio at that block size: fio reads only whole blocks of each file.
    #[arg(long, default_value = "1", value_parser = parse_size)]
    pub(crate) size_multiple: u64,
}

impl ShapeArgs {
    pub(crate) fn spec(&self, preset: Preset) -> Result<DatasetSpec> {
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

#[derive(Args, Debug, Clone)]
pub(crate) struct IoArgs {
    /// io_uring rings (driver threads); a list sweeps it.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub(crate) rings: Vec<usize>,
    /// Kernel submission polling (SQPOLL); it costs a core while busy.
    #[arg(long)]
    pub(crate) sqpoll: bool,
    /// Do not register the buffer pool as fixed buffers.
    #[arg(long)]
    pub(crate) no_register_buffers: bool,
    /// Registered files: each open returns a direct descriptor (io_uring fixed-file slot).
    #[arg(long)]
    pub(crate) register_files: bool,
    /// Largest single read (fio's --bs), e.g. 128k, rounded down to 4 KiB; larger files are
    /// read in pieces of this size that reuse the pooled buffers (pool = 2 x batch x read
    /// size, whatever the file sizes). 0 reads each file with one read up to 8 MiB and larger
    /// files in 8 MiB pieces.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub(crate) read_size: u64,
    /// Check every file's CRC-32C against the manifest (costs CPU).
    #[arg(long)]
    pub(crate) verify: bool,
    /// What to do with a file that cannot be read as the manifest says.
    #[arg(long, value_enum, default_value = "fail")]
    pub(crate) on_error: OnError,
    /// Order of the files in a pass: shuffled (seeded, per pass), manifest, or readdir (fio's
    /// --opendir order, for comparisons with fio).
    #[arg(long, value_enum, default_value = "shuffled")]
    pub(crate) order: Order,
    /// Passes per point (interleaved).
    #[arg(long, default_value_t = 5)]
    pub(crate) repeats: usize,
    /// Warm passes (no eviction).
    #[arg(long)]
    pub(crate) warm: bool,
    /// Also drop the whole page cache before each pass (root only).
    #[arg(long)]
    pub(crate) drop_caches: bool,
    /// Write the report as JSON here.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Write a plot of bandwidth against concurrency here (SVG).
    #[arg(long)]
    pub(crate) plot: Option<PathBuf>,
}

impl IoArgs {
    /// A read sweep over these settings.
    pub(crate) fn read_bench(
        &self,
        engines: Vec<Engine>,
        threads: Vec<usize>,
        depths: Vec<usize>,
        seed: u64,
    ) -> crate::readbench::ReadBenchConfig {
        crate::readbench::ReadBenchConfig {
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

    pub(crate) fn knobs(&self) -> Knobs {
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
pub(crate) struct DemoArgs {
    #[command(flatten)]
    pub(crate) shape: ShapeArgs,
    #[command(flatten)]
    pub(crate) io: IoArgs,
    /// Directory for the dataset (default: a new temp dir, removed afterwards).
    #[arg(long)]
    pub(crate) dir: Option<PathBuf>,
    /// Threads of the posix tier.
    #[arg(long, default_value_t = 8)]
    pub(crate) threads: usize,
    /// Requests in flight on the io_uring tier.
    #[arg(long, default_value_t = 32)]
    pub(crate) depth: usize,
}

#[derive(Args, Debug)]
pub(crate) struct ReadArgs {
    /// The dataset directory (from `ringtier gen`, or any directory of files); or an S3
    /// dataset, `s3://bucket/prefix[?endpoint=URL]` (every object under the prefix, e.g. from
    /// `ringtier gen --dir s3://...`; credentials from AWS_* variables), read through the S3
    /// tier's concurrent read_batch with one driver thread, --depths swept (--engines,
    /// --threads and the io_uring options do not apply there).
    #[arg(long)]
    pub(crate) dir: PathBuf,
    #[command(flatten)]
    pub(crate) io: IoArgs,
    /// Engines, comma-separated: memory, posix-threads, uring-direct, uring-buffered.
    #[arg(long, value_delimiter = ',', default_value = "posix-threads,uring-direct,uring-buffered")]
    pub(crate) engines: Vec<Engine>,
    /// Concurrency sweep: threads for posix-threads, queue depth for the uring engines.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64")]
    pub(crate) concurrency: Vec<usize>,
    /// Thread counts for posix-threads, instead of --concurrency.
    #[arg(long, value_delimiter = ',')]
    pub(crate) threads: Option<Vec<usize>>,
    /// Queue depths for the uring engines, instead of --concurrency.
    #[arg(long, value_delimiter = ',')]
    pub(crate) depths: Option<Vec<usize>>,
    /// Seed of the read order.
    #[arg(long, default_value_t = 1000)]
    pub(crate) seed: u64,
    /// Read the dataset directory through the throttled layer with this per-request latency
    /// in milliseconds (a parallel file system's round trip: the latency-bound regime), as an
    /// S3 dataset is read: one driver thread, --depths swept through read_batch.
    #[arg(long)]
    pub(crate) latency_ms: Option<f64>,
    /// What the directory holds: files (one sample each), or TFRecord / WebDataset shards,
    /// streamed through the loader's record reader (depth = the first of --depths, requests
    /// of --read-size, default 4 MiB) against a cold `cat` of the same shards.
    #[arg(long, value_enum, default_value = "files")]
    pub(crate) format: crate::recbench::ReadFormat,
    /// Records in the shuffle buffer of --format tfrecord|wds.
    #[arg(long, default_value_t = 1024)]
    pub(crate) shuffle_buffer: usize,
    /// Bytes of records in that shuffle buffer at most (whichever of the two is reached first;
    /// 0: no byte bound), e.g. 64m.
    #[arg(long, default_value = "64m", value_parser = parse_size)]
    pub(crate) shuffle_bytes: u64,
    /// Record order of --format tfrecord|wds: stream (shards front to back through the
    /// shuffle buffer) or global (every record in one random order across all shards,
    /// through the `SHARD.idx` indexes of `ringtier index`, built first where missing).
    #[arg(long, value_enum, default_value = "stream")]
    pub(crate) record_order: crate::recbench::RecordOrder,
}

#[derive(Args, Debug)]
pub(crate) struct IndexArgs {
    /// The directory of shards.
    #[arg(long)]
    pub(crate) dir: PathBuf,
    /// The shards' format: tfrecord (`*.tfrecord`, `*.tfrecords`) or wds (`*.tar`).
    #[arg(long, value_enum)]
    pub(crate) format: crate::recbench::ReadFormat,
}

#[derive(Args, Debug)]
pub(crate) struct RandReadArgs {
    /// The file to read (created with random data when it is missing or of another size).
    #[arg(long)]
    pub(crate) file: PathBuf,
    /// File size, e.g. 2G.
    #[arg(long, default_value = "2G", value_parser = parse_size)]
    pub(crate) size: u64,
    /// Block size, e.g. 128k.
    #[arg(long, default_value = "128k", value_parser = parse_size)]
    pub(crate) bs: u64,
    /// Requests in flight.
    #[arg(long, default_value_t = 32)]
    pub(crate) depth: u32,
    /// Seconds per run.
    #[arg(long, default_value_t = 10.0)]
    pub(crate) runtime: f64,
    /// Runs.
    #[arg(long, default_value_t = 1)]
    pub(crate) repeats: usize,
    /// Direct-I/O policy: off, auto (direct where the file system has it, else buffered; the
    /// report says which) or required.
    #[arg(long, default_value = "auto")]
    pub(crate) direct: DirectIoPolicy,
    /// Register the file as a fixed file.
    #[arg(long)]
    pub(crate) register_files: bool,
    /// Do not register buffers.
    #[arg(long)]
    pub(crate) no_register_buffers: bool,
    /// Kernel submission polling (SQPOLL).
    #[arg(long)]
    pub(crate) sqpoll: bool,
    /// Seed of the offsets.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Write the result as JSON here.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
}

/// Parses sizes such as `4096`, `128k`, `1M`, `2G` (binary multiples).
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
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
