//! Datasets read through a tier with one driver thread and requests in flight swept:
//! `ringtier bench read --dir s3://...` (the S3 tier) and `--latency-ms` (local files behind
//! the throttled layer's per-request latency, a parallel file system's round trip).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use ringtier_core::layers::{Throttle, Throttled};
use ringtier_core::{AlignedBuf, ReadBatch, Tier};
use ringtier_s3::{S3Config, S3Tier};
use ringtier_uring::BufferedWrites;
use serde::Serialize;

use super::args::ReadArgs;
use crate::harness::{interleaved, write_json, Cold, ColdMethod, Machine, Meter, Rng, Storage, Summary, Table, GIB};

/// One measured run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ClientRun {
    pub(crate) client: String,
    pub(crate) setting: usize,
    pub(crate) seconds: f64,
    pub(crate) cpu_seconds: f64,
    pub(crate) bytes: u64,
}

impl ClientRun {
    pub(crate) fn mb_per_sec(&self) -> f64 {
        self.bytes as f64 / self.seconds / 1e6
    }

    pub(crate) fn cpu_seconds_per_gib(&self) -> f64 {
        self.cpu_seconds / (self.bytes as f64 / GIB)
    }
}

/// Reads `objects` (key, bytes) through `tier`, `depth` requests per batch (one batch in
/// flight at a time), into `bufs` (at least `depth` buffers, each large enough): bytes read.
pub(crate) async fn read_batches(
    tier: &dyn Tier,
    objects: &[(&str, usize)],
    depth: usize,
    bufs: &mut Vec<AlignedBuf>,
) -> Result<u64> {
    let mut total = 0u64;
    let mut batch = ReadBatch::with_capacity(depth, depth * 64);
    for chunk in objects.chunks(depth) {
        for &(k, size) in chunk {
            let Some(b) = bufs.pop() else { bail!("buffer pool empty") };
            batch.push(k, 0, size, b);
        }
        batch = tier.read_batch(batch).await;
        for (key, _, res, buf) in batch.drain() {
            total += res.with_context(|| format!("reading {key}"))? as u64;
            if let Some(b) = buf {
                bufs.push(b);
            }
        }
    }
    Ok(total)
}

/// The tier for an `s3://` dataset URL (settings in the URL; credentials, and the endpoint
/// where the URL names none, from the AWS environment variables).
fn dataset_tier(url: &str, depth: usize) -> Result<S3Tier> {
    let cfg = S3Config::from_url(url)?.with_io_threads(1).with_read_concurrency(depth);
    Ok(S3Tier::new(cfg)?)
}

/// One point of the S3 dataset sweep.
#[derive(Debug, Serialize)]
struct DatasetPoint {
    depth: usize,
    mb_per_sec: Summary,
    files_per_sec: Summary,
    cpu_seconds_per_gib: Summary,
    /// Per repeat: this depth's MB/s over depth 1's (when depth 1 is in the sweep).
    speedup_vs_depth_1: Option<Summary>,
    runs: Vec<ClientRun>,
}

/// `ringtier bench read --dir s3://bucket/prefix[?endpoint=...]`: one shuffled epoch over
/// every object under the prefix per pass, through the S3 tier's concurrent `read_batch` (one
/// driver thread: a current-thread runtime, and one I/O worker), `depth` requests in flight,
/// depths swept, repeats interleaved.
pub(crate) fn read_dataset(url: &str, a: &ReadArgs) -> Result<()> {
    let rt = crate::runtime(0)?;
    // The dataset: every object under the prefix (empty ones left out).
    let objects: Vec<(String, usize)> = rt.block_on(async {
        let tier = S3Tier::open(S3Config::from_url(url)?).await.with_context(|| format!("opening {url}"))?;
        let listed = tier.list("").await.with_context(|| format!("listing {url}"))?;
        listed
            .into_iter()
            .filter(|m| m.size > 0)
            .map(|m| Ok((m.key, usize::try_from(m.size)?)))
            .collect::<Result<Vec<_>>>()
    })?;
    if objects.is_empty() {
        bail!("{url} holds no objects (upload a dataset with `ringtier gen --dir {url}`)");
    }
    let make = |depth: usize| -> Result<Arc<dyn Tier>> { Ok(Arc::new(dataset_tier(url, depth)?)) };
    let storage =
        SweepStorage { url: Some(url.to_string()), tier: "s3", path: None, filesystem: None, latency_ms: None };
    // Nothing of the dataset is local: the cold pass has no files to evict.
    sweep_tier(&rt, url, "S3 tier", storage, &objects, &[], &make, a)
}

/// `ringtier bench read --dir DIR --latency-ms MS`: a local dataset read through the
/// throttled layer with a per-request latency (a parallel file system's round trip), the same
/// sweep as an S3 dataset's (one driver thread, `--depths` through `read_batch`).
pub(crate) fn read_files_throttled(a: &ReadArgs, latency_ms: f64) -> Result<()> {
    if !latency_ms.is_finite() || latency_ms < 0.0 {
        bail!("--latency-ms must be a number of milliseconds, at least 0");
    }
    let ds = crate::dataset::Dataset::open(&a.dir)?;
    let objects: Vec<(String, usize)> = ds
        .manifest
        .entries
        .iter()
        .filter(|e| e.size > 0)
        .map(|e| Ok((e.key.clone(), usize::try_from(e.size)?)))
        .collect::<Result<_>>()?;
    if objects.is_empty() {
        bail!("{} holds no files", a.dir.display());
    }
    let latency = Duration::from_secs_f64(latency_ms / 1000.0);
    let make = |_depth: usize| -> Result<Arc<dyn Tier>> {
        let files =
            crate::tiers::dir_tier(&ds.root, "pfs", None, BufferedWrites::default(), ringtier_uring::Engine::Auto)?;
        Ok(Arc::new(Throttled::new(files, Throttle::bandwidth(u64::MAX).with_latency(latency))))
    };
    let rt = crate::runtime(0)?;
    let label = format!("files +{latency_ms} ms/request");
    let st = Storage::of(&ds.root);
    let storage = SweepStorage {
        url: None,
        tier: "files, throttled layer",
        path: Some(st.path),
        filesystem: Some(st.filesystem),
        latency_ms: Some(latency_ms),
    };
    let files: Vec<_> = objects.iter().map(|o| ds.root.join(&o.0)).collect();
    sweep_tier(&rt, &ds.root.display().to_string(), &label, storage, &objects, &files, &make, a)
}

/// Where a swept dataset lives. The URL's settings may name the endpoint; credentials never
/// appear in it.
#[derive(Debug, Serialize)]
struct SweepStorage {
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<String>,
    tier: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    filesystem: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    latency_ms: Option<f64>,
}

/// The objects of a swept dataset.
#[derive(Debug, Serialize)]
struct SweepDataset {
    objects: usize,
    bytes: u64,
    median_object_bytes: usize,
    max_object_bytes: usize,
}

/// The report of a depth sweep (`ringtier.bench.read.s3/1`).
#[derive(Debug, Serialize)]
struct SweepReport {
    schema: &'static str,
    machine: Machine,
    storage: SweepStorage,
    dataset: SweepDataset,
    repeats: usize,
    driver_threads: usize,
    seed: u64,
    cold: ColdMethod,
    points: Vec<DatasetPoint>,
}

/// The depth sweep over `objects` through tiers from `make(depth)` (see [`read_dataset`]);
/// `files` are the local files the cold pass evicts.
#[allow(clippy::too_many_arguments)]
fn sweep_tier(
    rt: &tokio::runtime::Runtime,
    name: &str,
    label: &str,
    storage: SweepStorage,
    objects: &[(String, usize)],
    files: &[std::path::PathBuf],
    make: &dyn Fn(usize) -> Result<Arc<dyn Tier>>,
    a: &ReadArgs,
) -> Result<()> {
    let depths = a.depths.clone().unwrap_or_else(|| a.concurrency.clone());
    if depths.is_empty() || depths.contains(&0) {
        bail!("--depths must be at least 1");
    }
    if a.io.repeats == 0 {
        bail!("--repeats must be at least 1");
    }
    let total: u64 = objects.iter().map(|o| o.1 as u64).sum();
    let max = objects.iter().map(|o| o.1).max().unwrap_or(0);
    let mut sizes: Vec<usize> = objects.iter().map(|o| o.1).collect();
    sizes.sort_unstable();
    println!(
        "bench read {name}: {} objects, {:.1} MB (median {:.0} KB), {label}, one driver thread, depths {depths:?}, {} repeats",
        objects.len(),
        total as f64 / 1e6,
        sizes[sizes.len() / 2] as f64 / 1e3,
        a.io.repeats
    );
    let cold = Cold { warm: a.io.warm, require_drop_caches: a.io.drop_caches, ..Cold::new() };
    let mut cold_method = ColdMethod::Warm;
    let mut order: Vec<usize> = Vec::new();
    let runs = interleaved(a.io.repeats, &depths, false, |rep, &depth| {
        if depth == depths[0] {
            order = (0..objects.len()).collect();
            Rng::new(a.seed + rep as u64).shuffle(&mut order);
        }
        let tier = make(depth)?;
        let mut bufs: Vec<AlignedBuf> =
            (0..depth).map(|_| AlignedBuf::new(max + 4096, 4096)).collect::<ringtier_core::Result<_>>()?;
        let mut pass = |keys: &[usize]| -> Result<u64> {
            let wanted: Vec<(&str, usize)> = keys.iter().map(|&k| (objects[k].0.as_str(), objects[k].1)).collect();
            rt.block_on(read_batches(tier.as_ref(), &wanted, depth, &mut bufs))
        };
        // Warm the connection pool (not measured).
        pass(&order[..depth.min(order.len())])?;
        cold_method = cold.pass(files)?;
        let meter = Meter::start();
        let bytes = pass(&order)?;
        let u = meter.stop();
        if bytes != total {
            bail!("a pass read {bytes} bytes of {total}");
        }
        eprintln!(
            "  repeat {}/{}: depth {depth:>4} {:>8.1} MB/s {:>8.0} objects/s {:>6.2} CPU s/GiB",
            rep + 1,
            a.io.repeats,
            bytes as f64 / u.wall_seconds / 1e6,
            objects.len() as f64 / u.wall_seconds,
            u.cpu_seconds / (bytes as f64 / GIB)
        );
        Ok(ClientRun {
            client: format!("ringtier {label}"),
            setting: depth,
            seconds: u.wall_seconds,
            cpu_seconds: u.cpu_seconds,
            bytes,
        })
    })?;
    let base = depths.iter().position(|&d| d == 1);
    let mb = |rs: &[ClientRun]| rs.iter().map(ClientRun::mb_per_sec).collect::<Vec<_>>();
    let points: Vec<DatasetPoint> = depths
        .iter()
        .enumerate()
        .map(|(i, &depth)| DatasetPoint {
            depth,
            mb_per_sec: Summary::by(&runs[i], ClientRun::mb_per_sec),
            files_per_sec: Summary::by(&runs[i], |r| objects.len() as f64 / r.seconds),
            cpu_seconds_per_gib: Summary::by(&runs[i], ClientRun::cpu_seconds_per_gib),
            speedup_vs_depth_1: base.map(|b| Summary::ratio(&mb(&runs[i]), &mb(&runs[b]))),
            runs: runs[i].clone(),
        })
        .collect();
    let mut table = Table::new(["depth", "MB/s min/median/max", "objects/s", "CPU s/GiB min/median/max", "vs depth 1"]);
    for p in &points {
        table.row([
            p.depth.to_string(),
            format!("{:.1}/{:.1}/{:.1}", p.mb_per_sec.min, p.mb_per_sec.median, p.mb_per_sec.max),
            format!("{:.0}", p.files_per_sec.median),
            format!(
                "{:.2}/{:.2}/{:.2}",
                p.cpu_seconds_per_gib.min, p.cpu_seconds_per_gib.median, p.cpu_seconds_per_gib.max
            ),
            p.speedup_vs_depth_1.as_ref().map_or("-".to_string(), |s| format!("{:.2}x", s.median)),
        ]);
    }
    print!("{}", table.text());
    let report = SweepReport {
        schema: "ringtier.bench.read.s3/1",
        machine: Machine::probe(),
        storage,
        dataset: SweepDataset {
            objects: objects.len(),
            bytes: total,
            median_object_bytes: sizes[sizes.len() / 2],
            max_object_bytes: max,
        },
        repeats: a.io.repeats,
        driver_threads: 1,
        seed: a.seed,
        cold: cold_method,
        points,
    };
    write_json(a.io.json.as_deref(), &report)
}
