//! End-to-end: the digits MLP trained data-parallel on 4 LocalComm ranks.
//!
//! One worker (batch 16, SGD lr 0.05, momentum 0.9) sets the pace. Dense
//! averaging (global batch 64, the gradients averaged) and AdaSum by delta
//! weight (each rank a local step on its own batch of 16 with the single
//! worker's learning rate, the weight changes combined with AdaSum) must both
//! reach 95 % test accuracy within 30 epochs; a plain sum of the deltas at the
//! same learning rate runs beside them. The epochs each needs are printed, not
//! compared: on this small problem whether AdaSum needs no more epochs than
//! one worker depends on the seed (see the AdaSum issue's notes), and a test
//! must not pick its seed to pass. Run with `--nocapture` to see the accuracy
//! per epoch.
//!
//! The second test runs DimReduce after a dense stage that records the
//! trajectory, beside dense training for the same number of steps.

use gradwire_algos::{AdaSum, fused_all_reduce};
use gradwire_comm::{Communicator, LocalComm, ReduceOp, local};
use gradwire_optim::{
    Combined, Combiner, DistOpt, DistOptConfig, Mode, OptimError, Optimizer, ParamSpec, Sgd,
    SgdConfig,
};
use gradwire_tensor::Tensor;
use gradwire_tests::digits::{BACKWARD_ORDER, Digits, FEATURES, Mlp};

const HIDDEN: usize = 32;
const BATCH: usize = 16;
const WORLD: usize = 4;
const LR: f64 = 0.05;
const MAX_EPOCHS: usize = 30;
const TARGET: f64 = 0.95;

fn sgd() -> Sgd {
    Sgd::new(SgdConfig::default().lr(LR).momentum(0.9)).expect("sgd")
}

/// The order of the training samples in `epoch` (seeded, the same on every rank).
fn epoch_order(n: usize, epoch: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut state = (epoch as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for i in (1..n).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        order.swap(i, (state % (i as u64 + 1)) as usize);
    }
    order
}

fn specs() -> Vec<ParamSpec> {
    let shape = |name: &str| match name {
        "w1" => vec![HIDDEN, FEATURES],
        "b1" => vec![HIDDEN],
        "w2" => vec![10, HIDDEN],
        _ => vec![10],
    };
    BACKWARD_ORDER
        .iter()
        .map(|&n| ParamSpec::new(n, shape(n)))
        .collect()
}

fn index_of(name: &str) -> usize {
    ["w1", "b1", "w2", "b2"]
        .iter()
        .position(|&n| n == name)
        .expect("known name")
}

/// Test accuracy after each epoch of one worker.
fn single_worker(data: &Digits) -> Vec<f64> {
    let mut mlp = Mlp::new(HIDDEN, 7);
    let mut opt = sgd();
    let mut accuracy = Vec::new();
    for epoch in 0..MAX_EPOCHS {
        for batch in epoch_order(data.train_len(), epoch).chunks(BATCH) {
            let (_, grads) = mlp.loss_and_grads(&data.train_x, &data.train_y, batch);
            for ((name, param), g) in mlp.named().zip(grads) {
                let n = g.len();
                opt.update(
                    name,
                    param,
                    &Tensor::from_vec(g, n)
                        .and_then(|t| t.reshape(param.dims().to_vec()))
                        .expect("grad"),
                )
                .expect("update");
            }
            opt.step();
        }
        accuracy.push(mlp.accuracy(&data.test_x, &data.test_y));
    }
    accuracy
}

/// A plain sum of the ranks' tensors, presented as final (no division).
struct PlainSum;

impl Combiner<LocalComm> for PlainSum {
    fn combine(
        &mut self,
        comm: &LocalComm,
        _: usize,
        t: &mut [Tensor],
    ) -> gradwire_algos::Result<Combined> {
        let traffic = fused_all_reduce(comm, t, ReduceOp::Sum, usize::MAX)?;
        Ok(Combined {
            traffic,
            averaged: true,
        })
    }
}

/// Test accuracy (rank 0's model) after each epoch of data-parallel training:
/// every rank takes its quarter of each global batch of `WORLD * BATCH`.
fn data_parallel<K: Combiner<LocalComm>>(
    data: &Digits,
    mode: Mode,
    combiner: impl Fn(&LocalComm) -> Option<K> + Sync,
) -> Vec<f64> {
    let results = local::run(WORLD, |comm: LocalComm| {
        let rank = comm.rank();
        let config = DistOptConfig {
            mode,
            ..DistOptConfig::default()
        };
        let mut dist = match combiner(&comm) {
            Some(k) => DistOpt::with_combiner(sgd(), comm, specs(), config, k)?,
            None => DistOpt::new(sgd(), comm, specs(), config)?,
        };
        let mut mlp = Mlp::new(HIDDEN, 7);
        let mut accuracy = Vec::new();
        for epoch in 0..MAX_EPOCHS {
            for global in epoch_order(data.train_len(), epoch).chunks(WORLD * BATCH) {
                let mine: Vec<usize> = global.iter().skip(rank).step_by(WORLD).copied().collect();
                let (_, grads) = mlp.loss_and_grads(&data.train_x, &data.train_y, &mine);
                let mut grads: Vec<Option<Vec<f32>>> = grads.into_iter().map(Some).collect();
                for name in BACKWARD_ORDER {
                    let i = index_of(name);
                    let g = grads[i].take().expect("each gradient once");
                    let shape = mlp.params[i].dims().to_vec();
                    dist.push(name, Tensor::from_vec(g, shape)?)?;
                }
                dist.finish(mlp.named())?;
            }
            accuracy.push(mlp.accuracy(&data.test_x, &data.test_y));
        }
        Ok::<_, OptimError>(accuracy)
    })
    .expect("ranks");
    results
        .into_iter()
        .next()
        .expect("rank 0")
        .expect("training")
}

fn first_epoch_at_target(accuracy: &[f64]) -> Option<usize> {
    accuracy.iter().position(|&a| a >= TARGET).map(|e| e + 1)
}

fn show(name: &str, accuracy: &[f64]) {
    let line: Vec<String> = accuracy
        .iter()
        .map(|a| format!("{:.1}", a * 100.0))
        .collect();
    println!(
        "{name:<28} epochs to 95 %: {:?}; accuracy per epoch: {}",
        first_epoch_at_target(accuracy),
        line.join(" ")
    );
}

#[test]
fn dense_and_adasum_reach_95_percent_on_digits() {
    let data = Digits::load(42);
    let single = single_worker(&data);
    show("one worker", &single);
    let dense = data_parallel::<PlainSum>(&data, Mode::Dense, |_| None);
    show("dense average, 4 ranks", &dense);
    let adasum = data_parallel(&data, Mode::DeltaWeight, |c| {
        Some(AdaSum::new(c).expect("adasum"))
    });
    show("AdaSum delta weight, 4", &adasum);
    let summed = data_parallel(&data, Mode::DeltaWeight, |_| Some(PlainSum));
    show("plain sum of deltas, 4", &summed);

    assert!(
        first_epoch_at_target(&single).is_some(),
        "one worker never reached 95 %"
    );
    assert!(
        first_epoch_at_target(&dense).is_some(),
        "dense averaging never reached 95 %"
    );
    assert!(
        first_epoch_at_target(&adasum).is_some(),
        "AdaSum by delta weight never reached 95 %"
    );
    // Data parallelism must not cost final accuracy: within 2 points of one
    // worker's after the same number of epochs.
    let last = |a: &[f64]| a.last().copied().unwrap_or(0.0);
    assert!(last(&dense) >= last(&single) - 0.02 && last(&adasum) >= last(&single) - 0.02);
}

/// Dense DistOpt for `dense_epochs` recording the trajectory (one snapshot
/// per step, the last 60 kept), then DimReduce for the remaining epochs, on
/// the same global batches; returns rank 0's test accuracy after each epoch.
fn dense_then_dimreduce(data: &Digits, dense_epochs: usize, total_epochs: usize) -> Vec<f64> {
    use gradwire_algos::dimreduce::{DimReduce, DimReduceConfig, TrajectoryRecorder};
    let results = local::run(WORLD, |comm: LocalComm| {
        let rank = comm.rank();
        let mut mlp = Mlp::new(HIDDEN, 7);
        let mut accuracy = Vec::new();
        let mut recorder = TrajectoryRecorder::new(60);
        let mut dist = DistOpt::new(sgd(), comm, specs(), DistOptConfig::default())?;
        let batches = |epoch: usize| epoch_order(data.train_len(), epoch);
        for epoch in 0..dense_epochs {
            for global in batches(epoch).chunks(WORLD * BATCH) {
                let mine: Vec<usize> = global.iter().skip(rank).step_by(WORLD).copied().collect();
                let (_, grads) = mlp.loss_and_grads(&data.train_x, &data.train_y, &mine);
                let mut grads: Vec<Option<Vec<f32>>> = grads.into_iter().map(Some).collect();
                for name in BACKWARD_ORDER {
                    let i = index_of(name);
                    let shape = mlp.params[i].dims().to_vec();
                    dist.push(
                        name,
                        Tensor::from_vec(grads[i].take().expect("once"), shape)?,
                    )?;
                }
                dist.finish(mlp.named())?;
                let refs: Vec<&Tensor> = mlp.params.iter().collect();
                recorder
                    .record(&refs)
                    .map_err(|e| OptimError::InvalidArgument(e.to_string()))?;
            }
            accuracy.push(mlp.accuracy(&data.test_x, &data.test_y));
        }
        let comm = dist.into_comm();
        let algo = |e: gradwire_algos::AlgoError| OptimError::InvalidArgument(e.to_string());
        let pca = recorder.fit(32).map_err(algo)?;
        let mut dr = DimReduce::new(&comm, &pca, DimReduceConfig::default()).map_err(algo)?;
        let flatten = |mlp: &Mlp| -> Vec<f32> {
            mlp.params
                .iter()
                .flat_map(|t| t.to_vec::<f32>().expect("f32"))
                .collect()
        };
        let unflatten = |mlp: &mut Mlp, w: &[f32]| {
            let mut offset = 0;
            for p in &mut mlp.params {
                let n = p.len();
                p.as_mut_slice::<f32>()
                    .expect("f32")
                    .copy_from_slice(&w[offset..offset + n]);
                offset += n;
            }
        };
        for epoch in dense_epochs..total_epochs {
            for global in batches(epoch).chunks(WORLD * BATCH) {
                let mine: Vec<usize> = global.iter().skip(rank).step_by(WORLD).copied().collect();
                let (loss, grads) = mlp.loss_and_grads(&data.train_x, &data.train_y, &mine);
                // Averaged gradient and loss (true division).
                let mut g: Vec<f32> = grads.concat();
                comm.all_reduce(&mut g, ReduceOp::Avg)
                    .map_err(|e| OptimError::InvalidArgument(e.to_string()))?;
                let mut l = [f64::from(loss)];
                comm.all_reduce(&mut l, ReduceOp::Avg)
                    .map_err(|e| OptimError::InvalidArgument(e.to_string()))?;
                let mut w = flatten(&mlp);
                let mut probe = Mlp::new(HIDDEN, 7);
                dr.step(&comm, &mut w, &g, l[0], |trial| {
                    unflatten(&mut probe, trial);
                    let (trial_loss, _) = probe.loss_and_grads(&data.train_x, &data.train_y, &mine);
                    let mut t = [f64::from(trial_loss)];
                    comm.all_reduce(&mut t, ReduceOp::Avg)?;
                    Ok(t[0])
                })
                .map_err(algo)?;
                unflatten(&mut mlp, &w);
            }
            accuracy.push(mlp.accuracy(&data.test_x, &data.test_y));
        }
        Ok::<_, OptimError>(accuracy)
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
    let data = Digits::load(42);
    let total = 12;
    let dense = data_parallel::<PlainSum>(&data, Mode::Dense, |_| None);
    let dimreduce = dense_then_dimreduce(&data, 6, total);
    show("dense average, 4 ranks", &dense[..total]);
    show("dense 6 + DimReduce 6, 4", &dimreduce);
    println!(
        "after {total} epochs: dense {:.1} %, DimReduce {:.1} %",
        dense[total - 1] * 100.0,
        dimreduce[total - 1] * 100.0
    );
}
