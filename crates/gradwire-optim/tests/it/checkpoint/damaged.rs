//! Damaged files: every truncation, random byte flips and garbage are refused
//! as corrupt, never panic, and never load as another checkpoint.

use gradwire_optim::OptimError;
use gradwire_optim::checkpoint::to_bytes;
use proptest::prelude::*;

use super::{big, corrupt_reason, from_bytes, load, rich, small};

#[test]
fn every_truncation_is_an_error() {
    let bytes = to_bytes(&small()).unwrap();
    for len in 0..bytes.len() {
        corrupt_reason(from_bytes(&bytes[..len]));
    }
    let bytes = to_bytes(&big()).unwrap();
    assert!(bytes.len() > 200_000);
    for len in (0..bytes.len())
        .step_by(997)
        .chain(bytes.len() - 16..bytes.len())
    {
        corrupt_reason(from_bytes(&bytes[..len]));
    }
    // Appending is as bad as truncating.
    let mut longer = to_bytes(&small()).unwrap();
    longer.push(0);
    corrupt_reason(from_bytes(&longer));
}

#[test]
fn truncated_file_on_disk_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ckpt");
    let bytes = to_bytes(&small()).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
    corrupt_reason(load(&path));
}

/// The data section of a valid checkpoint: where flips change values only.
fn data_start(bytes: &[u8]) -> usize {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    8 + usize::try_from(n).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Random byte flips never panic; whatever decodes re-encodes and decodes
    /// to the same checkpoint; flips in the tensor data always decode, to a
    /// different checkpoint.
    #[test]
    fn byte_flips_never_panic(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..=8)
    ) {
        let ckpt = small();
        let mut bytes = to_bytes(&ckpt).unwrap();
        let start = data_start(&bytes);
        let mut all_in_data = true;
        for (i, x) in &flips {
            let i = i.index(bytes.len());
            all_in_data &= i >= start;
            bytes[i] ^= x;
        }
        let changed = bytes != to_bytes(&ckpt).unwrap();
        match from_bytes(&bytes) {
            // The checksum covers everything decoded: a file that loads
            // holds what was saved (a flip in the safetensors header's
            // padding or layout that changes nothing decoded may load).
            Ok(back) => {
                prop_assert_eq!(&back, &ckpt);
                prop_assert!(!(changed && all_in_data), "a flip in the data loaded");
            }
            Err(OptimError::CorruptCheckpoint(_)) => {}
            Err(e) => prop_assert!(false, "unexpected error kind {:?}", e),
        }
    }

    /// Flips restricted to the header (the length prefix and the JSON) of a
    /// bigger checkpoint.
    #[test]
    fn header_flips_never_panic(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..=8)
    ) {
        // A flipped digit can turn a number (u64::MAX in a value) into a
        // long float: idempotence then relies on exact float parsing.
        let mut bytes = to_bytes(&rich()).unwrap();
        let start = data_start(&bytes);
        for (i, x) in &flips {
            bytes[i.index(start)] ^= x;
        }
        match from_bytes(&bytes) {
            Ok(back) => prop_assert_eq!(back, rich()),
            Err(OptimError::CorruptCheckpoint(_)) => {}
            Err(e) => prop_assert!(false, "unexpected error kind {:?}", e),
        }
    }

    /// Arbitrary bytes (and arbitrary bytes behind a plausible length
    /// prefix) are rejected as corrupt without panicking.
    #[test]
    fn garbage_is_rejected(data in proptest::collection::vec(any::<u8>(), 0..512), n in 0u64..600) {
        let result = from_bytes(&data);
        prop_assert!(matches!(result, Err(OptimError::CorruptCheckpoint(_))), "{:?}", result);
        let mut framed = n.to_le_bytes().to_vec();
        framed.extend_from_slice(&data);
        let result = from_bytes(&framed);
        prop_assert!(matches!(result, Err(OptimError::CorruptCheckpoint(_))), "{:?}", result);
    }
}
