//! The cases of whole training runs: a candle MLP through gradwire-candle,
//! uneven inputs through `GradSync::join`, and `gradwire train` against
//! the same run on LocalComm.

use super::{CaseError, Checks};
use gradwire_comm::Communicator;
use gradwire_experiments::Backend;
use gradwire_optim::{DistOptConfig, GradSync, ParamSpec};
use std::sync::Arc;

/// A communicator of every rank of `comm`, in its order (a split in which
/// nobody is left out): a case's own, so that what it leaves behind (a
/// lost lane, a poisoned group) stays there.
fn whole_copy<C: Communicator>(comm: &C) -> Result<C, CaseError> {
    comm.split(Some(0), comm.rank() as i64)?
        .ok_or_else(|| CaseError::Candle("a split left this rank out".into()))
}

/// A candle MLP trained through gradwire-candle on this backend equals one
/// process on the global batch, and every rank ends bitwise equal (dense,
/// SGD; the model and data of [`crate::candle_model`]).
pub(super) fn candle_training<C: Communicator + 'static>(
    comm: &C,
    checks: &mut Checks,
) -> Result<(), CaseError> {
    use crate::candle_model::{first_far, single, worker};
    let own = whole_copy(comm)?;
    let run = |r: candle_core::Result<_>| r.map_err(|e| CaseError::Candle(e.to_string()));
    // candle-nn's SGD, and gradwire's SGD with momentum and AdamW in place
    // on candle's variables (gradwire-candle's optimizers).
    let momentum = gradwire_optim::SgdConfig::default().lr(0.2).momentum(0.9);
    let adamw = gradwire_optim::AdamConfig::adamw().lr(0.01);
    let runs = [
        (
            "candle SGD",
            run(worker::<candle_nn::SGD, _>(
                whole_copy(&own)?,
                0.5,
                DistOptConfig::default(),
            ))?
            .0,
            run(single::<candle_nn::SGD>(0.5))?.0,
        ),
        (
            "gradwire SGD with momentum",
            run(worker::<gradwire_candle::Sgd, _>(
                whole_copy(&own)?,
                momentum.clone(),
                DistOptConfig::default(),
            ))?
            .0,
            run(single::<gradwire_candle::Sgd>(momentum))?.0,
        ),
        (
            "gradwire AdamW",
            run(worker::<gradwire_candle::AdamW, _>(
                own,
                adamw.clone(),
                DistOptConfig::default(),
            ))?
            .0,
            run(single::<gradwire_candle::AdamW>(adamw))?.0,
        ),
    ];
    for (name, got, want) in runs {
        checks.check(first_far(&got, &want).is_none(), || {
            format!("{name}: far from one process: {:?}", first_far(&got, &want))
        });
        let bits: Vec<u32> = got.iter().flatten().map(|x| x.to_bits()).collect();
        let mut all = vec![0u32; bits.len() * comm.world_size()];
        comm.all_gather(&bits, &mut all)?;
        checks.check(all.chunks(bits.len()).all(|c| c == bits.as_slice()), || {
            format!("{name}: ranks differ after candle training")
        });
    }
    Ok(())
}

/// Uneven inputs (`GradSync::join`): rank r has 1 + r steps of data,
/// weights each step by its samples and joins when out; every step's
/// combined gradient is the mean over the samples of the ranks still
/// training (against f64), and `join` takes part in the steps left.
pub(super) fn uneven_inputs<C: Communicator + 'static>(
    comm: &C,
    checks: &mut Checks,
) -> Result<(), CaseError> {
    let own = whole_copy(comm)?;
    let (rank, world) = (comm.rank(), comm.world_size());
    // Lengths 1, a prime and a matrix's.
    let lens = [1usize, 13, 28];
    let specs = lens
        .iter()
        .enumerate()
        .map(|(k, &n)| ParamSpec::new(format!("p{k}"), [n]))
        .collect();
    let mut sync = GradSync::new(own, specs, DistOptConfig::default())?;
    let samples = |r: usize, step: usize| ((r * 3 + step * 5) % 4) as u64 + 1;
    let value = |r: usize, step: usize, k: usize, i: usize| {
        (((r * 131 + step * 17 + k * 5 + i) as f32) * 0.37).sin() * 0.5
    };
    let mut combined: Vec<Vec<f32>> = lens.iter().map(|&n| vec![0.0; n]).collect();
    for step in 0..=rank {
        sync.set_samples(samples(rank, step))?;
        for (k, &n) in lens.iter().enumerate() {
            let grad: Vec<f32> = (0..n).map(|i| value(rank, step, k, i)).collect();
            sync.push(k, &grad)?;
        }
        let mut buffers: Vec<&mut [f32]> = combined.iter_mut().map(Vec::as_mut_slice).collect();
        sync.finish(&mut buffers)?;
        let active: Vec<usize> = (step..world).collect();
        let total: u64 = active.iter().map(|&r| samples(r, step)).sum();
        for (k, got) in combined.iter().enumerate() {
            for (i, &g) in got.iter().enumerate() {
                let want = active
                    .iter()
                    .map(|&r| samples(r, step) as f64 * f64::from(value(r, step, k, i)))
                    .sum::<f64>()
                    / total as f64;
                let bound = 1e-5 * world as f64 * (1.0 + want.abs());
                checks.check((f64::from(g) - want).abs() <= bound, || {
                    format!("step {step}, p{k}[{i}]: {g} against the samples' mean {want}")
                });
            }
        }
    }
    let joined = sync.join()?;
    checks.check(joined as usize == world - 1 - rank, || {
        format!(
            "join took part in {joined} steps, {} left",
            world - 1 - rank
        )
    });
    Ok(())
}

/// LocalComm's report of a run of `config`, trained (by `train`) once per
/// process: every harness of a test binary (LocalComm's own, NcclComm's
/// host transport under both reductions) compares with that same run,
/// which on LocalComm is bitwise the same every time (what
/// [`training_runs_match_local`] checks there, against its own run). A
/// failed run is not kept.
fn local_reference(
    config: &gradwire_experiments::TrainConfig,
    train: impl FnOnce() -> gradwire_experiments::Result<gradwire_experiments::RunReport>,
) -> gradwire_experiments::Result<gradwire_experiments::RunReport> {
    use std::collections::HashMap;
    use std::sync::{LazyLock, Mutex, PoisonError};
    type Slot = Arc<Mutex<Option<gradwire_experiments::RunReport>>>;
    static REPORTS: LazyLock<Mutex<HashMap<String, Slot>>> = LazyLock::new(Default::default);
    // Every field of the run, printed: equal keys are equal runs.
    let key = format!("{config:?}");
    let slot = Arc::clone(
        REPORTS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key)
            .or_default(),
    );
    // Held while training, so that a second harness asking for the same
    // run waits for this one instead of training it too.
    let mut report = slot.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(report) = report.as_ref() {
        return Ok(report.clone());
    }
    let fresh = train()?;
    *report = Some(fresh.clone());
    Ok(fresh)
}

/// `gradwire train` on this communicator gives rank 0 bitwise the model, the
/// accuracies and the traffic that the same run on LocalComm threads gives,
/// for a strategy of each family (dense, sparse with error feedback, partial
/// averaging, AdaSum by delta weight, DimReduce across its mode switch).
pub(super) fn training_runs_match_local<C: Backend + 'static>(
    comm: &C,
    checks: &mut Checks,
) -> Result<(), CaseError> {
    use gradwire_experiments::train::{Silent, train, train_rank};
    use gradwire_experiments::{
        TrainConfig,
        data::{Dataset, Digits},
    };
    let data = Dataset::Digits(Digits::load(42));
    let mlp = TrainConfig {
        world: comm.world_size(),
        epochs: 2,
        hidden: vec![16],
        dimreduce_dense_epochs: Some(1),
        components: 8,
        ..TrainConfig::default()
    };
    // The convolutional network too, with AdamW's state.
    let cnn = TrainConfig {
        strategy: "fp16".parse().expect("a registry name"),
        model: gradwire_experiments::ModelKind::Cnn,
        channels: vec![4, 8],
        optimizer: gradwire_experiments::OptimizerKind::Adamw,
        lr: 0.01,
        ..mlp.clone()
    };
    let configs = ["dense", "topk:0.05", "partial", "adasum-delta", "dimreduce"].map(|strategy| {
        TrainConfig {
            strategy: strategy.parse().expect("a registry name"),
            ..mlp.clone()
        }
    });
    for config in configs.iter().chain([&cnn]) {
        let (config, strategy) = (config.clone(), config.strategy);
        // A copy of the communicator for the run: train_rank takes it.
        let Some(run_comm) = comm.split(Some(0), comm.rank() as i64)? else {
            checks.check(false, || "split(Some(0)) gave no communicator".into());
            continue;
        };
        let report = train_rank(run_comm, &config, &data, &Silent, None)?;
        if comm.rank() != 0 {
            continue;
        }
        let Some(report) = report else {
            checks.check(false, || format!("{strategy:?}: rank 0 returned no report"));
            continue;
        };
        let local = local_reference(&config, || train(&config, &data, &Silent, None))?;
        if !checks.exact_sums() {
            // A library's sums: the same traffic, and the model as good.
            let traffic = |r: &gradwire_experiments::RunReport| -> Vec<u64> {
                r.epochs.iter().map(|e| e.bytes_total).collect()
            };
            checks.check(traffic(&report) == traffic(&local), || {
                format!("{strategy:?}: per-epoch traffic differs from LocalComm's")
            });
            let last =
                |r: &gradwire_experiments::RunReport| r.epochs.last().map(|e| e.test_accuracy);
            let close = match (last(&report), last(&local)) {
                (Some(a), Some(b)) => (a - b).abs() <= 0.05,
                _ => false,
            };
            checks.check(close, || {
                format!(
                    "{strategy:?}: final accuracy {:?}, LocalComm's {:?}",
                    last(&report),
                    last(&local)
                )
            });
            continue;
        }
        checks.check(report.param_checksum == local.param_checksum, || {
            format!(
                "{strategy:?}: parameters {} here, {} on LocalComm",
                report.param_checksum, local.param_checksum
            )
        });
        let summary = |r: &gradwire_experiments::RunReport| -> Vec<(u64, u64, u64)> {
            r.epochs
                .iter()
                .map(|e| {
                    (
                        e.test_accuracy.to_bits(),
                        e.train_loss.to_bits(),
                        e.bytes_total,
                    )
                })
                .collect()
        };
        checks.check(summary(&report) == summary(&local), || {
            format!("{strategy:?}: per-epoch accuracy, loss or traffic differ from LocalComm")
        });
    }
    Ok(())
}
