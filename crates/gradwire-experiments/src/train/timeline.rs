//! `--timeline FILE`: at the end of a run every rank's timeline is merged
//! ([`gradwire_comm::gather_trace`], collective) and rank 0 writes it,
//! whole or not at all, as a Chrome trace; every rank learns whether it
//! was written. Beside it rank 0 draws the last [`PICTURE_STEPS`] steps
//! (`FILE` with the extension `png`), a picture that may fail (no font)
//! without failing the run: it says so on stderr.

use super::agree::agree;
use crate::error::{ExperimentError, Result};
use gradwire_comm::{Communicator, Trace};
use gradwire_optim::OptimError;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::Path;

/// Steps the timeline's picture shows (the run's last).
pub const PICTURE_STEPS: usize = 3;

/// What the written timeline shows, for the run's summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimelineSummary {
    /// Collectives matched across the ranks.
    pub collectives: usize,
    /// The rank that arrived last most often, how often, and the mean
    /// microseconds the first arrival waited for it then.
    pub last: Option<(usize, u64, f64)>,
    /// The picture of the last steps, where one was drawn.
    pub picture: Option<std::path::PathBuf>,
}

impl TimelineSummary {
    fn of(trace: &Trace) -> TimelineSummary {
        let last = trace
            .last_arrivals
            .iter()
            .enumerate()
            // Most often; a tie goes to the lower rank.
            .fold(
                None,
                |best: Option<(usize, u64, u64)>, (rank, &(n, us))| match best {
                    Some((_, bn, _)) if bn >= n => best,
                    _ => (n > 0).then_some((rank, n, us)),
                },
            )
            .map(|(rank, n, us)| (rank, n, us as f64 / n as f64));
        TimelineSummary {
            collectives: trace.collectives().len(),
            last,
            picture: None,
        }
    }
}

/// Merges every rank's timeline and has rank 0 write it to `path`
/// (collective; fails alike on every rank), and draw it (the run called
/// `label`).
pub(super) fn write_timeline<C: Communicator>(
    comm: &C,
    path: &Path,
    label: &str,
) -> Result<TimelineSummary> {
    let trace = gradwire_comm::gather_trace(comm)?;
    let written = if comm.rank() == 0 {
        trace
            .to_json()
            .map_err(ExperimentError::from)
            .and_then(|json| {
                gradwire_optim::checkpoint::save_bytes_with(path, |file| {
                    file.write_all(json.as_bytes())
                })
                .map_err(|e| match e {
                    OptimError::Io(source) => ExperimentError::Io {
                        path: path.display().to_string(),
                        source,
                    },
                    other => ExperimentError::Optim(other),
                })
            })
    } else {
        Ok(())
    };
    agree(comm, written, "write the timeline")?;
    let mut summary = TimelineSummary::of(&trace);
    if comm.rank() == 0 {
        let picture = path.with_extension("png");
        let title = format!(
            "{label}: {} ranks, the last {PICTURE_STEPS} steps",
            comm.world_size()
        );
        match crate::plot::draw_timeline(&trace, PICTURE_STEPS, &title, &picture) {
            Ok(()) => summary.picture = Some(picture),
            Err(e) => eprintln!("gradwire: the timeline's picture was not drawn: {e}"),
        }
    }
    Ok(summary)
}
