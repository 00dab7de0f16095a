//! `ringtier tune`: the kernel I/O tuning lab, a user tool that **changes kernel settings**.
//! It sweeps a declared space of io_uring set-up knobs and block-layer settings over the
//! paper's read workload (or a loader epoch, or a checkpoint save and restore), every pass
//! cold and the configurations interleaved; reports bandwidth, IOPS, CPU per GiB and latency
//! p50/p99/p99.9 per configuration, the Pareto front, the best configuration as a command
//! line and a loader configuration, a latency breakdown from tracepoints, fio at the same
//! settings, and MLPerf-Storage-style presets (accelerator utilisation). `docs/TUNE.md`.
//!
//! # What it writes, and how it is put back
//!
//! Run as root, `tune` writes sysfs ([`sysfs`]): the queue settings of the device under the
//! data (`/sys/block/DEV/queue/*`), per configuration of the sweep, and the transparent huge
//! page mode (`/sys/kernel/mm/transparent_hugepage/enabled`) while fio runs. There is no
//! separate apply step and nothing stays applied: each setting's original value is recorded
//! before its first write, and every one is put back between configurations, at the end, on
//! an error, on a panic on any thread, and on Ctrl-C, SIGTERM or SIGHUP (then the exit
//! status is 128 + the signal). A setting it may not write (not root) is a note in the
//! report and is not swept; `--no-block` leaves the device alone, `--fio-small-pages` the
//! huge page mode. The best configuration comes back as shell lines to apply by hand.
//!
//! # Where things are
//!
//! * [`run`]: one run, a [`run::TuneRun`] with one method per phase (data, block settings,
//!   configurations, sweep, summary, traces, fio, presets, report);
//! * [`space`]: the knobs, TOML and flags, the sweep;
//! * [`workload`]: what a configuration is measured on: the read micro-benchmark, a loader
//!   epoch, a checkpoint save and restore;
//! * [`sysfs`]: the kernel settings it changes, and the journal that always restores them;
//! * [`trace`]: where a read's time goes;
//! * [`fio`]: the equivalent fio job, its run, and the comparison;
//! * [`presets`]: unet3d, resnet50, cosmoflow and AU;
//! * [`report`]: the points, the front, the best point, tables, plots, the report.

pub(crate) mod fio;
pub(crate) mod presets;
pub(crate) mod report;
pub(crate) mod run;
pub(crate) mod space;
pub(crate) mod sysfs;
pub(crate) mod trace;
pub(crate) mod workload;

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use run::{CloserLook, TuneRun};
use space::Sweep;
use workload::Workload;

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

/// Removes generated data when dropped.
pub(crate) struct Cleanup(pub(crate) Option<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(d) = self.0.take() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// `ringtier tune`.
pub(crate) fn command(a: TuneArgs) -> Result<()> {
    if a.list_knobs {
        list_knobs();
        return Ok(());
    }
    // Before any thread starts: Ctrl-C and panics restore the kernel settings.
    sysfs::install_restorers();
    let mut run = TuneRun::new(a)?;
    let mut data = run.data()?;
    let device = run.block_settings(&data);
    let plan = run.configurations(&data);
    let _guard = device.guard();
    let rt = crate::runtime(0)?;
    let measured = run.sweep(&mut data, &device, &plan, &rt)?;
    let summary = run.summarize(&data, &device, &plan, &measured);
    let traces = run.traces(&data, &device, &plan, &summary, &rt)?;
    let fio = run.fio(&data, &plan, &summary, &rt)?;
    let presets = run.presets(&summary)?;
    run.report(&data, device, measured, summary, CloserLook { traces, fio, presets })
}

/// `ringtier tune --list-knobs`: every knob, its layer, default and values.
fn list_knobs() {
    for k in space::KNOBS {
        println!(
            "{:<17} {:<6} default {:<8} {}",
            k.name,
            format!("{:?}", k.layer).to_lowercase(),
            k.default.unwrap_or("(current)"),
            k.values
        );
    }
}
