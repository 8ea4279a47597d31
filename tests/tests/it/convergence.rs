//! End-to-end: the digits MLP (the CLI's candle model) trained data-parallel
//! on 4 LocalComm ranks through gradwire-candle.
//!
//! Every rank takes its quarter of each global batch of 64 (16 each); SGD
//! with lr 0.05 and momentum 0.9 everywhere; test accuracy is measured four
//! times per epoch, so "epochs to 95 %" has a resolution of a quarter epoch.
//!
//! Dense averaging must reach 95 %. AdaSum by delta weight (each rank a local
//! step on its own 16 samples with the single-worker learning rate, the weight
//! changes combined with AdaSum) must reach 95 % in no more epochs than one
//! worker that takes the same global batches of 64 at that learning rate:
//! that is AdaSum's claim, that it needs no learning-rate rescaling as W
//! grows where averaging slows down. A plain sum of the deltas and one worker
//! taking batches of 16 (four times the steps) are run beside them and printed:
//! on this small problem the gradients of different batches are strongly
//! aligned early on (cosine about 0.5), so AdaSum sits between averaging and
//! the sequential run and does not match the latter (see the AdaSum issue's
//! notes for figures over seeds). Run with `--nocapture` to see the accuracy
//! per quarter epoch.
//!
//! The second test runs DimReduce (through DataParallel) after a dense stage that
//! records the trajectory, beside dense training for the same number of
//! steps: it must reach a clearly lower training loss and stay within a point
//! of dense test accuracy.

use candle_nn::Optimizer as _;
use gradwire_algos::{AdaSum, fused_all_reduce};
use gradwire_candle::{DataParallel, parameters_of};
use gradwire_comm::{Communicator, LocalComm, ReduceOp, local};
use gradwire_experiments::data::{Dataset, Digits, epoch_order};
use gradwire_experiments::model::Model;
use gradwire_optim::{Combined, DistOptConfig, SgdConfig, Strategy, StrategyConfig};
use gradwire_tensor::Tensor;

const HIDDEN: usize = 32;
const BATCH: usize = 16;
const WORLD: usize = 4;
const LR: f64 = 0.05;
const MAX_EPOCHS: usize = 15;
/// Test-accuracy measurements per epoch.
const EVALS_PER_EPOCH: usize = 4;
const TARGET: f64 = 0.95;

fn sgd_config() -> SgdConfig {
    SgdConfig::default().lr(LR).momentum(0.9)
}

fn mlp() -> Model {
    Model::mlp(&[HIDDEN], 7).expect("mlp")
}

/// Whether an evaluation falls after batch `index` of `batches` in an epoch.
fn evaluate_after(index: usize, batches: usize) -> bool {
    (index + 1) * EVALS_PER_EPOCH / batches != index * EVALS_PER_EPOCH / batches
}

/// Test accuracy, `EVALS_PER_EPOCH` times per epoch, of one worker taking
/// batches of `batch`.
fn single_worker(data: &Dataset, batch: usize) -> Vec<f64> {
    let mlp = mlp();
    let mut opt =
        gradwire_candle::Sgd::with_names(mlp.vars().to_vec(), sgd_config()).expect("optimizer");
    let mut accuracy = Vec::new();
    let batches = data.train_len().div_ceil(batch);
    for epoch in 0..MAX_EPOCHS {
        for (index, samples) in epoch_order(data.train_len(), epoch)
            .chunks(batch)
            .enumerate()
        {
            let (_, grads) = mlp.loss_and_grads(data, samples).expect("backward");
            opt.step(&grads).expect("update");
            if evaluate_after(index, batches) {
                accuracy.push(mlp.evaluate(data).expect("accuracy").accuracy);
            }
        }
    }
    accuracy
}

/// A plain sum of the ranks' tensors, presented as final (no division).
struct PlainSum;

impl Strategy<LocalComm> for PlainSum {
    fn combine(
        &mut self,
        comm: &LocalComm,
        _: &gradwire_optim::BucketView<'_>,
        t: &mut [Tensor],
    ) -> gradwire_algos::Result<Combined> {
        let traffic = fused_all_reduce(comm, t, ReduceOp::Sum, usize::MAX)?;
        Ok(Combined {
            traffic,
            averaged: true,
        })
    }
}

/// Test accuracy (rank 0's model), `EVALS_PER_EPOCH` times per epoch, of data-parallel training:
/// every rank takes its quarter of each global batch of `WORLD * BATCH`.
fn data_parallel<K: Strategy<LocalComm>>(
    data: &Dataset,
    mode: StrategyConfig,
    strategy: impl Fn(&LocalComm) -> Option<K> + Sync,
) -> Vec<f64> {
    let results = local::run(WORLD, |comm: LocalComm| {
        let rank = comm.rank();
        let config = DistOptConfig {
            strategy: mode,
            ..DistOptConfig::default()
        };
        let mlp = mlp();
        let vars = mlp.vars().to_vec();
        type Dp = DataParallel<gradwire_candle::Sgd, LocalComm>;
        let mut dist = match strategy(&comm) {
            Some(k) => Dp::with_strategy(vars, sgd_config(), comm, config, k)?,
            None => Dp::from_vars(vars, sgd_config(), comm, config)?,
        };
        let mut accuracy = Vec::new();
        let batches = data.train_len().div_ceil(WORLD * BATCH);
        for epoch in 0..MAX_EPOCHS {
            for (index, global) in epoch_order(data.train_len(), epoch)
                .chunks(WORLD * BATCH)
                .enumerate()
            {
                let mine: Vec<usize> = global.iter().skip(rank).step_by(WORLD).copied().collect();
                let (_, grads) = mlp.loss_and_grads(data, &mine).expect("backward");
                dist.step(grads)?;
                if evaluate_after(index, batches) {
                    accuracy.push(mlp.evaluate(data).expect("accuracy").accuracy);
                }
            }
        }
        Ok::<_, candle_core::Error>(accuracy)
    })
    .expect("ranks");
    results
        .into_iter()
        .next()
        .expect("rank 0")
        .expect("training")
}

/// Epochs until the accuracy, measured `per_epoch` times per epoch, first
/// reaches 95 %.
fn epochs_to_target(accuracy: &[f64], per_epoch: usize) -> Option<f64> {
    accuracy
        .iter()
        .position(|&a| a >= TARGET)
        .map(|i| (i + 1) as f64 / per_epoch as f64)
}

/// Prints a run's accuracy, measured `per_epoch` times per epoch.
fn show(name: &str, accuracy: &[f64], per_epoch: usize) {
    let line: Vec<String> = accuracy
        .iter()
        .map(|a| format!("{:.1}", a * 100.0))
        .collect();
    println!(
        "{name:<32} epochs to 95 %: {:>5}; accuracy ({per_epoch} per epoch): {}",
        epochs_to_target(accuracy, per_epoch).map_or("never".to_string(), |e| format!("{e:.2}")),
        line.join(" ")
    );
}

#[test]
fn dense_and_adasum_reach_95_percent_on_digits() {
    let data = Dataset::Digits(Digits::load(42));
    let global_batch = single_worker(&data, WORLD * BATCH);
    show("one worker, batch 64", &global_batch, EVALS_PER_EPOCH);
    let dense = data_parallel::<PlainSum>(&data, StrategyConfig::Dense, |_| None);
    show("dense average, 4 x 16", &dense, EVALS_PER_EPOCH);
    let adasum = data_parallel(&data, StrategyConfig::DeltaWeight { group: None }, |c| {
        Some(AdaSum::new(c).expect("adasum"))
    });
    show("AdaSum delta weight, 4 x 16", &adasum, EVALS_PER_EPOCH);
    let summed = data_parallel(&data, StrategyConfig::DeltaWeight { group: None }, |_| {
        Some(PlainSum)
    });
    show("plain sum of deltas, 4 x 16", &summed, EVALS_PER_EPOCH);
    let sequential = single_worker(&data, BATCH);
    show("one worker, batch 16", &sequential, EVALS_PER_EPOCH);

    let dense_epochs =
        epochs_to_target(&dense, EVALS_PER_EPOCH).expect("dense averaging never reached 95 %");
    let adasum_epochs = epochs_to_target(&adasum, EVALS_PER_EPOCH)
        .expect("AdaSum by delta weight never reached 95 %");
    let single_epochs = epochs_to_target(&global_batch, EVALS_PER_EPOCH)
        .expect("one worker, batch 64, never reached 95 %");
    assert!(
        adasum_epochs <= single_epochs,
        "AdaSum needed {adasum_epochs} epochs to 95 %, one worker on the same global batches {single_epochs}"
    );
    // Data parallelism must not cost final accuracy: within 2 points of the
    // sequential worker's after the same number of epochs.
    let last = |a: &[f64]| a.last().copied().unwrap_or(0.0);
    for (name, run) in [("dense", &dense), ("AdaSum", &adasum)] {
        assert!(
            last(run) >= last(&sequential) - 0.02,
            "{name} ends at {:.1} %, one worker at {:.1} %",
            last(run) * 100.0,
            last(&sequential) * 100.0
        );
    }
    println!(
        "epochs to 95 %: dense {dense_epochs}, AdaSum {adasum_epochs}, one worker (64) {single_epochs}"
    );
}

/// What [`dense_then_dimreduce`] measured (rank 0).
struct DimReduceRun {
    /// Test accuracy after each epoch.
    accuracy: Vec<f64>,
    /// Loss over the whole training set at the end.
    train_loss: f64,
    /// Fraction of DimReduce's line searches that took a step.
    accepted: f64,
}

/// DimReduce's dense first stage for `dense_epochs` recording the
/// trajectory (one snapshot per step, the last 60 kept), then DimReduce for the
/// remaining epochs (none when `dense_epochs == total_epochs`: plain dense
/// training), on the same global batches.
fn dense_then_dimreduce(data: &Dataset, dense_epochs: usize, total_epochs: usize) -> DimReduceRun {
    use gradwire_algos::dimreduce::{DimReduceConfig, TrajectoryRecorder};
    let results = local::run(WORLD, |comm: LocalComm| {
        let rank = comm.rank();
        let mlp = mlp();
        let mut accuracy = Vec::new();
        let mut recorder = TrajectoryRecorder::new(60);
        let dimreduce = DistOptConfig {
            strategy: StrategyConfig::DimReduce,
            ..DistOptConfig::default()
        };
        let mut dist = DataParallel::<gradwire_candle::Sgd, _>::from_vars(
            mlp.vars().to_vec(),
            sgd_config(),
            comm,
            dimreduce,
        )?;
        let mut accepted = (0usize, 0usize);
        for epoch in 0..total_epochs {
            if epoch == dense_epochs {
                let pca = recorder.fit(32).map_err(candle_core::Error::wrap)?;
                // MindSpore's defaults, but the residual momentum's rate set
                // to the SGD learning rate: it is what moves the parameters
                // outside the 32-dimensional subspace, and at MindSpore's
                // 0.001 they barely move here.
                let config = DimReduceConfig {
                    alpha: LR,
                    ..DimReduceConfig::default()
                };
                dist.start_dimreduce(&pca, config)?;
            }
            for global in epoch_order(data.train_len(), epoch).chunks(WORLD * BATCH) {
                let mine: Vec<usize> = global.iter().skip(rank).step_by(WORLD).copied().collect();
                let (loss, grads) = mlp.loss_and_grads(data, &mine).expect("backward");
                if epoch < dense_epochs {
                    dist.step(grads)?;
                    // DimReduce flattens in declaration order.
                    let params = parameters_of(dist.vars())?;
                    recorder
                        .record(&params.iter().collect::<Vec<_>>())
                        .map_err(candle_core::Error::wrap)?;
                } else {
                    let stats = dist.step_dimreduce(&grads, f64::from(loss), || {
                        mlp.loss(data, &mine)
                            .map(f64::from)
                            .map_err(candle_core::Error::wrap)
                    })?;
                    accepted.1 += 1;
                    if stats.dimreduce.is_some_and(|d| d.step > 0.0) {
                        accepted.0 += 1;
                    }
                }
            }
            accuracy.push(mlp.evaluate(data).expect("accuracy").accuracy);
        }
        let everything: Vec<usize> = (0..data.train_len()).collect();
        Ok::<_, candle_core::Error>(DimReduceRun {
            accuracy,
            train_loss: f64::from(mlp.loss(data, &everything).expect("loss")),
            accepted: accepted.0 as f64 / accepted.1.max(1) as f64,
        })
    })
    .expect("ranks");
    results
        .into_iter()
        .next()
        .expect("rank 0")
        .expect("training")
}

#[test]
fn dimreduce_after_a_dense_stage_keeps_up_with_dense_training() {
    let data = Dataset::Digits(Digits::load(42));
    let total = 12;
    let dense = dense_then_dimreduce(&data, total, total);
    let dimreduce = dense_then_dimreduce(&data, 6, total);
    show("dense average, 4 ranks", &dense.accuracy, 1);
    show("dense 6 + DimReduce 6, 4", &dimreduce.accuracy, 1);
    let last = |r: &DimReduceRun| r.accuracy.last().copied().unwrap_or(0.0);
    println!(
        "after {total} epochs: dense {:.1} % (training loss {:.4}), DimReduce {:.1} % \
         (training loss {:.4}, {:.0} % of its line searches accepted a step)",
        last(&dense) * 100.0,
        dense.train_loss,
        last(&dimreduce) * 100.0,
        dimreduce.train_loss,
        dimreduce.accepted * 100.0
    );
    // DimReduce optimises faster: over 8 seeds (gradwire train, hidden 32, 12
    // epochs, the last epoch's mean loss) its training loss was 0.47 to 0.68
    // of dense's; here 0.55. Its test accuracy keeps up rather than beats
    // dense's: the final difference ranged from -0.6 to +1.1 points (one test
    // image is 0.28 points), so that assertion allows one point.
    assert!(
        dimreduce.train_loss < 0.8 * dense.train_loss,
        "DimReduce's training loss {} against dense's {}",
        dimreduce.train_loss,
        dense.train_loss
    );
    assert!(
        last(&dimreduce) >= last(&dense) - 0.01,
        "DimReduce fell behind dense training"
    );
    assert!(
        dimreduce.accepted > 0.5,
        "most line searches must accept a step"
    );
}
