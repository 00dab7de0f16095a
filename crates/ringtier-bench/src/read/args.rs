//! The arguments of `ringtier bench read` and `ringtier demo`.

use std::path::PathBuf;

use clap::Args;

use super::pass::{Engine, Knobs, OnError, Order};
use crate::dataset::ShapeArgs;
use crate::parse_size;

/// The I/O options of a read sweep.
#[derive(Args, Debug, Clone)]
pub(crate) struct IoArgs {
    /// io_uring rings (driver threads); a list sweeps it.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub(crate) rings: Vec<usize>,
    /// Kernel submission polling (SQPOLL); it costs a core while busy.
    #[arg(long)]
    pub(crate) sqpoll: bool,
    /// SQPOLL's idle time in milliseconds before its kernel thread sleeps.
    #[arg(long, default_value_t = 50)]
    pub(crate) sqpoll_idle_ms: u32,
    /// IORING_SETUP_COOP_TASKRUN: completions run at the driver's next kernel entry instead of
    /// interrupting it (Linux 5.19; not with --sqpoll).
    #[arg(long)]
    pub(crate) coop_taskrun: bool,
    /// IORING_SETUP_DEFER_TASKRUN + SINGLE_ISSUER: completion work waits until the ring's one
    /// driver thread asks for completions (Linux 6.1; not with --sqpoll).
    #[arg(long)]
    pub(crate) defer_taskrun: bool,
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
    ) -> super::ReadBenchConfig {
        super::ReadBenchConfig {
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
            sqpoll_idle_ms: self.sqpoll_idle_ms,
            coop_taskrun: self.coop_taskrun,
            defer_taskrun: self.defer_taskrun,
            register_buffers: !self.no_register_buffers,
            register_files: self.register_files,
            verify: self.verify,
            on_error: self.on_error,
            order: self.order,
        }
    }
}

/// Arguments of `ringtier demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
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

/// Arguments of `ringtier bench read`.
#[derive(Args, Debug)]
pub struct ReadArgs {
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
    pub(crate) format: super::records::ReadFormat,
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
    pub(crate) record_order: super::records::RecordOrder,
}
