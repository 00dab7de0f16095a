//! Sharded record datasets in the CLI: `ringtier gen --format tfrecord|wds` writes the
//! preset's samples as shards, and `ringtier bench read --format tfrecord|wds` streams them
//! through the loader's record reader (io_uring, O_DIRECT where the file system has it),
//! against a cold `cat` of the same shards, repeats interleaved.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use ringtier_core::Tier;
use ringtier_dataset::OnBadSample;
use ringtier_loader::records::{RecordConfig, RecordFormat, RecordIndex, RecordLoader, Shard};
use ringtier_uring::UringConfig;
use serde::Serialize;

use super::args::ReadArgs;
use crate::harness::usage::run_child;
use crate::harness::{
    interleaved, peak_rss_bytes, write_json, Cold, ColdMethod, Machine, Meter, Storage, Summary, Usage, GIB,
};

/// What `bench read` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ReadFormat {
    /// One sample per file.
    Files,
    /// TFRecord shards (`*.tfrecord`), records parsed and CRC-checked.
    Tfrecord,
    /// WebDataset tar shards (`*.tar`), samples grouped by key.
    Wds,
}

impl ReadFormat {
    fn records(self) -> Option<RecordFormat> {
        match self {
            ReadFormat::Files => None,
            ReadFormat::Tfrecord => Some(RecordFormat::TfRecord),
            ReadFormat::Wds => Some(RecordFormat::WebDataset),
        }
    }
}

/// Record order of `bench read --format tfrecord|wds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RecordOrder {
    /// Shards front to back, records through the shuffle buffer.
    Stream,
    /// Every record in one random order across all shards, through the indexes.
    Global,
}

/// The io_uring tier over a directory of shards (links followed), its shards, and a loader.
pub(crate) fn open_shards(
    dir: &Path,
    format: RecordFormat,
    depth: usize,
    cfg: RecordConfig,
    rt: &tokio::runtime::Runtime,
) -> Result<(Vec<Shard>, RecordLoader)> {
    // Through the front door: io_uring where the kernel allows it, the thread pool otherwise.
    let options = ringtier::open::OpenOptions::dataset()
        .with_uring(UringConfig::default().with_queue_depth(depth as u32))
        .with_name("records")
        .with_metered(false);
    let tier: Arc<dyn Tier> =
        ringtier::open(dir, &options).with_context(|| format!("opening the shards in {}", dir.display()))?.tier;
    let shards: Vec<Shard> = rt.block_on(ringtier_loader::records::list_shards(tier.as_ref(), format))?;
    let loader = RecordLoader::new(tier, shards.clone(), format, cfg)?;
    Ok((shards, loader))
}

fn index_path(dir: &Path, shard: &Shard) -> std::path::PathBuf {
    dir.join(format!("{}.idx", shard.key))
}

/// The indexes of every shard: `SHARD.idx` where present (checked against the shard), else
/// built by streaming the shard and written.
fn indexes(
    dir: &Path,
    shards: &[Shard],
    loader: &RecordLoader,
    rt: &tokio::runtime::Runtime,
) -> Result<Vec<RecordIndex>> {
    let mut out = Vec::with_capacity(shards.len());
    for (i, s) in shards.iter().enumerate() {
        let path = index_path(dir, s);
        // Bounded by the shard's size before it is read.
        let idx = match RecordIndex::load(&path, s.size) {
            Ok(idx) => idx,
            Err(e) if e.kind() == ringtier_core::ErrorKind::NotFound => {
                let idx = rt.block_on(loader.build_index(i))?;
                write_index(&path, &idx)?;
                idx
            }
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        out.push(idx);
    }
    Ok(out)
}

fn write_index(path: &Path, idx: &RecordIndex) -> Result<()> {
    let tmp = path.with_extension(format!("idx.tmp-{}", std::process::id()));
    std::fs::write(&tmp, idx.to_text()).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    Ok(())
}

#[derive(Debug, Clone, Serialize)]
struct Pass {
    bytes: u64,
    records: u64,
    skipped: u64,
    wall_seconds: f64,
    cpu_seconds: f64,
}

impl Pass {
    fn mb_per_sec(&self) -> f64 {
        self.bytes as f64 / self.wall_seconds / 1e6
    }
    fn cpu_per_gib(&self) -> f64 {
        self.cpu_seconds / (self.bytes as f64 / GIB)
    }
}

#[derive(Debug, Serialize)]
struct Side {
    mb_per_sec: Summary,
    cpu_seconds_per_gib: Summary,
    runs: Vec<Pass>,
}

fn side(runs: Vec<Pass>) -> Side {
    Side {
        mb_per_sec: Summary::by(&runs, Pass::mb_per_sec),
        cpu_seconds_per_gib: Summary::by(&runs, Pass::cpu_per_gib),
        runs,
    }
}

#[derive(Debug, Serialize)]
struct Report {
    schema: &'static str,
    machine: Machine,
    storage: String,
    filesystem: String,
    /// How the passes were made cold.
    cold: ColdMethod,
    format: &'static str,
    order: RecordOrder,
    shards: usize,
    shard_bytes_max: u64,
    bytes: u64,
    repeats: usize,
    depth: usize,
    read_size: usize,
    shuffle_buffer: usize,
    shuffle_bytes: usize,
    prefetch_bytes: usize,
    /// The most record bytes the loader held at once (its own accounting), over the repeats.
    held_peak_bytes: u64,
    direct_io: bool,
    ringtier: Side,
    cat: Side,
    /// Per pair: ringtier MB/s over cat MB/s.
    ratio_to_cat: Summary,
    pool_bytes: usize,
    peak_rss_bytes: u64,
}

/// `ringtier bench read --format tfrecord|wds`.
pub(crate) fn bench(a: &ReadArgs) -> Result<()> {
    let Some(format) = a.format.records() else { bail!("not a record format") };
    let repeats = a.io.repeats.max(1);
    let depth = a.depths.as_ref().unwrap_or(&a.concurrency).first().copied().unwrap_or(8).max(1);
    let read_size = if a.io.read_size == 0 { 4 << 20 } else { a.io.read_size as usize };
    let shuffle_buffer = a.shuffle_buffer;
    let storage = Storage::of(&a.dir);
    let fs = storage.filesystem.clone();
    let direct = ringtier_core::fs::dir_supports_direct_io(&a.dir) != Some(false);
    // Two runtime threads, as the Python engine has: the reads' completions and the parsing
    // run beside this thread's consumer instead of taking turns on one worker.
    let rt = crate::runtime(2)?;
    let shuffle_bytes = usize::try_from(a.shuffle_bytes).context("--shuffle-bytes")?;
    let cfg = RecordConfig::default()
        .with_depth(depth)
        .with_read_size(read_size)
        .with_shuffle_buffer(shuffle_buffer)
        .with_shuffle_bytes(shuffle_bytes)
        .with_seed(a.seed)
        .with_on_bad(if a.io.on_error == super::pass::OnError::Skip { OnBadSample::Skip } else { OnBadSample::Fail });
    let (shards, mut loader) = open_shards(&a.dir, format, depth, cfg.clone(), &rt)?;
    let total: u64 = shards.iter().map(|s| s.size).sum();
    let global = match a.record_order {
        RecordOrder::Stream => None,
        RecordOrder::Global => {
            let idx = indexes(&a.dir, &shards, &loader, &rt)?;
            // Every record must fit one pooled buffer.
            let max = idx.iter().map(RecordIndex::max_len).max().unwrap_or(0) as usize;
            if max + 8192 > read_size {
                let bigger = cfg.clone().with_read_size((max + 8192).next_multiple_of(4096));
                loader = open_shards(&a.dir, format, depth, bigger, &rt)?.1;
            }
            Some(Arc::new(idx))
        }
    };
    eprintln!(
        "streaming {} {} shards ({:.1} MB, largest {:.1} MB) in {} ({fs}): depth {depth} x {} KiB, shuffle buffer {shuffle_buffer} records or {} MiB, {repeats} repeats against cold cat",
        shards.len(),
        format.as_str(),
        total as f64 / 1e6,
        shards.iter().map(|s| s.size).max().unwrap_or(0) as f64 / 1e6,
        a.dir.display(),
        read_size >> 10,
        shuffle_bytes >> 20
    );
    let paths: Vec<PathBuf> = shards.iter().map(|s| a.dir.join(&s.key)).collect();
    let cold = Cold { require_drop_caches: a.io.drop_caches, ..Cold::new() };
    let mut cold_method = ColdMethod::Warm;
    let mut held_peak = 0u64;
    let sides = ["ringtier", "cat"];
    let runs = interleaved(repeats, &sides, false, |r, &side| {
        cold_method = cold.pass(&paths)?;
        let (usage, (records, skipped)) = if side == "ringtier" {
            let meter = Meter::start();
            let records = rt.block_on(async {
                let mut e = match &global {
                    Some(idx) => loader.global_epoch(Arc::clone(idx), r as u64, 0)?,
                    None => loader.epoch(r as u64, 0),
                };
                while let Some(rec) = e.next().await {
                    rec?;
                }
                held_peak = held_peak.max(e.held().peak);
                Ok::<_, ringtier_core::Error>((e.stats().records, e.stats().skipped))
            })?;
            (meter.stop(), records)
        } else {
            let u = run_child(std::process::Command::new("cat").args(&paths).stdout(std::process::Stdio::null()))?;
            (Usage { cpu_seconds: u.children_cpu_seconds, ..u }, (0, 0))
        };
        // MB/s counts the shard bytes read (the framing included), as cat's does.
        let pass =
            Pass { bytes: total, records, skipped, wall_seconds: usage.wall_seconds, cpu_seconds: usage.cpu_seconds };
        eprintln!(
            "  repeat {}/{repeats}: {side:<8} {:>8.1} MB/s {:>6.3} CPU s/GiB, {records} records",
            r + 1,
            pass.mb_per_sec(),
            pass.cpu_per_gib()
        );
        Ok(pass)
    })?;
    let [ours, cats]: [Vec<Pass>; 2] = runs.try_into().map_err(|_| anyhow::anyhow!("two sides"))?;
    let mb = |v: &[Pass]| v.iter().map(Pass::mb_per_sec).collect::<Vec<_>>();
    let ratio = Summary::ratio(&mb(&ours), &mb(&cats));
    let report = Report {
        schema: "ringtier.bench.records/1",
        machine: Machine::probe(),
        storage: storage.path.clone(),
        filesystem: fs.clone(),
        cold: cold_method,
        format: format.as_str(),
        order: a.record_order,
        shards: shards.len(),
        shard_bytes_max: shards.iter().map(|s| s.size).max().unwrap_or(0),
        bytes: total,
        repeats,
        depth,
        read_size,
        shuffle_buffer,
        shuffle_bytes,
        prefetch_bytes: cfg.prefetch_bytes,
        held_peak_bytes: held_peak,
        direct_io: direct,
        ringtier: side(ours),
        cat: side(cats),
        ratio_to_cat: ratio,
        pool_bytes: loader.pool_bytes(),
        peak_rss_bytes: peak_rss_bytes(),
    };
    println!();
    println!(
        "{} {} shards, {:.1} MB on {fs}, cold, {repeats} pairs interleaved; min/median/max",
        report.shards,
        report.format,
        total as f64 / 1e6
    );
    for (name, s) in [("ringtier", &report.ringtier), ("cat", &report.cat)] {
        let (m, c) = (s.mb_per_sec, s.cpu_seconds_per_gib);
        println!(
            "{name:<9} {:>8.1} {:>8.1} {:>8.1} MB/s   {:>6.3} {:>6.3} {:>6.3} CPU s/GiB",
            m.min, m.median, m.max, c.min, c.median, c.max
        );
    }
    println!(
        "ringtier / cat: {:.2} (min {:.2}, max {:.2}); buffer pool {:.1} MiB, records held {:.1} MiB at most, peak RSS {:.1} MiB",
        ratio.median,
        ratio.min,
        ratio.max,
        report.pool_bytes as f64 / (1 << 20) as f64,
        held_peak as f64 / (1 << 20) as f64,
        report.peak_rss_bytes as f64 / (1 << 20) as f64
    );
    write_json(a.io.json.as_deref(), &report)?;
    Ok(())
}
