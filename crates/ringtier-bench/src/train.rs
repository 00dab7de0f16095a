//! `ringtier bench train`: the AlexNet mini-app. Each step takes a batch from the loader, then
//! spends an emulated accelerator compute time; every K steps it saves an AlexNet-sized
//! checkpoint through the checkpoint store. Prefetch on and off, side by side.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ringtier_core::{BufferPool, Tier};
use ringtier_dataset::manifest::Manifest;
use ringtier_dataset::{Dataset, OnBadSample};
use ringtier_decode::DecodeConfig;
use ringtier_loader::{Loader, LoaderConfig};
use ringtier_migrate::{Part, StoreConfig};
use ringtier_uring::{Engine, UringConfig};
use serde::Serialize;

use crate::harness::{interleaved, peak_rss_bytes, write_json, Machine, Storage, Summary};
use crate::parse_size;
use clap::Args;

/// Emulated compute per image: AlexNet training on one K80-class GPU processes on the order
/// of 800 images per second at 224x224 (1.2 ms per image); set `--compute-ms` to your own
/// accelerator's step time. DLIO emulates compute the same way.
pub(crate) const DEFAULT_COMPUTE_MS_PER_IMAGE: f64 = 1.2;

/// Settings of the mini-app.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TrainConfig {
    pub(crate) dir: PathBuf,
    pub(crate) batch: usize,
    pub(crate) epochs: usize,
    pub(crate) prefetch: Vec<usize>,
    pub(crate) compute_ms: f64,
    pub(crate) decode: bool,
    pub(crate) decode_threads: usize,
    pub(crate) ckpt_every: usize,
    pub(crate) ckpt_bytes: u64,
    pub(crate) ckpt_dirs: Option<(PathBuf, PathBuf)>,
    pub(crate) ckpt_slow_bytes_per_sec: Option<u64>,
    pub(crate) repeats: usize,
    pub(crate) json: Option<PathBuf>,
    /// The engine the dataset and checkpoint tiers are opened with.
    #[serde(serialize_with = "crate::harness::display")]
    pub(crate) engine: Engine,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct TrainRun {
    pub(crate) prefetch: usize,
    pub(crate) steps: u64,
    pub(crate) samples: u64,
    pub(crate) skipped: u64,
    pub(crate) total_seconds: f64,
    pub(crate) compute_seconds: f64,
    pub(crate) stall_seconds: f64,
    pub(crate) read_seconds: f64,
    pub(crate) decode_seconds: f64,
    pub(crate) ckpt_blocking_seconds: f64,
    pub(crate) checkpoints: u64,
    /// (stall + checkpoint blocking) / total: the share of the step time I/O was exposed.
    pub(crate) exposed_io_fraction: f64,
    pub(crate) stall_fraction: f64,
    /// Stall after the first batch of each epoch (the pipeline filled) over total time.
    pub(crate) steady_stall_fraction: f64,
    pub(crate) images_per_sec: f64,
    pub(crate) peak_rss_bytes: u64,
}

/// The loader over the dataset in `dir`, read through an io_uring tier with `uring` (metered,
/// named `dataset`). With a manifest the largest sample is known before the tier opens: the
/// tier registers a pool of the loader's shape as fixed buffers and the loader reads into it.
/// `bench train` and `tune --workload loader` open their loaders here.
pub(crate) async fn open_loader(dir: &Path, engine: Engine, uring: UringConfig, lcfg: LoaderConfig) -> Result<Loader> {
    let pool = match Manifest::load(dir) {
        Ok(m) => {
            let max = m.entries.iter().map(|e| e.size).max().unwrap_or(0);
            Some(BufferPool::new(Loader::pool_config(max, 4096, &lcfg))?)
        }
        // No manifest (or a bad one, which from_dir reports): the loader allocates its pool.
        Err(_) => None,
    };
    // Through the front door: io_uring where the kernel allows it, the thread pool otherwise.
    let options =
        ringtier::OpenOptions::store().with_engine(engine).with_uring(uring).with_name("dataset").with_pool(pool);
    let tier: Arc<dyn Tier> = ringtier::open(dir, &options).with_context(|| format!("opening {}", dir.display()))?.tier;
    let dataset = Dataset::from_dir(tier, dir).await?;
    Ok(Loader::new(dataset, lcfg)?)
}

async fn one_run(cfg: &TrainConfig, prefetch: usize, rep: usize) -> Result<TrainRun> {
    let lcfg = LoaderConfig::default()
        .with_batch_size(cfg.batch)
        .with_prefetch(prefetch)
        .with_seed(rep as u64)
        .with_decode(cfg.decode.then_some(DecodeConfig::default().with_size(224).with_threads(cfg.decode_threads)))
        .with_on_bad(OnBadSample::Skip);
    let loader = open_loader(&cfg.dir, cfg.engine, UringConfig::default(), lcfg).await?;
    let store = match &cfg.ckpt_dirs {
        Some((fast, slow)) if cfg.ckpt_every > 0 => {
            let dirs = [fast.join(format!("p{prefetch}-r{rep}")), slow.join(format!("p{prefetch}-r{rep}"))];
            for d in &dirs {
                let _ = std::fs::remove_dir_all(d);
            }
            let cfg_store = StoreConfig::default().with_keep_last(1);
            Some(
                crate::tiers::open_store(
                    &dirs,
                    cfg.ckpt_slow_bytes_per_sec,
                    Default::default(),
                    cfg_store,
                    false,
                    cfg.engine,
                )
                .await?,
            )
        }
        _ => None,
    };
    let weights = if store.is_some() { vec![0x5Au8; cfg.ckpt_bytes as usize] } else { Vec::new() };
    let compute = Duration::from_secs_f64(cfg.compute_ms / 1e3);
    let (mut steps, mut compute_secs, mut ckpt_secs, mut checkpoints) = (0u64, 0.0, 0.0, 0u64);
    let (mut stall, mut read, mut decode, mut samples, mut skipped) = (0.0, 0.0, 0.0, 0u64, 0u64);
    let mut first_stalls = 0.0;
    let start = Instant::now();
    for epoch in 0..cfg.epochs as u64 {
        let mut e = loader.epoch(epoch, 0)?;
        while let Some(batch) = e.next().await {
            let batch = batch?;
            drop(batch); // the step consumes the batch, then computes
            let t = Instant::now();
            tokio::time::sleep(compute).await;
            compute_secs += t.elapsed().as_secs_f64();
            steps += 1;
            if let Some(store) = &store {
                if steps % cfg.ckpt_every as u64 == 0 {
                    let t = Instant::now();
                    store.save(steps, vec![Part::bytes("weights", &weights)]).await?;
                    ckpt_secs += t.elapsed().as_secs_f64();
                    checkpoints += 1;
                }
            }
        }
        let st = e.stats();
        stall += st.stall_seconds;
        first_stalls += st.first_stall_seconds;
        read += st.read_seconds;
        decode += st.decode_seconds;
        samples += st.samples;
        skipped += st.skipped;
    }
    let total = start.elapsed().as_secs_f64();
    if let Some(store) = store {
        store.drain().await?;
    }
    if let Some((fast, slow)) = &cfg.ckpt_dirs {
        let _ = std::fs::remove_dir_all(fast.join(format!("p{prefetch}-r{rep}")));
        let _ = std::fs::remove_dir_all(slow.join(format!("p{prefetch}-r{rep}")));
    }
    Ok(TrainRun {
        prefetch,
        steps,
        samples,
        skipped,
        total_seconds: total,
        compute_seconds: compute_secs,
        stall_seconds: stall,
        read_seconds: read,
        decode_seconds: decode,
        ckpt_blocking_seconds: ckpt_secs,
        checkpoints,
        exposed_io_fraction: (stall + ckpt_secs) / total,
        stall_fraction: stall / total,
        steady_stall_fraction: (stall - first_stalls) / total,
        images_per_sec: samples as f64 / total,
        peak_rss_bytes: peak_rss_bytes(),
    })
}

/// Runs the mini-app for each prefetch depth, repeats interleaved; prints a table.
pub(crate) fn run(cfg: &TrainConfig) -> Result<TrainReport> {
    if cfg.batch == 0 || cfg.epochs == 0 || cfg.repeats == 0 || cfg.prefetch.is_empty() {
        bail!("--batch, --epochs, --repeats and --prefetch must be given and positive");
    }
    if !(cfg.compute_ms >= 0.0 && cfg.compute_ms.is_finite()) {
        bail!("--compute-ms must be a non-negative number");
    }
    let rt = crate::runtime(2)?;
    let runs = interleaved(cfg.repeats, &cfg.prefetch, false, |rep, &p| {
        let r = rt.block_on(one_run(cfg, p, rep))?;
        eprintln!(
            "  repeat {}/{} prefetch {p}: {} steps, stall {:.3} s of {:.3} s ({:.1}%), checkpoints {:.3} s",
            rep + 1,
            cfg.repeats,
            r.steps,
            r.stall_seconds,
            r.total_seconds,
            r.stall_fraction * 100.0,
            r.ckpt_blocking_seconds
        );
        Ok(r)
    })?;
    let runs: Vec<TrainRun> = runs.into_iter().flatten().collect();
    let (samples, skipped) = runs.iter().fold((0, 0), |(a, b), r| (a + r.samples, b + r.skipped));
    if samples == 0 && skipped > 0 {
        bail!(
            "every sample of {} was skipped as undecodable ({skipped} over the runs): {}",
            cfg.dir.display(),
            if cfg.decode {
                "--decode needs JPEGs (`ringtier gen --format jpeg`); pass --no-decode to read raw bytes"
            } else {
                "the files could not be read"
            }
        );
    }
    println!();
    if skipped > 0 {
        println!("note: {skipped} samples were skipped over the runs (not decodable); images/s counts the others");
    }
    println!(
        "AlexNet mini-app: {} (batch {}, {} epoch(s), {:.1} ms emulated compute per batch{}{}); {} repeats; median (min..max)",
        cfg.dir.display(),
        cfg.batch,
        cfg.epochs,
        cfg.compute_ms,
        if cfg.decode { ", JPEG decode + resize 224" } else { "" },
        if cfg.ckpt_every > 0 && cfg.ckpt_dirs.is_some() {
            format!(", a {:.0} MB checkpoint every {} steps", cfg.ckpt_bytes as f64 / 1e6, cfg.ckpt_every)
        } else {
            String::new()
        },
        cfg.repeats
    );
    println!(
        "{:>8}  {:>16}  {:>16}  {:>18}  {:>18}  {:>18}  {:>14}  {:>12}",
        "prefetch",
        "step time s",
        "stall s",
        "stall % of time",
        "after 1st batch %",
        "exposed I/O %",
        "ckpt block s",
        "images/s"
    );
    let mut points = Vec::new();
    for &p in &cfg.prefetch {
        let rs: Vec<&TrainRun> = runs.iter().filter(|r| r.prefetch == p).collect();
        let s = |f: &dyn Fn(&TrainRun) -> f64| Summary::by(&rs, |r| f(r));
        let step = s(&|r| r.total_seconds / r.steps.max(1) as f64);
        let stall = s(&|r| r.stall_seconds);
        let frac = s(&|r| r.stall_fraction * 100.0);
        let exposed = s(&|r| r.exposed_io_fraction * 100.0);
        let steady = s(&|r| r.steady_stall_fraction * 100.0);
        let ckpt = s(&|r| r.ckpt_blocking_seconds);
        let ips = s(&|r| r.images_per_sec);
        println!(
            "{:>8}  {:>6.4} ({:.4}..{:.4})  {:>6.3} ({:.3}..{:.3})  {:>6.2} ({:.2}..{:.2})  {:>6.2} ({:.2}..{:.2})  {:>6.2} ({:.2}..{:.2})  {:>14.3}  {:>12.0}",
            p, step.median, step.min, step.max, stall.median, stall.min, stall.max, frac.median, frac.min, frac.max,
            steady.median, steady.min, steady.max, exposed.median, exposed.min, exposed.max, ckpt.median, ips.median
        );
        points.push(TrainPoint {
            prefetch: p,
            step_seconds: step,
            stall_seconds: stall,
            stall_percent_of_time: frac,
            exposed_io_percent: exposed,
            stall_percent_after_first_batch: steady,
            ckpt_blocking_seconds: ckpt,
            images_per_sec: ips,
            read_seconds: s(&|r| r.read_seconds),
            decode_seconds: s(&|r| r.decode_seconds),
        });
    }
    let report = TrainReport {
        schema: "ringtier.bench.train/1",
        machine: Machine::probe(),
        storage: Storage::of(&cfg.dir),
        decoder: ringtier_decode::JPEG_DECODER,
        config: cfg.clone(),
        points,
        runs,
    };
    write_json(cfg.json.as_deref(), &report)?;
    Ok(report)
}

/// One prefetch depth over the repeats.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TrainPoint {
    pub(crate) prefetch: usize,
    pub(crate) step_seconds: Summary,
    pub(crate) stall_seconds: Summary,
    pub(crate) stall_percent_of_time: Summary,
    pub(crate) exposed_io_percent: Summary,
    pub(crate) stall_percent_after_first_batch: Summary,
    pub(crate) ckpt_blocking_seconds: Summary,
    pub(crate) images_per_sec: Summary,
    pub(crate) read_seconds: Summary,
    pub(crate) decode_seconds: Summary,
}

/// The report of `bench train` (`ringtier.bench.train/1`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TrainReport {
    pub(crate) schema: &'static str,
    pub(crate) machine: Machine,
    pub(crate) storage: Storage,
    /// The JPEG decoder the decode stage runs: "libjpeg-turbo" or "zune-jpeg".
    pub(crate) decoder: &'static str,
    pub(crate) config: TrainConfig,
    pub(crate) points: Vec<TrainPoint>,
    pub(crate) runs: Vec<TrainRun>,
}

/// `ringtier bench train`.
pub(crate) fn command(a: TrainArgs) -> Result<()> {
    let tmp;
    let ckpt_dirs = match (a.ckpt_every, a.ckpt_tiers) {
        (0, _) => None,
        (_, Some(t)) if t.len() == 2 => Some((t[0].clone(), t[1].clone())),
        (_, Some(_)) => bail!("--ckpt-tiers takes two directories: FAST,SLOW"),
        (_, None) => {
            tmp = tempfile::Builder::new().prefix("ringtier-train-").tempdir_in(".")?;
            Some((tmp.path().join("fast"), tmp.path().join("slow")))
        }
    };
    let cfg = TrainConfig {
        dir: a.dir,
        batch: a.batch,
        epochs: a.epochs,
        prefetch: a.prefetch,
        compute_ms: a.compute_ms.unwrap_or(DEFAULT_COMPUTE_MS_PER_IMAGE * a.batch as f64),
        decode: !a.no_decode,
        decode_threads: a.decode_threads,
        ckpt_every: a.ckpt_every,
        ckpt_bytes: a.ckpt_size,
        ckpt_dirs,
        ckpt_slow_bytes_per_sec: a.ckpt_slow_bw,
        repeats: a.repeats,
        json: a.json,
        engine: a.engine,
    };
    run(&cfg).map(|_| ())
}

/// Arguments of `ringtier bench train`.
#[derive(Args, Debug)]
pub struct TrainArgs {
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
    /// Engine of the dataset and checkpoint tiers: `auto` (io_uring where the kernel allows
    /// it, the thread pool where it is refused, with one warning), `uring` or `posix`.
    #[arg(long, default_value = "auto")]
    pub(crate) engine: Engine,
}
