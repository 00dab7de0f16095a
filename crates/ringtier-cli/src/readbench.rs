//! `ringtier bench read` (and the demo): the paper's read micro-benchmark. One cold,
//! shuffled epoch over a dataset per pass, through each engine, over a sweep of concurrency,
//! repeats interleaved; a table, JSON with a stable schema (`docs/BENCH_READ.md`) and an SVG
//! plot of bandwidth against concurrency.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::dataset::Dataset;
use crate::passes::{order_of, Engine, Knobs, PassResult, Reader};
use crate::stats::{drop_caches, peak_rss_bytes, write_json, Machine, Summary};
use std::io::IsTerminal;

use crate::dataset::Preset;

/// Settings of a read sweep.
#[derive(Debug, Clone)]
pub(crate) struct ReadBenchConfig {
    pub engines: Vec<Engine>,
    /// Threads for posix-threads (the first also for memory).
    pub threads: Vec<usize>,
    /// Queue depths for the uring engines.
    pub depths: Vec<usize>,
    /// Ring counts for the uring engines.
    pub rings: Vec<usize>,
    pub repeats: usize,
    pub warm: bool,
    pub drop_caches: bool,
    pub knobs: Knobs,
    pub json: Option<PathBuf>,
    pub plot: Option<PathBuf>,
    pub seed: u64,
}

#[derive(Debug, Serialize)]
struct Point {
    engine: Engine,
    concurrency: usize,
    rings: usize,
    unit: &'static str,
    mb_per_sec: Summary,
    files_per_sec: Summary,
    cpu_seconds_per_gib: Summary,
    latency_p50_ms: Summary,
    latency_p99_ms: Summary,
    /// Per repeat: this point's MB/s over the same engine's at concurrency 1 (same rings).
    speedup_vs_concurrency_1: Option<Summary>,
    /// Per repeat: this point's MB/s over the best posix-threads point's.
    ratio_to_posix_best: Option<Summary>,
    skipped_files: u64,
    runs: Vec<PassResult>,
}

/// An engine asked for that the dataset's file system cannot serve, left out of the sweep.
#[derive(Debug, Serialize)]
struct SkippedEngine {
    engine: Engine,
    reason: String,
}

#[derive(Debug, Serialize)]
struct Headline {
    best_overall: Option<PointRef>,
    posix_best: Option<PointRef>,
    uring_direct_best: Option<PointRef>,
    /// Best uring-direct point with one ring (one driver thread) over the best point of any
    /// engine, by median MB/s.
    uring_direct_one_ring_over_best: Option<f64>,
    /// Per repeat: uring-direct CPU s/GiB at its best point over posix-threads' at its best.
    cpu_per_gib_uring_direct_over_posix: Option<Summary>,
    uring_buffered_best: Option<PointRef>,
    /// Per repeat: uring-buffered CPU s/GiB at its best point over posix-threads' at its best.
    cpu_per_gib_uring_buffered_over_posix: Option<Summary>,
}

#[derive(Debug, Serialize)]
struct PointRef {
    engine: Engine,
    concurrency: usize,
    rings: usize,
    mb_per_sec_median: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    schema: &'static str,
    machine: Machine,
    storage: Storage,
    dataset: DatasetInfo,
    repeats: usize,
    cold: bool,
    knobs: Knobs,
    /// Engines asked for but not run, with the reason (uring-direct where the file system has
    /// no direct I/O, e.g. tmpfs).
    skipped_engines: Vec<SkippedEngine>,
    points: Vec<Point>,
    headline: Headline,
    peak_rss_bytes: u64,
    buffer_pool_bytes_max: u64,
}

#[derive(Debug, Serialize)]
struct Storage {
    path: String,
    filesystem: &'static str,
}

#[derive(Debug, Serialize)]
struct DatasetInfo {
    files: usize,
    bytes: u64,
    median_file_bytes: u64,
    max_file_bytes: u64,
    checksums: bool,
}

/// Runs the sweep over `ds`, prints the table, writes JSON and plot if asked; returns JSON.
pub(crate) fn run(cfg: &ReadBenchConfig, ds: &Dataset) -> Result<serde_json::Value> {
    if cfg.repeats == 0 {
        bail!("--repeats must be at least 1");
    }
    if cfg.engines.is_empty() || cfg.threads.is_empty() || cfg.depths.is_empty() || cfg.rings.is_empty() {
        bail!("need at least one engine, concurrency and ring count");
    }
    if cfg.threads.contains(&0) || cfg.depths.contains(&0) || cfg.rings.contains(&0) {
        bail!("concurrency and ring counts must be at least 1");
    }
    let fs = ringtier_core::fs::fs_type_name(&ds.root);
    // An engine the file system cannot serve is left out, and the table and JSON say so.
    let mut skipped = Vec::new();
    let mut engines = Vec::new();
    for &e in &cfg.engines {
        if e == Engine::UringDirect && ringtier_core::fs::dir_supports_direct_io(&ds.root) == Some(false) {
            skipped.push(SkippedEngine {
                engine: e,
                reason: format!("{} ({fs}) has no direct I/O (statx reports no DIO alignment)", ds.root.display()),
            });
        } else if !engines.contains(&e) {
            engines.push(e);
        }
    }
    for s in &skipped {
        eprintln!("skipping {}: {}", s.engine, s.reason);
    }
    if engines.is_empty() {
        bail!(
            "no engine can read {}: {}; use --engines posix-threads,uring-buffered",
            ds.root.display(),
            skipped.iter().map(|s| format!("{}: {}", s.engine, s.reason)).collect::<Vec<_>>().join("; ")
        );
    }
    let mut points: Vec<(Engine, usize, usize)> = Vec::new();
    for &e in &engines {
        let concurrency: Vec<usize> = match e {
            Engine::Memory => cfg.threads.iter().copied().take(1).collect(),
            Engine::PosixThreads => cfg.threads.clone(),
            Engine::UringDirect | Engine::UringBuffered => cfg.depths.clone(),
        };
        let rings: &[usize] = if e.is_uring() { &cfg.rings } else { &[1] };
        for &r in rings {
            points.extend(concurrency.iter().map(|&c| (e, c, r)));
        }
    }
    let mut readers = Vec::new();
    let mut pool_bytes = 0u64;
    for &(e, c, r) in &points {
        readers.push(Reader::new(e, c, r, ds, cfg.knobs).with_context(|| format!("setting up {e} at {c}"))?);
        let batch = (c * r).max(16) as u64;
        let buf = crate::passes::buffer_size(crate::passes::chunk_size(cfg.knobs.read_size, ds.max_size()));
        pool_bytes = pool_bytes.max(2 * batch * buf as u64);
    }
    eprintln!(
        "reading {} files ({:.1} MB) in {} ({fs}): {} points x {} repeats, {}",
        ds.len(),
        ds.total_bytes() as f64 / 1e6,
        ds.root.display(),
        points.len(),
        cfg.repeats,
        if cfg.warm { "warm" } else { "cold" }
    );
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut runs: Vec<Vec<PassResult>> = vec![Vec::new(); points.len()];
    for r in 0..cfg.repeats {
        // Interleaved: every point once per repeat, so drift hits all of them alike.
        for (i, reader) in readers.iter().enumerate() {
            if cfg.drop_caches && !cfg.warm {
                drop_caches().context("dropping the page cache (needs root)")?;
            }
            let order = order_of(ds, cfg.knobs.order, cfg.seed + r as u64)?;
            let res = rt.block_on(reader.pass(ds, &order, cfg.warm))?;
            eprintln!(
                "  repeat {}/{}: {:<15} {:>3} {:<7} {:>2} ring(s) {:>8.1} MB/s {:>6.2} CPU s/GiB p99 {:.2} ms{}",
                r + 1,
                cfg.repeats,
                reader.engine.as_str(),
                reader.concurrency,
                reader.engine.concurrency_unit(),
                reader.rings,
                res.mb_per_sec(),
                res.cpu_seconds_per_gib(),
                res.latency_p99_ms,
                if res.skipped > 0 { format!(", {} skipped", res.skipped) } else { String::new() }
            );
            runs[i].push(res);
        }
    }
    drop(readers);

    let median_mb = |i: usize| Summary::of(&runs[i].iter().map(|r| r.mb_per_sec()).collect::<Vec<_>>()).median;
    let best = |pred: &dyn Fn(&(Engine, usize, usize)) -> bool| {
        (0..points.len()).filter(|&i| pred(&points[i])).max_by(|&a, &b| median_mb(a).total_cmp(&median_mb(b)))
    };
    let posix_best = best(&|p| p.0 == Engine::PosixThreads);
    let uring_best = best(&|p| p.0 == Engine::UringDirect);
    let uring_buffered_best = best(&|p| p.0 == Engine::UringBuffered);
    let uring_one_ring = best(&|p| p.0 == Engine::UringDirect && p.2 == 1);
    let overall = best(&|p| p.0 != Engine::Memory);
    let ratio = |i: usize, j: usize, f: &dyn Fn(&PassResult) -> f64| {
        Summary::of(&runs[i].iter().zip(&runs[j]).map(|(a, b)| f(a) / f(b)).collect::<Vec<_>>())
    };
    let mb = |r: &PassResult| r.mb_per_sec();
    let point_ref = |i: usize| PointRef {
        engine: points[i].0,
        concurrency: points[i].1,
        rings: points[i].2,
        mb_per_sec_median: median_mb(i),
    };

    let mut out = Vec::new();
    for (i, &(engine, c, rings)) in points.iter().enumerate() {
        let s = |f: &dyn Fn(&PassResult) -> f64| Summary::of(&runs[i].iter().map(f).collect::<Vec<_>>());
        let base = points.iter().position(|&(e, c1, r1)| e == engine && c1 == 1 && r1 == rings);
        out.push(Point {
            engine,
            concurrency: c,
            rings,
            unit: engine.concurrency_unit(),
            mb_per_sec: s(&mb),
            files_per_sec: s(&|r| r.files_per_sec()),
            cpu_seconds_per_gib: s(&|r| r.cpu_seconds_per_gib()),
            latency_p50_ms: s(&|r| r.latency_p50_ms),
            latency_p99_ms: s(&|r| r.latency_p99_ms),
            speedup_vs_concurrency_1: base.map(|b| ratio(i, b, &mb)),
            ratio_to_posix_best: posix_best.map(|p| ratio(i, p, &mb)),
            skipped_files: runs[i].iter().map(|r| r.skipped).sum(),
            runs: runs[i].clone(),
        });
    }
    let headline = Headline {
        best_overall: overall.map(point_ref),
        posix_best: posix_best.map(point_ref),
        uring_direct_best: uring_best.map(point_ref),
        uring_direct_one_ring_over_best: match (uring_one_ring, overall) {
            (Some(u), Some(o)) => Some(median_mb(u) / median_mb(o)),
            _ => None,
        },
        cpu_per_gib_uring_direct_over_posix: match (uring_best, posix_best) {
            (Some(u), Some(p)) => Some(ratio(u, p, &|r| r.cpu_seconds_per_gib())),
            _ => None,
        },
        uring_buffered_best: uring_buffered_best.map(point_ref),
        cpu_per_gib_uring_buffered_over_posix: match (uring_buffered_best, posix_best) {
            (Some(u), Some(p)) => Some(ratio(u, p, &|r| r.cpu_seconds_per_gib())),
            _ => None,
        },
    };
    print_table(ds, fs, cfg, &out, &headline, &skipped);
    let report = Report {
        schema: "ringtier.bench.read/1",
        machine: Machine::probe(),
        storage: Storage { path: ds.root.display().to_string(), filesystem: fs },
        dataset: DatasetInfo {
            files: ds.len(),
            bytes: ds.total_bytes(),
            median_file_bytes: ds.median_size(),
            max_file_bytes: ds.max_size(),
            checksums: ds.has_checksums,
        },
        repeats: cfg.repeats,
        cold: !cfg.warm,
        knobs: cfg.knobs,
        skipped_engines: skipped,
        points: out,
        headline,
        peak_rss_bytes: peak_rss_bytes(),
        buffer_pool_bytes_max: pool_bytes,
    };
    if let Some(path) = &cfg.plot {
        plot(&report, path).with_context(|| format!("writing the plot {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    let value = serde_json::to_value(&report)?;
    write_json(cfg.json.as_deref(), &value)?;
    Ok(value)
}

fn print_table(
    ds: &Dataset,
    fs: &str,
    cfg: &ReadBenchConfig,
    points: &[Point],
    h: &Headline,
    skipped: &[SkippedEngine],
) {
    println!();
    println!(
        "{} files, {:.1} MB (median {:.0} KB), on {fs}; {} pass(es) per point, {}, shuffled; min/median/max",
        ds.len(),
        ds.total_bytes() as f64 / 1e6,
        ds.median_size() as f64 / 1e3,
        cfg.repeats,
        if cfg.warm { "warm" } else { "cold (posix_fadvise DONTNEED before each pass)" }
    );
    for s in skipped {
        println!("{:<15} skipped: {}", s.engine.as_str(), s.reason);
    }
    println!(
        "{:<15} {:>12} {:>5}  {:>26}  {:>8}  {:>20}  {:>7} {:>7}  {:>7}  {:>7}",
        "engine", "concurrency", "rings", "MB/s", "files/s", "CPU s/GiB", "p50 ms", "p99 ms", "speedup", "x posix"
    );
    for p in points {
        let (m, c) = (&p.mb_per_sec, &p.cpu_seconds_per_gib);
        let opt = |s: Option<Summary>| s.map(|r| format!("{:.2}", r.median)).unwrap_or_else(|| "-".into());
        println!(
            "{:<15} {:>4} {:<7} {:>5}  {:>8.1} {:>8.1} {:>8.1}  {:>8.0}  {:>6.2} {:>6.2} {:>6.2}  {:>7.2} {:>7.2}  {:>7}  {:>7}{}",
            p.engine.as_str(),
            p.concurrency,
            p.unit,
            p.rings,
            m.min,
            m.median,
            m.max,
            p.files_per_sec.median,
            c.min,
            c.median,
            c.max,
            p.latency_p50_ms.median,
            p.latency_p99_ms.median,
            opt(p.speedup_vs_concurrency_1),
            opt(p.ratio_to_posix_best),
            if p.skipped_files > 0 { format!("  ({} skipped)", p.skipped_files) } else { String::new() }
        );
    }
    if let (Some(u), Some(p), Some(r)) = (&h.uring_direct_best, &h.posix_best, h.cpu_per_gib_uring_direct_over_posix) {
        println!(
            "CPU per GiB, uring-direct (depth {}, {} ring) / posix-threads (best: {} threads): {:.2} (min {:.2}, max {:.2})",
            u.concurrency, u.rings, p.concurrency, r.median, r.min, r.max
        );
    }
    if let (Some(v), Some(b)) = (h.uring_direct_one_ring_over_best, &h.best_overall) {
        println!(
            "uring-direct with one driver thread reaches {:.0}% of the best point ({} at {} {})",
            v * 100.0,
            b.engine,
            b.concurrency,
            b.engine.concurrency_unit()
        );
    }
}

/// Bandwidth against concurrency, one line per engine (and ring count): the paper's figure.
fn plot(report: &Report, path: &Path) -> Result<()> {
    use plotters::prelude::*;
    let xs: Vec<usize> = {
        let mut v: Vec<usize> = report.points.iter().map(|p| p.concurrency).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let x_of = |c: usize| xs.iter().position(|&x| x == c).unwrap_or(0) as f64;
    let ymax = report.points.iter().map(|p| p.mb_per_sec.max).fold(0.0, f64::max) * 1.1;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let title = format!(
        "Cold read of {} files ({:.0} MB, {}), median of {} passes",
        report.dataset.files,
        report.dataset.bytes as f64 / 1e6,
        report.storage.filesystem,
        report.repeats
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.3f64..(xs.len() as f64 - 0.7), 0f64..ymax.max(1.0))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_labels(xs.len())
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                xs.get(i as usize).map(|c| c.to_string()).unwrap_or_default()
            } else {
                String::new()
            }
        })
        .x_desc("concurrency (threads for posix, queue depth for io_uring)")
        .y_desc("MB/s")
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut series: Vec<(Engine, usize)> = report.points.iter().map(|p| (p.engine, p.rings)).collect();
    series.dedup();
    let colors = [RED, BLUE, GREEN, MAGENTA, CYAN, BLACK];
    for (k, &(engine, rings)) in series.iter().enumerate() {
        let color = colors[k % colors.len()];
        let pts: Vec<(f64, f64)> = report
            .points
            .iter()
            .filter(|p| p.engine == engine && p.rings == rings)
            .map(|p| (x_of(p.concurrency), p.mb_per_sec.median))
            .collect();
        let label = if engine.is_uring() { format!("{engine} ({rings} ring)") } else { engine.to_string() };
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart
            .draw_series(pts.iter().map(|&(x, y)| Circle::new((x, y), 4, color.filled())))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        // min..max whiskers
        for p in report.points.iter().filter(|p| p.engine == engine && p.rings == rings) {
            let x = x_of(p.concurrency);
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(x, p.mb_per_sec.min), (x, p.mb_per_sec.max)],
                    color,
                )))
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

/// `ringtier bench read`.
pub(crate) fn command(a: crate::args::ReadArgs) -> anyhow::Result<()> {
    if let Some(url) = a.dir.to_str().filter(|d| ringtier_s3::S3Config::is_s3_url(d)) {
        if a.format != crate::recbench::ReadFormat::Files {
            bail!("--format {:?} reads local shards; an S3 dataset is read as objects (--format files)", a.format);
        }
        return crate::s3bench::read_dataset(url, &a);
    }
    if let Some(ms) = a.latency_ms {
        if a.format != crate::recbench::ReadFormat::Files {
            bail!("--latency-ms reads files through the throttled layer; not with --format {:?}", a.format);
        }
        return crate::s3bench::read_files_throttled(&a, ms);
    }
    if a.format != crate::recbench::ReadFormat::Files {
        return crate::recbench::bench(&a);
    }
    let ds = Dataset::open(&a.dir)?;
    let threads = a.threads.unwrap_or_else(|| a.concurrency.clone());
    let cfg = a.io.read_bench(a.engines, threads, a.depths.unwrap_or(a.concurrency), a.seed);
    run(&cfg, &ds)?;
    Ok(())
}

/// `ringtier demo`: a small generated dataset read, cold, through every tier.
pub(crate) fn demo(a: crate::args::DemoArgs) -> Result<()> {
    let spec = a.shape.spec(Preset::Small)?;
    let tmp;
    let root = match &a.dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::Builder::new().prefix("ringtier-demo-").tempdir().context("creating a temp dir")?;
            tmp.path().to_path_buf()
        }
    };
    eprintln!(
        "generating {} files (median {} KB, seed {}) in {}",
        spec.files,
        spec.median_bytes / 1000,
        spec.seed,
        root.display()
    );
    let ds = crate::dataset::generate(&root, &spec, true, std::io::stderr().is_terminal())?;
    let cfg = a.io.read_bench(Engine::ALL.to_vec(), vec![a.threads], vec![a.depth], 1000);
    let result = run(&cfg, &ds);
    if a.dir.is_some() {
        for f in &ds.manifest.entries {
            let _ = std::fs::remove_file(ds.root.join(&f.key));
        }
        let _ = std::fs::remove_file(ds.root.join(ringtier_loader::manifest::MANIFEST_FILE));
    }
    result.map(|_| ())
}
