//! Sharded record datasets in the CLI: `ringtier gen --format tfrecord|wds` writes the
//! preset's samples as shards, and `ringtier bench read --format tfrecord|wds` streams them
//! through the loader's record reader (io_uring, O_DIRECT where the file system has it),
//! against a cold `cat` of the same shards, repeats interleaved.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use ringtier_core::Tier;
use ringtier_loader::manifest::{checksum, Manifest, ManifestEntry, MANIFEST_FILE};
use ringtier_loader::records::{
    write_tar_end, write_tar_member, write_tfrecord, RecordConfig, RecordFormat, RecordIndex, RecordLoader, Shard,
};
use ringtier_loader::OnBadSample;
use ringtier_uring::{UringConfig, UringTier, UringTierOptions};
use serde::Serialize;

use crate::dataset::{sizes, DatasetSpec, Format};
use crate::stats::{drop_caches, evict, peak_rss_bytes, process_cpu, write_json, Machine, Rng, Summary};

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
fn open_shards(
    dir: &Path,
    format: RecordFormat,
    depth: usize,
    cfg: RecordConfig,
    rt: &tokio::runtime::Runtime,
) -> Result<(Vec<Shard>, RecordLoader)> {
    let options = UringTierOptions::default().with_name("records".to_string()).with_follow_links(true);
    let tier: Arc<dyn Tier> = Arc::new(
        UringTier::with_options(dir, UringConfig::default().with_queue_depth(depth as u32), options)
            .context("opening the io_uring tier")?,
    );
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
        let idx = match std::fs::read_to_string(&path) {
            Ok(text) => RecordIndex::parse(&text, &path.display().to_string(), s.size)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
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

/// `ringtier index`: writes `SHARD.idx` for every shard.
pub(crate) fn index_command(a: crate::args::IndexArgs) -> Result<()> {
    let Some(format) = a.format.records() else { bail!("--format must be tfrecord or wds") };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let (shards, loader) = open_shards(&a.dir, format, 8, RecordConfig::default(), &rt)?;
    let t0 = Instant::now();
    let mut records = 0;
    for (i, s) in shards.iter().enumerate() {
        let idx = rt.block_on(loader.build_index(i))?;
        records += idx.entries.len();
        write_index(&index_path(&a.dir, s), &idx)?;
    }
    println!(
        "indexed {records} records in {} {} shards in {:.1} s ({}/SHARD.idx)",
        shards.len(),
        format.as_str(),
        t0.elapsed().as_secs_f64(),
        a.dir.display()
    );
    Ok(())
}

fn shard_name(format: Format, s: usize, n: usize) -> String {
    match format {
        Format::Wds => format!("shard-{s:06}.tar"),
        _ => format!("train-{s:05}-of-{n:05}.tfrecord"),
    }
}

/// Writes the spec's samples (random bytes of the drawn sizes) as `shards` shards, sample i in
/// shard i % shards, and a manifest of the shard files. Returns (shards, samples, bytes).
pub(crate) fn generate_shards(root: &Path, spec: &DatasetSpec, shards: usize, force: bool) -> Result<(usize, u64)> {
    if shards == 0 {
        bail!("--shards must be at least 1");
    }
    if root.join(MANIFEST_FILE).exists() && !force {
        bail!("{} already holds a dataset (its manifest exists); pass --force to regenerate", root.display());
    }
    std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    let sizes = sizes(spec);
    let mut entries = Vec::with_capacity(shards);
    let mut total = 0u64;
    let mut sample = Vec::new();
    for s in 0..shards {
        let mut out = Vec::new();
        for i in (s..spec.files).step_by(shards) {
            let mut rng = Rng::new(spec.seed.wrapping_mul(1_000_003).wrapping_add(i as u64 + 1));
            sample.resize(sizes[i] as usize, 0);
            rng.fill(&mut sample);
            match spec.format {
                Format::Wds => {
                    let key = format!("class{:04}/img{i:07}", i % spec.classes);
                    write_tar_member(&mut out, &format!("{key}.bin"), &sample);
                    write_tar_member(&mut out, &format!("{key}.cls"), format!("{}", i % spec.classes).as_bytes());
                }
                _ => write_tfrecord(&mut out, &sample),
            }
        }
        if spec.format == Format::Wds {
            write_tar_end(&mut out);
        }
        let key = shard_name(spec.format, s, shards);
        let path = root.join(&key);
        std::fs::write(&path, &out).with_context(|| format!("writing {}", path.display()))?;
        total += out.len() as u64;
        entries.push(ManifestEntry { key, size: out.len() as u64, crc32c: checksum(&out) });
    }
    let dir = std::fs::File::open(root).with_context(|| format!("opening {}", root.display()))?;
    nix::unistd::syncfs(&dir).map_err(std::io::Error::from).context("syncfs")?;
    Manifest { entries }.store(root)?;
    Ok((shards, total))
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
        self.cpu_seconds / (self.bytes as f64 / (1u64 << 30) as f64)
    }
}

#[derive(Debug, Serialize)]
struct Side {
    mb_per_sec: Summary,
    cpu_seconds_per_gib: Summary,
    runs: Vec<Pass>,
}

fn side(runs: Vec<Pass>) -> Side {
    let s = |f: &dyn Fn(&Pass) -> f64| Summary::of(&runs.iter().map(f).collect::<Vec<_>>());
    Side { mb_per_sec: s(&|p| p.mb_per_sec()), cpu_seconds_per_gib: s(&|p| p.cpu_per_gib()), runs }
}

#[derive(Debug, Serialize)]
struct Report {
    schema: &'static str,
    machine: Machine,
    storage: String,
    filesystem: &'static str,
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

/// CPU seconds of reaped children (the `cat` baseline).
fn children_cpu() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_CHILDREN).map_or(0.0, |ru| {
        let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
        t(ru.user_time()) + t(ru.system_time())
    })
}

/// `ringtier bench read --format tfrecord|wds`.
pub(crate) fn bench(a: &crate::args::ReadArgs) -> Result<()> {
    let Some(format) = a.format.records() else { bail!("not a record format") };
    let repeats = a.io.repeats.max(1);
    let depth = a.depths.as_ref().unwrap_or(&a.concurrency).first().copied().unwrap_or(8).max(1);
    let read_size = if a.io.read_size == 0 { 4 << 20 } else { a.io.read_size as usize };
    let shuffle_buffer = a.shuffle_buffer;
    let fs = ringtier_core::fs::fs_type_name(&a.dir);
    let direct = ringtier_core::fs::dir_supports_direct_io(&a.dir) != Some(false);
    // Two runtime threads, as the Python engine has: the reads' completions and the parsing
    // run beside this thread's consumer instead of taking turns on one worker.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let shuffle_bytes = usize::try_from(a.shuffle_bytes).context("--shuffle-bytes")?;
    let cfg = RecordConfig::default()
        .with_depth(depth)
        .with_read_size(read_size)
        .with_shuffle_buffer(shuffle_buffer)
        .with_shuffle_bytes(shuffle_bytes)
        .with_seed(a.seed)
        .with_on_bad(if a.io.on_error == crate::passes::OnError::Skip { OnBadSample::Skip } else { OnBadSample::Fail });
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
    let paths: Vec<std::path::PathBuf> = shards.iter().map(|s| a.dir.join(&s.key)).collect();
    let cold = |paths: &[std::path::PathBuf]| -> Result<()> {
        if a.io.drop_caches {
            drop_caches().context("dropping the page cache (needs root)")?;
        }
        for p in paths {
            evict(p).with_context(|| format!("evicting {}", p.display()))?;
        }
        Ok(())
    };
    let (mut ours, mut cats) = (Vec::new(), Vec::new());
    let mut held_peak = 0u64;
    for r in 0..repeats {
        cold(&paths)?;
        let cpu0 = process_cpu();
        let t0 = Instant::now();
        let (records, bytes, skipped) = rt.block_on(async {
            let mut e = match &global {
                Some(idx) => loader.global_epoch(Arc::clone(idx), r as u64, 0)?,
                None => loader.epoch(r as u64, 0),
            };
            while let Some(rec) = e.next().await {
                rec?;
            }
            held_peak = held_peak.max(e.held().peak);
            Ok::<_, ringtier_core::Error>((e.stats().records, e.stats().bytes, e.stats().skipped))
        })?;
        let wall = t0.elapsed().as_secs_f64();
        let cpu = (process_cpu() - cpu0).as_secs_f64();
        // MB/s counts the shard bytes read (the framing included), as cat's does.
        let pass = Pass { bytes: total, records, skipped, wall_seconds: wall, cpu_seconds: cpu };
        let _ = bytes;
        eprintln!(
            "  repeat {}/{repeats}: ringtier {:>8.1} MB/s {:>6.3} CPU s/GiB, {records} records",
            r + 1,
            pass.mb_per_sec(),
            pass.cpu_per_gib()
        );
        ours.push(pass);
        cold(&paths)?;
        let c0 = children_cpu();
        let t0 = Instant::now();
        let status = std::process::Command::new("cat")
            .args(&paths)
            .stdout(std::process::Stdio::null())
            .status()
            .context("running cat")?;
        if !status.success() {
            bail!("cat failed: {status}");
        }
        let pass = Pass {
            bytes: total,
            records: 0,
            skipped: 0,
            wall_seconds: t0.elapsed().as_secs_f64(),
            cpu_seconds: children_cpu() - c0,
        };
        eprintln!(
            "  repeat {}/{repeats}: cat      {:>8.1} MB/s {:>6.3} CPU s/GiB",
            r + 1,
            pass.mb_per_sec(),
            pass.cpu_per_gib()
        );
        cats.push(pass);
    }
    let ratio = Summary::of(&ours.iter().zip(&cats).map(|(o, c)| o.mb_per_sec() / c.mb_per_sec()).collect::<Vec<_>>());
    let report = Report {
        schema: "ringtier.bench.records/1",
        machine: Machine::probe(),
        storage: a.dir.display().to_string(),
        filesystem: fs,
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
