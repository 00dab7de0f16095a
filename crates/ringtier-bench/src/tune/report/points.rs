//! The measured points of a sweep: per configuration the bandwidth, IOPS, CPU per GiB and
//! latency p50/p99/p99.9 (min/median/max over repeats); the Pareto front of bandwidth (up),
//! CPU per GiB (down) and p99 (down); the best configuration as a `bench read` command line
//! and a loader configuration; a table (text and Markdown) and two SVG plots: the front
//! (bandwidth against CPU per GiB, p99 in the label) and latency CDFs.

use std::path::Path;

use anyhow::{anyhow, Result};
use serde::Serialize;

use crate::harness::{Summary, Table};
use crate::tune::space::Config;

/// One configuration's measurements.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PointReport {
    pub(crate) label: String,
    pub(crate) config: Config,
    pub(crate) mb_per_sec: Summary,
    /// This point's bandwidth over the defaults' in the same repeat, pair by pair (passes are
    /// interleaved, so a pair shares the machine's state): above 1 in every pair is a lead
    /// beyond the run-to-run spread.
    pub(crate) mb_per_sec_vs_defaults: Summary,
    pub(crate) iops: Summary,
    pub(crate) cpu_seconds_per_gib: Summary,
    pub(crate) latency_p50_ms: Summary,
    pub(crate) latency_p99_ms: Summary,
    pub(crate) latency_p999_ms: Summary,
    /// Per-read latency quantiles 0, 0.01, ..., 1 of the median-bandwidth pass.
    pub(crate) latency_cdf_ms: Vec<f64>,
    /// The workload's own figures (the checkpoint's save and restore MB/s), a column each.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub(crate) extra: std::collections::BTreeMap<String, Summary>,
    pub(crate) on_pareto_front: bool,
}

/// Indices of the points no other point beats on all three of bandwidth (higher), CPU per GiB
/// and p99 (lower) while being strictly better on one. A workload without a latency
/// distribution (p99 NaN: the checkpoint) is judged on bandwidth and CPU alone.
pub(crate) fn pareto_front(points: &[PointReport]) -> Vec<usize> {
    let key = |p: &PointReport| {
        let p99 = p.latency_p99_ms.median;
        (p.mb_per_sec.median, p.cpu_seconds_per_gib.median, if p99.is_nan() { 0.0 } else { p99 })
    };
    (0..points.len())
        .filter(|&i| {
            let (b, c, l) = key(&points[i]);
            !points.iter().any(|q| {
                let (qb, qc, ql) = key(q);
                qb >= b && qc <= c && ql <= l && (qb > b || qc < c || ql < l)
            })
        })
        .collect()
}

/// The best point: the highest bandwidth on the front; within 3% of it, the lower CPU per GiB.
pub(crate) fn best(points: &[PointReport], front: &[usize]) -> Option<usize> {
    let top = front.iter().map(|&i| points[i].mb_per_sec.median).fold(f64::NAN, f64::max);
    front
        .iter()
        .copied()
        .filter(|&i| points[i].mb_per_sec.median >= 0.97 * top)
        .min_by(|&a, &b| points[a].cpu_seconds_per_gib.median.total_cmp(&points[b].cpu_seconds_per_gib.median))
}

/// `ringtier bench read ...` for `config` over `dir`.
pub(crate) fn bench_read_command(config: &Config, dir: &Path) -> String {
    let mut c = format!(
        "ringtier bench read --dir {} --engines {} --depths {} --rings {}",
        dir.display(),
        if config.get("io") == Some("buffered") { "uring-buffered" } else { "uring-direct" },
        config.num("depth").max(1),
        config.num("rings").max(1)
    );
    if config.num("read_size") > 0 {
        c.push_str(&format!(" --read-size {}", config.num("read_size")));
    }
    if let Some(idle) = config.sqpoll() {
        c.push_str(&format!(" --sqpoll --sqpoll-idle-ms {idle}"));
    }
    for (k, flag) in [
        ("coop_taskrun", "--coop-taskrun"),
        ("defer_taskrun", "--defer-taskrun"),
        ("register_files", "--register-files"),
    ] {
        if config.flag(k) {
            c.push(' ');
            c.push_str(flag);
        }
    }
    if !config.flag("register_buffers") {
        c.push_str(" --no-register-buffers");
    }
    c
}

/// The `UringConfig` of the loader (Rust), and the block settings as shell lines.
pub(crate) fn loader_config(config: &Config, queue_dir: Option<&Path>) -> String {
    let mut s = format!(
        "UringConfig::default()\n    .with_queue_depth({})\n    .with_rings({})\n    .with_direct_io(DirectIoPolicy::{})\n    .with_sqpoll_idle_ms({})\n    .with_coop_taskrun({})\n    .with_defer_taskrun({})\n    .with_register_buffers({})\n    .with_register_files({})\n    .with_max_read_bytes({})",
        config.num("depth").max(1),
        config.num("rings").max(1),
        if config.get("io") == Some("buffered") { "Off" } else { "Auto" },
        config.sqpoll().map(|v| format!("Some({v})")).unwrap_or_else(|| "None".into()),
        config.flag("coop_taskrun"),
        config.flag("defer_taskrun"),
        config.flag("register_buffers"),
        config.flag("register_files"),
        config.num("read_size"),
    );
    let block = config.block();
    if !block.is_empty() {
        s.push_str("\n# block settings (root):");
        for (k, v) in block {
            let dir = queue_dir.map(|d| d.display().to_string()).unwrap_or_else(|| "/sys/block/DEV/queue".into());
            s.push_str(&format!("\necho {v} > {dir}/{k}"));
        }
    }
    s
}

/// The table of every point (latency cells `-` where the workload has none; the workload's
/// own figures as extra columns before `front`).
pub(crate) fn table(points: &[PointReport]) -> Table {
    let extra: Vec<String> = points.first().map(|p| p.extra.keys().cloned().collect()).unwrap_or_default();
    let mut header: Vec<String> =
        ["configuration", "MB/s", "x defaults", "IOPS", "CPU s/GiB", "p50 ms", "p99 ms", "p99.9 ms"]
            .map(String::from)
            .to_vec();
    header.extend(extra.iter().cloned());
    header.push("front".into());
    let mut t = Table::new(header);
    let ms = |v: f64| if v.is_nan() { "-".to_string() } else { format!("{v:.2}") };
    for p in points {
        let mut row = vec![
            p.label.clone(),
            p.mb_per_sec.text(1),
            p.mb_per_sec_vs_defaults.text(2),
            format!("{:.0}", p.iops.median),
            p.cpu_seconds_per_gib.text(2),
            ms(p.latency_p50_ms.median),
            if p.latency_p99_ms.median.is_nan() { "-".into() } else { p.latency_p99_ms.text(2) },
            ms(p.latency_p999_ms.median),
        ];
        row.extend(extra.iter().map(|k| p.extra.get(k).map_or_else(|| "-".into(), |s| s.text(1))));
        row.push(if p.on_pareto_front { "*".into() } else { String::new() });
        t.row(row);
    }
    t
}

/// Bandwidth against CPU per GiB, every point; the front joined and labelled with p99.
pub(crate) fn pareto_svg(path: &Path, title: &str, points: &[PointReport]) -> Result<()> {
    use plotters::prelude::*;
    let e = |x: &dyn std::fmt::Display| anyhow!("drawing {}: {x}", path.display());
    let xmax = points.iter().map(|p| p.cpu_seconds_per_gib.median).filter(|x| x.is_finite()).fold(0.0, f64::max);
    let ymax = points.iter().map(|p| p.mb_per_sec.median).filter(|x| x.is_finite()).fold(0.0, f64::max);
    let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..(xmax * 1.15).max(0.01), 0f64..(ymax * 1.15).max(1.0))
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc("CPU seconds per GiB (lower is better)")
        .y_desc("MB/s (higher is better)")
        .draw()
        .map_err(|x| e(&x))?;
    let pt = |p: &PointReport| (p.cpu_seconds_per_gib.median, p.mb_per_sec.median);
    chart
        .draw_series(
            points.iter().filter(|p| !p.on_pareto_front).map(|p| Circle::new(pt(p), 4, BLUE.mix(0.5).filled())),
        )
        .map_err(|x| e(&x))?;
    let mut front: Vec<&PointReport> = points.iter().filter(|p| p.on_pareto_front).collect();
    front.sort_by(|a, b| a.cpu_seconds_per_gib.median.total_cmp(&b.cpu_seconds_per_gib.median));
    chart.draw_series(LineSeries::new(front.iter().map(|p| pt(p)), RED.stroke_width(2))).map_err(|x| e(&x))?;
    for p in &front {
        chart.draw_series(std::iter::once(Circle::new(pt(p), 5, RED.filled()))).map_err(|x| e(&x))?;
        chart
            .draw_series(std::iter::once(Text::new(
                format!("{} (p99 {:.2} ms)", p.label, p.latency_p99_ms.median),
                pt(p),
                ("sans-serif", 12),
            )))
            .map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

/// Latency CDFs (per read, log-scaled milliseconds), one line per point on the front plus
/// the defaults.
pub(crate) fn cdf_svg(path: &Path, title: &str, points: &[PointReport]) -> Result<()> {
    use plotters::prelude::*;
    let e = |x: &dyn std::fmt::Display| anyhow!("drawing {}: {x}", path.display());
    let shown: Vec<&PointReport> =
        points.iter().filter(|p| (p.on_pareto_front || p.label == "defaults") && p.latency_cdf_ms.len() > 1).collect();
    let all = shown.iter().flat_map(|p| p.latency_cdf_ms.iter().copied()).filter(|x| x.is_finite() && *x > 0.0);
    let (lo, hi) = all.fold((f64::INFINITY, 0.0f64), |(lo, hi), x| (lo.min(x), hi.max(x)));
    let (lo, hi) = if lo.is_finite() && hi > lo { (lo, hi) } else { (0.001, 1.0) };
    let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d((lo * 0.9..hi * 1.1).log_scale(), 0f64..1f64)
        .map_err(|x| e(&x))?;
    chart.configure_mesh().x_desc("read latency, ms (log)").y_desc("fraction of reads").draw().map_err(|x| e(&x))?;
    let colors = [RED, BLUE, GREEN, MAGENTA, CYAN, BLACK];
    for (k, p) in shown.iter().enumerate() {
        let c = colors[k % colors.len()];
        let n = p.latency_cdf_ms.len() - 1;
        let pts: Vec<(f64, f64)> = p
            .latency_cdf_ms
            .iter()
            .enumerate()
            .filter(|(_, x)| x.is_finite() && **x > 0.0)
            .map(|(i, x)| (*x, i as f64 / n as f64))
            .collect();
        chart
            .draw_series(LineSeries::new(pts, c.stroke_width(2)))
            .map_err(|x| e(&x))?
            .label(p.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    crate::harness::plot::finish(&mut chart, &root, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(label: &str, mb: f64, cpu: f64, p99: f64) -> PointReport {
        let s = |v: f64| Summary { min: v, median: v, max: v };
        PointReport {
            label: label.into(),
            config: Config::default(),
            mb_per_sec: s(mb),
            mb_per_sec_vs_defaults: s(1.0),
            iops: s(mb * 10.0),
            cpu_seconds_per_gib: s(cpu),
            latency_p50_ms: s(p99 / 2.0),
            latency_p99_ms: s(p99),
            latency_p999_ms: s(p99 * 2.0),
            latency_cdf_ms: (0..=100).map(|i| f64::from(i) * p99 / 99.0 + 0.01).collect(),
            extra: Default::default(),
            on_pareto_front: false,
        }
    }

    #[test]
    fn the_front_keeps_only_undominated_points_and_plots_draw() {
        let mut pts = vec![
            point("defaults", 500.0, 1.0, 2.0),
            point("fast", 900.0, 2.0, 3.0),
            point("dominated", 400.0, 1.5, 2.5),
            point("lean", 300.0, 0.5, 4.0),
        ];
        let front = pareto_front(&pts);
        assert_eq!(front, [0, 1, 3]);
        for &i in &front {
            pts[i].on_pareto_front = true;
        }
        assert_eq!(best(&pts, &front), Some(1));
        let dir = tempfile::tempdir().expect("tempdir");
        pareto_svg(&dir.path().join("p.svg"), "t", &pts).expect("pareto");
        cdf_svg(&dir.path().join("c.svg"), "t", &pts).expect("cdf");
        let svg = std::fs::read_to_string(dir.path().join("p.svg")).expect("svg");
        assert!(svg.contains("fast (p99 3.00 ms)") && !svg.contains("dominated (p99"), "front labels only");
        assert!(table(&pts).text().contains("dominated"));
        let c = Config(
            [("sqpoll", "50".to_string()), ("depth", "64".to_string()), ("register_buffers", "true".into())]
                .into_iter()
                .collect(),
        );
        assert_eq!(
            bench_read_command(&c, Path::new("/d")),
            "ringtier bench read --dir /d --engines uring-direct --depths 64 --rings 1 --sqpoll --sqpoll-idle-ms 50"
        );
        assert!(loader_config(&c, None).contains(".with_sqpoll_idle_ms(Some(50))"));
    }

    #[test]
    fn without_latencies_the_front_is_bandwidth_and_cpu_and_extra_columns_show() {
        let mut pts =
            vec![point("a", 500.0, 1.0, f64::NAN), point("b", 400.0, 0.5, f64::NAN), point("c", 300.0, 1.2, f64::NAN)];
        for p in &mut pts {
            p.extra.insert("save MB/s".into(), p.mb_per_sec);
        }
        assert_eq!(pareto_front(&pts), [0, 1]);
        let text = table(&pts).text();
        assert!(text.contains("save MB/s") && text.contains(" - "), "{text}");
    }
}
