//! The shaped-network report of `gradwire compare --network`: time, not
//! only bytes. Before the runs, the link is calibrated; after them, one row per strategy:
//! seconds per step split into compute, compression and network, bytes per
//! step, time to the target (accuracy, or the GPT's loss), the speedup
//! over the baseline (the library's own all-reduce), and what the cost
//! model predicted (the calibration: `calibrate.rs`).

use crate::train::{RunReport, Target};
use comfy_table::{Cell, CellAlignment, Table, presets::UTF8_FULL_CONDENSED};
use serde::{Deserialize, Serialize};

/// One strategy's row of the shaped report (`project::profile_of` builds
/// the profile `gradwire project` reads from the same rows).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShapedRow {
    /// The strategy's label.
    pub label: String,
    /// Final test accuracy.
    pub final_accuracy: f64,
    /// Final test loss.
    #[serde(default)]
    pub final_loss: f64,
    /// What counts as trained (95 % accuracy, or the GPT's target loss).
    #[serde(default)]
    pub target: Target,
    /// Wall-clock seconds to the target, if reached.
    pub seconds_to_target: Option<f64>,
    /// Steps to the target, if reached.
    pub steps_to_target: Option<u64>,
    /// The step's time, split.
    pub split: crate::train::StepSplit,
}

impl ShapedRow {
    /// The row of one run.
    pub fn of(run: &RunReport) -> ShapedRow {
        ShapedRow {
            label: run.label.clone(),
            final_accuracy: run.final_accuracy(),
            final_loss: run.final_loss(),
            target: run.target(),
            seconds_to_target: run.seconds_to_target(),
            steps_to_target: run.steps_to_target(),
            split: run.per_step(),
        }
    }
}

/// The shaped report's table: `predicted[i]` is the cost model's seconds
/// per step for run `i`, if any; the baseline is the run labelled
/// `baseline`.
pub fn shaped_table(runs: &[RunReport], predicted: &[Option<f64>]) -> Table {
    let rows: Vec<ShapedRow> = runs.iter().map(ShapedRow::of).collect();
    let baseline = rows.iter().find(|r| r.label == "baseline");
    let target = rows.first().map(|r| r.target).unwrap_or_default();
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header(vec![
        "strategy".to_string(),
        format!("final {}", target.measure_name()),
        format!("s to {target}"),
        "s / step".into(),
        "compute".into(),
        "codec".into(),
        "network".into(),
        "of which imbalance".into(),
        "MB / step".into(),
        "speedup".into(),
        "model s / step".into(),
        "model error".into(),
    ]);
    let right = |text: String| Cell::new(text).set_alignment(CellAlignment::Right);
    let ms = |s: Option<f64>| s.map_or("-".to_string(), |s| format!("{:.1} ms", s * 1e3));
    for (i, r) in rows.iter().enumerate() {
        let split = &r.split;
        // Against the baseline: time to accuracy where both reached it,
        // else seconds per step.
        let speedup = baseline.map(|b| match (b.seconds_to_target, r.seconds_to_target) {
            (Some(b), Some(s)) if s > 0.0 => format!("{:.2}x", b / s),
            _ if split.total > 0.0 => format!("{:.2}x / step", b.split.total / split.total),
            _ => "-".into(),
        });
        let model = predicted.get(i).copied().flatten();
        table.add_row(vec![
            Cell::new(&r.label),
            right(target.show(target.pick(r.final_accuracy, r.final_loss))),
            right(
                r.seconds_to_target
                    .map_or("-".into(), |s| format!("{s:.1}")),
            ),
            right(format!("{:.1} ms", split.total * 1e3)),
            right(format!("{:.1} ms", split.compute * 1e3)),
            right(ms(split.codec)),
            right(ms(split.network)),
            right(ms(split.imbalance)),
            right(format!("{:.3}", split.bytes / 1e6)),
            right(speedup.unwrap_or_else(|| "-".into())),
            right(ms(model)),
            right(model.map_or("-".into(), |m| {
                format!(
                    "{:+.0} %",
                    (m - split.total) / split.total.max(1e-12) * 100.0
                )
            })),
        ]);
    }
    table
}
