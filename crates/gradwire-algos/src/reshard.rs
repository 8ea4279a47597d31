//! Resuming at another world size: how the state that each rank of a world
//! of W saved becomes the state of every rank of a world of W'
//! ([`crate::Strategy::reshard_state`]).
//!
//! A strategy's per-rank state is what each rank still owes the combined
//! result: an error-feedback residual or a local momentum enters the next
//! average as `(1 / W) sum_r e_r`. Every rank of the new world takes the
//! mean of the old ranks' values, so that the new average adds
//! `(1 / W') W' mean = (1 / W) sum_r e_r`: the same mass, whatever W'
//! (DeepSpeed's universal checkpoints fold optimizer shards the same way).
//! State that every rank holds alike (warm starts, counters) is old rank
//! 0's. The quantized all-reduce's server residual, which one rank keeps
//! per chunk and which enters the result undivided, is gathered from every
//! old rank's chunk and added to every new worker residual (the fold that
//! [`crate::QuantizedAllReduce`] makes when its layout changes).

use crate::error::{AlgoError, Result};
use crate::strategy::StateDict;

/// The element-wise mean of the f32 tensor `key` over the old ranks'
/// states, or `None` when no rank saved one. Every rank must hold it, of
/// one length (else [`AlgoError::StateMismatch`]).
pub fn mean_of(saved: &[&StateDict], key: &str) -> Result<Option<Vec<f32>>> {
    let held = saved.iter().filter(|s| s.tensors.contains_key(key)).count();
    if held == 0 {
        return Ok(None);
    }
    if held != saved.len() {
        return Err(AlgoError::StateMismatch(format!(
            "{key} is saved by {held} of {} ranks",
            saved.len()
        )));
    }
    let values = saved
        .iter()
        .map(|s| s.f32s(key))
        .collect::<Result<Vec<_>>>()?;
    let len = values[0].len();
    if let Some(rank) = values.iter().position(|v| v.len() != len) {
        return Err(AlgoError::StateMismatch(format!(
            "{key} has {len} entries on rank 0 and {} on rank {rank}",
            values[rank].len()
        )));
    }
    Ok(Some(mean_in_rank_order(
        values.iter().map(|v| Some(v.as_slice())),
        len,
    )))
}

/// The element-wise mean of `parts`, one per rank, each of `len` entries
/// (a rank's `None` counts as zeros), summed in f64 in rank order, so that
/// every rank that computes it gets the same bits.
pub fn mean_in_rank_order<'a>(
    parts: impl ExactSizeIterator<Item = Option<&'a [f32]>>,
    len: usize,
) -> Vec<f32> {
    let ranks = parts.len();
    let mut sum = vec![0f64; len];
    for part in parts.flatten() {
        for (s, &v) in sum.iter_mut().zip(part) {
            *s += f64::from(v);
        }
    }
    let inverse = 1.0 / ranks.max(1) as f64;
    sum.into_iter().map(|s| (s * inverse) as f32).collect()
}

/// Copies the value `key` of old rank 0's state into `out`, if it saved
/// one.
pub fn copy_value(saved: &[&StateDict], key: &str, out: &mut StateDict) {
    if let Some(value) = saved.first().and_then(|s| s.values.get(key)) {
        out.values.insert(key.to_string(), value.clone());
    }
}

/// Copies the tensor `key` of old rank 0's state into `out`, if it saved
/// one.
pub fn copy_tensor(saved: &[&StateDict], key: &str, out: &mut StateDict) {
    if let Some(tensor) = saved.first().and_then(|s| s.tensors.get(key)) {
        out.tensors.insert(key.to_string(), tensor.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dict(key: &str, values: Vec<f32>) -> StateDict {
        let mut d = StateDict::default();
        d.insert_f32s(key.into(), values).unwrap();
        d
    }

    #[test]
    fn the_mean_keeps_what_the_ranks_owe_the_average() {
        let (a, b, c) = (
            dict("r", vec![1.0, -2.0]),
            dict("r", vec![3.0, 0.5]),
            dict("r", vec![-1.0, 0.0]),
        );
        let mean = mean_of(&[&a, &b, &c], "r").unwrap().unwrap();
        assert_eq!(mean, vec![1.0, -0.5]);
        assert_eq!(mean_of(&[&a, &b], "absent").unwrap(), None);
    }

    #[test]
    fn a_residual_missing_or_of_another_length_on_one_rank_is_a_mismatch() {
        let a = dict("r", vec![1.0, 2.0]);
        let short = dict("r", vec![1.0]);
        let other = dict("s", vec![1.0, 2.0]);
        for saved in [[&a, &short], [&a, &other]] {
            let result = mean_of(&saved, "r");
            assert!(
                matches!(result, Err(AlgoError::StateMismatch(_))),
                "{result:?}"
            );
        }
    }
}
