//! What `tune` hands back: the report (`ringtier.tune/1`) as JSON and Markdown (also
//! printed), and two SVG plots.
//!
//! * [`points`]: per configuration the bandwidth, IOPS, CPU per GiB and latency
//!   p50/p99/p99.9 (min/median/max over repeats); the Pareto front; the best configuration as
//!   a `bench read` command line and a loader configuration; the table and the plots;
//! * [`markdown`]: the report as Markdown.

mod markdown;
pub(crate) mod points;

use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use super::fio::compare::FioComparison;
use super::space::{Config, Sweep};
use super::sysfs::block::ReadOnly;
use super::workload::Workload;
use super::{presets, trace};
use crate::harness::{write_json, Machine, Storage};
pub(crate) use points::{bench_read_command, best, loader_config, pareto_front, PointReport};

/// The report (`ringtier.tune/1`).
#[derive(Debug, Serialize)]
pub(crate) struct TuneReport {
    pub(crate) schema: &'static str,
    pub(crate) date: String,
    pub(crate) machine: Machine,
    pub(crate) storage: Storage,
    /// Every queue setting of the device before the sweep (restored afterwards).
    pub(crate) block_settings_before: Option<std::collections::BTreeMap<String, String>>,
    /// Block settings that could not be written, with the reason (then not swept).
    pub(crate) block_read_only: Vec<ReadOnly>,
    pub(crate) notes: Vec<String>,
    /// What each configuration was measured on, and what its latency and IOPS columns mean.
    pub(crate) workload: Workload,
    pub(crate) workload_detail: String,
    pub(crate) latency_is: &'static str,
    pub(crate) iops_is: &'static str,
    pub(crate) dataset: DatasetFacts,
    pub(crate) repeats: usize,
    pub(crate) cold_method: String,
    pub(crate) load_average: String,
    pub(crate) sweep: Sweep,
    pub(crate) seconds: f64,
    pub(crate) points: Vec<PointReport>,
    pub(crate) pareto_front: Vec<String>,
    pub(crate) defaults_on_front: bool,
    /// The best point was faster than the defaults in every repeat's pair (otherwise the
    /// difference is within the run-to-run spread and the defaults stand).
    pub(crate) best_beats_defaults_beyond_spread: bool,
    pub(crate) best: Option<Best>,
    pub(crate) trace: Vec<(String, trace::Breakdown)>,
    pub(crate) fio: Vec<FioComparison>,
    pub(crate) presets: Vec<presets::PresetReport>,
}

/// The data the configurations were measured on (a dataset, or the checkpoint's parts).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DatasetFacts {
    pub(crate) path: String,
    pub(crate) files: usize,
    pub(crate) bytes: u64,
    pub(crate) median_file_bytes: u64,
    pub(crate) generated: bool,
}

/// The best configuration, and how to use it.
#[derive(Debug, Serialize)]
pub(crate) struct Best {
    pub(crate) label: String,
    pub(crate) config: Config,
    pub(crate) bench_read: String,
    pub(crate) loader_config: String,
}

impl TuneReport {
    /// Prints the Markdown and writes `tune.md`, `pareto.svg`, `latency-cdf.svg` and
    /// `tune.json` to `out`.
    pub(crate) fn write(&self, out: &Path) -> Result<()> {
        let md = markdown::markdown(self);
        print!("{md}");
        std::fs::write(out.join("tune.md"), &md).with_context(|| format!("writing {}", out.display()))?;
        let title =
            format!("{} files, {} ({}), cold", self.dataset.files, self.storage.filesystem, self.storage.device_text());
        points::pareto_svg(&out.join("pareto.svg"), &title, &self.points)?;
        points::cdf_svg(&out.join("latency-cdf.svg"), &title, &self.points)?;
        write_json(Some(&out.join("tune.json")), self)?;
        Ok(())
    }
}
