//! The digits data set (UCI's Optical Recognition of Handwritten Digits:
//! 1,797 8x8 images, 10 classes, the copy scikit-learn and smartcore ship)
//! embedded as `data/digits.bin`, with a fixed, seeded train/test split.

use super::shuffle;

/// Pixels per image.
pub const FEATURES: usize = 64;
/// Digits 0-9.
pub const CLASSES: usize = 10;

/// The images in their published order: per image its `FEATURES` pixels
/// (integers 0 to 16, row-major), then its label, one byte each (made from
/// smartcore 0.7's `digits.xy`, whose f32 values are those integers).
const DIGITS: &[u8] = include_bytes!("../../data/digits.bin");
/// Bytes per image in [`DIGITS`]: the pixels and the label.
const RECORD: usize = FEATURES + 1;

/// The data, split: features scaled to [0, 1].
#[derive(Debug, Clone)]
pub struct Digits {
    /// Training images, row-major, `FEATURES` each.
    pub train_x: Vec<f32>,
    /// Training labels.
    pub train_y: Vec<usize>,
    /// Test images.
    pub test_x: Vec<f32>,
    /// Test labels.
    pub test_y: Vec<usize>,
}

impl Digits {
    /// Loads the data set and splits it 80/20 with a shuffle seeded by `seed`.
    pub fn load(seed: u64) -> Digits {
        let n = DIGITS.len() / RECORD;
        let mut order: Vec<usize> = (0..n).collect();
        shuffle(&mut order, seed);
        let test_len = n / 5;
        let mut digits = Digits {
            train_x: vec![],
            train_y: vec![],
            test_x: vec![],
            test_y: vec![],
        };
        for (k, &i) in order.iter().enumerate() {
            let record = &DIGITS[i * RECORD..(i + 1) * RECORD];
            let x = record[..FEATURES].iter().map(|&v| f32::from(v) / 16.0);
            let y = usize::from(record[FEATURES]);
            if k < test_len {
                digits.test_x.extend(x);
                digits.test_y.push(y);
            } else {
                digits.train_x.extend(x);
                digits.train_y.push(y);
            }
        }
        digits
    }

    /// Number of training images.
    pub fn train_len(&self) -> usize {
        self.train_y.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_split_is_fixed_by_the_seed_and_covers_every_image() {
        let a = Digits::load(42);
        let b = Digits::load(42);
        assert_eq!(a.train_y, b.train_y);
        assert_eq!(a.train_len() + a.test_y.len(), 1797);
        assert_eq!(a.test_y.len(), 359);
        assert!(a.train_x.iter().all(|v| (0.0..=1.0).contains(v)));
        assert_ne!(Digits::load(3).train_y, a.train_y);
    }

    /// The embedded bytes are the published data set: scikit-learn's
    /// `load_digits()` has the same first image (a zero) and class counts.
    #[test]
    fn the_embedded_images_are_the_published_data_set() {
        assert_eq!(DIGITS.len(), 1797 * RECORD);
        assert_eq!(
            DIGITS[..16],
            [0, 0, 5, 13, 9, 1, 0, 0, 0, 0, 13, 15, 10, 15, 5, 0]
        );
        assert_eq!(DIGITS[FEATURES], 0);
        let mut counts = [0usize; CLASSES];
        for record in DIGITS.chunks(RECORD) {
            assert!(record[..FEATURES].iter().all(|&v| v <= 16));
            counts[usize::from(record[FEATURES])] += 1;
        }
        assert_eq!(counts, [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]);
    }
}
