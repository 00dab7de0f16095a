//! SVG line plots of a measurement against a swept setting: one line per series at the
//! medians, min..max whiskers at every point.

use std::path::Path;

use anyhow::{anyhow, Result};

use super::Summary;

/// One line of a plot: a label and (x position, summary) points.
#[derive(Debug, Clone)]
pub(crate) struct Series {
    pub(crate) label: String,
    pub(crate) points: Vec<(usize, Summary)>,
}

/// What goes around the lines.
#[derive(Debug, Clone)]
pub(crate) struct Axes<'a> {
    pub(crate) title: String,
    /// Labels of the x positions (categories, e.g. the swept concurrency).
    pub(crate) x_labels: &'a [String],
    pub(crate) x_desc: &'a str,
    pub(crate) y_desc: &'a str,
}

/// Draws `series` over `axes` into the SVG file `path`.
pub(crate) fn line_plot(path: &Path, axes: &Axes<'_>, series: &[Series]) -> Result<()> {
    use plotters::prelude::*;
    let e = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", path.display());
    let ymax = series.iter().flat_map(|s| &s.points).map(|p| p.1.max).filter(|y| y.is_finite()).fold(0.0, f64::max);
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let n = axes.x_labels.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(&axes.title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.3f64..(n as f64 - 0.7), 0f64..(ymax * 1.1).max(1.0))
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                axes.x_labels.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .x_desc(axes.x_desc)
        .y_desc(axes.y_desc)
        .draw()
        .map_err(|x| e(&x))?;
    let colors = [RED, BLUE, GREEN, MAGENTA, CYAN, BLACK];
    for (k, s) in series.iter().enumerate() {
        let color = colors[k % colors.len()];
        let pts: Vec<(f64, f64)> = s.points.iter().map(|(x, y)| (*x as f64, y.median)).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(|x| e(&x))?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(pts.iter().map(|&(x, y)| Circle::new((x, y), 4, color.filled()))).map_err(|x| e(&x))?;
        for (x, y) in &s.points {
            let x = *x as f64;
            chart
                .draw_series(std::iter::once(PathElement::new(vec![(x, y.min), (x, y.max)], color)))
                .map_err(|x| e(&x))?;
        }
    }
    finish(&mut chart, &root, path)
}

/// The legend (lower right, on a white panel) and the file written: how every plot ends.
pub(crate) fn finish<'a, DB, CT>(
    chart: &mut plotters::chart::ChartContext<'a, DB, CT>,
    root: &plotters::drawing::DrawingArea<DB, plotters::coord::Shift>,
    path: &Path,
) -> Result<()>
where
    DB: plotters::prelude::DrawingBackend + 'a,
    CT: plotters::coord::CoordTranslate,
{
    use plotters::prelude::*;
    let e = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", path.display());
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}
