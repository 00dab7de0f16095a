//! `ringtier bench stage`: bytes per second from storage to the accelerator (or to host memory
//! on the CPU path) through pinned buffers with reads and copies overlapped, against raw reads
//! and two baselines measured in the same run: pageable buffers plus a copy, and pinned
//! buffers without overlap.

use std::collections::VecDeque;
use std::path::PathBuf;

use serde::Serialize;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use ringtier_core::{BufferPool, PoolConfig, Tier};
use ringtier_stage::{PinnedPool, Stager, Target};

use crate::dataset::Dataset;
use crate::harness::{interleaved, write_json, Cold, ColdMethod, Machine, Rng, Summary};
use clap::Args;

/// Parses `host`, `cuda` or `cuda:N`.
pub(crate) fn parse_target(s: &str) -> std::result::Result<Target, String> {
    match s {
        "host" | "cpu" => Ok(Target::Host),
        "cuda" => Ok(Target::Cuda(0)),
        _ => s
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .map(Target::Cuda)
            .ok_or_else(|| format!("unknown target {s:?} (host, cuda or cuda:N)")),
    }
}

/// Settings of the staging benchmark.
#[derive(Debug, Clone)]
pub(crate) struct StageBenchConfig {
    pub(crate) dir: PathBuf,
    pub(crate) target: Target,
    pub(crate) batch: usize,
    pub(crate) depth: usize,
    pub(crate) repeats: usize,
    pub(crate) json: Option<PathBuf>,
}

const MODES: [&str; 4] = ["raw-read", "pipelined", "pinned-no-overlap", "pageable-copy"];

/// Runs the benchmark; prints a table; returns JSON.
pub(crate) fn run(cfg: &StageBenchConfig) -> Result<StageReport> {
    if cfg.batch == 0 || cfg.depth == 0 || cfg.repeats == 0 {
        bail!("--batch, --depth and --repeats must be at least 1");
    }
    let ds = Dataset::open(&cfg.dir)?;
    let buf = (ds.max_size() as usize).next_multiple_of(4096) + 4096;
    let pinned = PinnedPool::new(buf, cfg.depth * cfg.batch, cfg.target)?;
    let options = ringtier::OpenOptions::store().with_pool(pinned.pool().clone()).with_metered(false);
    let tier: Arc<dyn Tier> = ringtier::open(&ds.root, &options)?.tier;
    let stager = Stager::new(tier, pinned.clone(), cfg.target)?;
    let pageable = BufferPool::new(PoolConfig::new(buf, cfg.batch, 4096))?;
    let rt = crate::runtime(2)?;
    eprintln!(
        "staging {} files ({:.0} MB) to {:?}: batches of {}, {} in flight, pinned buffers {:?}",
        ds.len(),
        ds.total_bytes() as f64 / 1e6,
        cfg.target,
        cfg.batch,
        cfg.depth,
        pinned.pinning()
    );
    let files: Vec<_> = ds.manifest.entries.iter().map(|e| ds.root.join(&e.key)).collect();
    let mut cold_method = ColdMethod::Warm;
    // The order of the modes rotates from repeat to repeat, so none always runs first or
    // last (the disk drifts within a repeat).
    let mb: Vec<Vec<f64>> = interleaved(cfg.repeats, &MODES, true, |r, mode| {
        let mut order: Vec<usize> = (0..ds.len()).collect();
        Rng::new(r as u64).shuffle(&mut order);
        let batches: Vec<Vec<(String, usize)>> = order
            .chunks(cfg.batch)
            .map(|c| {
                c.iter().map(|&i| (ds.manifest.entries[i].key.clone(), ds.manifest.entries[i].size as usize)).collect()
            })
            .collect();
        {
            cold_method = Cold::new().pass(&files)?;
            let t = Instant::now();
            let bytes: u64 = rt.block_on(async {
                let mut bytes = 0u64;
                match *mode {
                    "raw-read" => {
                        for b in &batches {
                            bytes += stager.read_only(b).await?;
                        }
                    }
                    "pipelined" => {
                        let mut in_flight = VecDeque::new();
                        for b in &batches {
                            if in_flight.len() == cfg.depth {
                                let done: ringtier_stage::StagedBatch = in_flight.pop_front().context("in flight")?;
                                bytes += done.bytes();
                                done.wait().await?;
                            }
                            in_flight.push_back(stager.stage(b).await?);
                        }
                        for done in in_flight {
                            bytes += done.bytes();
                            done.wait().await?;
                        }
                    }
                    "pinned-no-overlap" => {
                        for b in &batches {
                            let s = stager.stage(b).await?;
                            bytes += s.bytes();
                            s.wait().await?;
                        }
                    }
                    _ => {
                        for b in &batches {
                            bytes += stager.stage_pageable(b, &pageable).await?;
                        }
                    }
                }
                Ok::<u64, anyhow::Error>(bytes)
            })?;
            let secs = t.elapsed().as_secs_f64();
            if bytes != ds.total_bytes() {
                bail!("{mode}: staged {bytes} bytes of {}", ds.total_bytes());
            }
            eprintln!("  repeat {}/{}: {mode:<18} {:>8.1} MB/s", r + 1, cfg.repeats, bytes as f64 / secs / 1e6);
            Ok(bytes as f64 / secs / 1e6)
        }
    })?;
    // Copy bandwidth without storage: the stager's copy path against one big copy.
    let mut copy_staged = Vec::new();
    let mut copy_reference = Vec::new();
    for _ in 0..cfg.repeats {
        let (s, r) = rt.block_on(stager.copy_bandwidth(4))?;
        copy_staged.push(s / 1e6);
        copy_reference.push(r / 1e6);
    }
    let ratio = |a: usize, b: usize| Summary::ratio(&mb[a], &mb[b]);
    println!();
    println!(
        "{} files, {:.0} MB, to {:?}; batches of {}; {} repeats, cold ({cold_method}); min/median/max MB/s",
        ds.len(),
        ds.total_bytes() as f64 / 1e6,
        cfg.target,
        cfg.batch,
        cfg.repeats
    );
    for (m, mode) in MODES.iter().enumerate() {
        let s = Summary::of(&mb[m]);
        println!("{mode:<18} {:>8.1} {:>8.1} {:>8.1}", s.min, s.median, s.max);
    }
    let (over_raw, over_pageable, over_serial) = (ratio(1, 0), ratio(1, 3), ratio(1, 2));
    let copy_ratio = Summary::ratio(&copy_staged, &copy_reference);
    let (cs, cr) = (Summary::of(&copy_staged), Summary::of(&copy_reference));
    println!(
        "copies from pinned buffers without storage: {:.0} MB/s through the stager, {:.0} MB/s as one copy ({:.2})",
        cs.median, cr.median, copy_ratio.median
    );
    println!(
        "pipelined / raw read {:.3} (staging overhead {:.1}%), / pageable + copy {:.2}x, / pinned without overlap {:.2}x",
        over_raw.median,
        (1.0 - over_raw.median) * 100.0,
        over_pageable.median,
        over_serial.median
    );
    let report = StageReport {
        schema: "ringtier.bench.stage/1",
        machine: Machine::probe(),
        target: format!("{:?}", cfg.target),
        pinning: format!("{:?}", pinned.pinning()),
        dataset: StageDataset { files: ds.len(), bytes: ds.total_bytes(), path: ds.root.display().to_string() },
        batch: cfg.batch,
        depth: cfg.depth,
        repeats: cfg.repeats,
        cold: cold_method,
        mb_per_sec: MODES
            .iter()
            .zip(mb)
            .map(|(mode, runs)| (*mode, ModeRuns { summary: Summary::of(&runs), runs }))
            .collect(),
        pipelined_over_raw_read: over_raw,
        pipelined_over_pageable_copy: over_pageable,
        pipelined_over_pinned_no_overlap: over_serial,
        copy_mb_per_sec_through_stager: cs,
        copy_mb_per_sec_one_copy: cr,
        copy_through_stager_over_one_copy: copy_ratio,
    };
    write_json(cfg.json.as_deref(), &report)?;
    Ok(report)
}

/// One mode's MB/s over the repeats.
#[derive(Debug, Serialize)]
struct ModeRuns {
    runs: Vec<f64>,
    summary: Summary,
}

/// The dataset staged.
#[derive(Debug, Serialize)]
struct StageDataset {
    files: usize,
    bytes: u64,
    path: String,
}

/// The report of `bench stage` (`ringtier.bench.stage/1`).
#[derive(Debug, Serialize)]
pub(crate) struct StageReport {
    schema: &'static str,
    machine: Machine,
    target: String,
    pinning: String,
    dataset: StageDataset,
    batch: usize,
    depth: usize,
    repeats: usize,
    cold: ColdMethod,
    mb_per_sec: std::collections::BTreeMap<&'static str, ModeRuns>,
    pipelined_over_raw_read: Summary,
    pipelined_over_pageable_copy: Summary,
    pipelined_over_pinned_no_overlap: Summary,
    copy_mb_per_sec_through_stager: Summary,
    copy_mb_per_sec_one_copy: Summary,
    copy_through_stager_over_one_copy: Summary,
}

/// `ringtier bench stage`.
pub(crate) fn command(a: StageArgs) -> Result<()> {
    let cfg = StageBenchConfig {
        dir: a.dir,
        target: a.target,
        batch: a.batch,
        depth: a.depth,
        repeats: a.repeats,
        json: a.json,
    };
    run(&cfg).map(|_| ())
}

/// Arguments of `ringtier bench stage`.
#[derive(Args, Debug)]
pub struct StageArgs {
    /// The dataset directory.
    #[arg(long)]
    pub(crate) dir: PathBuf,
    /// host, cuda or cuda:N (cuda needs the `cuda` feature and a driver).
    #[arg(long, default_value = "host", value_parser = parse_target)]
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
