//! Running the matrix: on in-process ranks, or on the ranks of any
//! communicator (records gathered over it).

use super::*;
use gradwire_comm::Communicator;

/// Runs every terminal scenario on `world` in-process ranks.
pub fn run_local_terminal(world: usize, deadline: Duration) -> crate::Result<Vec<TerminalReport>> {
    use gradwire_comm::{LocalConfig, local};
    check_run(world, deadline)?;
    let config = LocalConfig::with_timeout(Some(deadline));
    let _quiet = QuietInjectedPanics::install();
    let mut reports = Vec::new();
    for (mode, fault) in terminal_scenarios() {
        let results = local::run_with(world, &config, |comm| {
            run_scenario(comm, mode, fault, false)
        })?;
        // A panicked rank has no record; any other failure is a real error.
        let records = results
            .into_iter()
            .map(|r| match r {
                Ok(record) => record.map(Some).map_err(crate::ExperimentError::from),
                Err(gradwire_comm::CommError::RankPanicked { .. }) => Ok(None),
                Err(e) => Err(e.into()),
            })
            .collect::<crate::Result<Vec<_>>>()?;
        reports.push(TerminalReport::judge(mode, fault, &records));
    }
    Ok(reports)
}

/// Silences the panic hook for this module's injected panics (their
/// messages start with "injected") while it lives; every other panic is
/// reported by the hook that was there before.
struct QuietInjectedPanics;

type PanicHook = Box<dyn Fn(&std::panic::PanicHookInfo<'_>) + Sync + Send + 'static>;

static PREVIOUS_HOOK: std::sync::Mutex<Option<std::sync::Arc<PanicHook>>> =
    std::sync::Mutex::new(None);

impl QuietInjectedPanics {
    fn install() -> QuietInjectedPanics {
        let previous: std::sync::Arc<PanicHook> = std::sync::Arc::new(std::panic::take_hook());
        if let Ok(mut slot) = PREVIOUS_HOOK.lock() {
            *slot = Some(std::sync::Arc::clone(&previous));
        }
        std::panic::set_hook(Box::new(move |info| {
            let message = info
                .payload()
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| info.payload().downcast_ref::<&str>().copied())
                .unwrap_or("");
            if !message.starts_with("injected") {
                previous(info);
            }
        }));
        QuietInjectedPanics
    }
}

impl Drop for QuietInjectedPanics {
    fn drop(&mut self) {
        let previous = PREVIOUS_HOOK.lock().ok().and_then(|mut slot| slot.take());
        if let Some(previous) = previous {
            std::panic::set_hook(Box::new(move |info| previous(info)));
        }
    }
}

impl RankRecord {
    /// The record as words for an all-gather: per step its outcome code
    /// and its time in microseconds, then a 64-bit FNV-1a digest of the
    /// parameters (an error's text does not travel).
    fn encode(&self) -> Vec<u64> {
        let mut words = vec![self.outcomes.len() as u64];
        for (o, t) in self.outcomes.iter().zip(&self.times) {
            words.push(match o {
                Outcome::Done => 1,
                Outcome::Skipped => 2,
                Outcome::Fault(rank, kind) => {
                    3 | u64::from(kind.code()) << 8 | rank.map_or(0xFFFF, |r| r as u64) << 16
                }
                Outcome::Lost(r) => 5 | (*r as u64) << 16,
                Outcome::Error(_) => 4,
            });
            words.push(t.as_micros() as u64);
        }
        let mut digest = fnv::FnvHasher::default();
        for bits in &self.params {
            std::hash::Hasher::write(&mut digest, &bits.to_le_bytes());
        }
        words.push(std::hash::Hasher::finish(&digest));
        words
    }

    /// What [`RankRecord::encode`] wrote (parameters as their digest).
    fn decode(words: &[u64]) -> Option<RankRecord> {
        let (&n, rest) = words.split_first()?;
        let n = usize::try_from(n).ok()?;
        let mut record = RankRecord {
            outcomes: Vec::with_capacity(n),
            times: Vec::with_capacity(n),
            params: Vec::new(),
        };
        for pair in rest.get(..2 * n)?.chunks(2) {
            let code = pair[0];
            let rank = (code >> 16) as usize;
            record.outcomes.push(match code & 0xFF {
                1 => Outcome::Done,
                2 => Outcome::Skipped,
                3 => Outcome::Fault(
                    (rank != 0xFFFF).then_some(rank),
                    FaultKind::from_code(((code >> 8) & 0xFF) as u32),
                ),
                5 => Outcome::Lost(rank),
                _ => Outcome::Error("(on another rank)".into()),
            });
            record.times.push(Duration::from_micros(pair[1]));
        }
        let digest = *rest.get(2 * n)?;
        record.params = vec![digest as u32, (digest >> 32) as u32];
        Some(record)
    }
}

/// Runs every scenario on the ranks of `comm` (each on its own duplicate,
/// so a scenario's faults stay in it), gathers every rank's record over
/// `comm` and judges each; every rank gets the same reports.
pub fn run_on<C: Communicator + 'static>(comm: &C) -> crate::Result<Vec<Report>> {
    run_share_on(comm, Share::WHOLE)
}

/// [`run_on`] for the scenarios of `share` only; every rank must pass the
/// same share.
pub fn run_share_on<C: Communicator + 'static>(
    comm: &C,
    share: Share,
) -> crate::Result<Vec<Report>> {
    let w = comm.world_size();
    // Every rank's record of a run on its own duplicate of `comm`.
    let gather = |run: &dyn Fn(C) -> gradwire_optim::Result<RankRecord>| {
        let own = comm
            .split(Some(0), comm.rank() as i64)?
            .ok_or_else(|| crate::ExperimentError::Usage("a split left this rank out".into()))?;
        let record = run(own)?;
        // Records have one length on every rank that completed the run.
        let gathered = comm.all_gather_varied(&record.encode())?;
        (0..w)
            .map(|r| {
                RankRecord::decode(gathered.part(r)).ok_or_else(|| {
                    crate::ExperimentError::Usage(format!(
                        "rank {r} sent a record this rank cannot read"
                    ))
                })
            })
            .collect::<crate::Result<Vec<_>>>()
    };
    let mut references = References::default();
    let mut reports = Vec::new();
    let all = scenarios();
    for &(mode, fault, skip) in &all[share.range(all.len())] {
        let records = gather(&|own| run_scenario(own, mode, fault, skip))?;
        let reference = references.get(mode, fault, skip, || {
            let lost: Vec<usize> = steps_lost(mode, FAULT_STEP).collect();
            gather(&|own| run_without(own, mode, skip, &lost, STEPS))
        })?;
        reports.push(Report::judge(mode, fault, skip, &records, reference));
    }
    Ok(reports)
}

/// The runs without the fault step (its round, in DiLoCo: [`steps_lost`]),
/// one per mode and skip setting, made
/// when a scenario first needs one (a scenario with a fault that passes).
#[derive(Default)]
struct References(Vec<((StrategyConfig, bool), Vec<RankRecord>)>);

impl References {
    fn get(
        &mut self,
        mode: StrategyConfig,
        fault: Fault,
        skip: bool,
        run: impl FnOnce() -> crate::Result<Vec<RankRecord>>,
    ) -> crate::Result<Option<&[RankRecord]>> {
        if fault == Fault::None || !fault.restores(mode, FAULT_STEP) {
            return Ok(None);
        }
        let at = match self.0.iter().position(|(key, _)| *key == (mode, skip)) {
            Some(at) => at,
            None => {
                self.0.push(((mode, skip), run()?));
                self.0.len() - 1
            }
        };
        Ok(Some(&self.0[at].1))
    }
}

/// Runs every scenario on `world` in-process ranks (LocalComm, with a
/// deadline of `deadline`) and judges each.
pub fn run_local(world: usize, deadline: Duration) -> crate::Result<Vec<Report>> {
    use gradwire_comm::{LocalConfig, local};
    check_run(world, deadline)?;
    let config = LocalConfig::with_timeout(Some(deadline));
    let run = |scenario: &(
                    dyn Fn(gradwire_comm::LocalComm) -> gradwire_optim::Result<RankRecord> + Sync
                )| {
        local::run_with(world, &config, scenario)?
            .into_iter()
            .map(|r| {
                r.map_err(crate::ExperimentError::from)?
                    .map_err(crate::ExperimentError::from)
            })
            .collect::<crate::Result<Vec<_>>>()
    };
    let mut references = References::default();
    let mut reports = Vec::new();
    for (mode, fault, skip) in scenarios() {
        let records = run(&|comm| run_scenario(comm, mode, fault, skip))?;
        let reference = references.get(mode, fault, skip, || {
            let lost: Vec<usize> = steps_lost(mode, FAULT_STEP).collect();
            run(&|comm| run_without(comm, mode, skip, &lost, STEPS))
        })?;
        reports.push(Report::judge(mode, fault, skip, &records, reference));
    }
    Ok(reports)
}

/// The fault matrix's settings, checked: 1 to
/// [`MAX_LOCAL_WORLD`](crate::config::MAX_LOCAL_WORLD) ranks (threads of
/// this process), a deadline of at least a second (shorter ones time out
/// healthy steps and break scenarios that keep the failure model).
fn check_run(world: usize, deadline: Duration) -> crate::Result<()> {
    crate::config::check_local_world("--world", world)?;
    if deadline < Duration::from_secs(1) {
        return Err(crate::ExperimentError::Usage(format!(
            "--deadline must be at least 1 second, got {deadline:?}"
        )));
    }
    Ok(())
}
