//! `ringtier bench ckpt`: the paper's burst-buffer experiment. Checkpoint blocking time of the
//! burst buffer against writing straight to the slow tier and against a raw O_DIRECT write of
//! the same bytes on the fast tier (the baseline), over a range of slow-tier speeds.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use ringtier_core::AlignedBuf;
use ringtier_migrate::{OnFull, Part, StoreConfig};
use ringtier_uring::BufferedWrites;
use serde::Serialize;

use crate::harness::{display, interleaved, peak_rss_bytes, write_json, Machine, Rng, Storage, Summary, Table};
use crate::parse_size;
use crate::tiers::open_store;

/// Settings of `bench ckpt`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CkptBenchConfig {
    pub(crate) base: PathBuf,
    pub(crate) fast_dir: Option<PathBuf>,
    /// Slow tier directory (default `base/slow`).
    pub(crate) slow_dir: Option<PathBuf>,
    /// The slow directory is already throttled by the kernel (cgroup blkio on a loop device)
    /// at this many bytes per second: no throttled layer, one point at fast / this.
    pub(crate) slow_kernel_bps: Option<u64>,
    /// Drained checkpoints kept on the fast tier.
    pub(crate) keep_last: usize,
    pub(crate) count: usize,
    pub(crate) size: u64,
    pub(crate) compute_secs: f64,
    pub(crate) ratios: Vec<f64>,
    pub(crate) repeats: usize,
    #[serde(serialize_with = "display")]
    pub(crate) buffered_writes: BufferedWrites,
    pub(crate) json: Option<PathBuf>,
    /// The engine the tiers are opened with (`auto`, `uring` or `posix`).
    #[serde(serialize_with = "display")]
    pub(crate) engine: ringtier_uring::Engine,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct CkptRun {
    /// `raw` (the baseline: O_DIRECT write + fsync of a new file on the fast tier), `direct`
    /// (the store writing straight to the slow tier) or `burst` (the burst buffer).
    pub(crate) mode: &'static str,
    pub(crate) ratio: f64,
    pub(crate) slow_bytes_per_sec: f64,
    pub(crate) blocking_seconds: Vec<f64>,
    pub(crate) all_on_slow_seconds: f64,
    pub(crate) total_seconds: f64,
    /// Drain throughput while copying (pauses for saves excluded).
    pub(crate) drain_mb_per_sec: Option<f64>,
    /// Seconds the drain spent paused while saves wrote.
    pub(crate) drain_paused_seconds: f64,
    pub(crate) peak_rss_over_data_bytes: u64,
}

/// Whether files in `dir` can be opened with O_DIRECT (false where the file system refuses it
/// with EINVAL, as tmpfs did before Linux 6.6).
fn direct_write_supported(dir: &Path) -> Result<bool> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join("raw-write-probe.bin");
    let res =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).custom_flags(libc::O_DIRECT).open(&path);
    let _ = std::fs::remove_file(&path);
    match res {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
        Err(e) => Err(e).with_context(|| format!("creating {}", path.display())),
    }
}

/// Writes `data` to a new file in `dir` and fsyncs it: the raw fast-tier write, with O_DIRECT
/// when `direct` (buffered otherwise), one write of `buf`'s capacity at a time (the store's
/// chunk size, one write in flight). The buffer is allocated once by the caller, as the store's
/// are.
fn raw_write(dir: &Path, data: &[u8], buf: &mut AlignedBuf, direct: bool) -> Result<f64> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join("raw-write.bin");
    let start = Instant::now();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(if direct { libc::O_DIRECT } else { 0 })
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    for piece in data.chunks(buf.capacity()) {
        let padded = piece.len().next_multiple_of(4096);
        buf.capacity_mut()[..piece.len()].copy_from_slice(piece);
        buf.capacity_mut()[piece.len()..padded].fill(0);
        buf.set_window(0, padded)?;
        f.write_all(buf.as_slice()).with_context(|| format!("writing {}", path.display()))?;
    }
    f.set_len(data.len() as u64)?;
    f.sync_all()?;
    let secs = start.elapsed().as_secs_f64();
    drop(f);
    std::fs::remove_file(&path)?;
    Ok(secs)
}

/// A chunk buffer for the raw write, allocated as the store's are (touched, huge pages), so
/// page faults stay out of its timing and both sides write from the same kind of memory.
fn raw_buffer() -> Result<AlignedBuf> {
    Ok(AlignedBuf::new(StoreConfig::default().chunk_bytes, 4096)?)
}

/// One run of a mode: `count` checkpoints, `compute` of emulated training between them.
async fn one_run(
    cfg: &CkptBenchConfig,
    data: &[u8],
    mode: &'static str,
    ratio: f64,
    slow_bps: f64,
    raw_buf: &mut AlignedBuf,
    raw_direct: bool,
) -> Result<CkptRun> {
    let fast_root = cfg.fast_dir.clone().unwrap_or_else(|| cfg.base.join("fast"));
    if mode == "raw" {
        let mut blocking = Vec::new();
        let start = Instant::now();
        for _ in 0..cfg.count {
            tokio::time::sleep(Duration::from_secs_f64(cfg.compute_secs)).await;
            blocking.push(raw_write(&fast_root, data, raw_buf, raw_direct)?);
        }
        let total = start.elapsed().as_secs_f64();
        return Ok(CkptRun {
            mode,
            ratio,
            slow_bytes_per_sec: slow_bps,
            blocking_seconds: blocking,
            all_on_slow_seconds: total,
            total_seconds: total,
            drain_mb_per_sec: None,
            drain_paused_seconds: 0.0,
            peak_rss_over_data_bytes: 0,
        });
    }
    let fast = fast_root.join(format!("run-{mode}-{ratio}"));
    let slow = cfg.slow_root().join(format!("run-{mode}-{ratio}"));
    for d in [&fast, &slow] {
        let _ = std::fs::remove_dir_all(d);
    }
    let store_cfg = StoreConfig::default().with_keep_last(cfg.keep_last).with_on_full(OnFull::Wait);
    let store = open_store(
        &[fast.clone(), slow.clone()],
        cfg.layer_bps(slow_bps),
        cfg.buffered_writes,
        store_cfg,
        false,
        cfg.engine,
    )
    .await?;
    let rss0 = peak_rss_bytes();
    let start = Instant::now();
    let mut blocking = Vec::new();
    let meta = format!("{{\"mode\": \"{mode}\"}}");
    for step in 0..cfg.count as u64 {
        tokio::time::sleep(Duration::from_secs_f64(cfg.compute_secs)).await;
        let parts = vec![Part::bytes("model", data), Part::bytes("meta", meta.as_bytes())];
        let t = Instant::now();
        if mode == "direct" {
            store.save_direct(step, parts).await?;
        } else {
            store.save(step, parts).await?;
        }
        blocking.push(t.elapsed().as_secs_f64());
    }
    let train_end = start.elapsed().as_secs_f64();
    store.drain().await?;
    let all_on_slow = start.elapsed().as_secs_f64();
    let drain = store.drain_stats();
    drop(store);
    for d in [&fast, &slow] {
        let _ = std::fs::remove_dir_all(d);
    }
    Ok(CkptRun {
        mode,
        ratio,
        slow_bytes_per_sec: slow_bps,
        blocking_seconds: blocking,
        all_on_slow_seconds: all_on_slow,
        total_seconds: train_end,
        drain_mb_per_sec: drain.copy_bytes_per_sec().map(|b| b / 1e6),
        drain_paused_seconds: drain.paused_seconds,
        peak_rss_over_data_bytes: peak_rss_bytes().saturating_sub(rss0),
    })
}

impl CkptBenchConfig {
    fn slow_root(&self) -> PathBuf {
        self.slow_dir.clone().unwrap_or_else(|| self.base.join("slow"))
    }

    /// The throttled layer's bandwidth: none when the kernel throttles the slow directory.
    fn layer_bps(&self, slow_bps: f64) -> Option<u64> {
        self.slow_kernel_bps.is_none().then_some(slow_bps as u64)
    }

    fn slow_kind(&self) -> String {
        match self.slow_kernel_bps {
            Some(bps) => format!("kernel-throttled device (cgroup blkio), {:.0} MB/s", bps as f64 / 1e6),
            None => "throttled layer (token bucket), bandwidth = fast raw write / slowdown".into(),
        }
    }
}

/// The fast tier of a burst-buffer run and its raw write (the baseline).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct FastTier {
    pub(crate) path: String,
    pub(crate) filesystem: String,
    pub(crate) raw_write_direct: bool,
    pub(crate) raw_write_mb_per_sec: f64,
    pub(crate) raw_write_seconds: Summary,
}

/// The slow tier of a burst-buffer run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SlowTier {
    pub(crate) path: String,
    pub(crate) filesystem: String,
    /// The throttled layer or a kernel-throttled device, and its bandwidth.
    pub(crate) kind: String,
}

/// One slow-tier speed, over the repeats.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CkptPoint {
    pub(crate) slowdown: f64,
    pub(crate) slow_mb_per_sec: f64,
    pub(crate) raw_write_seconds: Summary,
    pub(crate) direct_blocking_seconds: Summary,
    pub(crate) burst_blocking_seconds: Summary,
    /// Direct blocking time over burst blocking time, pair by pair.
    pub(crate) speedup_blocking: Summary,
    /// Burst blocking time over the raw write's, pair by pair.
    pub(crate) burst_blocking_over_raw_write: Summary,
    pub(crate) drain_mb_per_sec: Summary,
    pub(crate) drain_fraction_of_cap: f64,
    pub(crate) burst_all_on_slow_seconds: Summary,
}

/// The report of `bench ckpt` (`ringtier.bench.ckpt/1`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CkptReport {
    pub(crate) schema: &'static str,
    pub(crate) machine: Machine,
    pub(crate) fast: FastTier,
    pub(crate) slow: SlowTier,
    pub(crate) config: CkptBenchConfig,
    pub(crate) points: Vec<CkptPoint>,
    pub(crate) peak_rss_over_data_bytes: u64,
    pub(crate) runs: Vec<CkptRun>,
}

/// Runs the burst-buffer experiment and prints a table; returns the report.
pub(crate) fn bench(cfg: &CkptBenchConfig) -> Result<CkptReport> {
    if cfg.count == 0 || cfg.repeats == 0 || cfg.size == 0 || cfg.ratios.is_empty() {
        bail!("--count, --repeats, --size and --ratios must be positive");
    }
    if cfg.ratios.iter().any(|r| *r < 1.0 || !r.is_finite()) {
        bail!("--ratios are slowdowns of the slow tier, each at least 1");
    }
    let fast_root = cfg.fast_dir.clone().unwrap_or_else(|| cfg.base.join("fast"));
    std::fs::create_dir_all(&fast_root).with_context(|| format!("creating {}", fast_root.display()))?;
    let slow_root = cfg.slow_root();
    std::fs::create_dir_all(&slow_root).with_context(|| format!("creating {}", slow_root.display()))?;
    let (fast_st, slow_st) = (Storage::of(&fast_root), Storage::of(&slow_root));
    let (fast_fs, slow_fs) = (&fast_st.filesystem, &slow_st.filesystem);
    eprintln!("generating a {} MB checkpoint of real bytes", cfg.size / 1_000_000);
    let mut data = vec![0u8; cfg.size as usize];
    Rng::new(7).fill(&mut data);
    // The raw fast-tier write sets the throttled slow tier's bandwidth.
    let mut raw_buf = raw_buffer()?;
    let raw_direct = direct_write_supported(&fast_root)?;
    let raw_kind = if raw_direct { "O_DIRECT" } else { "buffered (no O_DIRECT here)" };
    let raws: Vec<f64> =
        (0..3).map(|_| raw_write(&fast_root, &data, &mut raw_buf, raw_direct)).collect::<Result<_>>()?;
    let fast_bps = cfg.size as f64 / Summary::of(&raws).median;
    eprintln!(
        "fast tier: {} ({fast_fs}), raw {raw_kind} write + fsync {:.0} MB/s; slow tier: {} ({slow_fs}), {}",
        fast_root.display(),
        fast_bps / 1e6,
        slow_root.display(),
        cfg.slow_kind()
    );
    // With a kernel-throttled slow tier there is one point: its own slowdown.
    let ratios = match cfg.slow_kernel_bps {
        Some(bps) => vec![fast_bps / bps as f64],
        None => cfg.ratios.clone(),
    };
    let rt = crate::runtime(2)?;
    // Interleaved: the raw baseline runs at the same cadence right before each pair.
    let sides: Vec<(f64, &'static str)> =
        ratios.iter().flat_map(|&r| ["raw", "direct", "burst"].map(|m| (r, m))).collect();
    let runs = interleaved(cfg.repeats, &sides, false, |r, &(ratio, mode)| {
        let run = rt.block_on(one_run(cfg, &data, mode, ratio, fast_bps / ratio, &mut raw_buf, raw_direct))?;
        eprintln!(
            "  repeat {}/{} slow 1/{ratio:.1}: {mode:<6} blocking median {:.3} s, all on slow after {:.2} s",
            r + 1,
            cfg.repeats,
            Summary::of(&run.blocking_seconds).median,
            run.all_on_slow_seconds
        );
        Ok(run)
    })?;
    let runs: Vec<CkptRun> = runs.into_iter().flatten().collect();
    let med = |rs: &[&CkptRun]| rs.iter().map(|r| Summary::of(&r.blocking_seconds).median).collect::<Vec<_>>();
    let raw = Summary::of(&med(&runs.iter().filter(|r| r.mode == "raw").collect::<Vec<_>>()));
    println!();
    println!(
        "{} checkpoints of {:.0} MB every {} s of compute; fast {fast_fs} (raw write {:.0} MB/s, {:.3} s per checkpoint); \
         slow = {}; {} repeats; min/median/max",
        cfg.count,
        cfg.size as f64 / 1e6,
        cfg.compute_secs,
        fast_bps / 1e6,
        raw.median,
        cfg.slow_kind(),
        cfg.repeats
    );
    let mut table = Table::new([
        "slowdown",
        "slow MB/s",
        "raw s",
        "direct blocking s",
        "burst blocking s",
        "speedup",
        "burst/raw",
        "drain MB/s",
        "all on slow",
    ]);
    let mmm = |s: Summary, d: usize| format!("{:.d$} {:.d$} {:.d$}", s.min, s.median, s.max, d = d);
    let mut points = Vec::new();
    for &ratio in &ratios {
        let pick = |mode: &str| runs.iter().filter(|r| r.mode == mode && r.ratio == ratio).collect::<Vec<_>>();
        let (w, d, b) = (med(&pick("raw")), med(&pick("direct")), med(&pick("burst")));
        let burst = pick("burst");
        let slow_mb = fast_bps / ratio / 1e6;
        let p = CkptPoint {
            slowdown: ratio,
            slow_mb_per_sec: slow_mb,
            raw_write_seconds: Summary::of(&w),
            direct_blocking_seconds: Summary::of(&d),
            burst_blocking_seconds: Summary::of(&b),
            speedup_blocking: Summary::ratio(&d, &b),
            burst_blocking_over_raw_write: Summary::ratio(&b, &w),
            drain_mb_per_sec: Summary::of(&burst.iter().filter_map(|r| r.drain_mb_per_sec).collect::<Vec<_>>()),
            drain_fraction_of_cap: 0.0,
            burst_all_on_slow_seconds: Summary::by(&burst, |r| r.all_on_slow_seconds),
        };
        let p = CkptPoint { drain_fraction_of_cap: p.drain_mb_per_sec.median / slow_mb, ..p };
        table.row([
            format!("{ratio:.1}x"),
            format!("{slow_mb:.0}"),
            format!("{:.3}", p.raw_write_seconds.median),
            mmm(p.direct_blocking_seconds, 3),
            mmm(p.burst_blocking_seconds, 3),
            mmm(p.speedup_blocking, 2),
            mmm(p.burst_blocking_over_raw_write, 2),
            format!("{:.0} ({:.0}%)", p.drain_mb_per_sec.median, p.drain_fraction_of_cap * 100.0),
            format!("{:.1} s", p.burst_all_on_slow_seconds.median),
        ]);
        points.push(p);
    }
    print!("{}", table.text());
    let rss = runs.iter().filter(|r| r.mode == "burst").map(|r| r.peak_rss_over_data_bytes).max().unwrap_or(0);
    println!(
        "peak resident memory above the checkpoint data during saves: {:.1} MiB (largest part {:.0} MiB)",
        rss as f64 / (1 << 20) as f64,
        cfg.size as f64 / (1 << 20) as f64
    );
    let report = CkptReport {
        schema: "ringtier.bench.ckpt/1",
        machine: Machine::probe(),
        fast: FastTier {
            path: fast_st.path.clone(),
            filesystem: fast_st.filesystem.clone(),
            raw_write_direct: raw_direct,
            raw_write_mb_per_sec: fast_bps / 1e6,
            raw_write_seconds: raw,
        },
        slow: SlowTier { path: slow_st.path.clone(), filesystem: slow_st.filesystem.clone(), kind: cfg.slow_kind() },
        config: cfg.clone(),
        points,
        peak_rss_over_data_bytes: rss,
        runs,
    };
    write_json(cfg.json.as_deref(), &report)?;
    Ok(report)
}

/// Arguments of `ringtier bench ckpt`.
#[derive(Args, Debug)]
pub struct BenchCkptArgs {
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
    /// Size of the checkpoint the restore half restores (after the save experiment): cold
    /// loads into memory and restores into a directory, against `cat` and `cp` of its part
    /// files, from the fast copy and from the slow one.
    #[arg(long, value_parser = parse_size, default_value = "2G")]
    restore_size: u64,
    /// Parts of the restored checkpoint.
    #[arg(long, default_value_t = 4)]
    restore_parts: usize,
    /// Read requests in flight of the restores.
    #[arg(long, default_value_t = ringtier_migrate::RestoreOptions::default().depth)]
    restore_depth: usize,
    /// Bytes per read request of the restores, e.g. 1M.
    #[arg(long, value_parser = parse_size, default_value_t = ringtier_migrate::RestoreOptions::default().chunk_bytes as u64)]
    restore_chunk: u64,
    /// CkptRun only the restore half.
    #[arg(long, conflicts_with = "no_restore")]
    restore_only: bool,
    /// Skip the restore half.
    #[arg(long)]
    no_restore: bool,
    /// Write the restore half's report as JSON here.
    #[arg(long)]
    restore_json: Option<PathBuf>,
    /// Engine of the store's tiers (save and restore): `auto` (io_uring where the kernel allows it, the thread pool
    /// where it is refused, with one warning), `uring` or `posix`.
    #[arg(long, default_value = "auto")]
    engine: ringtier_uring::Engine,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum CkptPreset {
    Alexnet,
    Paper,
}

/// `ringtier bench ckpt`.
pub(crate) fn command(a: BenchCkptArgs) -> Result<()> {
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
    let restore = crate::restore::RestoreBenchConfig {
        base: base.clone(),
        fast_dir: a.fast_dir.clone(),
        slow_dir: a.slow_dir.clone(),
        size: a.restore_size,
        parts: a.restore_parts,
        repeats: a.repeats,
        depth: a.restore_depth,
        chunk: usize::try_from(a.restore_chunk).context("--restore-chunk too large")?,
        json: a.restore_json.clone(),
        engine: a.engine,
    };
    if a.restore_only {
        return crate::restore::bench(&restore).map(|_| ());
    }
    let cfg = CkptBenchConfig {
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
        engine: a.engine,
    };
    bench(&cfg)?;
    if !a.no_restore {
        crate::restore::bench(&restore)?;
    }
    Ok(())
}
