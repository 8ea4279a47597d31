//! `gradwire project`'s plots, as SVG and PNG (plotters, the font handling
//! of [`crate::plot`]): per model and algorithm, a column per link rate,
//! seconds per step (top, log scale) and the speedup over dense (bottom)
//! against the number of workers (log2 scale), one line per strategy.

use super::Projection;
use super::report::rate_label;
use crate::error::{ExperimentError, Result};
use crate::plot::{draw_series, ensure_font};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// A strategy's points in one panel.
type Series = Vec<(String, Vec<(f64, f64)>)>;

/// Draws `projection_<model>_<algorithm>.svg` and `.png` into `dir` for
/// every model and algorithm; returns the files written.
pub fn write_plots(projection: &Projection, dir: &Path) -> Result<Vec<PathBuf>> {
    ensure_font()?;
    std::fs::create_dir_all(dir).map_err(|source| ExperimentError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let mut keys: Vec<(String, String)> = Vec::new();
    for r in &projection.rows {
        let key = (r.model.clone(), r.algorithm.clone());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    let mut files = Vec::new();
    for (model, algorithm) in keys {
        let rows: Vec<_> = projection
            .rows
            .iter()
            .filter(|r| r.model == model && r.algorithm == algorithm)
            .collect();
        let mut rates: Vec<u64> = rows.iter().map(|r| r.rate_bits_per_s).collect();
        rates.dedup();
        rates.sort_unstable();
        rates.dedup();
        let mut labels: Vec<&str> = Vec::new();
        for r in &rows {
            if !labels.contains(&r.strategy.as_str()) {
                labels.push(&r.strategy);
            }
        }
        // Per rate: (seconds, speedup) series.
        let panels: Vec<(String, Series, Series)> = rates
            .iter()
            .map(|&rate| {
                let series = |value: &dyn Fn(&super::ProjectionRow) -> f64| -> Series {
                    labels
                        .iter()
                        .map(|l| {
                            let points = rows
                                .iter()
                                .filter(|r| r.rate_bits_per_s == rate && r.strategy == *l)
                                .map(|r| (r.world as f64, value(r)))
                                .collect();
                            (l.to_string(), points)
                        })
                        .collect()
                };
                (
                    rate_label(rate),
                    series(&|r| r.step_s),
                    series(&|r| r.speedup),
                )
            })
            .collect();
        let stem = format!("projection_{model}_{}", algorithm.replace(':', ""));
        let title = format!("{model}, {algorithm}");
        let svg = dir.join(format!("{stem}.svg"));
        let png = dir.join(format!("{stem}.png"));
        let size = (480 * panels.len().max(1) as u32, 800);
        draw(
            SVGBackend::new(&svg, size).into_drawing_area(),
            &title,
            &panels,
            &svg,
        )?;
        draw(
            BitMapBackend::new(&png, size).into_drawing_area(),
            &title,
            &panels,
            &png,
        )?;
        files.push(svg);
        files.push(png);
    }
    Ok(files)
}

/// The figure: a title, then a column per rate.
fn draw<DB: DrawingBackend>(
    area: DrawingArea<DB, Shift>,
    title: &str,
    panels: &[(String, Series, Series)],
    path: &Path,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let fail = |e: &dyn std::fmt::Display| ExperimentError::Plot {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    area.fill(&WHITE).map_err(|e| fail(&e))?;
    let area = area
        .titled(title, ("sans-serif", 24))
        .map_err(|e| fail(&e))?;
    let cells = area.split_evenly((2, panels.len().max(1)));
    for (i, (rate, secs, speedup)) in panels.iter().enumerate() {
        panel(&cells[i], &format!("{rate}: s / step"), secs, true, i == 0).map_err(|e| fail(&e))?;
        let bottom = &cells[panels.len() + i];
        panel(
            bottom,
            &format!("{rate}: speedup over dense"),
            speedup,
            false,
            false,
        )
        .map_err(|e| fail(&e))?;
    }
    area.present().map_err(|e| fail(&e))?;
    Ok(())
}

/// One panel: log2 workers on x; y on a log scale (`log_y`) or linear
/// from 0; a legend if asked.
fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    caption: &str,
    series: &Series,
    log_y: bool,
    legend: bool,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let all = series.iter().flat_map(|(_, p)| p.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::INFINITY, 0f64, f64::INFINITY, 0f64);
    for &(x, y) in all {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if !x0.is_finite() {
        (x0, x1, y0, y1) = (1.0, 2.0, 1.0, 2.0);
    }
    let xs = (x0 / 1.2).max(0.5)..(x1 * 1.2).max(x0 * 2.0);
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(caption, ("sans-serif", 17))
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(56);
    let x_fmt = |x: &f64| format!("{}", x.round());
    if log_y {
        let ys = (y0.max(1e-6) / 1.5)..(y1 * 1.5).max(y0 * 2.0);
        let mut chart = builder.build_cartesian_2d(xs.log_scale().base(2.0), ys.log_scale())?;
        chart
            .configure_mesh()
            .x_desc("workers")
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&|y| match *y {
                y if y >= 10.0 => format!("{y:.0}"),
                y if y >= 1.0 => format!("{y:.1}"),
                y => format!("{y:.3}"),
            })
            .label_style(("sans-serif", 13))
            .draw()?;
        draw_series(
            &mut chart,
            series,
            legend.then_some((SeriesLabelPosition::UpperLeft, 12)),
        )
    } else {
        let ys = 0.0..(y1 * 1.1).max(1.2);
        let mut chart = builder.build_cartesian_2d(xs.log_scale().base(2.0), ys)?;
        chart
            .configure_mesh()
            .x_desc("workers")
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&|y| format!("{y:.1}x"))
            .label_style(("sans-serif", 13))
            .draw()?;
        draw_series(
            &mut chart,
            series,
            legend.then_some((SeriesLabelPosition::UpperLeft, 12)),
        )
    }
}
