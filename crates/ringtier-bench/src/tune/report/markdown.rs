//! The tune report as Markdown (`tune.md`, also printed).

use super::points::table;
use super::TuneReport;
use crate::tune::trace;

/// The report as Markdown: the run's facts, the table, the front and the best point, the
/// traces, fio and the presets.
pub(super) fn markdown(r: &TuneReport) -> String {
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
    let _ = writeln!(md, "{}", table(&r.points).markdown());
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
