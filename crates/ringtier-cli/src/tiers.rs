//! `ringtier demo` and `ringtier bench tiers`: a generated dataset read, cold and shuffled,
//! through every engine, with repeats interleaved and a table plus JSON out.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::dataset::{generate, Dataset, DatasetSpec};
use crate::passes::{Engine, PassResult, Reader, UringKnobs};
use crate::stats::{drop_caches, peak_rss_bytes, Machine, Summary};

/// Settings of a tier sweep.
#[derive(Debug, Clone)]
pub(crate) struct TiersConfig {
    pub dir: Option<PathBuf>,
    pub keep: bool,
    pub spec: DatasetSpec,
    pub engines: Vec<Engine>,
    pub threads: Vec<usize>,
    pub depths: Vec<usize>,
    pub repeats: usize,
    pub warm: bool,
    pub drop_caches: bool,
    pub knobs: UringKnobs,
    pub json: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
struct Point {
    engine: Engine,
    concurrency: usize,
    unit: &'static str,
    runs: Vec<PassResult>,
    mb_per_sec: Summary,
    files_per_sec: Summary,
    cpu_seconds_per_gib: Summary,
    /// Median of the per-repeat ratio of this point's MB/s to the best posix point's.
    ratio_to_posix_best: Option<Summary>,
}

#[derive(Debug, Serialize)]
struct Headline {
    posix_best_threads: Option<usize>,
    posix_best_mb_per_sec: Option<f64>,
    uring_direct_best_depth: Option<usize>,
    uring_direct_best_mb_per_sec: Option<f64>,
    /// uring-direct CPU s/GiB at its best depth over posix's at its best thread count,
    /// per repeat (min/median/max).
    cpu_per_gib_ratio_uring_direct_to_posix: Option<Summary>,
}

#[derive(Debug, Serialize)]
struct Report {
    schema: &'static str,
    machine: Machine,
    storage: Storage,
    dataset: DatasetInfo,
    repeats: usize,
    cold: bool,
    uring: UringKnobs,
    points: Vec<Point>,
    headline: Headline,
    peak_rss_bytes: u64,
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
    seed: u64,
}

/// Runs the sweep and prints the table; returns the report's JSON.
pub(crate) fn run(cfg: &TiersConfig) -> Result<serde_json::Value> {
    if cfg.repeats == 0 {
        bail!("--repeats must be at least 1");
    }
    if cfg.engines.is_empty() {
        bail!("no engine to run");
    }
    let tmp;
    let root = match &cfg.dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::Builder::new().prefix("ringtier-demo-").tempdir().context("creating a temp dir")?;
            tmp.path().to_path_buf()
        }
    };
    eprintln!(
        "generating {} files (median {} KB, seed {}) in {}",
        cfg.spec.files,
        cfg.spec.median_bytes / 1000,
        cfg.spec.seed,
        root.display()
    );
    let ds = generate(&root, &cfg.spec)?;
    let fs = ringtier_core::fs::fs_type_name(&root);
    let result = sweep(cfg, &ds, fs);
    if cfg.dir.is_some() && !cfg.keep {
        for f in &ds.files {
            let _ = std::fs::remove_file(ds.root.join(&f.key));
        }
    }
    result
}

fn sweep(cfg: &TiersConfig, ds: &Dataset, fs: &'static str) -> Result<serde_json::Value> {
    let mut points: Vec<(Engine, usize)> = Vec::new();
    for &e in &cfg.engines {
        let list = match e {
            Engine::PosixThreads | Engine::Memory => &cfg.threads,
            Engine::UringDirect | Engine::UringBuffered => &cfg.depths,
        };
        let list: Vec<usize> = if e == Engine::Memory { list.iter().copied().take(1).collect() } else { list.clone() };
        points.extend(list.into_iter().map(|c| (e, c)));
    }
    let mut readers = Vec::new();
    for &(e, c) in &points {
        readers.push(Reader::new(e, c, ds, cfg.knobs).with_context(|| format!("setting up {e} at {c}"))?);
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut runs: Vec<Vec<PassResult>> = vec![Vec::new(); points.len()];
    for r in 0..cfg.repeats {
        // Interleaved: every point once per repeat, so drift hits all of them alike.
        for (i, reader) in readers.iter().enumerate() {
            if cfg.drop_caches && !cfg.warm {
                drop_caches().context("dropping the page cache (needs root)")?;
            }
            let res = rt.block_on(reader.pass(ds, 1000 + r as u64, cfg.warm))?;
            eprintln!(
                "  repeat {}/{}: {:<15} {:>3} {:<7} {:>8.1} MB/s {:>6.2} CPU s/GiB",
                r + 1,
                cfg.repeats,
                reader.engine.as_str(),
                reader.concurrency,
                reader.engine.concurrency_unit(),
                res.mb_per_sec(),
                res.cpu_seconds_per_gib()
            );
            runs[i].push(res);
        }
    }
    drop(readers);

    let median_mb = |i: usize| Summary::of(&runs[i].iter().map(|r| r.mb_per_sec()).collect::<Vec<_>>()).median;
    let best_of = |engine: Engine| {
        points
            .iter()
            .enumerate()
            .filter(|(_, p)| p.0 == engine)
            .max_by(|a, b| median_mb(a.0).total_cmp(&median_mb(b.0)))
            .map(|(i, _)| i)
    };
    let posix_best = best_of(Engine::PosixThreads);
    let uring_best = best_of(Engine::UringDirect);
    let per_repeat_ratio = |i: usize, j: usize, f: &dyn Fn(&PassResult) -> f64| {
        Summary::of(&runs[i].iter().zip(&runs[j]).map(|(a, b)| f(a) / f(b)).collect::<Vec<_>>())
    };

    let mut out_points = Vec::new();
    for (i, &(engine, c)) in points.iter().enumerate() {
        let s = |f: &dyn Fn(&PassResult) -> f64| Summary::of(&runs[i].iter().map(f).collect::<Vec<_>>());
        out_points.push(Point {
            engine,
            concurrency: c,
            unit: engine.concurrency_unit(),
            mb_per_sec: s(&|r| r.mb_per_sec()),
            files_per_sec: s(&|r| r.files_per_sec()),
            cpu_seconds_per_gib: s(&|r| r.cpu_seconds_per_gib()),
            ratio_to_posix_best: posix_best.map(|p| per_repeat_ratio(i, p, &|r| r.mb_per_sec())),
            runs: runs[i].clone(),
        });
    }
    let headline = Headline {
        posix_best_threads: posix_best.map(|i| points[i].1),
        posix_best_mb_per_sec: posix_best.map(median_mb),
        uring_direct_best_depth: uring_best.map(|i| points[i].1),
        uring_direct_best_mb_per_sec: uring_best.map(median_mb),
        cpu_per_gib_ratio_uring_direct_to_posix: match (uring_best, posix_best) {
            (Some(u), Some(p)) => Some(per_repeat_ratio(u, p, &|r| r.cpu_seconds_per_gib())),
            _ => None,
        },
    };
    print_table(ds, fs, cfg, &out_points, &headline);
    let report = Report {
        schema: "ringtier.bench.tiers/1",
        machine: Machine::probe(),
        storage: Storage { path: ds.root.display().to_string(), filesystem: fs },
        dataset: DatasetInfo {
            files: ds.files.len(),
            bytes: ds.total_bytes(),
            median_file_bytes: {
                let mut s: Vec<u64> = ds.files.iter().map(|f| f.size).collect();
                s.sort_unstable();
                s[s.len() / 2]
            },
            max_file_bytes: ds.max_size(),
            seed: cfg.spec.seed,
        },
        repeats: cfg.repeats,
        cold: !cfg.warm,
        uring: cfg.knobs,
        points: out_points,
        headline,
        peak_rss_bytes: peak_rss_bytes(),
    };
    let value = serde_json::to_value(&report)?;
    if let Some(path) = &cfg.json {
        std::fs::write(path, serde_json::to_string_pretty(&value)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(value)
}

fn print_table(ds: &Dataset, fs: &str, cfg: &TiersConfig, points: &[Point], h: &Headline) {
    println!();
    println!(
        "{} files, {:.1} MB, on {fs}; {} pass(es) per point, {}, shuffled; min/median/max",
        ds.files.len(),
        ds.total_bytes() as f64 / 1e6,
        cfg.repeats,
        if cfg.warm { "warm" } else { "cold (posix_fadvise DONTNEED before each pass)" }
    );
    println!(
        "{:<15} {:>12}  {:>26}  {:>9}  {:>20}  {:>9}",
        "engine", "concurrency", "MB/s", "files/s", "CPU s/GiB", "x posix"
    );
    for p in points {
        let m = &p.mb_per_sec;
        let c = &p.cpu_seconds_per_gib;
        println!(
            "{:<15} {:>4} {:<7}  {:>8.1} {:>8.1} {:>8.1}  {:>9.0}  {:>6.2} {:>6.2} {:>6.2}  {:>9}",
            p.engine.as_str(),
            p.concurrency,
            p.unit,
            m.min,
            m.median,
            m.max,
            p.files_per_sec.median,
            c.min,
            c.median,
            c.max,
            p.ratio_to_posix_best.map(|r| format!("{:.2}", r.median)).unwrap_or_else(|| "-".into())
        );
    }
    if let (Some(pt), Some(ud), Some(r)) =
        (h.posix_best_threads, h.uring_direct_best_depth, h.cpu_per_gib_ratio_uring_direct_to_posix)
    {
        println!(
            "CPU per GiB, uring-direct (depth {ud}) / posix-threads (best: {pt} threads): {:.2} (min {:.2}, max {:.2})",
            r.median, r.min, r.max
        );
    }
}
