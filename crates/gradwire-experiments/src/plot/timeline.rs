//! A picture of a timeline (`--timeline`'s Chrome trace, for a README or a
//! machine without a browser): a window of the run's last steps, one row
//! per rank and track, spans stacked by nesting, coloured by what they are
//! (the wait for the last rank red, the agreement orange, the transfer
//! green, codec work purple, computation blue).

use super::ensure_font;
use crate::error::{ExperimentError, Result};
use gradwire_comm::timeline::{Trace, TraceEvent};
use plotters::prelude::*;
use std::path::Path;

/// Width of the picture, and of its label column, in pixels.
const WIDTH: u32 = 1600;
const LABELS: i32 = 230;
/// Height of one level of nesting, and the space between rows.
const LEVEL: i32 = 16;
const GAP: i32 = 10;
/// Nesting levels drawn (deeper spans are left out).
const LEVELS: usize = 5;
const TOP: i32 = 56;
const BOTTOM: i32 = 110;

/// What each colour means, in the legend's order.
fn palette() -> [(&'static str, RGBColor); 12] {
    [
        ("finish (wait, update)", RGBColor(225, 225, 225)),
        ("forward, backward", RGBColor(100, 149, 237)),
        ("evaluation", RGBColor(188, 189, 34)),
        ("wait for buckets", RGBColor(255, 190, 190)),
        ("optimizer", RGBColor(32, 178, 170)),
        ("bucket job", RGBColor(255, 230, 160)),
        ("combine", RGBColor(216, 200, 250)),
        ("codec", RGBColor(148, 103, 189)),
        ("collective", RGBColor(170, 170, 170)),
        ("wait for rank k", RGBColor(214, 39, 40)),
        ("agree", RGBColor(255, 127, 14)),
        ("transfer", RGBColor(44, 160, 44)),
    ]
}

fn colour_of(e: &TraceEvent) -> RGBColor {
    let key = match e.cat.as_str() {
        "step" => "finish (wait, update)",
        "compute" => "forward, backward",
        "evaluate" => "evaluation",
        "wait" => "wait for buckets",
        "optimizer" => "optimizer",
        "bucket" => "bucket job",
        "combine" => "combine",
        "codec" => "codec",
        "collective" => "collective",
        "phase" if e.name.starts_with("wait for") => "wait for rank k",
        "phase" if e.name == "agree" => "agree",
        "phase" => "transfer",
        _ => "collective",
    };
    palette()
        .into_iter()
        .find(|(k, _)| *k == key)
        .map_or(RGBColor(128, 128, 128), |(_, c)| c)
}

/// The window of the last `steps` of rank 0's steps (its `step` spans on
/// its first track), in microseconds; the trace's last tenth without any.
fn window(trace: &Trace, steps: usize) -> (i64, i64) {
    let mut own: Vec<&TraceEvent> = trace
        .spans()
        .filter(|e| e.pid == 0 && e.tid == 0 && e.cat == "step")
        .collect();
    own.sort_by_key(|e| e.ts);
    let end = |e: &TraceEvent| e.ts + e.dur.unwrap_or(0);
    let (from, to) = match own.len().checked_sub(steps.max(1)) {
        // The step before the window's first ends where its work begins.
        Some(first) if first > 0 => (end(own[first - 1]), own.last().map_or(0, |e| end(e))),
        _ if !own.is_empty() => (own[0].ts, own.last().map_or(0, |e| end(e))),
        _ => {
            let last = trace.spans().map(end).max().unwrap_or(1);
            (last - last / 10, last)
        }
    };
    let pad = ((to - from) / 40).max(1);
    (from - pad, to + pad)
}

/// Each row's events within the window, with their nesting level.
type Row<'t> = ((usize, u32), Vec<(usize, &'t TraceEvent)>);

fn rows(trace: &Trace, (from, to): (i64, i64)) -> Vec<Row<'_>> {
    let mut by_track: std::collections::BTreeMap<(usize, u32), Vec<&TraceEvent>> =
        Default::default();
    for e in trace.spans() {
        by_track.entry((e.pid, e.tid)).or_default().push(e);
    }
    let end = |e: &TraceEvent| e.ts + e.dur.unwrap_or(0);
    by_track
        .into_iter()
        .filter_map(|(key, mut events)| {
            events.sort_by_key(|e| (e.ts, std::cmp::Reverse(e.dur.unwrap_or(0))));
            let mut open: Vec<i64> = Vec::new();
            let mut levelled = Vec::new();
            for e in events {
                while open.last().is_some_and(|&close| close <= e.ts) {
                    open.pop();
                }
                let level = open.len();
                open.push(end(e));
                if level < LEVELS && end(e) > from && e.ts < to {
                    levelled.push((level, e));
                }
            }
            (!levelled.is_empty()).then_some((key, levelled))
        })
        .collect()
}

/// Draws the last `steps` steps of `trace` into the PNG at `path`, under
/// `title`.
pub fn draw_timeline(trace: &Trace, steps: usize, title: &str, path: &Path) -> Result<()> {
    ensure_font()?;
    let fail = |e: &dyn std::fmt::Display| ExperimentError::Plot {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let (from, to) = window(trace, steps);
    let rows = rows(trace, (from, to));
    let heights: Vec<i32> = rows
        .iter()
        .map(|(_, events)| {
            let deepest = events.iter().map(|&(l, _)| l).max().unwrap_or(0);
            (deepest as i32 + 1) * LEVEL + GAP
        })
        .collect();
    let height = TOP + heights.iter().sum::<i32>() + BOTTOM;
    let area = BitMapBackend::new(path, (WIDTH, height.max(200) as u32)).into_drawing_area();
    area.fill(&WHITE).map_err(|e| fail(&e))?;
    let plot_width = f64::from(WIDTH as i32 - LABELS - 20);
    let x_of = |us: i64| LABELS + ((us - from) as f64 / (to - from) as f64 * plot_width) as i32;
    let text = |size: u32| ("sans-serif", size).into_font().color(&BLACK);
    area.draw(&Text::new(title.to_string(), (20, 16), text(22)))
        .map_err(|e| fail(&e))?;
    let mut y = TOP;
    for (((pid, tid), events), h) in rows.iter().zip(&heights) {
        let name = trace.track_name(*pid, *tid).unwrap_or("?");
        let label = if *tid == 0 {
            format!("rank {pid}")
        } else {
            format!("rank {pid} {}", name.trim_start_matches("collectives "))
        };
        area.draw(&Text::new(label, (10, y + 2), text(14)))
            .map_err(|e| fail(&e))?;
        for &(level, e) in events {
            let top = y + level as i32 * LEVEL;
            let (x0, x1) = (
                x_of(e.ts.max(from)),
                x_of((e.ts + e.dur.unwrap_or(0)).min(to)),
            );
            let rect = Rectangle::new(
                [(x0, top), (x1.max(x0 + 1), top + LEVEL - 2)],
                colour_of(e).filled(),
            );
            area.draw(&rect).map_err(|e| fail(&e))?;
        }
        y += h;
        let rule = PathElement::new(
            vec![(10, y - GAP / 2), (WIDTH as i32 - 10, y - GAP / 2)],
            RGBColor(235, 235, 235),
        );
        area.draw(&rule).map_err(|e| fail(&e))?;
    }
    // The time axis, in milliseconds from the window's start.
    let span_ms = (to - from) as f64 / 1e3;
    let tick = [
        0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0,
    ]
    .into_iter()
    .find(|t| span_ms / t <= 12.0)
    .unwrap_or(2000.0);
    let axis = y + 4;
    area.draw(&PathElement::new(
        vec![(LABELS, axis), (WIDTH as i32 - 20, axis)],
        BLACK,
    ))
    .map_err(|e| fail(&e))?;
    let mut t = 0.0;
    while t <= span_ms {
        let x = x_of(from + (t * 1e3) as i64);
        area.draw(&PathElement::new(vec![(x, axis), (x, axis + 5)], BLACK))
            .map_err(|e| fail(&e))?;
        area.draw(&Text::new(format!("{t} ms"), (x - 12, axis + 8), text(13)))
            .map_err(|e| fail(&e))?;
        t += tick;
    }
    // The legend.
    let mut x = LABELS;
    let legend_y = axis + 40;
    for (name, colour) in palette() {
        area.draw(&Rectangle::new(
            [(x, legend_y), (x + 14, legend_y + 14)],
            colour.filled(),
        ))
        .map_err(|e| fail(&e))?;
        area.draw(&Text::new(name, (x + 18, legend_y), text(13)))
            .map_err(|e| fail(&e))?;
        x += 24 + 8 * name.len() as i32;
    }
    area.present().map_err(|e| fail(&e))?;
    Ok(())
}
