//! Where a step stands among its micro-batches, for a front end that sums
//! a framework's gradients itself (gradwire-candle's and gradwire-burn's
//! `DataParallel` in the loops of local steps; the gradient strategies'
//! sums are the engine's, `DistOptConfig::accumulate`).

use crate::error::{OptimError, Result};

/// The micro-batches of the step in progress: how many a step takes, how
/// many are done. A checkpoint or a restore must come between steps
/// ([`MicroBatches::between_steps`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MicroBatches {
    per_step: u32,
    done: u32,
}

impl MicroBatches {
    /// `per_step` micro-batches a step (0 counts as 1: no accumulation).
    pub fn new(per_step: u32) -> MicroBatches {
        MicroBatches {
            per_step: per_step.max(1),
            done: 0,
        }
    }

    /// Micro-batches per step.
    pub fn per_step(&self) -> u32 {
        self.per_step
    }

    /// Counts one micro-batch: `true` if it was the step's last (the count
    /// starts again).
    pub fn count(&mut self) -> bool {
        self.done += 1;
        let last = self.done >= self.per_step;
        if last {
            self.done = 0;
        }
        last
    }

    /// An error if a step is between its micro-batches: `what` (a
    /// checkpoint, a restore) must come between steps.
    pub fn between_steps(&self, what: &str) -> Result<()> {
        if self.done > 0 {
            return Err(OptimError::between_micro_batches(
                what,
                self.done,
                self.per_step,
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kth_micro_batch_ends_a_step_and_only_then_may_a_checkpoint_come() {
        let mut micro = MicroBatches::new(3);
        for _ in 0..2 {
            micro.between_steps("a checkpoint").expect("between steps");
            assert!(!micro.count());
            assert!(matches!(
                micro.between_steps("a checkpoint"),
                Err(OptimError::InvalidArgument(m)) if m.contains("1 of 3")
            ));
            assert!(!micro.count());
            assert!(micro.count());
        }
        let mut one = MicroBatches::new(0);
        assert_eq!(one.per_step(), 1);
        assert!(one.count() && one.count());
        one.between_steps("a restore")
            .expect("never between micro-batches");
    }
}
