//! `gradwire compare`'s plots, as SVG and PNG (plotters): test accuracy
//! (the GPT: test loss) against epochs, against the megabytes one worker
//! sent (log scale: the strategies differ by orders of magnitude) and
//! against wall-clock seconds, one line per strategy.
//!
//! `timeline.rs` draws a window of a run's timeline.
//!
//! Text is laid out with a TrueType font read once from the system (DejaVu
//! Sans from Debian's fonts-dejavu-core, which `cargo xtask` installs) or
//! from the file named by `GRADWIRE_FONT`: plotters needs a font to measure
//! text even for SVG.

mod timeline;

pub use timeline::draw_timeline;

use crate::error::{ExperimentError, Result};
use crate::train::{RunReport, Target};
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Where a sans-serif font is looked for when `GRADWIRE_FONT` is not set.
const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "C:\\Windows\\Fonts\\arial.ttf",
];

/// Registers the font once per process; the error says how to get one.
pub(crate) fn ensure_font() -> Result<()> {
    static REGISTERED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            let candidates: Vec<PathBuf> = match std::env::var_os("GRADWIRE_FONT") {
                Some(p) => vec![PathBuf::from(p)],
                None => FONT_PATHS.iter().map(PathBuf::from).collect(),
            };
            let bytes = candidates
                .iter()
                .find_map(|p| std::fs::read(p).ok())
                .ok_or_else(|| {
                    "no font to draw text with: install Debian's fonts-dejavu-core \
                     (cargo xtask compare does) or set GRADWIRE_FONT to a .ttf file"
                        .to_string()
                })?;
            // plotters keeps registered fonts for the life of the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            register_font("sans-serif", FontStyle::Normal, bytes)
                .map_err(|_| "the font file is not a TrueType font plotters can read".to_string())
        })
        .clone()
        .map_err(|message| ExperimentError::Plot {
            path: "(font)".into(),
            message,
        })
}

/// The files [`write_plots`] wrote (`accuracy_vs_...` on the digits,
/// `loss_vs_...` for the GPT).
#[derive(Debug, Clone)]
pub struct PlotFiles {
    /// accuracy_vs_epoch.svg and .png.
    pub by_epoch: [PathBuf; 2],
    /// accuracy_vs_bytes.svg and .png.
    pub by_bytes: [PathBuf; 2],
    /// accuracy_vs_time.svg and .png (wall-clock seconds since the start).
    pub by_time: [PathBuf; 2],
}

/// Draws the three plots of `runs` into `dir` (created if missing).
pub fn write_plots(runs: &[RunReport], dir: &Path) -> Result<PlotFiles> {
    ensure_font()?;
    std::fs::create_dir_all(dir).map_err(|source| ExperimentError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let target = runs.first().map(RunReport::target).unwrap_or_default();
    let measure = |e: &crate::train::EpochRecord| target.measure(e);
    let by_epoch = |r: &RunReport| -> Vec<(f64, f64)> {
        r.epochs
            .iter()
            .map(|e| (e.epoch as f64, measure(e)))
            .collect()
    };
    let by_bytes = |r: &RunReport| -> Vec<(f64, f64)> {
        r.epochs
            .iter()
            .map(|e| (e.bytes_total as f64 / 1e6, measure(e)))
            .collect()
    };
    let by_time = |r: &RunReport| -> Vec<(f64, f64)> {
        r.epochs
            .iter()
            .scan(0.0, |elapsed, e| {
                *elapsed += e.wall_secs;
                Some((*elapsed, measure(e)))
            })
            .collect()
    };
    let (stem, quality) = match target {
        Target::Accuracy(_) => ("accuracy", "Test accuracy"),
        Target::Loss(_) => ("loss", "Test loss"),
    };
    let files = |x: &str| {
        [
            dir.join(format!("{stem}_vs_{x}.svg")),
            dir.join(format!("{stem}_vs_{x}.png")),
        ]
    };
    let (epoch_files, bytes_files, time_files) = (files("epoch"), files("bytes"), files("time"));
    let epoch_chart = Chart {
        title: format!("{quality} by epoch"),
        x_label: "epoch",
        log_x: false,
        x_decimals: 0,
        x_from: None,
        target,
    };
    let bytes_chart = Chart {
        title: format!("{quality} by data sent per worker"),
        x_label: "MB sent per worker (log scale)",
        log_x: true,
        x_decimals: 0,
        x_from: None,
        target,
    };
    let time_chart = Chart {
        title: format!("{quality} by wall-clock time (time to {target})"),
        x_label: "seconds since the start",
        log_x: false,
        x_decimals: 1,
        x_from: Some(0.0),
        target,
    };
    for (chart, files, points) in [
        (
            &epoch_chart,
            &epoch_files,
            &by_epoch as &dyn Fn(&RunReport) -> Vec<(f64, f64)>,
        ),
        (&bytes_chart, &bytes_files, &by_bytes),
        (&time_chart, &time_files, &by_time),
    ] {
        let series: Vec<(String, Vec<(f64, f64)>)> =
            runs.iter().map(|r| (r.label.clone(), points(r))).collect();
        let svg = SVGBackend::new(&files[0], (960, 600)).into_drawing_area();
        chart.draw(svg, &series, &files[0])?;
        let png = BitMapBackend::new(&files[1], (960, 600)).into_drawing_area();
        chart.draw(png, &series, &files[1])?;
    }
    Ok(PlotFiles {
        by_epoch: epoch_files,
        by_bytes: bytes_files,
        by_time: time_files,
    })
}

/// One chart's texts and axis kind.
struct Chart {
    title: String,
    x_label: &'static str,
    log_x: bool,
    /// Decimals of the linear x axis' labels.
    x_decimals: usize,
    /// Where the linear x axis starts (default: the first point, or 1).
    x_from: Option<f64>,
    /// What the y axis shows: accuracy in percent, or loss.
    target: Target,
}

impl Chart {
    fn draw<DB: DrawingBackend>(
        &self,
        area: DrawingArea<DB, plotters::coord::Shift>,
        series: &[(String, Vec<(f64, f64)>)],
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
        let all = series.iter().flat_map(|(_, p)| p.iter());
        let (mut x_min, mut x_max) = (f64::INFINITY, f64::NEG_INFINITY);
        let (mut y_min, mut y_max) = (f64::INFINITY, f64::NEG_INFINITY);
        for &(x, y) in all {
            x_min = x_min.min(x);
            x_max = x_max.max(x);
            y_min = y_min.min(y);
            y_max = y_max.max(y);
        }
        if !x_min.is_finite() {
            (x_min, x_max) = (1.0, 2.0);
        }
        let (y_range, y_desc, legend) = match self.target {
            // Accuracy from just below the worst point to 100 %.
            Target::Accuracy(_) => (
                (y_min.min(100.0) - 2.0).clamp(0.0, 95.0)..100.0,
                "test accuracy (%)",
                SeriesLabelPosition::LowerRight,
            ),
            // Loss from just below the best point to just above the worst.
            Target::Loss(_) => {
                let (lo, hi) = if y_min.is_finite() {
                    (y_min, y_max.max(y_min + 1e-3))
                } else {
                    (0.0, 1.0)
                };
                let pad = (hi - lo) * 0.05;
                (
                    (lo - pad).max(0.0)..hi + pad,
                    "test loss (nats per character)",
                    SeriesLabelPosition::UpperRight,
                )
            }
        };
        let mut builder = ChartBuilder::on(&area);
        builder
            .caption(&self.title, ("sans-serif", 26))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(64);
        if self.log_x {
            let lo = (x_min.max(1e-9) / 1.5).max(1e-9);
            let hi = (x_max * 1.5).max(lo * 10.0);
            let mut chart = builder
                .build_cartesian_2d((lo..hi).log_scale(), y_range)
                .map_err(|e| fail(&e))?;
            chart
                .configure_mesh()
                .x_desc(self.x_label)
                .y_desc(y_desc)
                .label_style(("sans-serif", 15))
                .draw()
                .map_err(|e| fail(&e))?;
            draw_series(&mut chart, series, Some((legend, 15))).map_err(|e| fail(&e))?;
        } else {
            let mut chart = builder
                .build_cartesian_2d(
                    self.x_from.unwrap_or(x_min.min(1.0))..x_max.max(x_min + 1.0),
                    y_range,
                )
                .map_err(|e| fail(&e))?;
            chart
                .configure_mesh()
                .x_desc(self.x_label)
                .x_label_formatter(&|x| format!("{x:.*}", self.x_decimals))
                .y_desc(y_desc)
                .label_style(("sans-serif", 15))
                .draw()
                .map_err(|e| fail(&e))?;
            draw_series(&mut chart, series, Some((legend, 15))).map_err(|e| fail(&e))?;
        }
        area.present().map_err(|e| fail(&e))?;
        Ok(())
    }
}

/// Lines with markers, one colour per strategy, and a legend at `legend`
/// (its position and font size; `None`: no legend), for every chart of
/// the CLI (`compare`'s and `project`'s).
pub(crate) fn draw_series<'a, DB, X, Y>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    series: &[(String, Vec<(f64, f64)>)],
    legend: Option<(SeriesLabelPosition, u32)>,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>>
where
    DB: DrawingBackend + 'a,
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    for (i, (label, points)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
            });
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    if let Some((position, size)) = legend {
        chart
            .configure_series_labels()
            .position(position)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", size))
            .draw()?;
    }
    Ok(())
}
