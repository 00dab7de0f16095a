//! `ringtier tune`: the kernel I/O tuning lab. Sweeps a declared space of io_uring set-up
//! knobs and block-layer settings over the paper's read workload, every pass cold and the
//! configurations interleaved; reports bandwidth, IOPS, CPU per GiB and latency
//! p50/p99/p99.9 per configuration, the Pareto front, the best configuration as a command
//! line and a loader configuration, a latency breakdown from tracepoints, fio at the same
//! settings, and MLPerf-Storage-style presets (accelerator utilisation). `docs/TUNE.md`.
//!
//! * [`space`]: the knobs, TOML and flags, the sweep;
//! * [`workload`]: what a configuration is measured on: the read micro-benchmark, a loader
//!   epoch, a checkpoint save and restore;
//! * [`block`]: the device's queue settings, changed and always restored;
//! * [`trace`]: where a read's time goes;
//! * [`fio`]: the equivalent fio job and its run;
//! * [`presets`]: unet3d, resnet50, cosmoflow and AU;
//! * [`report`]: the front, the best point, tables and plots.

pub(crate) mod block;
pub(crate) mod fio;
pub(crate) mod presets;
pub(crate) mod report;
pub(crate) mod space;
pub(crate) mod trace;
pub(crate) mod workload;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;

use crate::dataset::{Dataset, DatasetSpec, Preset as DataPreset};
use crate::harness::report::utc_now;
use crate::harness::{interleaved, write_json, Cold, Machine, Storage, Summary};
use crate::read::pass::{order_of, Engine, Knobs, Order, PassResult, Reader};
use space::{Config, Space, Sweep};
use workload::{CkptWorkload, LoaderShape, Workload, WorkloadPass};

/// Arguments of `ringtier tune`.
#[derive(Args, Debug)]
pub struct TuneArgs {
    /// The data: a dataset directory (from `ringtier gen`), or any directory, where a dataset
    /// of small files is generated (in `ringtier-tune-data/`, removed afterwards unless --keep).
    #[arg(long)]
    pub(crate) dir: PathBuf,
    /// What each configuration is measured on: `read` (the paper's read micro-benchmark, a
    /// cold shuffled pass over the files), `loader` (a cold data-loader epoch of raw samples),
    /// `ckpt` (a checkpoint save, then a cold restore into memory).
    #[arg(long, value_enum, default_value = "read")]
    pub(crate) workload: Workload,
    /// Samples per batch of the loader workload.
    #[arg(long, default_value_t = 64)]
    pub(crate) loader_batch: usize,
    /// Batches the loader reads ahead (the loader workload).
    #[arg(long, default_value_t = 2)]
    pub(crate) loader_prefetch: usize,
    /// Size of the checkpoint workload's checkpoint (held in memory twice: the model and the
    /// restore's buffers); default 1G, 256M with --quick.
    #[arg(long, value_parser = crate::parse_size)]
    pub(crate) ckpt_size: Option<u64>,
    /// Parts (files) of the checkpoint workload's checkpoint.
    #[arg(long, default_value_t = 8)]
    pub(crate) ckpt_parts: usize,
    /// A short sweep (at most 3 minutes here): fewer knobs and files, 2 repeats.
    #[arg(long)]
    pub(crate) quick: bool,
    /// The space as TOML (`[uring]` and `[block]` tables of knob = [values]); replaces the
    /// default space.
    #[arg(long)]
    pub(crate) space: Option<PathBuf>,
    /// A knob's values, `NAME=V1,V2` (repeatable), over the default or TOML space; `tune
    /// --list-knobs` names them.
    #[arg(long = "knob")]
    pub(crate) knobs: Vec<String>,
    /// How the space is walked.
    #[arg(long, value_enum)]
    pub(crate) sweep: Option<Sweep>,
    /// Print the knobs and exit.
    #[arg(long)]
    pub(crate) list_knobs: bool,
    /// Passes per configuration (interleaved); default 3, 2 with --quick.
    #[arg(long)]
    pub(crate) repeats: Option<usize>,
    /// Files of a generated dataset; default 4000, 1200 with --quick.
    #[arg(long)]
    pub(crate) files: Option<usize>,
    /// Leave block settings alone (no block knobs).
    #[arg(long)]
    pub(crate) no_block: bool,
    /// Leave transparent huge pages as they are for the fio comparison (by default, where the
    /// mode is `madvise`, it is `always` while fio runs, so that fio's buffers are on huge
    /// pages as ringtier's are; put back after).
    #[arg(long)]
    pub(crate) fio_small_pages: bool,
    /// No tracepoint breakdown.
    #[arg(long)]
    pub(crate) no_trace: bool,
    /// No fio comparison.
    #[arg(long)]
    pub(crate) no_fio: bool,
    /// Size of the big file of the fio comparison.
    #[arg(long, default_value = "1G", value_parser = crate::parse_size)]
    pub(crate) fio_file_size: u64,
    /// MLPerf-Storage-style presets to run with the best configuration: unet3d, resnet50,
    /// cosmoflow (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub(crate) preset: Vec<String>,
    /// Files of each preset's data set (default: the preset's full set, e.g. 56 for unet3d).
    #[arg(long)]
    pub(crate) preset_files: Option<usize>,
    /// Run the preset on the files already in this directory (e.g. DLIO's generated set for the
    /// same workload, `bench/dlio_compare.sh`) instead of generating its own; one preset only.
    #[arg(long)]
    pub(crate) preset_data: Option<PathBuf>,
    /// Most emulated accelerators tried.
    #[arg(long, default_value_t = 64)]
    pub(crate) max_accelerators: usize,
    /// Keep generated data.
    #[arg(long)]
    pub(crate) keep: bool,
    /// Where the report goes (JSON, Markdown, SVG plots, fio jobs).
    #[arg(long, default_value = "ringtier-tune-out")]
    pub(crate) out: PathBuf,
    /// sysfs root (tests point it at a fake tree).
    #[arg(long, default_value = "/sys", hide = true)]
    pub(crate) sysfs: PathBuf,
    /// Sleep this long after block settings are first applied (tests interrupt it there).
    #[arg(long, default_value_t = 0, hide = true)]
    pub(crate) hold_after_apply_ms: u64,
}

/// The report (`ringtier.tune/1`).
#[derive(Debug, Serialize)]
struct TuneReport {
    schema: &'static str,
    date: String,
    machine: Machine,
    storage: Storage,
    /// Every queue setting of the device before the sweep (restored afterwards).
    block_settings_before: Option<std::collections::BTreeMap<String, String>>,
    /// Block settings that could not be written, with the reason (then not swept).
    block_read_only: Vec<block::ReadOnly>,
    notes: Vec<String>,
    /// What each configuration was measured on, and what its latency and IOPS columns mean.
    workload: Workload,
    workload_detail: String,
    latency_is: &'static str,
    iops_is: &'static str,
    dataset: DatasetFacts,
    repeats: usize,
    cold_method: String,
    load_average: String,
    sweep: Sweep,
    seconds: f64,
    points: Vec<report::PointReport>,
    pareto_front: Vec<String>,
    defaults_on_front: bool,
    /// The best point was faster than the defaults in every repeat's pair (otherwise the
    /// difference is within the run-to-run spread and the defaults stand).
    best_beats_defaults_beyond_spread: bool,
    best: Option<Best>,
    trace: Vec<(String, trace::Breakdown)>,
    fio: Vec<FioComparison>,
    presets: Vec<presets::PresetReport>,
}

#[derive(Debug, Serialize)]
struct DatasetFacts {
    path: String,
    files: usize,
    bytes: u64,
    median_file_bytes: u64,
    generated: bool,
}

#[derive(Debug, Serialize)]
struct Best {
    label: String,
    config: Config,
    bench_read: String,
    loader_config: String,
}

#[derive(Debug, Serialize)]
struct FioComparison {
    target: String,
    config: String,
    job_file: String,
    fio_mb_per_sec: Summary,
    ringtier_mb_per_sec: Summary,
    /// ringtier / fio, pair by pair.
    ratio: Summary,
    fio_clat_p99_ms: f64,
    fio_cpu_seconds_per_gib: Summary,
    /// The memory fio's buffers were on (huge pages or not), against ringtier's.
    memory: String,
}

/// Removes generated data when dropped.
struct Cleanup(Option<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(d) = self.0.take() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// `ringtier tune`.
pub(crate) fn command(a: TuneArgs) -> Result<()> {
    if a.list_knobs {
        for k in space::KNOBS {
            println!(
                "{:<17} {:<6} default {:<8} {}",
                k.name,
                format!("{:?}", k.layer).to_lowercase(),
                k.default.unwrap_or("(current)"),
                k.values
            );
        }
        return Ok(());
    }
    // Before any thread starts: Ctrl-C and panics restore block settings.
    block::install_restorers();
    let t0 = Instant::now();
    let mut notes = Vec::new();
    let (mut space, toml_sweep) = match &a.space {
        Some(p) => Space::from_toml(&std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?)
            .with_context(|| format!("in {}", p.display()))?,
        None => (space::default_space(a.quick), None),
    };
    for k in &a.knobs {
        space.set_flag(k)?;
    }
    let sweep = a.sweep.or(toml_sweep).unwrap_or(Sweep::OneAtATime);
    let repeats = a.repeats.unwrap_or(if a.quick { 2 } else { 3 });
    if repeats == 0 {
        bail!("--repeats must be at least 1");
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;

    // The data: a dataset of files (read, loader), or a checkpoint held in memory (ckpt).
    let mut cleanup = Cleanup(None);
    let mut ckpt = None;
    let (ds, generated) = if a.workload == Workload::Ckpt {
        let size = a.ckpt_size.unwrap_or(if a.quick { 256 << 20 } else { 1 << 30 });
        let w = CkptWorkload::new(&a.dir, size, a.ckpt_parts)?;
        std::fs::create_dir_all(w.dir()).with_context(|| format!("creating {}", w.dir().display()))?;
        if !a.keep {
            cleanup.0 = Some(w.dir().to_path_buf());
        }
        ckpt = Some(w);
        (None, false)
    } else {
        let (ds, generated) = match Dataset::open(&a.dir) {
            Ok(ds) => (ds, false),
            Err(_) => {
                let root = a.dir.join("ringtier-tune-data");
                let mut spec = DatasetSpec::preset(DataPreset::Small);
                spec.files = a.files.unwrap_or(if a.quick { 1200 } else { 4000 });
                eprintln!(
                    "tune: generating {} files (median {} KB) in {}",
                    spec.files,
                    spec.median_bytes / 1000,
                    root.display()
                );
                if !a.keep {
                    cleanup.0 = Some(root.clone());
                }
                (crate::dataset::generate(&root, &spec, true, false)?, true)
            }
        };
        (Some(ds), generated)
    };
    let facts = match (&ds, &ckpt) {
        (Some(ds), _) => DatasetFacts {
            path: ds.root.display().to_string(),
            files: ds.len(),
            bytes: ds.total_bytes(),
            median_file_bytes: ds.median_size(),
            generated,
        },
        (None, Some(w)) => DatasetFacts {
            path: w.dir().display().to_string(),
            files: w.parts(),
            bytes: w.bytes(),
            median_file_bytes: w.bytes() / w.parts().max(1) as u64,
            generated: true,
        },
        (None, None) => bail!("no data"),
    };
    let data_root = PathBuf::from(&facts.path);
    let shape = LoaderShape { batch: a.loader_batch, prefetch: a.loader_prefetch };
    let workload_detail = match a.workload {
        Workload::Read => "one cold shuffled pass over the files, each read whole (in pieces of read_size)".to_string(),
        Workload::Loader => format!(
            "one cold loader epoch of raw samples (batch {}, prefetch {}), no compute",
            shape.batch, shape.prefetch
        ),
        Workload::Ckpt => format!(
            "a {:.0} MB checkpoint in {} parts saved (committed, fsynced), then restored cold into memory; \
             MB/s = 2 x size / (save + restore seconds)",
            facts.bytes as f64 / 1e6,
            facts.files
        ),
    };

    // The device and which of its settings we may write.
    let device = crate::harness::blockdev::device_of(&data_root, &a.sysfs);
    let mut read_only = Vec::new();
    let settings = match device {
        Ok(d) => Some(block::BlockSettings::new(d)),
        Err(why) => {
            notes.push(format!("no block settings: {why}"));
            None
        }
    };
    let before = settings.as_ref().map(|s| s.snapshot());
    let block_knobs: Vec<&'static str> = space::KNOBS
        .iter()
        .filter(|k| k.layer == space::Layer::Block && space.values.contains_key(k.name))
        .map(|k| k.name)
        .collect();
    if a.no_block || settings.is_none() {
        for k in &block_knobs {
            space.values.remove(k);
        }
    } else if let Some(s) = &settings {
        read_only = s.probe_writable(&block_knobs);
        for ro in &read_only {
            notes.push(format!("block setting {} is read-only here, not swept: {}", ro.setting, ro.why));
            space.values.remove(ro.setting.as_str());
        }
    }
    let mut configs = Vec::new();
    for c in space.configs(sweep) {
        match c.invalid() {
            Some(why) => notes.push(format!("{} left out: {why}", c.label())),
            None => configs.push(c),
        }
    }
    let direct_ok = ringtier_core::fs::dir_supports_direct_io(&data_root) != Some(false);
    if !direct_ok {
        notes.push(format!("{} has no direct I/O: io=direct points read buffered", data_root.display()));
    }
    if a.workload != Workload::Read && !(a.no_trace && a.no_fio) {
        notes.push(format!("the tracepoint breakdown and fio run on the read workload only, not on {:?}", a.workload));
    }
    for n in &notes {
        eprintln!("tune: {n}");
    }
    eprintln!(
        "tune: {} configurations x {repeats} cold passes of the {:?} workload over {} files ({:.0} MB) in {}",
        configs.len(),
        a.workload,
        facts.files,
        facts.bytes as f64 / 1e6,
        data_root.display()
    );

    let _guard = settings.as_ref().map(|s| s.guard());
    let rt = crate::runtime(0)?;
    let files: Vec<PathBuf> =
        ds.iter().flat_map(|ds| ds.manifest.entries.iter().map(|f| ds.root.join(&f.key))).collect();
    let cold = Cold::new();
    let mut cold_method = String::new();
    let mut held = false;
    let run_pass = |c: &Config, seed: u64, tracer: Option<&trace::Tracer>| -> Result<PassResult> {
        let ds = ds.as_ref().context("the read workload needs a dataset")?;
        let engine =
            if c.get("io") == Some("buffered") || !direct_ok { Engine::UringBuffered } else { Engine::UringDirect };
        let reader =
            Reader::new(engine, c.num("depth").max(1) as usize, c.num("rings").max(1) as usize, ds, knobs_of(c))
                .with_context(|| format!("setting up {c}"))?;
        if let Some(t) = tracer {
            t.follow_new_threads();
        }
        let order = order_of(ds, Order::Shuffled, seed)?;
        rt.block_on(reader.pass(ds, &order))
    };
    // Every configuration once per repeat, the order rotated by the repeat (the harness's
    // interleaving), each pass cold.
    let runs: Vec<Vec<WorkloadPass>> = interleaved(repeats, &configs, true, |r, c| {
        block::restore_all_quiet();
        if let Some(s) = &settings {
            s.apply(&c.block()).with_context(|| format!("applying {c}"))?;
            if !held && !c.block().is_empty() && a.hold_after_apply_ms > 0 {
                eprintln!("tune: block settings applied, holding {} ms", a.hold_after_apply_ms);
                std::thread::sleep(std::time::Duration::from_millis(a.hold_after_apply_ms));
                held = true;
            }
        }
        let seed = 1000 + r as u64;
        let res = match (a.workload, ckpt.as_mut()) {
            (Workload::Ckpt, Some(w)) => {
                // The store's files are made cold between its save and its restore.
                cold_method = cold.pass(std::iter::empty::<PathBuf>())?.to_string();
                w.pass(&rt, c, direct_ok, &cold)?
            }
            (Workload::Loader, _) => {
                cold_method = cold.pass(&files)?.to_string();
                workload::loader_epoch(&rt, &data_root, c, direct_ok, shape, seed)?
            }
            _ => {
                cold_method = cold.pass(&files)?.to_string();
                WorkloadPass::from(run_pass(c, seed, None)?)
            }
        };
        eprintln!(
            "  {}/{repeats} {:<40} {:>8.1} MB/s {:>8.0} IOPS {:>6.2} CPU s/GiB p99 {:>6.2} ms",
            r + 1,
            c.label(),
            res.mb_per_sec(),
            res.iops(),
            res.cpu_seconds_per_gib(),
            res.latency_p99_ms
        );
        Ok(res)
    })?;
    block::restore_all_quiet();

    let mut points: Vec<report::PointReport> = configs
        .iter()
        .zip(&runs)
        .map(|(c, rs)| {
            let s = |f: &dyn Fn(&WorkloadPass) -> f64| Summary::by(rs, f);
            let mb = s(&|r| r.mb_per_sec());
            let mine: Vec<f64> = rs.iter().map(WorkloadPass::mb_per_sec).collect();
            let theirs: Vec<f64> =
                runs.first().map(|d| d.iter().map(WorkloadPass::mb_per_sec).collect()).unwrap_or_default();
            let median_run = rs
                .iter()
                .min_by(|a, b| (a.mb_per_sec() - mb.median).abs().total_cmp(&(b.mb_per_sec() - mb.median).abs()));
            report::PointReport {
                label: c.label(),
                config: c.clone(),
                mb_per_sec: mb,
                mb_per_sec_vs_defaults: Summary::ratio(&mine, &theirs),
                iops: s(&|r| r.iops()),
                cpu_seconds_per_gib: s(&|r| r.cpu_seconds_per_gib()),
                latency_p50_ms: s(&|r| r.latency_p50_ms),
                latency_p99_ms: s(&|r| r.latency_p99_ms),
                latency_p999_ms: s(&|r| r.latency_p999_ms),
                latency_cdf_ms: median_run.map(|r| r.latency_cdf_ms.clone()).unwrap_or_default(),
                extra: rs
                    .first()
                    .map(|first| {
                        (0..first.extra.len())
                            .map(|i| {
                                let v = s(&|r| r.extra.get(i).map_or(f64::NAN, |e| e.1));
                                (first.extra[i].0.to_string(), v)
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                on_pareto_front: false,
            }
        })
        .collect();
    let front = report::pareto_front(&points);
    for &i in &front {
        points[i].on_pareto_front = true;
    }
    let best_i = report::best(&points, &front);
    let defaults_on_front = points.first().map(|p| p.on_pareto_front).unwrap_or(false);
    let beyond_spread = match (best_i, points.first()) {
        (Some(b), Some(_)) => b != 0 && points[b].mb_per_sec_vs_defaults.min > 1.0,
        _ => false,
    };
    let queue_dir = settings.as_ref().map(|s| s.device.queue_dir.clone());
    let best = best_i.map(|i| Best {
        label: points[i].label.clone(),
        config: points[i].config.clone(),
        bench_read: report::bench_read_command(&points[i].config, &data_root),
        loader_config: report::loader_config(&points[i].config, queue_dir.as_deref()),
    });

    // Where the time goes: one traced pass of the defaults and of the best.
    let mut traces = Vec::new();
    if !a.no_trace && a.workload == Workload::Read {
        let dev = settings.as_ref().and_then(|s| {
            let (ma, mi) = s.device.dev.split_once(':')?;
            Some((ma.parse().ok()?, mi.parse().ok()?))
        });
        let mut which = vec![0usize];
        which.extend(best_i.filter(|&b| b != 0));
        for i in which {
            let c = &configs[i];
            let _ = settings.as_ref().map(|s| s.apply(&c.block()));
            cold.pass(&files)?;
            let breakdown = match trace::Tracer::start(dev) {
                Ok(t) => {
                    let r = run_pass(c, 7, Some(&t));
                    let b = t.finish();
                    r?;
                    b
                }
                Err(why) => trace::Breakdown { unavailable: Some(why), ..Default::default() },
            };
            block::restore_all_quiet();
            traces.push((c.label(), breakdown));
        }
    }

    // fio at the best settings: one big file (±15% expected) and the dataset's files.
    let mut fio_cmp = Vec::new();
    if let (false, Some(ds)) = (a.no_fio || a.workload != Workload::Read, &ds) {
        if !fio::available() {
            notes.push("fio is not installed (apt-get install fio): no fio comparison".into());
        } else if let Some(b) = &best {
            fio_cmp = fio_comparisons(&a, &b.config, ds, direct_ok, repeats, &rt)?;
        }
    }

    // Presets with the best configuration.
    let mut preset_reports = Vec::new();
    for name in &a.preset {
        let p = presets::preset(name)?;
        let c = best.as_ref().map(|b| b.config.clone()).unwrap_or_default();
        let r = match &a.preset_data {
            Some(dir) => {
                if a.preset.len() > 1 {
                    bail!("--preset-data takes one preset, not {}", a.preset.len());
                }
                let (q, files) = presets::existing(&p, dir)?;
                eprintln!(
                    "tune: preset {} on {} existing files in {} ({} B samples) with {}",
                    q.name,
                    files.len(),
                    dir.display(),
                    q.sample_bytes,
                    c.label()
                );
                presets::max_accelerators(&q, dir, &files, &c, 1.0, a.max_accelerators)
            }
            None => {
                let dir = a.dir.join(format!("ringtier-tune-{}", p.name));
                let n = a.preset_files.unwrap_or(p.files);
                eprintln!("tune: preset {} ({n} files) with {}", p.name, c.label());
                let files = presets::generate(&p, &dir, n)?;
                let r = presets::max_accelerators(&p, &dir, &files, &c, 1.0, a.max_accelerators);
                if !a.keep {
                    let _ = std::fs::remove_dir_all(&dir);
                }
                r
            }
        };
        preset_reports.push(r?);
    }

    let report = TuneReport {
        schema: "ringtier.tune/1",
        date: utc_now(),
        machine: Machine::probe(),
        storage: Storage::of(&data_root),
        block_settings_before: before,
        block_read_only: read_only,
        notes,
        workload: a.workload,
        workload_detail,
        latency_is: a.workload.latency_meaning(),
        iops_is: a.workload.ops_meaning(),
        dataset: facts,
        repeats,
        cold_method,
        load_average: load_average(),
        sweep,
        seconds: t0.elapsed().as_secs_f64(),
        pareto_front: front.iter().map(|&i| points[i].label.clone()).collect(),
        defaults_on_front,
        best_beats_defaults_beyond_spread: beyond_spread,
        points,
        best,
        trace: traces,
        fio: fio_cmp,
        presets: preset_reports,
    };
    let md = markdown(&report);
    print!("{md}");
    std::fs::write(a.out.join("tune.md"), &md).with_context(|| format!("writing {}", a.out.display()))?;
    let title = format!(
        "{} files, {} ({}), cold",
        report.dataset.files,
        report.storage.filesystem,
        report.storage.device_text()
    );
    report::pareto_svg(&a.out.join("pareto.svg"), &title, &report.points)?;
    report::cdf_svg(&a.out.join("latency-cdf.svg"), &title, &report.points)?;
    write_json(Some(&a.out.join("tune.json")), &report)?;
    Ok(())
}

/// The engine knobs of a configuration.
fn knobs_of(c: &Config) -> Knobs {
    Knobs {
        read_size: c.num("read_size") as usize,
        sqpoll: c.sqpoll().is_some(),
        sqpoll_idle_ms: c.sqpoll().unwrap_or(50),
        coop_taskrun: c.flag("coop_taskrun"),
        defer_taskrun: c.flag("defer_taskrun"),
        register_buffers: c.flag("register_buffers"),
        register_files: c.flag("register_files"),
        ..Knobs::default()
    }
}

/// The two sides of a fio comparison, interleaved (the order rotated by the repeat).
#[derive(Debug, Clone, Copy)]
enum FioSide {
    Ringtier,
    /// fio submitting in batches, as ringtier does.
    Fio,
    /// fio's own one-at-a-time submission: the baseline's better setting on some runs.
    FioUnbatched,
}

const FIO_SIDES: [FioSide; 3] = [FioSide::Ringtier, FioSide::Fio, FioSide::FioUnbatched];

/// One pass of a fio comparison: bandwidth, and for fio its CPU per GiB and completion p99.
#[derive(Debug, Clone, Copy)]
struct FioPass {
    mb_per_sec: f64,
    cpu_seconds_per_gib: f64,
    clat_p99_ms: f64,
}

impl FioPass {
    fn ours(mb_per_sec: f64) -> Self {
        FioPass { mb_per_sec, cpu_seconds_per_gib: f64::NAN, clat_p99_ms: f64::NAN }
    }

    fn fio(f: &fio::FioResult, gib: f64) -> Self {
        FioPass { mb_per_sec: f.mb_per_sec, cpu_seconds_per_gib: f.cpu_seconds / gib, clat_p99_ms: f.clat_p99_ms }
    }

    /// ringtier's bandwidths, fio's at its better job of the repeat (batched or not), that
    /// job's CPU per GiB (pass by pass) and fio's last p99.
    fn split(per_side: &[Vec<FioPass>]) -> (Vec<f64>, Vec<f64>, Vec<f64>, f64) {
        let ours = per_side[0].iter().map(|p| p.mb_per_sec).collect();
        let best: Vec<FioPass> = per_side[1]
            .iter()
            .zip(&per_side[2])
            .map(|(a, b)| if b.mb_per_sec > a.mb_per_sec { *b } else { *a })
            .collect();
        let theirs = best.iter().map(|p| p.mb_per_sec).collect();
        let cpu = best.iter().map(|p| p.cpu_seconds_per_gib).collect();
        let p99 = best.last().map_or(f64::NAN, |p| p.clat_p99_ms);
        (ours, theirs, cpu, p99)
    }
}

fn fio_comparisons(
    a: &TuneArgs,
    c: &Config,
    ds: &Dataset,
    direct_ok: bool,
    repeats: usize,
    rt: &tokio::runtime::Runtime,
) -> Result<Vec<FioComparison>> {
    let mut out = Vec::new();
    // fio's buffers on huge pages, as ringtier's, while the comparison runs.
    let (_thp, memory) = fio::huge_pages_for_fio(Path::new(fio::THP_ENABLED), !a.fio_small_pages);
    eprintln!("tune: fio comparison: {memory}");
    // One big file: random reads of the read size (128 KiB when whole files) at the depth.
    let big = a.dir.join("ringtier-tune-bigfile");
    let _rm = Cleanup((!a.keep).then(|| big.clone()));
    let runtime_secs = if a.quick { 2.0 } else { 5.0 };
    let bs = match c.num("read_size") {
        0 => 128 << 10,
        n => n as usize,
    };
    let cfg = crate::randread::RandReadConfig {
        file: big.join("big.bin"),
        size: a.fio_file_size.next_multiple_of(4096),
        block_size: bs,
        depth: c.num("depth").max(1) as u32,
        runtime_secs,
        repeats: 1,
        direct: if c.get("io") == Some("buffered") || !direct_ok {
            ringtier_uring::DirectIoPolicy::Off
        } else {
            ringtier_uring::DirectIoPolicy::Required
        },
        register_files: c.flag("register_files"),
        register_buffers: c.flag("register_buffers"),
        sqpoll: c.sqpoll().is_some(),
        seed: 1,
    };
    crate::randread::prepare_file(&cfg.file, cfg.size)?;
    let target = fio::Target::BigFile { path: cfg.file.clone(), runtime_secs };
    let (job, plain) = (fio::job(c, &target), fio::job_with(c, &target, false));
    let (job_path, plain_path) = (a.out.join("fio-bigfile.fio"), a.out.join("fio-bigfile-unbatched.fio"));
    let per_side = interleaved(repeats.max(3), &FIO_SIDES, true, |r, side| match side {
        FioSide::Ringtier => {
            Ok(FioPass::ours(crate::randread::run(&RandSeed(&cfg, r as u64).cfg())?.median_mb_per_sec()))
        }
        FioSide::Fio | FioSide::FioUnbatched => {
            let f = match side {
                FioSide::Fio => fio::run(&job, &job_path)?,
                _ => fio::run(&plain, &plain_path)?,
            };
            let gib = f.mb_per_sec * 1e6 * runtime_secs / crate::harness::GIB;
            Ok(FioPass::fio(&f, gib))
        }
    })?;
    let (ours, theirs, fio_cpu, p99) = FioPass::split(&per_side);
    out.push(FioComparison {
        target: format!("one {} MiB file, random {} KiB reads", cfg.size >> 20, bs >> 10),
        config: c.label(),
        job_file: format!(
            "{} (fio batched as ringtier) and {} (fio one I/O at a time); fio is the better per repeat",
            job_path.display(),
            plain_path.display()
        ),
        fio_mb_per_sec: Summary::of(&theirs),
        ringtier_mb_per_sec: Summary::of(&ours),
        ratio: Summary::ratio(&ours, &theirs),
        fio_clat_p99_ms: p99,
        fio_cpu_seconds_per_gib: Summary::of(&fio_cpu),
        memory: memory.clone(),
    });
    // The dataset's files, each read whole, cold.
    let target = fio::Target::Files {
        dir: ds.root.clone(),
        files: ds.len(),
        min_file_bytes: ds.manifest.entries.iter().map(|e| e.size).min().unwrap_or(0),
    };
    let (job, plain) = (fio::job(c, &target), fio::job_with(c, &target, false));
    let (job_path, plain_path) = (a.out.join("fio-files.fio"), a.out.join("fio-files-unbatched.fio"));
    let files: Vec<PathBuf> = ds.manifest.entries.iter().map(|f| ds.root.join(&f.key)).collect();
    let engine =
        if c.get("io") == Some("buffered") || !direct_ok { Engine::UringBuffered } else { Engine::UringDirect };
    // fio stats every file before its timed phase: the files' pages are dropped, their inodes
    // kept, so that both sides open files with warm metadata.
    let cold = Cold { keep_metadata: true, ..Cold::new() };
    let per_side = interleaved(repeats, &FIO_SIDES, true, |r, side| {
        cold.pass(&files)?;
        match side {
            FioSide::Ringtier => {
                let reader = Reader::new(
                    engine,
                    c.num("depth").max(1) as usize,
                    c.num("rings").max(1) as usize,
                    ds,
                    knobs_of(c),
                )?;
                let order = order_of(ds, Order::Readdir, r as u64)?;
                Ok(FioPass::ours(rt.block_on(reader.pass(ds, &order))?.mb_per_sec()))
            }
            FioSide::Fio => {
                Ok(FioPass::fio(&fio::run(&job, &job_path)?, ds.total_bytes() as f64 / crate::harness::GIB))
            }
            FioSide::FioUnbatched => {
                Ok(FioPass::fio(&fio::run(&plain, &plain_path)?, ds.total_bytes() as f64 / crate::harness::GIB))
            }
        }
    })?;
    let (ours, theirs, fio_cpu, p99) = FioPass::split(&per_side);
    out.push(FioComparison {
        target: format!(
            "{} files (median {} KB), cold (pages dropped, metadata warm on both sides: fio stats every file \
             first); ringtier reads each whole, fio in {} KiB blocks",
            ds.len(),
            ds.median_size() / 1000,
            fio::files_block_size(ds.manifest.entries.iter().map(|e| e.size).min().unwrap_or(0)) >> 10
        ),
        config: c.label(),
        job_file: format!(
            "{} (fio batched as ringtier) and {} (fio one I/O at a time); fio is the better per repeat",
            job_path.display(),
            plain_path.display()
        ),
        fio_mb_per_sec: Summary::of(&theirs),
        ringtier_mb_per_sec: Summary::of(&ours),
        ratio: Summary::ratio(&ours, &theirs),
        fio_clat_p99_ms: p99,
        fio_cpu_seconds_per_gib: Summary::of(&fio_cpu),
        memory: memory.clone(),
    });
    Ok(out)
}

/// A randread configuration with its own seed per repeat.
struct RandSeed<'a>(&'a crate::randread::RandReadConfig, u64);

impl RandSeed<'_> {
    fn cfg(&self) -> crate::randread::RandReadConfig {
        crate::randread::RandReadConfig { seed: self.0.seed + self.1, ..self.0.clone() }
    }
}

fn markdown(r: &TuneReport) -> String {
    use std::fmt::Write;
    let mut md = String::new();
    let _ = writeln!(md, "# ringtier tune, {}\n", r.date);
    let _ = writeln!(md, "Machine: {}; {}.", r.machine.text(), r.machine.io_uring_text());
    let _ = writeln!(
        md,
        "Storage: {} ({}); block device {}.",
        r.storage.path,
        r.storage.filesystem,
        r.storage.device_text()
    );
    let _ = writeln!(
        md,
        "Workload `{:?}`: {}. Latency: {}; IOPS: {}.",
        r.workload, r.workload_detail, r.latency_is, r.iops_is
    );
    let _ = writeln!(
        md,
        "Data: {} files, {:.0} MB (median {} KB). {} cold passes per configuration ({}), interleaved; load average {}. {:.0} s in all.\n",
        r.dataset.files,
        r.dataset.bytes as f64 / 1e6,
        r.dataset.median_file_bytes / 1000,
        r.repeats,
        r.cold_method,
        r.load_average,
        r.seconds
    );
    for n in &r.notes {
        let _ = writeln!(md, "- note: {n}");
    }
    if !r.notes.is_empty() {
        md.push('\n');
    }
    let _ = writeln!(md, "{}", report::table(&r.points).markdown());
    let _ = writeln!(md, "Pareto front (MB/s up, CPU s/GiB down, p99 down): {}.", r.pareto_front.join("; "));
    let _ = writeln!(md, "The engine's defaults are {}on the front.", if r.defaults_on_front { "" } else { "not " });
    let ahead: Vec<String> = r
        .points
        .iter()
        .skip(1)
        .filter(|p| p.mb_per_sec_vs_defaults.min > 1.0)
        .map(|p| format!("{} ({})", p.label, p.mb_per_sec_vs_defaults.text(2)))
        .collect();
    let _ = writeln!(
        md,
        "Faster than the defaults in every repeat's pair (x defaults, min..max): {}.\n",
        if ahead.is_empty() { "none".to_string() } else { ahead.join("; ") }
    );
    if let Some(b) = &r.best {
        let _ =
            writeln!(md, "Best: `{}`\n\n```\n{}\n```\n\n```rust\n{}\n```\n", b.label, b.bench_read, b.loader_config);
    }
    for (label, t) in &r.trace {
        match &t.unavailable {
            Some(why) => {
                let _ = writeln!(md, "Trace of `{label}`: unavailable: {why}");
            }
            None => {
                let st = |s: &Option<trace::Stage>| {
                    s.map(|s| format!("p50 {:.3} / p99 {:.3} ms", s.p50_ms, s.p99_ms)).unwrap_or_else(|| "-".into())
                };
                let _ = writeln!(
                    md,
                    "Trace of `{label}` ({} of {} reads paired, {} handed to io-wq): submit->device {}; device {}; device done->CQE {}; submit->CQE {}.{}",
                    t.paired_reads,
                    t.traced_reads,
                    t.reads_punted_to_io_wq,
                    st(&t.submission),
                    st(&t.device),
                    st(&t.completion_to_cqe),
                    st(&t.in_kernel),
                    if t.notes.is_empty() { String::new() } else { format!(" ({})", t.notes.join("; ")) }
                );
            }
        }
    }
    for f in &r.fio {
        let _ = writeln!(
            md,
            "\nfio on {} at `{}`: fio {} MB/s, ringtier {} MB/s, ringtier/fio {} (jobs: {}; {})",
            f.target,
            f.config,
            f.fio_mb_per_sec.text(0),
            f.ringtier_mb_per_sec.text(0),
            f.ratio.text(2),
            f.job_file,
            f.memory
        );
    }
    for p in &r.presets {
        let _ = writeln!(
            md,
            "\nPreset {} ({} files, {:.1} GB, batch {}, {} s compute per step): largest accelerator count at AU >= 90%: {}.",
            p.preset.name,
            p.files,
            p.bytes as f64 / 1e9,
            p.preset.batch_size,
            p.preset.compute_secs * p.compute_scale,
            p.max_accelerators_au90
        );
        for run in &p.runs {
            let _ = writeln!(
                md,
                "- {} accelerator(s): AU {:.1}% (first step left out, as DLIO computes it), {:.1}% (every step), {:.0} MB/s",
                run.accelerators,
                run.au_mlperf * 100.0,
                run.au * 100.0,
                run.mb_per_sec
            );
        }
    }
    md
}
