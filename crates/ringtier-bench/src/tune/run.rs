//! One run of `ringtier tune`, phase by phase: [`TuneRun::new`] reads the space;
//! [`TuneRun::data`] finds or generates what is measured; [`TuneRun::block_settings`] finds
//! the device and which of its queue settings may be written; [`TuneRun::configurations`]
//! lists the points of the sweep; [`TuneRun::sweep`] measures them, cold and interleaved;
//! [`TuneRun::summarize`] finds the Pareto front and the best point; [`TuneRun::traces`],
//! [`TuneRun::fio`] and [`TuneRun::presets`] look closer at the best point; and
//! [`TuneRun::report`] writes it all down.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use tokio::runtime::Runtime;

use super::fio::compare::{fio_comparisons, FioComparison};
use super::report::{Best, DatasetFacts, PointReport, TuneReport};
use super::space::{self, Config, Space, Sweep};
use super::sysfs::block::{BlockSettings, ReadOnly};
use super::sysfs::{restore_all_quiet, RestoreGuard};
use super::workload::{self, CkptWorkload, LoaderShape, Workload, WorkloadPass};
use super::{fio, presets, report, trace, Cleanup, TuneArgs};
use crate::dataset::{Dataset, DatasetSpec, Preset as DataPreset};
use crate::harness::report::utc_now;
use crate::harness::{interleaved, Cold, Machine, Storage, Summary};

/// One run of `ringtier tune`: its arguments, the space it sweeps and the notes it gathers
/// for the report.
pub(super) struct TuneRun {
    a: TuneArgs,
    started: Instant,
    notes: Vec<String>,
    space: Space,
    sweep: Sweep,
    repeats: usize,
    cold: Cold,
}

/// What the configurations are measured on: a dataset of files (read, loader) or a
/// checkpoint held in memory (ckpt).
pub(super) struct Data {
    ds: Option<Dataset>,
    ckpt: Option<CkptWorkload>,
    facts: DatasetFacts,
    /// The directory of the data.
    root: PathBuf,
    /// The dataset's files, made cold before each pass.
    files: Vec<PathBuf>,
    shape: LoaderShape,
    detail: String,
    /// Removes generated data when dropped (last: after the dataset and the checkpoint).
    _cleanup: Cleanup,
}

/// The device under the data and its queue settings, where there is one.
pub(super) struct Device {
    settings: Option<BlockSettings>,
    /// Every queue setting before the sweep.
    before: Option<BTreeMap<String, String>>,
    /// The settings the space names that cannot be written (not swept).
    read_only: Vec<ReadOnly>,
}

impl Device {
    /// A guard that puts back whatever is changed while it lives.
    pub(super) fn guard(&self) -> Option<RestoreGuard> {
        self.settings.as_ref().map(BlockSettings::guard)
    }
}

/// The sweep's points: the configurations (the defaults first) and where the file system
/// serves direct I/O.
pub(super) struct Plan {
    configs: Vec<Config>,
    direct_ok: bool,
}

/// Every pass of every configuration, and how the passes were made cold.
pub(super) struct Measured {
    runs: Vec<Vec<WorkloadPass>>,
    cold_method: String,
}

/// The points, the front, and the best configuration.
pub(super) struct Summarized {
    points: Vec<PointReport>,
    front: Vec<usize>,
    best_i: Option<usize>,
    defaults_on_front: bool,
    beyond_spread: bool,
    best: Option<Best>,
}

/// A closer look at the defaults and the best point: where a read's time goes, fio at the
/// same settings, the presets.
pub(super) struct CloserLook {
    pub(super) traces: Vec<(String, trace::Breakdown)>,
    pub(super) fio: Vec<FioComparison>,
    pub(super) presets: Vec<presets::PresetReport>,
}

impl TuneRun {
    /// The space (TOML or the default, then `--knob` flags), the sweep, the repeats; creates the
    /// output directory.
    pub(super) fn new(a: TuneArgs) -> Result<TuneRun> {
        let started = Instant::now();
        let (mut space, toml_sweep) = match &a.space {
            Some(p) => {
                Space::from_toml(&std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?)
                    .with_context(|| format!("in {}", p.display()))?
            }
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
        Ok(TuneRun { a, started, notes: Vec::new(), space, sweep, repeats, cold: Cold::new() })
    }

    /// The data: the dataset in `--dir` (generated there when there is none), or the
    /// checkpoint workload's directory.
    pub(super) fn data(&self) -> Result<Data> {
        let a = &self.a;
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
        let shape = LoaderShape { batch: a.loader_batch, prefetch: a.loader_prefetch };
        let detail = match a.workload {
            Workload::Read => {
                "one cold shuffled pass over the files, each read whole (in pieces of read_size)".to_string()
            }
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
        let files = ds.iter().flat_map(|ds| ds.manifest.entries.iter().map(|f| ds.root.join(&f.key))).collect();
        Ok(Data { root: PathBuf::from(&facts.path), ds, ckpt, facts, files, shape, detail, _cleanup: cleanup })
    }

    /// The device under the data and which of the block settings the space names may be
    /// written: the others (and all of them with `--no-block`, or without a device) leave the
    /// space, with a note.
    pub(super) fn block_settings(&mut self, data: &Data) -> Device {
        let device = crate::harness::blockdev::device_of(&data.root, &self.a.sysfs);
        let mut read_only = Vec::new();
        let settings = match device {
            Ok(d) => Some(BlockSettings::new(d)),
            Err(why) => {
                self.notes.push(format!("no block settings: {why}"));
                None
            }
        };
        let before = settings.as_ref().map(|s| s.snapshot());
        let block_knobs: Vec<&'static str> = space::KNOBS
            .iter()
            .filter(|k| k.layer == space::Layer::Block && self.space.values.contains_key(k.name))
            .map(|k| k.name)
            .collect();
        if self.a.no_block || settings.is_none() {
            for k in &block_knobs {
                self.space.values.remove(k);
            }
        } else if let Some(s) = &settings {
            read_only = s.probe_writable(&block_knobs);
            for ro in &read_only {
                self.notes.push(format!("block setting {} is read-only here, not swept: {}", ro.setting, ro.why));
                self.space.values.remove(ro.setting.as_str());
            }
        }
        Device { settings, before, read_only }
    }

    /// The configurations of the sweep (an invalid one is left out with a note), and whether
    /// the data's file system serves direct I/O; prints the notes so far and what will run.
    pub(super) fn configurations(&mut self, data: &Data) -> Plan {
        let mut configs = Vec::new();
        for c in self.space.configs(self.sweep) {
            match c.invalid() {
                Some(why) => self.notes.push(format!("{} left out: {why}", c.label())),
                None => configs.push(c),
            }
        }
        let direct_ok = ringtier_core::fs::dir_supports_direct_io(&data.root) != Some(false);
        if !direct_ok {
            self.notes.push(format!("{} has no direct I/O: io=direct points read buffered", data.root.display()));
        }
        let a = &self.a;
        if a.workload != Workload::Read && !(a.no_trace && a.no_fio) {
            self.notes.push(format!(
                "the tracepoint breakdown and fio run on the read workload only, not on {:?}",
                a.workload
            ));
        }
        for n in &self.notes {
            eprintln!("tune: {n}");
        }
        eprintln!(
            "tune: {} configurations x {} cold passes of the {:?} workload over {} files ({:.0} MB) in {}",
            configs.len(),
            self.repeats,
            a.workload,
            data.facts.files,
            data.facts.bytes as f64 / 1e6,
            data.root.display()
        );
        Plan { configs, direct_ok }
    }

    /// Every configuration once per repeat, the order rotated by the repeat (the harness's
    /// interleaving), each pass cold, with the configuration's block settings applied (and the
    /// previous one's put back first).
    pub(super) fn sweep(&self, data: &mut Data, device: &Device, plan: &Plan, rt: &Runtime) -> Result<Measured> {
        let a = &self.a;
        let repeats = self.repeats;
        let mut cold_method = String::new();
        let mut held = false;
        let runs = interleaved(repeats, &plan.configs, true, |r, c| {
            restore_all_quiet();
            if let Some(s) = &device.settings {
                s.apply(&c.block()).with_context(|| format!("applying {c}"))?;
                if !held && !c.block().is_empty() && a.hold_after_apply_ms > 0 {
                    eprintln!("tune: block settings applied, holding {} ms", a.hold_after_apply_ms);
                    std::thread::sleep(std::time::Duration::from_millis(a.hold_after_apply_ms));
                    held = true;
                }
            }
            let seed = 1000 + r as u64;
            let res = match (a.workload, data.ckpt.as_mut()) {
                (Workload::Ckpt, Some(w)) => {
                    // The store's files are made cold between its save and its restore.
                    cold_method = self.cold.pass(std::iter::empty::<PathBuf>())?.to_string();
                    w.pass(rt, c, plan.direct_ok, &self.cold)?
                }
                (Workload::Loader, _) => {
                    cold_method = self.cold.pass(&data.files)?.to_string();
                    workload::loader_epoch(rt, &data.root, c, plan.direct_ok, data.shape, seed)?
                }
                _ => {
                    cold_method = self.cold.pass(&data.files)?.to_string();
                    WorkloadPass::from(workload::read_pass(rt, data.ds.as_ref(), c, plan.direct_ok, seed, None)?)
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
        restore_all_quiet();
        Ok(Measured { runs, cold_method })
    }

    /// Each configuration's summaries over its passes (and against the defaults' pass by pass),
    /// the Pareto front, and the best point with its command line and loader configuration.
    pub(super) fn summarize(&self, data: &Data, device: &Device, plan: &Plan, measured: &Measured) -> Summarized {
        let runs = &measured.runs;
        let mut points: Vec<PointReport> = plan
            .configs
            .iter()
            .zip(runs)
            .map(|(c, rs)| {
                let s = |f: &dyn Fn(&WorkloadPass) -> f64| Summary::by(rs, f);
                let mb = s(&|r| r.mb_per_sec());
                let mine: Vec<f64> = rs.iter().map(WorkloadPass::mb_per_sec).collect();
                let theirs: Vec<f64> =
                    runs.first().map(|d| d.iter().map(WorkloadPass::mb_per_sec).collect()).unwrap_or_default();
                let median_run = rs
                    .iter()
                    .min_by(|a, b| (a.mb_per_sec() - mb.median).abs().total_cmp(&(b.mb_per_sec() - mb.median).abs()));
                PointReport {
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
        let queue_dir = device.settings.as_ref().map(|s| s.device.queue_dir.clone());
        let best = best_i.map(|i| Best {
            label: points[i].label.clone(),
            config: points[i].config.clone(),
            bench_read: report::bench_read_command(&points[i].config, &data.root),
            loader_config: report::loader_config(&points[i].config, queue_dir.as_deref()),
        });
        Summarized { points, front, best_i, defaults_on_front, beyond_spread, best }
    }

    /// Where the time goes: one traced pass of the defaults and of the best (the read
    /// workload only, unless `--no-trace`).
    pub(super) fn traces(
        &self,
        data: &Data,
        device: &Device,
        plan: &Plan,
        summary: &Summarized,
        rt: &Runtime,
    ) -> Result<Vec<(String, trace::Breakdown)>> {
        let mut traces = Vec::new();
        if self.a.no_trace || self.a.workload != Workload::Read {
            return Ok(traces);
        }
        let dev = device.settings.as_ref().and_then(|s| {
            let (ma, mi) = s.device.dev.split_once(':')?;
            Some((ma.parse().ok()?, mi.parse().ok()?))
        });
        let mut which = vec![0usize];
        which.extend(summary.best_i.filter(|&b| b != 0));
        for i in which {
            let c = &plan.configs[i];
            let _ = device.settings.as_ref().map(|s| s.apply(&c.block()));
            self.cold.pass(&data.files)?;
            let breakdown = match trace::Tracer::start(dev) {
                Ok(t) => {
                    let r = workload::read_pass(rt, data.ds.as_ref(), c, plan.direct_ok, 7, Some(&t));
                    let b = t.finish();
                    r?;
                    b
                }
                Err(why) => trace::Breakdown { unavailable: Some(why), ..Default::default() },
            };
            restore_all_quiet();
            traces.push((c.label(), breakdown));
        }
        Ok(traces)
    }

    /// fio at the best settings: one big file (±15% expected) and the dataset's files (the
    /// read workload only, unless `--no-fio`; a note where fio is not installed).
    pub(super) fn fio(
        &mut self,
        data: &Data,
        plan: &Plan,
        summary: &Summarized,
        rt: &Runtime,
    ) -> Result<Vec<FioComparison>> {
        let mut fio_cmp = Vec::new();
        if let (false, Some(ds)) = (self.a.no_fio || self.a.workload != Workload::Read, &data.ds) {
            if !fio::available() {
                self.notes.push("fio is not installed (apt-get install fio): no fio comparison".into());
            } else if let Some(b) = &summary.best {
                fio_cmp = fio_comparisons(&self.a, &b.config, ds, plan.direct_ok, self.repeats, rt)?;
            }
        }
        Ok(fio_cmp)
    }

    /// The MLPerf-Storage-style presets (`--preset`) with the best configuration: each on its
    /// generated data set (removed after, unless `--keep`) or on `--preset-data`.
    pub(super) fn presets(&self, summary: &Summarized) -> Result<Vec<presets::PresetReport>> {
        let a = &self.a;
        let mut preset_reports = Vec::new();
        for name in &a.preset {
            let p = presets::preset(name)?;
            let c = summary.best.as_ref().map(|b| b.config.clone()).unwrap_or_default();
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
        Ok(preset_reports)
    }

    /// The report (`ringtier.tune/1`): printed as Markdown, written to `--out` as Markdown,
    /// JSON and two plots.
    pub(super) fn report(
        self,
        data: &Data,
        device: Device,
        measured: Measured,
        summary: Summarized,
        closer: CloserLook,
    ) -> Result<()> {
        let a = self.a;
        let points = summary.points;
        let report = TuneReport {
            schema: "ringtier.tune/1",
            date: utc_now(),
            machine: Machine::probe(),
            storage: Storage::of(&data.root),
            block_settings_before: device.before,
            block_read_only: device.read_only,
            notes: self.notes,
            workload: a.workload,
            workload_detail: data.detail.clone(),
            latency_is: a.workload.latency_meaning(),
            iops_is: a.workload.ops_meaning(),
            dataset: data.facts.clone(),
            repeats: self.repeats,
            cold_method: measured.cold_method,
            load_average: load_average(),
            sweep: self.sweep,
            seconds: self.started.elapsed().as_secs_f64(),
            pareto_front: summary.front.iter().map(|&i| points[i].label.clone()).collect(),
            defaults_on_front: summary.defaults_on_front,
            best_beats_defaults_beyond_spread: summary.beyond_spread,
            points,
            best: summary.best,
            trace: closer.traces,
            fio: closer.fio,
            presets: closer.presets,
        };
        report.write(&a.out)
    }
}

/// The 1, 5 and 15 minute load averages, as `/proc/loadavg` says them.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}
