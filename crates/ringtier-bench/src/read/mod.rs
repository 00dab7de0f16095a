//! `ringtier bench read` (and the demo): the paper's read micro-benchmark. One cold,
//! shuffled epoch over a dataset per pass, through each engine, over a sweep of concurrency,
//! repeats interleaved; a table, JSON with a stable schema (`docs/BENCH_READ.md`) and an SVG
//! plot of bandwidth against concurrency. An S3 dataset or `--latency-ms` goes to `remote.rs`,
//! `--format tfrecord|wds` to `records.rs`.

pub(crate) mod args;
pub(crate) mod pass;
pub(crate) mod records;
pub(crate) mod remote;

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::dataset::{Dataset, Preset};
use crate::harness::plot::{line_plot, Axes, Series};
use crate::harness::{interleaved, peak_rss_bytes, write_json, Cold, ColdMethod, Machine, Storage, Summary};
use args::{DemoArgs, ReadArgs};
use pass::{order_of, Engine, Knobs, PassResult, Reader};
use records::ReadFormat;

/// Settings of a read sweep.
#[derive(Debug, Clone)]
pub(crate) struct ReadBenchConfig {
    pub(crate) engines: Vec<Engine>,
    /// Threads for posix-threads (the first also for memory).
    pub(crate) threads: Vec<usize>,
    /// Queue depths for the uring engines.
    pub(crate) depths: Vec<usize>,
    /// Ring counts for the uring engines.
    pub(crate) rings: Vec<usize>,
    pub(crate) repeats: usize,
    pub(crate) warm: bool,
    pub(crate) drop_caches: bool,
    pub(crate) knobs: Knobs,
    pub(crate) json: Option<PathBuf>,
    pub(crate) plot: Option<PathBuf>,
    pub(crate) seed: u64,
}

/// One (engine, concurrency, rings) point over the repeats.
#[derive(Debug, Serialize)]
pub(crate) struct Point {
    pub(crate) engine: Engine,
    pub(crate) concurrency: usize,
    pub(crate) rings: usize,
    pub(crate) unit: &'static str,
    pub(crate) mb_per_sec: Summary,
    pub(crate) files_per_sec: Summary,
    pub(crate) cpu_seconds_per_gib: Summary,
    pub(crate) latency_p50_ms: Summary,
    pub(crate) latency_p99_ms: Summary,
    /// Per repeat: this point's MB/s over the same engine's at concurrency 1 (same rings).
    pub(crate) speedup_vs_concurrency_1: Option<Summary>,
    /// Per repeat: this point's MB/s over the best posix-threads point's.
    pub(crate) ratio_to_posix_best: Option<Summary>,
    pub(crate) skipped_files: u64,
    pub(crate) runs: Vec<PassResult>,
}

/// An engine asked for that the dataset's file system cannot serve, left out of the sweep.
#[derive(Debug, Serialize)]
pub(crate) struct SkippedEngine {
    pub(crate) engine: Engine,
    pub(crate) reason: String,
}

/// The sweep's answers.
#[derive(Debug, Serialize)]
pub(crate) struct Headline {
    pub(crate) best_overall: Option<PointRef>,
    pub(crate) posix_best: Option<PointRef>,
    pub(crate) uring_direct_best: Option<PointRef>,
    /// Best uring-direct point with one ring (one driver thread) over the best point of any
    /// engine, by median MB/s.
    pub(crate) uring_direct_one_ring_over_best: Option<f64>,
    /// Per repeat: uring-direct CPU s/GiB at its best point over posix-threads' at its best.
    pub(crate) cpu_per_gib_uring_direct_over_posix: Option<Summary>,
    pub(crate) uring_buffered_best: Option<PointRef>,
    /// Per repeat: uring-buffered CPU s/GiB at its best point over posix-threads' at its best.
    pub(crate) cpu_per_gib_uring_buffered_over_posix: Option<Summary>,
}

/// A point named by its engine and settings.
#[derive(Debug, Serialize)]
pub(crate) struct PointRef {
    pub(crate) engine: Engine,
    pub(crate) concurrency: usize,
    pub(crate) rings: usize,
    pub(crate) mb_per_sec_median: f64,
}

/// The report of `bench read` (`ringtier.bench.read/1`, `docs/BENCH_READ.md`).
#[derive(Debug, Serialize)]
pub(crate) struct ReadReport {
    pub(crate) schema: &'static str,
    pub(crate) machine: Machine,
    pub(crate) storage: Storage,
    pub(crate) dataset: DatasetInfo,
    pub(crate) repeats: usize,
    pub(crate) cold: bool,
    /// How the passes were made cold (`drop_caches`, `posix_fadvise(DONTNEED)` or `warm`).
    pub(crate) cold_method: ColdMethod,
    pub(crate) knobs: Knobs,
    /// Engines asked for but not run, with the reason (uring-direct where the file system has
    /// no direct I/O, e.g. tmpfs).
    pub(crate) skipped_engines: Vec<SkippedEngine>,
    pub(crate) points: Vec<Point>,
    pub(crate) headline: Headline,
    pub(crate) peak_rss_bytes: u64,
    pub(crate) buffer_pool_bytes_max: u64,
}

/// The dataset read.
#[derive(Debug, Serialize)]
pub(crate) struct DatasetInfo {
    pub(crate) files: usize,
    pub(crate) bytes: u64,
    pub(crate) median_file_bytes: u64,
    pub(crate) max_file_bytes: u64,
    pub(crate) checksums: bool,
}

/// This process's soft locked-memory limit as `/proc/self/limits` says it ("65536 bytes",
/// "unlimited").
fn memlock_limit() -> String {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    limits
        .lines()
        .find_map(|l| l.strip_prefix("Max locked memory"))
        .and_then(|rest| rest.split_whitespace().next())
        .map_or(
            "unknown".to_string(),
            |soft| if soft == "unlimited" { soft.to_string() } else { format!("{soft} bytes") },
        )
}

/// Whether `err` is io_uring's set-up refused for memory at every ring size.
fn ring_refused_for_memory(err: &anyhow::Error) -> bool {
    err.chain().any(|c| {
        c.downcast_ref::<ringtier_core::Error>().is_some_and(|e| {
            e.kind() == ringtier_core::ErrorKind::ResourceExhausted
                && e.operation() == Some(ringtier_core::Operation::Setup)
        })
    })
}

/// Runs the sweep over `ds`, prints the table, writes JSON and plot if asked; returns JSON.
pub(crate) fn run(cfg: &ReadBenchConfig, ds: &Dataset) -> Result<ReadReport> {
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
    let uring = ringtier_uring::uring_availability();
    for &e in &cfg.engines {
        if let (true, Err(why)) = (e.is_uring(), &uring) {
            // io_uring refused (a container's seccomp profile, the sysctl, memlock): the
            // thread pool runs alone and the table and JSON say why.
            skipped.push(SkippedEngine { engine: e, reason: format!("{why}; to use io_uring: {}", why.remedy()) });
        } else if e == Engine::UringDirect && ringtier_core::fs::dir_supports_direct_io(&ds.root) == Some(false) {
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
    let mut kept = Vec::new();
    for &(e, c, r) in &points {
        match Reader::new(e, c, r, ds, cfg.knobs) {
            Ok(reader) => readers.push(reader),
            // A ring the locked-memory limit refuses even at its smallest (`ulimit -l` as in
            // many containers; every point's rings are held at once): that point is left out
            // and the table says why, the rest run.
            Err(err) if e.is_uring() && ring_refused_for_memory(&err) => {
                let limit = memlock_limit();
                let reason = format!(
                    "at concurrency {c} x {r} ring(s): io_uring_setup failed with ENOMEM at every ring size \
                     (locked-memory limit {limit}; raise `ulimit -l`)"
                );
                eprintln!("skipping {e}: {reason}");
                skipped.push(SkippedEngine { engine: e, reason });
                continue;
            }
            Err(err) => return Err(err.context(format!("setting up {e} at {c}"))),
        }
        kept.push((e, c, r));
        let batch = (c * r).max(16) as u64;
        let buf = pass::buffer_size(pass::chunk_size(cfg.knobs.read_size, ds.max_size()));
        pool_bytes = pool_bytes.max(2 * batch * buf as u64);
    }
    let points = kept;
    eprintln!(
        "reading {} files ({:.1} MB) in {} ({fs}): {} points x {} repeats, {}",
        ds.len(),
        ds.total_bytes() as f64 / 1e6,
        ds.root.display(),
        points.len(),
        cfg.repeats,
        if cfg.warm { "warm" } else { "cold" }
    );
    let rt = crate::runtime(0)?;
    let cold = Cold {
        warm: cfg.warm,
        require_drop_caches: cfg.drop_caches,
        tolerate_unreadable: cfg.knobs.on_error == pass::OnError::Skip,
        ..Cold::new()
    };
    let files: Vec<PathBuf> = ds.manifest.entries.iter().map(|f| ds.root.join(&f.key)).collect();
    let mut cold_method = ColdMethod::Warm;
    // Interleaved: every point once per repeat, so drift hits all of them alike.
    let runs: Vec<Vec<PassResult>> = interleaved(cfg.repeats, &readers, false, |r, reader| {
        cold_method = cold.pass(&files)?;
        let order = order_of(ds, cfg.knobs.order, cfg.seed + r as u64)?;
        let res = rt.block_on(reader.pass(ds, &order))?;
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
        Ok(res)
    })?;
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
        Summary::ratio(&runs[i].iter().map(f).collect::<Vec<_>>(), &runs[j].iter().map(f).collect::<Vec<_>>())
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
        let s = |f: &dyn Fn(&PassResult) -> f64| Summary::by(&runs[i], f);
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
    print_table(ds, fs, cfg, cold_method, &out, &headline, &skipped);
    let report = ReadReport {
        schema: "ringtier.bench.read/1",
        machine: Machine::probe(),
        storage: Storage::of(&ds.root),
        dataset: DatasetInfo {
            files: ds.len(),
            bytes: ds.total_bytes(),
            median_file_bytes: ds.median_size(),
            max_file_bytes: ds.max_size(),
            checksums: ds.has_checksums,
        },
        repeats: cfg.repeats,
        cold: !cfg.warm,
        cold_method,
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
    write_json(cfg.json.as_deref(), &report)?;
    Ok(report)
}

fn print_table(
    ds: &Dataset,
    fs: &str,
    cfg: &ReadBenchConfig,
    cold: ColdMethod,
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
        if cfg.warm { "warm".to_string() } else { format!("cold ({cold} before each pass)") }
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
fn plot(report: &ReadReport, path: &std::path::Path) -> Result<()> {
    let xs: Vec<usize> = {
        let mut v: Vec<usize> = report.points.iter().map(|p| p.concurrency).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let x_of = |c: usize| xs.iter().position(|&x| x == c).unwrap_or(0);
    let mut keys: Vec<(Engine, usize)> = report.points.iter().map(|p| (p.engine, p.rings)).collect();
    keys.dedup();
    let series: Vec<Series> = keys
        .into_iter()
        .map(|(engine, rings)| Series {
            label: if engine.is_uring() { format!("{engine} ({rings} ring)") } else { engine.to_string() },
            points: report
                .points
                .iter()
                .filter(|p| p.engine == engine && p.rings == rings)
                .map(|p| (x_of(p.concurrency), p.mb_per_sec))
                .collect(),
        })
        .collect();
    let x_labels: Vec<String> = xs.iter().map(|x| x.to_string()).collect();
    let axes = Axes {
        title: format!(
            "Cold read of {} files ({:.0} MB, {}), median of {} passes",
            report.dataset.files,
            report.dataset.bytes as f64 / 1e6,
            report.storage.filesystem,
            report.repeats
        ),
        x_labels: &x_labels,
        x_desc: "concurrency (threads for posix, queue depth for io_uring)",
        y_desc: "MB/s",
    };
    line_plot(path, &axes, &series)
}

/// `ringtier bench read`.
pub(crate) fn command(a: ReadArgs) -> Result<()> {
    if let Some(url) = a.dir.to_str().filter(|d| ringtier_s3::S3Config::is_s3_url(d)) {
        if a.format != ReadFormat::Files {
            bail!("--format {:?} reads local shards; an S3 dataset is read as objects (--format files)", a.format);
        }
        return remote::read_dataset(url, &a);
    }
    if let Some(ms) = a.latency_ms {
        if a.format != ReadFormat::Files {
            bail!("--latency-ms reads files through the throttled layer; not with --format {:?}", a.format);
        }
        return remote::read_files_throttled(&a, ms);
    }
    if a.format != ReadFormat::Files {
        return records::bench(&a);
    }
    let ds = Dataset::open(&a.dir)?;
    let threads = a.threads.unwrap_or_else(|| a.concurrency.clone());
    let cfg = a.io.read_bench(a.engines, threads, a.depths.unwrap_or(a.concurrency), a.seed);
    run(&cfg, &ds)?;
    Ok(())
}

/// `ringtier demo`: a small generated dataset read, cold, through every tier.
pub(crate) fn demo(a: DemoArgs) -> Result<()> {
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
        let _ = std::fs::remove_file(ds.root.join(ringtier_dataset::manifest::MANIFEST_FILE));
    }
    result.map(|_| ())
}
