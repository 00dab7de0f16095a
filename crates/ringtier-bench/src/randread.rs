//! `ringtier bench randread`: random reads of one block size from one file through the
//! io_uring tier, at a fixed depth, for a fixed time: the workload of
//! `fio --ioengine=io_uring --direct=1 --rw=randread`, to compare side by side.

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ringtier_core::{AlignedBuf, BufferPool, PoolConfig, ReadBatch};
use ringtier_uring::{DirectIoPolicy, UringConfig, UringTier, UringTierOptions};
use serde::Serialize;

use crate::harness::{interleaved, write_json, Machine, Meter, Rng, Storage, Summary, GIB};
use crate::parse_size;
use clap::Args;

/// Settings of a random-read run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RandReadConfig {
    pub(crate) file: PathBuf,
    pub(crate) size: u64,
    pub(crate) block_size: usize,
    pub(crate) depth: u32,
    pub(crate) runtime_secs: f64,
    pub(crate) repeats: usize,
    #[serde(serialize_with = "policy_name")]
    pub(crate) direct: DirectIoPolicy,
    pub(crate) register_files: bool,
    pub(crate) register_buffers: bool,
    pub(crate) sqpoll: bool,
    pub(crate) seed: u64,
}

fn policy_name<S: serde::Serializer>(p: &DirectIoPolicy, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(p.as_str())
}

#[derive(Debug, Clone, Copy, Serialize)]
struct RandReadRun {
    bytes: u64,
    reads: u64,
    wall_seconds: f64,
    cpu_seconds: f64,
    mb_per_sec: f64,
    iops: f64,
}

/// Creates `cfg.file` with `cfg.size` bytes of random data (O_DIRECT writes, fsynced) unless
/// it already has that size.
pub(crate) fn prepare_file(path: &std::path::Path, size: u64) -> Result<()> {
    if std::fs::metadata(path).map(|m| m.len() == size).unwrap_or(false) {
        return Ok(());
    }
    if size == 0 || size % 4096 != 0 {
        bail!("--size must be a positive multiple of 4096, got {size}");
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    eprintln!("writing {} MiB of random data to {}", size >> 20, path.display());
    let open = |flags: i32| OpenOptions::new().write(true).create(true).truncate(true).custom_flags(flags).open(path);
    // O_DIRECT keeps the data out of the page cache; a file system without it is written
    // buffered (the fsync below still makes the data durable).
    let mut f = match open(libc::O_DIRECT) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => open(0),
        other => other,
    }
    .with_context(|| format!("creating {}", path.display()))?;
    let chunk = 4 << 20;
    let mut buf = AlignedBuf::new(chunk, 4096)?;
    let mut rng = Rng::new(size);
    let mut left = size;
    while left > 0 {
        let n = (chunk as u64).min(left) as usize;
        rng.fill(&mut buf.capacity_mut()[..n]);
        buf.set_window(0, n)?;
        f.write_all(buf.as_slice()).with_context(|| format!("writing {}", path.display()))?;
        left -= n as u64;
    }
    f.sync_all().with_context(|| format!("syncing {}", path.display()))?;
    Ok(())
}

/// Runs the benchmark and prints one line per repeat and a summary; returns JSON.
pub(crate) fn run(cfg: &RandReadConfig) -> Result<RandReadReport> {
    if cfg.block_size == 0 || cfg.block_size % 4096 != 0 {
        bail!("--bs must be a positive multiple of 4096");
    }
    if cfg.depth == 0 || cfg.repeats == 0 {
        bail!("--depth and --repeats must be at least 1");
    }
    prepare_file(&cfg.file, cfg.size)?;
    let size = std::fs::metadata(&cfg.file)?.len();
    let blocks = size / cfg.block_size as u64;
    if blocks == 0 {
        bail!("{} is smaller than one block", cfg.file.display());
    }
    let dir = cfg.file.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let key = cfg.file.file_name().and_then(|n| n.to_str()).context("file name is not UTF-8")?;
    let depth = cfg.depth as usize;
    let pool = BufferPool::new(PoolConfig::new(cfg.block_size, 2 * depth, 4096))?;
    let config = UringConfig::default()
        .with_queue_depth(cfg.depth)
        .with_rings(1)
        .with_sqpoll_idle_ms(cfg.sqpoll.then_some(50))
        .with_register_buffers(cfg.register_buffers)
        .with_register_files(cfg.register_files)
        .with_direct_io(cfg.direct);
    let options = UringTierOptions::default().with_pool(pool.clone());
    let tier = UringTier::with_options(dir, config, options)?;
    let fs = tier.filesystem();
    let rt = crate::runtime(0)?;
    let file = Arc::new(rt.block_on(tier.open_file(key))?);
    eprintln!(
        "randread {} ({fs}, {} MiB): bs {} KiB, depth {}, 1 ring, direct {}, {} s x {}",
        cfg.file.display(),
        size >> 20,
        cfg.block_size >> 10,
        cfg.depth,
        file.is_direct(),
        cfg.runtime_secs,
        cfg.repeats
    );
    let runs = interleaved(cfg.repeats, &["uring"], false, |r, _| {
        let run = rt.block_on(one_run(&file, &pool, cfg, blocks, cfg.seed + r as u64))?;
        println!(
            "run {}: {:.1} MB/s, {:.0} IOPS, {:.3} CPU s/GiB",
            r + 1,
            run.mb_per_sec,
            run.iops,
            run.cpu_seconds / (run.bytes as f64 / GIB)
        );
        Ok(run)
    })?;
    let runs: Vec<RandReadRun> = runs.into_iter().flatten().collect();
    let bw = Summary::by(&runs, |r| r.mb_per_sec);
    println!("MB/s min/median/max: {:.1} / {:.1} / {:.1}", bw.min, bw.median, bw.max);
    let stats = tier.stats();
    Ok(RandReadReport {
        schema: "ringtier.bench.randread/1",
        machine: Machine::probe(),
        filesystem: Storage::of(dir).filesystem,
        file_bytes: size,
        direct: file.is_direct(),
        cold: "O_DIRECT reads bypass the page cache; buffered ones may hit it (a random read set larger than memory keeps them honest)",
        config: cfg.clone(),
        runs,
        mb_per_sec: bw,
        uring_stats: UringStats {
            reads_direct: stats.reads_direct,
            fixed_buffer_reads: stats.fixed_buffer_reads,
            fixed_file_reads: stats.fixed_file_reads,
            submits: stats.submits,
            sqes: stats.sqes,
        },
    })
}

/// The io_uring tier's own counters over the run.
#[derive(Debug, Serialize)]
struct UringStats {
    reads_direct: u64,
    fixed_buffer_reads: u64,
    fixed_file_reads: u64,
    submits: u64,
    sqes: u64,
}

impl RandReadReport {
    /// The median bandwidth over the runs, MB/s.
    pub(crate) fn median_mb_per_sec(&self) -> f64 {
        self.mb_per_sec.median
    }
}

/// The report of `bench randread` (`ringtier.bench.randread/1`).
#[derive(Debug, Serialize)]
pub(crate) struct RandReadReport {
    schema: &'static str,
    machine: Machine,
    filesystem: String,
    file_bytes: u64,
    direct: bool,
    /// What keeps the reads cold.
    cold: &'static str,
    config: RandReadConfig,
    runs: Vec<RandReadRun>,
    mb_per_sec: Summary,
    uring_stats: UringStats,
}

async fn one_run(
    file: &Arc<ringtier_uring::UringFile>,
    pool: &BufferPool,
    cfg: &RandReadConfig,
    blocks: u64,
    seed: u64,
) -> Result<RandReadRun> {
    let mut rng = Rng::new(seed);
    let depth = cfg.depth as usize;
    // Two batches of `depth` reads: while one comes back, the other keeps the ring full.
    let mut spare: Vec<ReadBatch> = (0..2).map(|_| ReadBatch::with_capacity(depth, 0)).collect();
    let mut in_flight: VecDeque<tokio::task::JoinHandle<ReadBatch>> = VecDeque::new();
    let deadline = Duration::from_secs_f64(cfg.runtime_secs);
    let (meter, t0) = (Meter::start(), Instant::now());
    let (mut bytes, mut reads) = (0u64, 0u64);
    loop {
        while in_flight.len() < 2 && t0.elapsed() < deadline {
            let mut batch = spare.pop().unwrap_or_default();
            for _ in 0..depth {
                let off = (rng.next_u64() % blocks) * cfg.block_size as u64;
                batch.push_range(off, cfg.block_size, pool.acquire().await);
            }
            let file = Arc::clone(file);
            in_flight.push_back(tokio::spawn(async move { file.read_batch(batch).await }));
        }
        let Some(h) = in_flight.pop_front() else {
            break;
        };
        let mut batch = h.await.context("reader task failed")?;
        for (_, off, res, _) in batch.drain() {
            let n = res.with_context(|| format!("read at offset {off}"))?;
            bytes += n as u64;
            reads += 1;
        }
        spare.push(batch);
    }
    let u = meter.stop();
    let (wall, cpu) = (u.wall_seconds, u.cpu_seconds);
    Ok(RandReadRun {
        bytes,
        reads,
        wall_seconds: wall,
        cpu_seconds: cpu,
        mb_per_sec: bytes as f64 / wall / 1e6,
        iops: reads as f64 / wall,
    })
}

/// `ringtier bench randread`.
pub(crate) fn command(a: RandReadArgs) -> Result<()> {
    let cfg = RandReadConfig {
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
    let report = run(&cfg)?;
    write_json(a.json.as_deref(), &report)?;
    Ok(())
}

/// Arguments of `ringtier bench randread`.
#[derive(Args, Debug)]
pub struct RandReadArgs {
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
