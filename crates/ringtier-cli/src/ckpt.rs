//! `ringtier ckpt ...` (the checkpoint store from the command line) and `ringtier bench ckpt`
//! (the paper's burst-buffer experiment).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ringtier_core::layers::{Metered, Throttle, Throttled};
use ringtier_core::{AlignedBuf, PosixConfig, PosixTier, Tier};
use ringtier_migrate::{CheckpointStore, OnFull, Part, RestoreOptions, RestoreReport, StoreConfig, TierSink};
use ringtier_uring::{BufferedWrites, DirectIoPolicy, UringConfig, UringTier, UringTierOptions};
use serde::Serialize;

use crate::args::{CkptAction, CkptArgs, CkptPreset, OnFullArg};
use crate::stats::{peak_rss_bytes, write_json, Machine, Rng, Summary};

/// A tier over a directory, through io_uring (O_DIRECT where the filesystem allows), metered;
/// or, for `s3://bucket/prefix[?settings]`, the S3 tier (see `ringtier_s3::S3Config::from_url`).
pub(crate) fn dir_tier(
    dir: &Path,
    name: &str,
    throttle: Option<u64>,
    buffered_writes: BufferedWrites,
) -> Result<Arc<dyn Tier>> {
    if let Some(url) = dir.to_str().filter(|d| ringtier_s3::S3Config::is_s3_url(d)) {
        let cfg = ringtier_s3::S3Config::from_url(url)?.named(name);
        let tier: Arc<dyn Tier> =
            Arc::new(ringtier_s3::S3Tier::new(cfg).with_context(|| format!("opening tier {name} at {url}"))?);
        let tier: Arc<dyn Tier> = match throttle {
            Some(bps) => Arc::new(Throttled::new(tier, Throttle::bandwidth(bps))),
            None => tier,
        };
        return Ok(Arc::new(Metered::new(tier)));
    }
    let options = UringTierOptions::default().with_name(name.to_string()).with_create_root(true);
    let tier: Arc<dyn Tier> = Arc::new(
        UringTier::with_options(
            dir,
            UringConfig::default().with_direct_io(DirectIoPolicy::Auto).with_buffered_writes(buffered_writes),
            options,
        )
        .with_context(|| format!("opening tier {name} at {}", dir.display()))?,
    );
    let tier: Arc<dyn Tier> = match throttle {
        Some(bps) => Arc::new(Throttled::new(tier, Throttle::bandwidth(bps))),
        None => tier,
    };
    Ok(Arc::new(Metered::new(tier)))
}

/// Tier names for a list of directories: fast/slow for two, tier0.. otherwise.
pub(crate) fn tier_names(n: usize) -> Vec<String> {
    match n {
        1 => vec!["fast".into()],
        2 => vec!["fast".into(), "slow".into()],
        _ => (0..n).map(|i| format!("tier{i}")).collect(),
    }
}

/// Opens a store over `dirs` (fastest first); the last tier throttled to `throttle_last`.
pub(crate) async fn open_store(
    dirs: &[PathBuf],
    throttle_last: Option<u64>,
    buffered_writes: BufferedWrites,
    cfg: StoreConfig,
    read_only: bool,
) -> Result<CheckpointStore> {
    if dirs.is_empty() {
        bail!("--tiers needs at least one directory");
    }
    let names = tier_names(dirs.len());
    let mut tiers = Vec::new();
    for (i, d) in dirs.iter().enumerate() {
        let throttle = if i + 1 == dirs.len() { throttle_last } else { None };
        tiers.push(dir_tier(d, &names[i], throttle, buffered_writes)?);
    }
    Ok(if read_only {
        CheckpointStore::open_read_only(tiers, cfg).await?
    } else {
        CheckpointStore::open(tiers, cfg).await?
    })
}

/// Restores `step` into `dir`, one file per part, through an io_uring tier over the directory
/// (O_DIRECT where it allows): each file staged, fsynced and renamed into place only once whole
/// and checked. The tier's staging directory is removed after.
pub(crate) async fn restore_to_dir(
    store: &CheckpointStore,
    step: u64,
    dir: &Path,
    opts: &RestoreOptions,
    sync: bool,
) -> Result<RestoreReport> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tier: Arc<dyn Tier> = if sync {
        let options = UringTierOptions::default().with_name("out".to_string());
        Arc::new(
            UringTier::with_options(dir, UringConfig::default().with_direct_io(DirectIoPolicy::Auto), options)
                .with_context(|| format!("opening {} for writing", dir.display()))?,
        )
    } else {
        // Buffered writes into the page cache, renamed without fsync (`cp`'s durability).
        let config = PosixConfig::new(dir).with_name("out".to_string()).with_threads(2).with_sync(false);
        Arc::new(PosixTier::new(config).with_context(|| format!("opening {} for writing", dir.display()))?)
    };
    let mut sink = TierSink::new(Arc::clone(&tier), None);
    let res = store.restore(step, &mut sink, opts).await;
    if res.is_err() {
        // Parts of a failed restore that were already written go: nothing in `dir` may look
        // like a checkpoint that was restored.
        for meta in sink.written() {
            let _ = tier.delete(&meta.key).await;
        }
    }
    drop(sink);
    drop(tier);
    let _ = std::fs::remove_dir(dir.join(ringtier_core::fs::STAGING_DIR));
    Ok(res?)
}

/// Restores the newest intact checkpoint into `dir`: a step whose every copy is bad is passed
/// over with a warning naming it and why, and the next older one restored.
async fn restore_latest_to_dir(
    store: &CheckpointStore,
    dir: &Path,
    opts: &RestoreOptions,
    sync: bool,
) -> Result<(u64, RestoreReport)> {
    let steps: Vec<u64> = store.list().await?.iter().rev().map(|c| c.step).collect();
    let mut skipped = 0;
    for step in steps {
        match restore_to_dir(store, step, dir, opts, sync).await {
            Ok(r) => return Ok((step, r)),
            Err(e) => match e.downcast_ref::<ringtier_core::Error>() {
                Some(re) if ringtier_migrate::is_bad_copy(re) => {
                    eprintln!("warning: skipping checkpoint {step}, no intact copy: {re}");
                    skipped += 1;
                }
                _ => return Err(e.context(format!("restoring checkpoint {step} into {}", dir.display()))),
            },
        }
    }
    if skipped > 0 {
        bail!("no intact checkpoint to restore ({skipped} bad, see the warnings)");
    }
    bail!("no checkpoint to restore")
}

/// Warns about every step the store quarantined since it was opened (recovery or the drain):
/// the drain went on without them.
fn report_quarantined(store: &CheckpointStore) {
    for (step, why) in store.quarantined_since_open() {
        eprintln!(
            "warning: checkpoint {step} quarantined, no intact copy ({why}); later steps drain on; \
             `ringtier ckpt rm --step {step}` removes it"
        );
    }
}

/// Deterministic contents of a crash-test checkpoint part (the test regenerates them with the
/// same formula to check restored bytes).
pub(crate) fn crash_part(step: u64, part: usize, size: usize) -> Vec<u8> {
    (0..size as u64).map(|i| ((i.wrapping_mul(2_654_435_761) >> 7) ^ (step * 31 + part as u64)) as u8).collect()
}

/// The crash-test child: saves steps from `start` on, printing `saved STEP` after each save
/// returns (and is therefore durable), until killed.
pub(crate) async fn crash_helper(store: &CheckpointStore, start: u64, count: u64, size: usize) -> Result<()> {
    let mut out = std::io::stdout();
    for step in start..start + count {
        let a = crash_part(step, 0, size);
        let b = crash_part(step, 1, size / 3 + 1);
        store.save(step, vec![Part::bytes("a", &a), Part::bytes("b", &b)]).await?;
        writeln!(out, "saved {step}")?;
        out.flush()?;
    }
    store.drain().await?;
    writeln!(out, "drained")?;
    out.flush()?;
    Ok(())
}

fn display<T: std::fmt::Display, S: serde::Serializer>(v: &T, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// Settings of `bench ckpt`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CkptBenchConfig {
    pub base: PathBuf,
    pub fast_dir: Option<PathBuf>,
    /// Slow tier directory (default `base/slow`).
    pub slow_dir: Option<PathBuf>,
    /// The slow directory is already throttled by the kernel (cgroup blkio on a loop device)
    /// at this many bytes per second: no throttled layer, one point at fast / this.
    pub slow_kernel_bps: Option<u64>,
    /// Drained checkpoints kept on the fast tier.
    pub keep_last: usize,
    pub count: usize,
    pub size: u64,
    pub compute_secs: f64,
    pub ratios: Vec<f64>,
    pub repeats: usize,
    #[serde(serialize_with = "display")]
    pub buffered_writes: BufferedWrites,
    pub json: Option<PathBuf>,
}

#[derive(Debug, Clone, Serialize)]
struct Run {
    /// `raw` (the baseline: O_DIRECT write + fsync of a new file on the fast tier), `direct`
    /// (the store writing straight to the slow tier) or `burst` (the burst buffer).
    mode: &'static str,
    ratio: f64,
    slow_bytes_per_sec: f64,
    blocking_seconds: Vec<f64>,
    all_on_slow_seconds: f64,
    total_seconds: f64,
    /// Drain throughput while copying (pauses for saves excluded).
    drain_mb_per_sec: Option<f64>,
    /// Seconds the drain spent paused while saves wrote.
    drain_paused_seconds: f64,
    peak_rss_over_data_bytes: u64,
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
) -> Result<Run> {
    let fast_root = cfg.fast_dir.clone().unwrap_or_else(|| cfg.base.join("fast"));
    if mode == "raw" {
        let mut blocking = Vec::new();
        let start = Instant::now();
        for _ in 0..cfg.count {
            tokio::time::sleep(Duration::from_secs_f64(cfg.compute_secs)).await;
            blocking.push(raw_write(&fast_root, data, raw_buf, raw_direct)?);
        }
        let total = start.elapsed().as_secs_f64();
        return Ok(Run {
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
    let store =
        open_store(&[fast.clone(), slow.clone()], cfg.layer_bps(slow_bps), cfg.buffered_writes, store_cfg, false)
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
    Ok(Run {
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

/// Runs the burst-buffer experiment and prints a table; returns the JSON report.
pub(crate) fn bench(cfg: &CkptBenchConfig) -> Result<serde_json::Value> {
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
    let fast_fs = ringtier_core::fs::fs_type_name(&fast_root);
    let slow_fs = ringtier_core::fs::fs_type_name(&slow_root);
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
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut runs: Vec<Run> = Vec::new();
    for r in 0..cfg.repeats {
        for &ratio in &ratios {
            let slow_bps = fast_bps / ratio;
            // Interleaved: the raw baseline runs at the same cadence right before each pair.
            for mode in ["raw", "direct", "burst"] {
                let run = rt.block_on(one_run(cfg, &data, mode, ratio, slow_bps, &mut raw_buf, raw_direct))?;
                eprintln!(
                    "  repeat {}/{} slow 1/{ratio:.1}: {mode:<6} blocking median {:.3} s, all on slow after {:.2} s",
                    r + 1,
                    cfg.repeats,
                    Summary::of(&run.blocking_seconds).median,
                    run.all_on_slow_seconds
                );
                runs.push(run);
            }
        }
    }
    let raw = Summary::of(
        &runs.iter().filter(|r| r.mode == "raw").map(|r| Summary::of(&r.blocking_seconds).median).collect::<Vec<_>>(),
    );
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
    println!(
        "{:>8} {:>10}  {:>7}  {:>22}  {:>22}  {:>17}  {:>17}  {:>12}  {:>11}",
        "slowdown",
        "slow MB/s",
        "raw s",
        "direct blocking s",
        "burst blocking s",
        "speedup",
        "burst/raw",
        "drain MB/s",
        "all on slow"
    );
    let mut points = Vec::new();
    for &ratio in &ratios {
        let pick = |mode: &str| runs.iter().filter(|r| r.mode == mode && r.ratio == ratio).collect::<Vec<_>>();
        let (raws, direct, burst) = (pick("raw"), pick("direct"), pick("burst"));
        let med = |rs: &[&Run]| rs.iter().map(|r| Summary::of(&r.blocking_seconds).median).collect::<Vec<_>>();
        let (w, d, b) = (med(&raws), med(&direct), med(&burst));
        let speed = Summary::of(&d.iter().zip(&b).map(|(d, b)| d / b).collect::<Vec<_>>());
        let over_raw = Summary::of(&b.iter().zip(&w).map(|(b, w)| b / w).collect::<Vec<_>>());
        let drain = Summary::of(&burst.iter().filter_map(|r| r.drain_mb_per_sec).collect::<Vec<_>>());
        let slow_mb = fast_bps / ratio / 1e6;
        let (ws, ds, bs) = (Summary::of(&w), Summary::of(&d), Summary::of(&b));
        let all_on_slow = Summary::of(&burst.iter().map(|r| r.all_on_slow_seconds).collect::<Vec<_>>());
        println!(
            "{:>7.1}x {:>10.0}  {:>7.3}  {:>6.3} {:>6.3} {:>6.3}  {:>6.3} {:>6.3} {:>6.3}  {:>5.2} {:>5.2} {:>5.2}  {:>5.2} {:>5.2} {:>5.2}  {:>5.0} ({:>3.0}%)  {:>9.1} s",
            ratio,
            slow_mb,
            ws.median,
            ds.min,
            ds.median,
            ds.max,
            bs.min,
            bs.median,
            bs.max,
            speed.min,
            speed.median,
            speed.max,
            over_raw.min,
            over_raw.median,
            over_raw.max,
            drain.median,
            drain.median / slow_mb * 100.0,
            all_on_slow.median
        );
        points.push(serde_json::json!({
            "slowdown": ratio,
            "slow_mb_per_sec": slow_mb,
            "raw_write_seconds": ws,
            "direct_blocking_seconds": ds,
            "burst_blocking_seconds": bs,
            "speedup_blocking": speed,
            "burst_blocking_over_raw_write": over_raw,
            "drain_mb_per_sec": drain,
            "drain_fraction_of_cap": drain.median / slow_mb,
            "burst_all_on_slow_seconds": all_on_slow,
        }));
    }
    let rss = runs.iter().filter(|r| r.mode == "burst").map(|r| r.peak_rss_over_data_bytes).max().unwrap_or(0);
    println!(
        "peak resident memory above the checkpoint data during saves: {:.1} MiB (largest part {:.0} MiB)",
        rss as f64 / (1 << 20) as f64,
        cfg.size as f64 / (1 << 20) as f64
    );
    let report = serde_json::json!({
        "schema": "ringtier.bench.ckpt/1",
        "machine": Machine::probe(),
        "fast": {"path": fast_root.display().to_string(), "filesystem": fast_fs, "raw_write_direct": raw_direct, "raw_write_mb_per_sec": fast_bps / 1e6, "raw_write_seconds": raw},
        "slow": {"path": slow_root.display().to_string(), "filesystem": slow_fs, "kind": cfg.slow_kind()},
        "config": cfg,
        "points": points,
        "peak_rss_over_data_bytes": rss,
        "runs": runs,
    });
    write_json(cfg.json.as_deref(), &report)?;
    Ok(report)
}

/// `ringtier bench ckpt`.
pub(crate) fn bench_command(a: crate::args::BenchCkptArgs) -> anyhow::Result<()> {
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
    let restore = crate::restorebench::RestoreBenchConfig {
        base: base.clone(),
        fast_dir: a.fast_dir.clone(),
        slow_dir: a.slow_dir.clone(),
        size: a.restore_size,
        parts: a.restore_parts,
        repeats: a.repeats,
        depth: a.restore_depth,
        chunk: usize::try_from(a.restore_chunk).context("--restore-chunk too large")?,
        json: a.restore_json.clone(),
    };
    if a.restore_only {
        return crate::restorebench::bench(&restore).map(|_| ());
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
    };
    bench(&cfg)?;
    if !a.no_restore {
        crate::restorebench::bench(&restore)?;
    }
    Ok(())
}

/// `ringtier ckpt ...`.
pub(crate) fn command(a: crate::args::CkptArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(ckpt_command(a))
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
    let store = open_store(&a.tiers, a.throttle_last, BufferedWrites::default(), cfg, read_only).await?;
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
                report_quarantined(&store);
                println!("drained to the slowest tier in {:.3} s", t.elapsed().as_secs_f64());
            }
        }
        CkptAction::Ls => {
            println!("{:>20}  {:>12}  tiers", "step", "MB");
            for c in store.list().await? {
                println!("{:>20}  {:>12.1}  {}", c.step, c.bytes as f64 / 1e6, c.tiers.join(", "));
            }
            for q in store.quarantined().await? {
                println!("{:>20}  {:>12}  {} QUARANTINED: {}", q.step, "-", q.tier, q.reason);
            }
            let backlog = store.drain_backlog_bytes();
            if backlog > 0 {
                println!("drain backlog: {:.1} MB (run `ringtier ckpt ... drain`)", backlog as f64 / 1e6);
            }
        }
        CkptAction::Restore { step, out, parts, depth, chunk, no_sync } => {
            let opts = RestoreOptions::default()
                .with_depth(depth)
                .with_chunk_bytes(usize::try_from(chunk).context("--chunk too large")?)
                .with_parts((!parts.is_empty()).then_some(parts));
            let (step, r) = match step {
                Some(step) => (
                    step,
                    restore_to_dir(&store, step, &out, &opts, !no_sync)
                        .await
                        .with_context(|| format!("restoring checkpoint {step} into {}", out.display()))?,
                ),
                None => restore_latest_to_dir(&store, &out, &opts, !no_sync).await?,
            };
            for f in &r.fallbacks {
                eprintln!("warning: checkpoint {step}: {f}");
            }
            println!(
                "restored step {step} from {} ({} parts, {:.1} MB) into {}{} in {:.2} s ({:.0} MB/s)",
                r.tier_summary(),
                r.sources.len(),
                r.bytes as f64 / 1e6,
                out.display(),
                if no_sync { " (not fsynced)" } else { "" },
                r.seconds,
                r.bytes as f64 / r.seconds.max(1e-9) / 1e6
            );
        }
        CkptAction::Verify { step } => {
            let steps: Vec<u64> = match step {
                Some(s) => vec![s],
                None => store.list().await?.iter().map(|c| c.step).collect(),
            };
            let mut bad = 0;
            for q in store.quarantined().await? {
                if step.is_none_or(|s| s == q.step) {
                    bad += 1;
                    println!("step {} on {}: QUARANTINED: {}", q.step, q.tier, q.reason);
                }
            }
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
            report_quarantined(&store);
            println!("drained {:.1} MB to the slowest tier", backlog as f64 / 1e6);
        }
        CkptAction::Rm { step } => {
            store.delete(step).await.with_context(|| format!("removing checkpoint {step}"))?;
            println!("removed step {step} from every tier");
        }
        CkptAction::CrashHelper { start, count, size } => {
            let start = start.max(store.latest().await?.map_or(0, |s| s + 1));
            crash_helper(&store, start, count, size).await?;
        }
    }
    Ok(())
}
