//! What the CLI's models learn from: the digits images for the classifiers
//! (`digits.rs`) and a text corpus for the character-level language model
//! (`text.rs`), each split into training and test samples by a seed; and
//! the seeded order of every epoch, which every rank draws alike.

mod digits;
mod text;

pub use digits::{CLASSES, Digits, FEATURES};
pub use text::{Corpus, DEFAULT_CORPUS, MAX_TEST_WINDOWS, VOCAB, token};

use crate::config::{ModelKind, TrainConfig};
use crate::error::Result;

/// One step of the xorshift64 generator every seeded choice here uses (the
/// split, the epoch order, the initial weights): tiny, and the same bits on
/// every platform.
pub(crate) fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Fisher-Yates over `items` with the generator seeded by `seed`.
pub(crate) fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut state = seed | 1;
    for i in (1..items.len()).rev() {
        items.swap(i, (xorshift(&mut state) % (i as u64 + 1)) as usize);
    }
}

/// The order of the `n` training samples in `epoch`: a seeded shuffle, the
/// same on every rank, so that ranks agree on every global batch.
pub fn epoch_order(n: usize, epoch: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    shuffle(
        &mut order,
        (epoch as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
    );
    order
}

/// The data of a run: what its model ([`ModelKind`]) learns from.
#[derive(Debug, Clone)]
pub enum Dataset {
    /// The digits images (the MLP and the CNN).
    Digits(Digits),
    /// A text corpus cut into windows (the GPT).
    Text(Corpus),
}

impl Dataset {
    /// The data `config`'s model learns from, split by `split_seed`: the
    /// embedded digits, or the corpus at `config.corpus` cut into windows
    /// of `config.gpt.context` characters. Errors if the corpus cannot be
    /// read or is too short.
    pub fn load(config: &TrainConfig, split_seed: u64) -> Result<Dataset> {
        Ok(match config.model {
            ModelKind::Mlp | ModelKind::Cnn => Dataset::Digits(Digits::load(split_seed)),
            ModelKind::Gpt => Dataset::Text(
                Corpus::load(&config.corpus, config.gpt.context, split_seed)?
                    .with_epoch_windows(config.epoch_windows),
            ),
        })
    }

    /// Number of training samples (images, or windows of text).
    pub fn train_len(&self) -> usize {
        match self {
            Dataset::Digits(d) => d.train_len(),
            Dataset::Text(c) => c.train_len(),
        }
    }

    /// Number of test samples.
    pub fn test_len(&self) -> usize {
        match self {
            Dataset::Digits(d) => d.test_y.len(),
            Dataset::Text(c) => c.test_len(),
        }
    }

    /// Training samples per epoch: all of them, or a corpus's
    /// `--epoch-windows`.
    pub fn epoch_len(&self) -> usize {
        match self {
            Dataset::Digits(d) => d.train_len(),
            Dataset::Text(c) => c.epoch_len(),
        }
    }

    /// The training samples of `epoch` in the order they are taken, the
    /// same on every rank: a seeded shuffle of all of them
    /// ([`epoch_order`]); with a corpus's `--epoch-windows` W, samples
    /// `epoch * W ..` of the endless sequence of such shuffles, one per
    /// pass over the windows, so that every window is seen once a pass.
    pub fn epoch_samples(&self, epoch: usize) -> Vec<usize> {
        let n = self.train_len();
        let per_epoch = self.epoch_len();
        if per_epoch >= n {
            return epoch_order(n, epoch);
        }
        let start = epoch.saturating_mul(per_epoch);
        let mut samples = Vec::with_capacity(per_epoch);
        let mut pass = start / n;
        let mut at = start % n;
        while samples.len() < per_epoch {
            let order = epoch_order(n, pass);
            let take = (per_epoch - samples.len()).min(n - at);
            samples.extend_from_slice(&order[at..at + take]);
            pass += 1;
            at = 0;
        }
        samples
    }
}

/// `samples` cut into `parts` consecutive slices whose sizes differ by at
/// most one, the larger first (a step's micro-batches: `--batch` samples
/// each when the step is whole, the shorter last step of an epoch spread
/// evenly). `parts` of 0 is taken as 1.
pub fn split_even(samples: &[usize], parts: usize) -> impl DoubleEndedIterator<Item = &[usize]> {
    let parts = parts.max(1);
    let (base, longer) = (samples.len() / parts, samples.len() % parts);
    (0..parts).map(move |p| {
        let start = p * base + p.min(longer);
        let len = base + usize::from(p < longer);
        // In range by construction: the parts tile the samples.
        samples.get(start..start + len).unwrap_or_default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_orders_are_permutations_that_differ_by_epoch() {
        let mut first = epoch_order(101, 0);
        assert_ne!(first, epoch_order(101, 1));
        first.sort_unstable();
        assert_eq!(first, (0..101).collect::<Vec<_>>());
        assert!(epoch_order(0, 3).is_empty());
        assert_eq!(epoch_order(1, 0), [0]);
    }

    /// With windows per epoch, consecutive epochs walk the passes' orders
    /// end to end: every window once per pass, across epoch boundaries
    /// that do not divide the windows (7 of 23, 1 of 5, 5 of 5, more than
    /// there are).
    #[test]
    fn epochs_of_some_windows_walk_each_pass_in_turn() {
        for (len, per_epoch) in [(23usize, 7usize), (5, 1), (5, 5), (5, 9)] {
            let text: Vec<u8> = (0..len * 4 + 1).map(|i| b'a' + (i % 26) as u8).collect();
            let corpus = Corpus::from_text(&text, 4, 1).unwrap();
            let n = corpus.train_len();
            let data = Dataset::Text(corpus.with_epoch_windows(Some(per_epoch)));
            assert_eq!(data.epoch_len(), per_epoch.min(n));
            let walked: Vec<usize> = (0..3 * n).flat_map(|e| data.epoch_samples(e)).collect();
            let passes: Vec<usize> = (0..walked.len().div_ceil(n))
                .flat_map(|p| epoch_order(n, p))
                .collect();
            assert_eq!(walked, passes[..walked.len()], "{len} {per_epoch}");
        }
        let digits = Dataset::Digits(Digits::load(1));
        assert_eq!(digits.epoch_samples(2), epoch_order(digits.train_len(), 2));
    }

    #[test]
    fn split_even_tiles_the_samples_in_near_equal_parts() {
        for n in [0usize, 1, 2, 7, 13, 64] {
            let samples: Vec<usize> = (0..n).map(|i| i * 3).collect();
            for parts in 1..=5 {
                let cut: Vec<&[usize]> = split_even(&samples, parts).collect();
                assert_eq!(cut.len(), parts, "n = {n}");
                assert_eq!(cut.concat(), samples, "n = {n}, {parts} parts");
                let (min, max) = (
                    cut.iter().map(|c| c.len()).min().unwrap_or(0),
                    cut.iter().map(|c| c.len()).max().unwrap_or(0),
                );
                assert!(max - min <= 1, "n = {n}, {parts} parts: {min}..{max}");
                assert!(
                    cut.windows(2).all(|w| w[0].len() >= w[1].len()),
                    "the longer first"
                );
            }
        }
        assert_eq!(split_even(&[1, 2, 3], 0).count(), 1, "0 parts is 1");
    }
}
