//! `ringtier bench decode`: JPEG decode and transform throughput against Pillow, side by side.
//!
//! For each dataset directory, a fixed subset of its JPEGs (spread over the manifest) is read
//! into memory once; then, repeat after repeat, each transform chain runs on ringtier's
//! decoder (1 thread and N threads, one `JpegDecoder` and one output buffer per thread) and on
//! `bench/decode_vs_pillow.py` (one Python thread: a DataLoader worker), interleaved
//! A, B, A, B. Only decode and transform are timed (no I/O). Per core = images per CPU second
//! (user + system, `getrusage` for ringtier, `time.process_time` for Python), which holds on a
//! busy machine where wall time does not.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use ringtier_dataset::manifest::Manifest;
use ringtier_decode::{Crop, DecodeConfig, JpegDecoder, Layout, Normalize, SampleRng};
use serde::Serialize;

use crate::harness::scripts::Script;
use crate::harness::{files_under, interleaved, process_cpu, write_json, Cold, Machine, Summary};

/// Arguments of `ringtier bench decode`.
#[derive(Args, Debug)]
pub struct DecodeBenchArgs {
    /// Dataset directories with JPEGs and a manifest (`ringtier gen --format jpeg`),
    /// comma-separated, e.g. the caltech101 and imagenet presets.
    #[arg(long, value_delimiter = ',', required = true)]
    pub(crate) dir: Vec<PathBuf>,
    /// JPEGs per dataset (spread evenly over the manifest), held in memory.
    #[arg(long, default_value_t = 1000)]
    pub(crate) files: usize,
    /// Transform chains: resize (whole image to size x size, the Pillow baseline),
    /// center (Resize(size*8/7) + CenterCrop), rrc-flip (RandomResizedCrop + flip),
    /// rrc-flip-norm (the same, CHW float32 normalized).
    #[arg(long, value_delimiter = ',', default_value = "resize,center,rrc-flip,rrc-flip-norm")]
    pub(crate) chains: Vec<String>,
    /// Output size in pixels.
    #[arg(long, default_value_t = 224)]
    pub(crate) size: u32,
    /// ringtier decode thread counts to run (default: 1 and the cores available).
    #[arg(long, value_delimiter = ',')]
    pub(crate) threads: Vec<usize>,
    /// Repeats (interleaved with Pillow).
    #[arg(long, default_value_t = 5)]
    pub(crate) repeats: usize,
    /// Python with Pillow (and numpy for rrc-flip-norm) for the baseline.
    #[arg(long, default_value = "python3")]
    pub(crate) python: String,
    /// Skip the Pillow baseline.
    #[arg(long)]
    pub(crate) no_pillow: bool,
    /// Decode at full size (no DCT-domain downscaling).
    #[arg(long)]
    pub(crate) no_dct_scaling: bool,
    /// Decode whole images (no partial decode of the window the crop reads; libjpeg-turbo).
    #[arg(long)]
    pub(crate) no_partial_decode: bool,
    /// Also measure the split point: whole epochs through the loader (io_uring, cold caches)
    /// with every step online, against decode + resize materialized into a tier on local disk
    /// (first epoch writes it, the next reads it back with only the random steps online).
    #[arg(long)]
    pub(crate) split: bool,
    /// The chain of the split-point epochs.
    #[arg(long, default_value = "rrc-flip")]
    pub(crate) split_chain: String,
    /// Stored size of a materialized sample (size x size x 3 bytes).
    #[arg(long, default_value_t = 256)]
    pub(crate) split_size: u32,
    /// Where the materialized copy goes (default: a new directory next to each dataset, on
    /// the same file system; removed after).
    #[arg(long)]
    pub(crate) split_dir: Option<PathBuf>,
    /// Repeats of the split-point experiment (each: online, materializing, materialized).
    #[arg(long, default_value_t = 3)]
    pub(crate) split_repeats: usize,
    /// Write the report as JSON here.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
}

/// One epoch of the split-point experiment.
#[derive(Debug, Clone, Serialize)]
struct SplitEpoch {
    dataset: String,
    /// online, materializing (first epoch, writes the store) or materialized (reads it).
    split: String,
    repeat: usize,
    samples: u64,
    skipped: u64,
    seconds: f64,
    cpu_seconds: f64,
    bytes_read: u64,
}

/// Makes the dataset's files (and those under `extra`) cold.
fn make_cold(dir: &Path, extra: Option<&Path>) -> Result<crate::harness::ColdMethod> {
    let mut files: Vec<PathBuf> = Manifest::load(dir)?.entries.iter().map(|e| dir.join(&e.key)).collect();
    if let Some(extra) = extra {
        files.extend(files_under(extra)?);
    }
    Cold::new().pass(files)
}

async fn split_epoch(
    dir: &Path,
    decode: DecodeConfig,
    materialize: Option<ringtier_loader::Materialize>,
    epoch: u64,
) -> Result<(u64, u64, f64, f64, u64)> {
    let tier = ringtier::open(dir, &ringtier::OpenOptions::store().with_metered(false))?.tier;
    let dataset = ringtier_dataset::Dataset::from_dir(tier, dir).await?;
    let cfg = ringtier_loader::LoaderConfig::default()
        .with_batch_size(64)
        .with_prefetch(2)
        .with_decode(decode)
        .with_materialize(materialize);
    let loader = ringtier_loader::Loader::new(dataset, cfg)?;
    let (c0, t0) = (process_cpu(), Instant::now());
    let mut e = loader.epoch(epoch, 0)?;
    while let Some(b) = e.next().await {
        drop(b?);
    }
    let st = e.stats();
    Ok((st.samples, st.skipped, t0.elapsed().as_secs_f64(), (process_cpu() - c0).as_secs_f64(), st.bytes))
}

/// Waits until the background writes of the materializing epoch are on the store.
async fn wait_stored(tier: &dyn ringtier_core::Tier, n: usize) -> Result<()> {
    let start = Instant::now();
    while tier.list("materialized/").await?.len() < n {
        if start.elapsed().as_secs() > 120 {
            bail!("the materialized copy did not complete within 120 s");
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    Ok(())
}

/// The materialized copy of one dataset.
#[derive(Debug, Serialize)]
struct SplitStorage {
    dataset: String,
    jpeg_bytes: u64,
    materialized_bytes: u64,
    materialized_sample_bytes: u64,
}

/// One (dataset, split) over the repeats.
#[derive(Debug, Serialize)]
struct SplitRow {
    dataset: String,
    split: &'static str,
    images_per_sec: Summary,
    cpu_ms_per_sample: Summary,
    storage_bytes: f64,
    ratio_vs_online: Summary,
}

/// The split-point half of the decode report.
#[derive(Debug, Serialize)]
struct SplitReport {
    chain: String,
    size: u32,
    materialized_size: u32,
    cold: crate::harness::ColdMethod,
    storage: Vec<SplitStorage>,
    summary: Vec<SplitRow>,
    epochs: Vec<SplitEpoch>,
}

fn run_split(a: &DecodeBenchArgs) -> Result<SplitReport> {
    let decode = chain_config(&a.split_chain, a.size)?
        .with_dct_scaling(!a.no_dct_scaling)
        .with_partial_decode(!a.no_partial_decode);
    let rt = crate::runtime(2)?;
    let mut cold = crate::harness::ColdMethod::Warm;
    let mut epochs: Vec<SplitEpoch> = Vec::new();
    let mut storage = Vec::new();
    for dir in &a.dir {
        let name = dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned());
        let m = Manifest::load(dir)?;
        let jpeg_bytes: u64 = m.entries.iter().map(|e| e.size).sum();
        let parent = match &a.split_dir {
            Some(d) => d.clone(),
            None => dir.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf),
        };
        std::fs::create_dir_all(&parent)?;
        let mut stored_bytes = 0u64;
        for rep in 0..a.split_repeats {
            let store_dir = tempfile::Builder::new().prefix("ringtier-materialized-").tempdir_in(&parent)?;
            let store = ringtier::open(store_dir.path(), &ringtier::OpenOptions::store().with_metered(false))?.tier;
            let mat = ringtier_loader::Materialize::new(Arc::clone(&store)).with_size(a.split_size);
            for (split, materialize, epoch) in [
                ("online", None, 1u64),
                ("materializing", Some(mat.clone()), 0),
                ("materialized", Some(mat.clone()), 1),
            ] {
                cold = make_cold(dir, Some(store_dir.path()))?;
                let (samples, skipped, seconds, cpu_seconds, bytes_read) =
                    rt.block_on(split_epoch(dir, decode, materialize, epoch))?;
                if split == "materializing" {
                    rt.block_on(wait_stored(store.as_ref(), samples as usize))?;
                    nix::unistd::sync();
                    stored_bytes =
                        files_under(store_dir.path())?.iter().filter_map(|p| p.metadata().ok()).map(|m| m.len()).sum();
                }
                eprintln!(
                    "  {name} repeat {}/{} {split}: {samples} samples in {seconds:.2} s ({:.0}/s), {:.2} ms CPU per sample",
                    rep + 1,
                    a.split_repeats,
                    samples as f64 / seconds,
                    cpu_seconds / samples.max(1) as f64 * 1e3
                );
                epochs.push(SplitEpoch {
                    dataset: name.clone(),
                    split: split.into(),
                    repeat: rep,
                    samples,
                    skipped,
                    seconds,
                    cpu_seconds,
                    bytes_read,
                });
            }
        }
        storage.push(SplitStorage {
            dataset: name,
            jpeg_bytes,
            materialized_bytes: stored_bytes,
            materialized_sample_bytes: a.split_size as u64 * a.split_size as u64 * 3,
        });
    }
    println!();
    println!(
        "Split point: chain {} to {}x{}, whole epochs through the loader (io_uring, batch 64, prefetch 2, cold caches), \
         {} repeats; materialized = decode + resize to {}x{} stored; median (min..max)",
        a.split_chain, a.size, a.size, a.split_repeats, a.split_size, a.split_size
    );
    println!(
        "{:<12} {:<14} {:>22} {:>16} {:>14} {:>22}",
        "dataset", "split", "images/s", "CPU ms/sample", "storage MB", "vs online (same repeat)"
    );
    let mut rows = Vec::new();
    for st in &storage {
        let name = st.dataset.clone();
        let mut best = (String::new(), 0.0f64);
        for split in ["online", "materializing", "materialized"] {
            let es: Vec<&SplitEpoch> = epochs.iter().filter(|e| e.dataset == name && e.split == split).collect();
            let rate = Summary::of(&es.iter().map(|e| e.samples as f64 / e.seconds).collect::<Vec<_>>());
            let cpu =
                Summary::of(&es.iter().map(|e| e.cpu_seconds / e.samples.max(1) as f64 * 1e3).collect::<Vec<_>>());
            let (ours, online): (Vec<f64>, Vec<f64>) = es
                .iter()
                .filter_map(|e| {
                    epochs
                        .iter()
                        .find(|o| o.dataset == name && o.split == "online" && o.repeat == e.repeat)
                        .map(|o| (e.samples as f64 / e.seconds, o.samples as f64 / o.seconds))
                })
                .unzip();
            let ratio = Summary::ratio(&ours, &online);
            let storage_mb = if split == "online" { st.jpeg_bytes } else { st.materialized_bytes } as f64 / 1e6;
            if split != "materializing" && rate.median > best.1 {
                best = (split.to_string(), rate.median);
            }
            println!(
                "{:<12} {:<14} {:>8.0} ({:>5.0}..{:>5.0}) {:>16.2} {:>14.0} {:>10.2}x ({:.2}..{:.2})",
                name,
                split,
                rate.median,
                rate.min,
                rate.max,
                cpu.median,
                storage_mb,
                ratio.median,
                ratio.min,
                ratio.max
            );
            rows.push(SplitRow {
                dataset: name.clone(),
                split,
                images_per_sec: rate,
                cpu_ms_per_sample: cpu,
                storage_bytes: storage_mb * 1e6,
                ratio_vs_online: ratio,
            });
        }
        println!("{name}: fastest steady-state split: {} ({:.0} images/s)", best.0, best.1);
    }
    Ok(SplitReport {
        chain: a.split_chain.clone(),
        size: a.size,
        materialized_size: a.split_size,
        cold,
        storage,
        summary: rows,
        epochs,
    })
}

/// The decoder settings of a named chain.
pub(crate) fn chain_config(name: &str, size: u32) -> Result<DecodeConfig> {
    let base = DecodeConfig::default().with_size(size);
    Ok(match name {
        "resize" => base,
        "center" => base.with_crop(Crop::Center { resize: size * 8 / 7 }),
        "rrc-flip" => base.with_crop(Crop::RANDOM_RESIZED).with_flip(true),
        "rrc-flip-norm" => base
            .with_crop(Crop::RANDOM_RESIZED)
            .with_flip(true)
            .with_layout(Layout::Chw)
            .with_normalize(Normalize::IMAGENET),
        other => bail!("unknown chain {other:?} (resize, center, rrc-flip, rrc-flip-norm)"),
    })
}

/// One timed pass.
#[derive(Debug, Clone, Serialize)]
struct Pass {
    dataset: String,
    chain: String,
    /// "ringtier" or "pillow".
    engine: String,
    threads: usize,
    repeat: usize,
    images: usize,
    errors: usize,
    seconds: f64,
    cpu_seconds: f64,
}

impl Pass {
    fn rate(&self) -> f64 {
        self.images as f64 / self.seconds
    }
    fn per_cpu(&self) -> f64 {
        self.images as f64 / self.cpu_seconds
    }
}

/// The subset: `n` manifest entries spread evenly, in manifest order.
pub(crate) fn subset(dir: &Path, n: usize) -> Result<Vec<PathBuf>> {
    let m = Manifest::load(dir).with_context(|| format!("{}: a manifest is needed (ringtier gen)", dir.display()))?;
    let jpegs: Vec<_> = m.entries.iter().filter(|e| e.key.ends_with(".jpg") || e.key.ends_with(".jpeg")).collect();
    if jpegs.is_empty() {
        bail!("{}: no .jpg files in the manifest (generate with --format jpeg)", dir.display());
    }
    let n = n.clamp(1, jpegs.len());
    Ok((0..n).map(|i| dir.join(&jpegs[i * jpegs.len() / n].key)).collect())
}

/// Decodes every image of `data` with `cfg` on `threads` threads; returns (seconds, CPU
/// seconds, errors).
pub(crate) fn ringtier_pass(
    data: &[Vec<u8>],
    cfg: &DecodeConfig,
    threads: usize,
    seed: u64,
) -> Result<(f64, f64, usize)> {
    let next = AtomicUsize::new(0);
    let errors = AtomicUsize::new(0);
    let (c0, t0) = (process_cpu(), Instant::now());
    std::thread::scope(|s| -> Result<()> {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> ringtier_core::Result<()> {
                    let mut dec = JpegDecoder::new()?;
                    let mut out = vec![0u8; cfg.output_bytes()];
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(jpeg) = data.get(i) else { return Ok(()) };
                        let mut rng = SampleRng::new(seed, 0, i as u64);
                        if dec.decode_into(jpeg, cfg, &mut rng, &mut out).is_err() {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                        std::hint::black_box(&out);
                    }
                })
            })
            .collect();
        for w in workers {
            match w.join() {
                Ok(r) => r?,
                Err(_) => bail!("a decode thread panicked"),
            }
        }
        Ok(())
    })?;
    Ok((t0.elapsed().as_secs_f64(), (process_cpu() - c0).as_secs_f64(), errors.into_inner()))
}

fn pillow_pass(
    python: &str,
    script: &Path,
    list: &Path,
    chain: &str,
    size: u32,
    seed: u64,
) -> Result<(f64, f64, usize)> {
    let out = Command::new(python)
        .arg(script)
        .arg("--list")
        .arg(list)
        .args(["--chain", chain, "--size", &size.to_string(), "--seed", &seed.to_string()])
        .output()
        .with_context(|| format!("running {python} {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed: {}", script.display(), String::from_utf8_lossy(&out.stderr).trim());
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("the Pillow script's JSON")?;
    let num = |k: &str| v[k].as_f64().with_context(|| format!("the Pillow script's {k}"));
    Ok((num("seconds")?, num("cpu_seconds")?, num("images")? as usize))
}

/// `ringtier bench decode`.
pub(crate) fn command(a: DecodeBenchArgs) -> Result<()> {
    if a.repeats == 0 || a.files == 0 {
        bail!("--repeats and --files must be positive");
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = if a.threads.is_empty() { vec![1, cores] } else { a.threads.clone() };
    let mut threads: Vec<usize> = threads.into_iter().filter(|&t| t > 0).collect();
    threads.dedup();
    let configs: Vec<(String, DecodeConfig)> = a
        .chains
        .iter()
        .map(|c| {
            chain_config(c, a.size).map(|cfg| {
                (c.clone(), cfg.with_dct_scaling(!a.no_dct_scaling).with_partial_decode(!a.no_partial_decode))
            })
        })
        .collect::<Result<_>>()?;
    let tmp = tempfile::Builder::new().prefix("ringtier-decode-").tempdir()?;
    let script = if a.no_pillow { None } else { Some(Script::DecodeVsPillow.write_to(tmp.path())?) };
    let mut passes: Vec<Pass> = Vec::new();
    let mut datasets = Vec::new();
    for dir in &a.dir {
        let paths = subset(dir, a.files)?;
        let data: Vec<Vec<u8>> = paths
            .iter()
            .map(|p| std::fs::read(p).with_context(|| format!("reading {}", p.display())))
            .collect::<Result<_>>()?;
        let bytes: usize = data.iter().map(Vec::len).sum();
        let name = dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned());
        let list = tmp.path().join(format!("{}.txt", datasets.len()));
        let text: String = paths.iter().map(|p| format!("{}\n", p.display())).collect();
        std::fs::write(&list, text)?;
        eprintln!("{name}: {} JPEGs, {:.1} MB in memory", data.len(), bytes as f64 / 1e6);
        datasets.push(DatasetRow { name: name.clone(), dir: dir.display().to_string(), images: data.len(), bytes });
        // Every chain at every thread count, and Pillow per chain, once per repeat, the order
        // rotated by the repeat (the harness's interleaving).
        let sides: Vec<DecodeSide> = (0..configs.len())
            .flat_map(|ci| {
                threads
                    .iter()
                    .map(move |&t| DecodeSide::Ringtier(ci, t))
                    .chain(script.is_some().then_some(DecodeSide::Pillow(ci)))
            })
            .collect();
        let per_side = interleaved(a.repeats, &sides, true, |rep, side| {
            let pass = match *side {
                DecodeSide::Ringtier(ci, t) => {
                    let (chain, cfg) = &configs[ci];
                    let (secs, cpu, errors) = ringtier_pass(&data, cfg, t, rep as u64)?;
                    Pass {
                        dataset: name.clone(),
                        chain: chain.clone(),
                        engine: "ringtier".into(),
                        threads: t,
                        repeat: rep,
                        images: data.len() - errors,
                        errors,
                        seconds: secs,
                        cpu_seconds: cpu,
                    }
                }
                DecodeSide::Pillow(ci) => {
                    let chain = &configs[ci].0;
                    let script = script.as_ref().ok_or_else(|| anyhow::anyhow!("no Pillow script"))?;
                    let (secs, cpu, images) = pillow_pass(&a.python, script, &list, chain, a.size, rep as u64)?;
                    Pass {
                        dataset: name.clone(),
                        chain: chain.clone(),
                        engine: "pillow".into(),
                        threads: 1,
                        repeat: rep,
                        images,
                        errors: 0,
                        seconds: secs,
                        cpu_seconds: cpu,
                    }
                }
            };
            eprint!(".");
            Ok(pass)
        })?;
        passes.extend(per_side.into_iter().flatten());
        eprintln!();
    }
    let mut report = summarize(&a, &threads, passes, datasets);
    if a.split {
        report.split = Some(run_split(&a)?);
    }
    write_json(a.json.as_deref(), &report)
}

/// One side of the decode comparison: ringtier's chain (by index) at a thread count, or
/// Pillow's chain (one process, one thread).
#[derive(Debug, Clone, Copy)]
enum DecodeSide {
    Ringtier(usize, usize),
    Pillow(usize),
}

/// A dataset's JPEGs held in memory.
#[derive(Debug, Serialize)]
struct DatasetRow {
    name: String,
    dir: String,
    images: usize,
    bytes: usize,
}

/// One (dataset, chain, engine) over the repeats.
#[derive(Debug, Serialize)]
struct DecodeRow {
    dataset: String,
    chain: String,
    engine: String,
    images_per_sec: Summary,
    images_per_cpu_sec: Summary,
    per_core_ratio_vs_pillow: Option<Summary>,
    errors: usize,
}

/// The settings of a decode run.
#[derive(Debug, Serialize)]
struct DecodeSettings {
    files: usize,
    size: u32,
    repeats: usize,
    threads: Vec<usize>,
    chains: Vec<String>,
    dct_scaling: bool,
    /// Whether only the window the crop reads was decoded (libjpeg-turbo).
    partial_decode: bool,
    pillow: bool,
    /// The JPEG decoder that ran: "libjpeg-turbo" (feature `turbojpeg`) or "zune-jpeg".
    decoder: &'static str,
}

/// The report of `bench decode` (`ringtier.bench.decode/1`).
#[derive(Debug, Serialize)]
struct DecodeReport {
    schema: &'static str,
    machine: Machine,
    config: DecodeSettings,
    datasets: Vec<DatasetRow>,
    summary: Vec<DecodeRow>,
    passes: Vec<Pass>,
    #[serde(skip_serializing_if = "Option::is_none")]
    split: Option<SplitReport>,
}

fn summarize(a: &DecodeBenchArgs, threads: &[usize], passes: Vec<Pass>, datasets: Vec<DatasetRow>) -> DecodeReport {
    println!();
    println!("decoder: {}", ringtier_decode::JPEG_DECODER);
    println!(
        "JPEG decode + transform to {0}x{0}, in memory; {1} repeats interleaved with Pillow; median (min..max); \
         per core = images per CPU second",
        a.size, a.repeats
    );
    println!(
        "{:<12} {:<14} {:<14} {:>22} {:>22} {:>24}",
        "dataset", "chain", "engine", "images/s", "per core", "per-core ratio vs Pillow"
    );
    let mut rows = Vec::new();
    let names: Vec<String> = datasets.iter().map(|d| d.name.clone()).collect();
    for name in &names {
        for chain in &a.chains {
            let of = |engine: &str, t: usize| -> Vec<&Pass> {
                passes
                    .iter()
                    .filter(|p| &p.dataset == name && &p.chain == chain && p.engine == engine && p.threads == t)
                    .collect()
            };
            let pillow = of("pillow", 1);
            let mut engines: Vec<(String, Vec<&Pass>)> =
                threads.iter().map(|&t| (format!("ringtier x{t}"), of("ringtier", t))).collect();
            if !pillow.is_empty() {
                engines.push(("pillow x1".into(), pillow.clone()));
            }
            for (engine, ps) in engines {
                let rate = Summary::of(&ps.iter().map(|p| p.rate()).collect::<Vec<_>>());
                let per = Summary::of(&ps.iter().map(|p| p.per_cpu()).collect::<Vec<_>>());
                // Pairwise ratios: the same repeat's Pillow pass.
                let ratios: Vec<(f64, f64)> = ps
                    .iter()
                    .filter_map(|p| pillow.iter().find(|q| q.repeat == p.repeat).map(|q| (p.per_cpu(), q.per_cpu())))
                    .collect();
                let (ours, theirs): (Vec<f64>, Vec<f64>) = ratios.iter().copied().unzip();
                let ratio = Summary::ratio(&ours, &theirs);
                let errors: usize = ps.iter().map(|p| p.errors).sum();
                println!(
                    "{:<12} {:<14} {:<14} {:>8.0} ({:>5.0}..{:>5.0}) {:>8.0} ({:>5.0}..{:>5.0}) {:>10}{}",
                    name,
                    chain,
                    engine,
                    rate.median,
                    rate.min,
                    rate.max,
                    per.median,
                    per.min,
                    per.max,
                    if ratios.is_empty() || engine.starts_with("pillow") {
                        String::new()
                    } else {
                        format!("{:.2}x ({:.2}..{:.2})", ratio.median, ratio.min, ratio.max)
                    },
                    if errors > 0 { format!("  ({errors} decode errors)") } else { String::new() }
                );
                rows.push(DecodeRow {
                    dataset: name.clone(),
                    chain: chain.clone(),
                    engine,
                    images_per_sec: rate,
                    images_per_cpu_sec: per,
                    per_core_ratio_vs_pillow: (!ratios.is_empty()).then_some(ratio),
                    errors,
                });
            }
        }
    }
    DecodeReport {
        schema: "ringtier.bench.decode/1",
        machine: Machine::probe(),
        config: DecodeSettings {
            files: a.files,
            size: a.size,
            repeats: a.repeats,
            threads: threads.to_vec(),
            chains: a.chains.clone(),
            dct_scaling: !a.no_dct_scaling,
            partial_decode: !a.no_partial_decode,
            pillow: !a.no_pillow,
            decoder: ringtier_decode::JPEG_DECODER,
        },
        datasets,
        summary: rows,
        passes,
        split: None,
    }
}
