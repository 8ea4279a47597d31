//! What fuzzing `gradwire_compress::wire::decode` with arbitrary bytes checks.
//!
//! Decoding must never panic. Whatever it accepts must satisfy the format's
//! invariants: exact length, count at most the dense length, indices strictly
//! increasing and in range; `to_sparse` must round-trip through `encode` to
//! the same bytes (byte-identical for f32 values; for f16 / bf16 identical
//! except that a NaN may come back with another NaN bit pattern); and
//! `scatter_add` into a zeroed buffer must put each value at its index.
//!
//! One function for `fuzz_targets/decode.rs` (libFuzzer) and for the
//! corpus replay of `cargo xtask test` (gradwire-tests' `fuzz_corpus`),
//! both including this file with `#[path]`.

use gradwire_compress::{CompressError, wire};

/// Equal bits, or both NaN (narrowing may requiet a NaN).
fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Checks one input; a failed check panics.
pub fn check(data: &[u8]) {
    let Ok(p) = wire::decode(data) else {
        return;
    };
    let n = p.dense_len();
    let count = p.count();
    let dtype = p.value_dtype();

    // Structure.
    assert!(count <= n);
    assert!(n <= u32::MAX as usize + 1);
    assert_eq!(data.len(), wire::encoded_len(count, dtype));
    assert_eq!(p.as_bytes().len(), data.len());
    let indices: Vec<u32> = p.indices().collect();
    let values: Vec<f32> = p.values_f32().collect();
    assert_eq!(indices.len(), count);
    assert_eq!(values.len(), count);
    assert!(
        indices.windows(2).all(|w| w[0] < w[1]),
        "indices not strictly increasing"
    );
    assert!(
        indices.iter().all(|&i| (i as usize) < n),
        "index out of range"
    );

    // Round trip through SparseVec and encode.
    let sparse = p.to_sparse();
    assert_eq!(sparse.dense_len(), n);
    assert_eq!(sparse.indices(), &indices[..]);
    let again = wire::encode(&sparse, p.codec(), dtype);
    if dtype.as_str() == "f32" {
        assert_eq!(again, data, "an f32 payload must re-encode byte for byte");
    } else {
        assert_eq!(again.len(), data.len());
        let head = wire::HEADER_LEN + 4 * count;
        assert_eq!(again[..head], data[..head], "header or indices changed");
        let q = wire::decode(&again).expect("a re-encoded payload decodes");
        assert!(
            q.values_f32().zip(&values).all(|(a, &b)| same(a, b)),
            "values changed"
        );
    }

    // Apply.
    if n <= 1 << 20 {
        let mut dense = vec![0.0f32; n];
        p.scatter_add(&mut dense).expect("the dense length matches");
        for (&i, &v) in indices.iter().zip(&values) {
            let got = dense[i as usize];
            assert!(same(got, 0.0 + v), "dense[{i}] = {got}, expected {v}");
        }
        let mut via_bytes = vec![0.0f32; n];
        wire::scatter_add(data, &mut via_bytes).expect("valid payload");
        assert!(dense.iter().zip(&via_bytes).all(|(&a, &b)| same(a, b)));
        // A dense buffer of the wrong length is refused, naming both.
        let mut short = vec![0.0f32; n.saturating_sub(1)];
        if n > 0 {
            assert!(matches!(
                p.scatter_add(&mut short),
                Err(CompressError::LengthMismatch { expected, got, .. })
                    if expected == n && got == n - 1
            ));
        }
    }
}
