//! `gradwire train`: one strategy on LocalComm threads, MPI processes or
//! NCCL ranks (or, with `--network`, MPI ranks on a shaped network), a row
//! per epoch and a summary.

use crate::console::{Console, print_train_header};
use gradwire_experiments::ExperimentError;
use gradwire_experiments::train::TrainArgs;
use std::sync::Mutex;

/// Runs `gradwire train` with its flags.
pub(crate) fn run(args: TrainArgs) -> Result<(), ExperimentError> {
    let json = args.common.json;
    let console = Console {
        json,
        bar: Mutex::new(None),
    };
    let report = args.run(&console, |config| print_train_header(config, json))?;
    // Under MPI only rank 0 reports (with --network, rank 0 of the ranks).
    let Some(report) = report else {
        return Ok(());
    };
    if json {
        let mut value = serde_json::to_value(&report)?;
        if let Some(map) = value.as_object_mut() {
            map.insert("type".into(), "summary".into());
        }
        println!("{value}");
    } else {
        println!(
            "final test accuracy {:.1} %, best {:.1} %, test loss {:.4} (perplexity {:.2}), epochs to {}: {}, {:.3} MB sent per worker (dense / sent: {:.1}x), parameters {}",
            report.final_accuracy() * 100.0,
            report.best_accuracy() * 100.0,
            report.final_loss(),
            report.final_loss().exp(),
            report.target(),
            report
                .epochs_to_target()
                .map_or("not reached".to_string(), |e| e.to_string()),
            report.bytes_per_worker() as f64 / 1e6,
            report.compression(),
            report.param_checksum
        );
        if let Some(s) = report.epochs.last().and_then(|e| e.straggler) {
            println!(
                "waited for most: rank {} (last to arrive in {:.0} % of the last epoch's exchanges, by {:.2} ms on average)",
                s.rank,
                s.share * 100.0,
                s.late_secs * 1e3
            );
        }
        if let (Some(t), Some(path)) = (&report.timeline, &report.config.timeline) {
            let last = t.last.map_or(String::new(), |(rank, n, us)| {
                format!(
                    "; rank {rank} arrived last most often ({n} times, {:.2} ms late on average)",
                    us / 1e3
                )
            });
            let picture = t.picture.as_ref().map_or(String::new(), |p| {
                format!(", the last steps drawn in {}", p.display())
            });
            println!(
                "timeline: {} ({} collectives on one clock; open it in ui.perfetto.dev{picture}){last}",
                path.display(),
                t.collectives
            );
        }
    }
    Ok(())
}
