//! Judging a scenario from every rank's record, and the tables.

use super::*;

/// Every rank's record of one scenario, judged.
#[derive(Debug, Clone)]
pub struct Report {
    /// The mode.
    pub mode: StrategyConfig,
    /// The fault.
    pub fault: Fault,
    /// Whether DistOpt skipped non-finite steps.
    pub skip_non_finite: bool,
    /// Rank 0's outcome at the step the fault is reported at
    /// ([`reported_at`]).
    pub at_fault: Outcome,
    /// Whether every rank saw the same outcome at every step.
    pub agreed: bool,
    /// Whether every step but the one the fault is reported at
    /// ([`reported_at`]) completed on every rank.
    pub recovered: bool,
    /// Whether the ranks ended with bitwise-equal parameters (`None` in
    /// partial mode, local SGD, where ranks differ by design).
    pub equal: Option<bool>,
    /// Whether every rank ended with bitwise the parameters it has in a run
    /// without the fault step (not taken at all, on any rank): the failed
    /// or skipped step changed nothing, in parameters, optimizer state,
    /// residuals or counters, which the later steps would show. `None`
    /// without a fault, or where [`Fault::restores`] says the run cannot
    /// end so (an optimizer error: the failing rank's update may be
    /// partial).
    pub unchanged: Option<bool>,
    /// The slowest rank's time for the fault step.
    pub time_to_outcome: Duration,
}

impl Report {
    /// Judges the records of every rank (rank order), against `reference`,
    /// every rank's record of the run without the fault step, where there
    /// is one.
    pub fn judge(
        mode: StrategyConfig,
        fault: Fault,
        skip: bool,
        records: &[RankRecord],
        reference: Option<&[RankRecord]>,
    ) -> Report {
        let first = &records[0];
        let at = reported_at(mode, FAULT_STEP);
        // Outcomes compared whole: the same kind and the same named rank.
        let agreed = records.iter().all(|r| r.outcomes == first.outcomes);
        let recovered = records.iter().all(|r| {
            r.outcomes.len() > at
                && r.outcomes[..at]
                    .iter()
                    .chain(&r.outcomes[at + 1..])
                    .all(|o| *o == Outcome::Done)
        });
        // Partial averaging and DiLoCo's inner steps keep ranks apart.
        let equal = (!matches!(
            mode,
            StrategyConfig::Partial { .. } | StrategyConfig::DiLoCo(_)
        ))
        .then(|| records.iter().all(|r| r.params == first.params));
        let time_to_outcome = records
            .iter()
            .filter_map(|r| r.times.get(at))
            .max()
            .copied()
            .unwrap_or_default();
        let unchanged = reference.map(|clean| {
            records.len() == clean.len()
                && records.iter().zip(clean).all(|(r, c)| r.params == c.params)
        });
        Report {
            mode,
            fault,
            skip_non_finite: skip,
            at_fault: first.outcomes.get(at).cloned().unwrap_or(Outcome::Done),
            agreed,
            recovered,
            equal,
            unchanged,
            time_to_outcome,
        }
    }

    /// What the failure model promises for this row: the same outcome
    /// everywhere, the next steps done, and (for faults that pass) equal
    /// parameters; the fault step's outcome is the expected one.
    pub fn holds(&self) -> bool {
        let expected = match self.fault {
            Fault::None => matches!(self.at_fault, Outcome::Done),
            Fault::Nan | Fault::Inf if self.skip_non_finite => self.at_fault == Outcome::Skipped,
            Fault::Nan | Fault::Inf => {
                matches!(self.at_fault, Outcome::Fault(_, FaultKind::NonFinite))
            }
            Fault::UnknownName | Fault::WrongLength | Fault::WrongShape => {
                matches!(
                    self.at_fault,
                    Outcome::Fault(Some(_), FaultKind::InvalidArgument)
                )
            }
            Fault::OptimizerError => {
                matches!(self.at_fault, Outcome::Fault(Some(_), FaultKind::Optimizer))
            }
            // Judged by [`TerminalReport`]: the run does not go on.
            Fault::PanickingStrategy | Fault::RankPanics | Fault::DropsCommunicator => false,
        };
        let equal = self.equal.unwrap_or(true) || !self.fault.passes();
        let unchanged = self.unchanged != Some(false);
        expected && self.agreed && self.recovered && equal && unchanged
    }
}

/// The faults that end a run, judged: every surviving rank's run ends with
/// a step that fails naming the lost rank, promptly.
///
/// The failing step is the one the fault is reported at ([`reported_at`]:
/// [`FAULT_STEP`] but in the outer loops), or the step before it on a rank that
/// was still finishing that step when the faulty rank, done with it,
/// left: a group that lost a rank fails every later call on it (LocalComm's
/// rule), so a survivor's last exchanges with the other survivors fail too.
#[derive(Debug, Clone)]
pub struct TerminalReport {
    /// The mode.
    pub mode: StrategyConfig,
    /// The fault.
    pub fault: Fault,
    /// Each rank's last step and its outcome (`None`: the rank is gone).
    pub outcomes: Vec<Option<(usize, Outcome)>>,
    /// Whether every step before a rank's last one completed.
    pub done_before: bool,
    /// The slowest surviving rank's time for its last step.
    pub time_to_outcome: Duration,
}

impl TerminalReport {
    /// Judges every rank's record (`None` for the rank that panicked).
    pub fn judge(
        mode: StrategyConfig,
        fault: Fault,
        records: &[Option<RankRecord>],
    ) -> TerminalReport {
        let last = |r: &RankRecord| r.outcomes.last().map(|o| (r.outcomes.len() - 1, o.clone()));
        let outcomes = records.iter().map(|r| r.as_ref().and_then(last)).collect();
        let done_before = records.iter().flatten().all(|r| {
            let n = r.outcomes.len().saturating_sub(1);
            r.outcomes[..n].iter().all(|o| *o == Outcome::Done)
        });
        let time_to_outcome = records
            .iter()
            .flatten()
            .filter_map(|r| r.times.last())
            .max()
            .copied()
            .unwrap_or_default();
        TerminalReport {
            mode,
            fault,
            outcomes,
            done_before,
            time_to_outcome,
        }
    }

    /// Whether every rank still there ended with a step that failed naming
    /// the lost rank (the last one), at the fault step or the one before,
    /// every earlier step done. The faulty rank itself may be gone, may have
    /// returned after its last completed step, or (a panicking strategy on
    /// its communication thread) fail naming itself.
    pub fn holds(&self) -> bool {
        let lost = self.outcomes.len() - 1;
        let ends_lost = self.outcomes.iter().enumerate().all(|(rank, o)| match o {
            // The faulty rank: gone, left after its last completed step, or
            // failed naming itself (its own job panicked).
            _ if rank == lost => true,
            Some((step, o)) => {
                let at = reported_at(self.mode, FAULT_STEP);
                *o == Outcome::Lost(lost) && (at.saturating_sub(1)..=at).contains(step)
            }
            None => false,
        });
        // A world of one has nobody to tell.
        self.done_before && (ends_lost || lost == 0)
    }
}

/// The terminal scenarios as a table.
pub fn terminal_table(reports: &[TerminalReport], backend: &str, world: usize) -> String {
    use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header(vec![
        "mode".to_string(),
        "fault (last rank)".to_string(),
        format!("last step per rank: outcome, {backend} W={world}"),
        "ms".to_string(),
        "holds".to_string(),
    ]);
    for r in reports {
        let outcomes: Vec<String> = r
            .outcomes
            .iter()
            .map(|o| {
                o.as_ref().map_or_else(
                    || "gone".to_string(),
                    |(step, o)| format!("{step}: {}", o.label()),
                )
            })
            .collect();
        table.add_row(vec![
            r.mode.to_string(),
            r.fault.name().to_string(),
            outcomes.join(" | "),
            format!("{:.1}", r.time_to_outcome.as_secs_f64() * 1e3),
            if r.holds() { "yes" } else { "NO" }.to_string(),
        ]);
    }
    table.to_string()
}

/// The matrix as a table: mode, fault, `skip_non_finite`, the outcome at
/// the fault step (every rank's, when they agree), the steps after it,
/// equal parameters, the slowest rank's time to the outcome, and whether
/// the row keeps the failure model.
pub fn table(reports: &[Report], backend: &str, world: usize) -> String {
    use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header(vec![
        "mode",
        "fault (last rank)",
        "skip",
        &format!("outcome, {backend} W={world}"),
        "next 3 steps",
        "ranks equal",
        "as without it",
        "ms",
        "holds",
    ]);
    for r in reports {
        table.add_row(vec![
            r.mode.to_string(),
            r.fault.name().to_string(),
            if r.skip_non_finite { "yes" } else { "no" }.to_string(),
            if r.agreed {
                format!("{} on every rank", r.at_fault.label())
            } else {
                "DIFFERS between ranks".to_string()
            },
            if r.recovered { "done" } else { "FAILED" }.to_string(),
            match r.equal {
                None => "n/a (local SGD)",
                Some(true) => "bitwise",
                Some(false) if r.fault.passes() => "NO",
                Some(false) => "differ (partial update)",
            }
            .to_string(),
            match r.unchanged {
                None => "-",
                Some(true) => "bitwise",
                Some(false) => "NO",
            }
            .to_string(),
            format!("{:.1}", r.time_to_outcome.as_secs_f64() * 1e3),
            if r.holds() { "yes" } else { "NO" }.to_string(),
        ]);
    }
    table.to_string()
}
