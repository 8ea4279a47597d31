//! DiLoCo with every codec on the pseudo-gradient: what a round did not
//! apply is owed by the residuals (no mass lost).

use super::*;

/// One rank's round: its parameters before it, after its local step, and
/// its checkpoint after it.
type Round = (Vec<f32>, Vec<f32>, gradwire_optim::checkpoint::Checkpoint);

/// What the ranks still owe the model after a round, per entry of the one
/// bucket (every parameter, in declaration order), from their
/// checkpoints: `(1/W) sum_r residual_r`, plus the quantized all-reduce's
/// server residuals, which enter the average undivided.
fn owed(ckpts: &[gradwire_optim::checkpoint::Checkpoint], n: usize) -> Vec<f64> {
    let world = ckpts.len();
    let mut owed = vec![0f64; n];
    for (rank, ckpt) in ckpts.iter().enumerate() {
        let dict = &ckpt.state;
        let per_rank: Vec<Vec<f32>> = dict
            .tensors
            .keys()
            .filter(|k| {
                k.starts_with("residual/") || k.ends_with("/residual") || k.ends_with("/worker")
            })
            .map(|k| dict.f32s(k).unwrap())
            .collect();
        for residual in per_rank {
            if residual.len() == n {
                for (o, r) in owed.iter_mut().zip(residual) {
                    *o += f64::from(r) / world as f64;
                }
            }
        }
        if let Ok(server) = dict.f32s("quantized/0/server")
            && !server.is_empty()
        {
            let own = gradwire_comm::chunk_range(n, world, rank);
            for (o, s) in owed[own].iter_mut().zip(server) {
                *o += f64::from(s);
            }
        }
    }
    owed
}

#[test]
fn with_every_codec_what_the_round_did_not_apply_is_owed_by_the_residuals() {
    // One bucket, H = 1 and an outer SGD of rate 1: a round applies
    // avg = θ_global - θ_next, and error feedback keeps the rest:
    // (1/W) sum_i (Δ_i) + owed_before = avg + owed_after.
    let plain = OuterOptimizer::Nesterov {
        lr: 1.0,
        momentum: 0.0,
    };
    let n: usize = BLOCKS.iter().sum();
    for codec in [
        OuterCodec::TopK(0.2),
        OuterCodec::Quantized(gradwire_compress::Quantizer::Sign),
        OuterCodec::Quantized(gradwire_compress::Quantizer::MinMaxU8),
        // 4 bits an entry, as Streaming DiLoCo's pseudo-gradients.
        OuterCodec::Quantized(gradwire_compress::Quantizer::Qsgd {
            levels: gradwire_compress::quant::QSGD_NIBBLE_LEVELS,
            seed: 3,
            norm: gradwire_compress::QsgdNorm::L2,
        }),
        // Streaming DiLoCo's own 4-bit float.
        OuterCodec::Quantized(gradwire_compress::Quantizer::E3m0 { seed: 3 }),
        OuterCodec::PowerSgd(1),
    ] {
        let world = 3;
        let strategy = diloco(1, codec, plain);
        let rounds: Vec<Vec<Round>> = local::run(world, |comm: LocalComm| {
            let dist_config = DistOptConfig {
                fusion_threshold: 1 << 20,
                ..config(strategy)
            };
            let mut dist = LocalSteps::new(inner_sgd(), comm, specs(), dist_config)?;
            let mut w = tensors(&initial().concat());
            let mut out = Vec::new();
            for _ in 0..4 {
                let before = flat(&w);
                // This rank's local step, as the engine takes it: p - lr g.
                let g = flat(&shard_gradients(&w, world, dist.rank(), false));
                let local: Vec<f32> = before
                    .iter()
                    .zip(&g)
                    .map(|(&p, &g)| p - INNER_LR as f32 * g)
                    .collect();
                step(&mut dist, &mut w, world, false)?;
                out.push((before, local, dist.checkpoint()?));
            }
            Ok::<_, OptimError>(out)
        })
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
        // Declaration order (backward: the last block first) of a flat,
        // forward-ordered vector.
        let declared = |v: &[f32]| -> Vec<f32> {
            let mut starts = Vec::new();
            let mut at = 0;
            for &b in BLOCKS {
                starts.push(at);
                at += b;
            }
            (0..BLOCKS.len())
                .rev()
                .flat_map(|k| v[starts[k]..starts[k] + BLOCKS[k]].to_vec())
                .collect()
        };
        let mut owed_before = vec![0f64; n];
        for round in 0..4 {
            let what = format!("{codec:?}, round {round}");
            let global = declared(&rounds[0][round].0);
            let next = declared(&rounds[0][(round + 1).min(3)].0);
            let ckpts: Vec<_> = rounds.iter().map(|r| r[round].2.clone()).collect();
            let owed_after = owed(&ckpts, n);
            if round < 3 {
                let scale = global
                    .iter()
                    .fold(1e-3f64, |m, v| m.max(f64::from(v.abs())));
                for j in 0..n {
                    let sent: f64 = rounds
                        .iter()
                        .map(|r| f64::from(global[j] - declared(&r[round].1)[j]))
                        .sum::<f64>()
                        / world as f64;
                    let applied = f64::from(global[j]) - f64::from(next[j]);
                    let lhs = sent + owed_before[j];
                    let rhs = applied + owed_after[j];
                    assert!(
                        (lhs - rhs).abs() <= 1e-5 * scale,
                        "{what}, entry {j}: {lhs} sent and owed, {rhs} applied and owed"
                    );
                }
            }
            owed_before = owed_after;
        }
    }
}
