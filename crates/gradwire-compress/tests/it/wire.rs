//! Property tests of the sparse wire format: encode/decode identity for
//! every value dtype, scatter-add of several payloads against the sum of
//! their dense forms, rejection of every corruption built from a valid
//! payload, no panic on arbitrary bytes, and the dense-fallback boundary.

use gradwire_compress::wire::{self, CodecId, HEADER_LEN, Payload, WIRE_VERSION};
use gradwire_compress::{CompressError, SparseVec};
use gradwire_tensor::DType;
use half::{bf16, f16};
use proptest::prelude::*;
use proptest::sample::{Index, subsequence};
use proptest::test_runner::TestCaseError;

const PRIMES: [usize; 8] = [2, 3, 5, 7, 13, 31, 257, 1021];

/// Dense lengths: 0, 1, primes, and anything up to 3000.
fn dense_len() -> impl Strategy<Value = usize> {
    prop_oneof![
        1 => Just(0usize),
        1 => Just(1usize),
        2 => proptest::sample::select(PRIMES.to_vec()),
        4 => 0usize..3000,
    ]
}

/// Finite, non-NaN or infinite values: what f16/bf16 narrowing is checked on.
/// Includes exact f16 and bf16 rounding ties.
fn no_nan_value() -> BoxedStrategy<f32> {
    use proptest::num::f32 as pf;
    prop_oneof![
        4 => pf::NORMAL | pf::SUBNORMAL | pf::ZERO | pf::INFINITE | pf::POSITIVE | pf::NEGATIVE,
        2 => -1000.0f32..1000.0,
        // Halfway between two f16 neighbours (for normal f16 range values).
        1 => any::<u32>()
            .prop_map(|b| f32::from_bits((b & !0x1fff) | 0x1000))
            .prop_filter("not NaN", |v| !v.is_nan()),
        // Halfway between two bf16 neighbours.
        1 => any::<u32>()
            .prop_map(|b| f32::from_bits((b & !0xffff) | 0x8000))
            .prop_filter("not NaN", |v| !v.is_nan()),
    ]
    .boxed()
}

/// Finite values only (for sums).
fn finite_value() -> BoxedStrategy<f32> {
    use proptest::num::f32 as pf;
    prop_oneof![
        2 => pf::NORMAL | pf::SUBNORMAL | pf::ZERO | pf::POSITIVE | pf::NEGATIVE,
        3 => -1000.0f32..1000.0,
    ]
    .prop_filter("finite", |v| v.is_finite())
    .boxed()
}

/// Any f32 bit pattern, NaNs with payloads included: f32 values are data.
fn any_bits_value() -> BoxedStrategy<f32> {
    prop_oneof![no_nan_value(), any::<u32>().prop_map(f32::from_bits)].boxed()
}

/// A random strictly increasing subset of `0..n`.
fn indices_of(n: usize) -> BoxedStrategy<Vec<u32>> {
    if n <= 3000 {
        subsequence((0..n as u32).collect::<Vec<_>>(), 0..=n).boxed()
    } else {
        // Huge dense lengths (up to u32::MAX + 1): a few indices, the top ones
        // included often.
        let top = (n - 1) as u32;
        proptest::collection::btree_set(
            prop_oneof![any::<u32>(), (top.saturating_sub(8))..=top],
            0..24,
        )
        .prop_map(move |s| s.into_iter().filter(|&i| (i as usize) < n).collect())
        .boxed()
    }
}

/// A SparseVec over a dense length from `len`, with values from `values`.
fn sparse_with(
    len: impl Strategy<Value = usize>,
    values: BoxedStrategy<f32>,
) -> impl Strategy<Value = SparseVec> {
    len.prop_flat_map(|n| (Just(n), indices_of(n)))
        .prop_flat_map(move |(n, idx)| {
            let k = idx.len();
            (
                Just(n),
                Just(idx),
                proptest::collection::vec(values.clone(), k),
            )
        })
        .prop_map(|(n, idx, vals)| SparseVec::new(n, idx, vals).expect("valid by construction"))
}

/// SparseVecs of ordinary and of huge dense lengths (up to `u32::MAX + 1`).
fn sparse(values: BoxedStrategy<f32>) -> impl Strategy<Value = SparseVec> {
    let huge = prop_oneof![
        Just(u32::MAX as usize + 1),
        Just(u32::MAX as usize),
        Just(1usize << 31),
        3001usize..1 << 24,
    ];
    prop_oneof![
        8 => sparse_with(dense_len(), values.clone()).boxed(),
        1 => sparse_with(huge, values).boxed(),
    ]
}

fn dtype() -> impl Strategy<Value = DType> {
    proptest::sample::select(DType::ALL.to_vec())
}

fn codec() -> impl Strategy<Value = CodecId> {
    proptest::sample::select(CodecId::ALL.to_vec())
}

/// What a value becomes on the wire in `dtype`, widened back.
fn narrowed(v: f32, dtype: DType) -> f32 {
    match dtype {
        DType::F32 => v,
        DType::F16 => f16::from_f32(v).to_f32(),
        DType::BF16 => bf16::from_f32(v).to_f32(),
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A valid payload and the SparseVec it was built from (ordinary lengths).
fn payload() -> impl Strategy<Value = (SparseVec, CodecId, DType, Vec<u8>)> {
    (sparse_with(dense_len(), any_bits_value()), codec(), dtype()).prop_map(|(s, c, d)| {
        let bytes = wire::encode(&s, c, d);
        (s, c, d, bytes)
    })
}

/// `bytes` must be refused as corrupt, and applying it must write nothing.
fn assert_corrupt(bytes: &[u8], dense_len: usize, what: &str) -> Result<(), TestCaseError> {
    let r = wire::decode(bytes);
    prop_assert!(
        matches!(r, Err(CompressError::Corrupt(_))),
        "{what}: decode gave {r:?}"
    );
    let mut dense = vec![7.0f32; dense_len];
    let r = wire::scatter_add(bytes, &mut dense);
    prop_assert!(
        matches!(r, Err(CompressError::Corrupt(_))),
        "{what}: scatter_add gave {r:?}"
    );
    prop_assert!(
        dense.iter().all(|&x| x == 7.0),
        "{what}: a corrupt payload wrote"
    );
    Ok(())
}

/// Reads the u32 index at position `k` of a payload.
fn index_at(bytes: &[u8], k: usize) -> u32 {
    let at = HEADER_LEN + 4 * k;
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

fn set_index(bytes: &mut [u8], k: usize, i: u32) {
    let at = HEADER_LEN + 4 * k;
    bytes[at..at + 4].copy_from_slice(&i.to_le_bytes());
}

/// Invariants of anything `decode` accepted.
fn check_valid(p: &Payload<'_>) -> Result<(), TestCaseError> {
    prop_assert!(p.count() <= p.dense_len());
    prop_assert!(p.dense_len() <= u32::MAX as usize + 1);
    prop_assert_eq!(
        p.as_bytes().len(),
        wire::encoded_len(p.count(), p.value_dtype())
    );
    let idx: Vec<u32> = p.indices().collect();
    prop_assert_eq!(idx.len(), p.count());
    prop_assert_eq!(p.values_f32().count(), p.count());
    prop_assert!(idx.windows(2).all(|w| w[0] < w[1]));
    prop_assert!(idx.iter().all(|&i| (i as usize) < p.dense_len()));
    if p.dense_len() <= 1 << 16 {
        let mut dense = vec![0.0f32; p.dense_len()];
        p.scatter_add(&mut dense).unwrap();
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// f32: bitwise identity, NaN payloads included.
    #[test]
    fn f32_round_trip_is_bitwise(s in sparse(any_bits_value()), c in codec()) {
        let bytes = wire::encode(&s, c, DType::F32);
        prop_assert_eq!(bytes.len(), wire::encoded_len(s.nnz(), DType::F32));
        let p = wire::decode(&bytes).unwrap();
        prop_assert_eq!(p.codec(), c);
        prop_assert_eq!(p.value_dtype(), DType::F32);
        prop_assert_eq!(p.dense_len(), s.dense_len());
        prop_assert_eq!(p.count(), s.nnz());
        prop_assert_eq!(p.indices().collect::<Vec<_>>(), s.indices());
        prop_assert_eq!(bits(&p.values_f32().collect::<Vec<_>>()), bits(s.values()));
        let back = p.to_sparse();
        prop_assert_eq!(back.dense_len(), s.dense_len());
        prop_assert_eq!(back.indices(), s.indices());
        prop_assert_eq!(bits(back.values()), bits(s.values()));
        // Re-encoding what was decoded gives the same bytes.
        prop_assert_eq!(wire::encode(&back, c, DType::F32), bytes);
    }

    /// f16 / bf16: each value equals `from_f32(v).to_f32()` bitwise (round to
    /// nearest even), indices and header exact.
    #[test]
    fn half_round_trip_narrows_to_nearest_even(
        s in sparse(no_nan_value()),
        c in codec(),
        d in prop_oneof![Just(DType::F16), Just(DType::BF16)],
    ) {
        let bytes = wire::encode(&s, c, d);
        prop_assert_eq!(bytes.len(), wire::encoded_len(s.nnz(), d));
        let p = wire::decode(&bytes).unwrap();
        prop_assert_eq!(p.codec(), c);
        prop_assert_eq!(p.value_dtype(), d);
        prop_assert_eq!(p.dense_len(), s.dense_len());
        prop_assert_eq!(p.count(), s.nnz());
        prop_assert_eq!(p.indices().collect::<Vec<_>>(), s.indices());
        let want: Vec<f32> = s.values().iter().map(|&v| narrowed(v, d)).collect();
        prop_assert_eq!(bits(&p.values_f32().collect::<Vec<_>>()), bits(&want));
        let back = p.to_sparse();
        prop_assert_eq!(back.indices(), s.indices());
        prop_assert_eq!(bits(back.values()), bits(&want));
        // Narrowing is idempotent: re-encoding gives the same bytes.
        prop_assert_eq!(wire::encode(&back, c, d), bytes);
    }

    /// encode_into clears the buffer and gives the same bytes as encode.
    #[test]
    fn encode_into_reuses_the_buffer(
        (s, c, d, bytes) in payload(),
        junk in proptest::collection::vec(any::<u8>(), 0..5000),
    ) {
        let mut out = junk;
        wire::encode_into(&s, c, d, &mut out);
        prop_assert_eq!(out, bytes);
    }

    /// scatter_add of W payloads into zeros equals the per-element sum, in
    /// the same order, of their (narrowed) dense forms: bitwise.
    #[test]
    fn scatter_add_sums_dense_forms(
        (n, parts) in dense_len().prop_flat_map(|n| {
            let one = (
                indices_of(n).prop_flat_map(|idx| {
                    let k = idx.len();
                    (Just(idx), proptest::collection::vec(finite_value(), k))
                }),
                codec(),
                dtype(),
            );
            (Just(n), proptest::collection::vec(one, 1..=8))
        }),
    ) {
        let mut dense = vec![0.0f32; n];
        let mut via_payload = vec![0.0f32; n];
        let mut expected = vec![0.0f32; n];
        for ((idx, vals), c, d) in parts {
            let s = SparseVec::new(n, idx, vals).unwrap();
            let bytes = wire::encode(&s, c, d);
            wire::scatter_add(&bytes, &mut dense).unwrap();
            wire::decode(&bytes).unwrap().scatter_add(&mut via_payload).unwrap();
            for (e, v) in expected.iter_mut().zip(s.to_dense()) {
                *e += narrowed(v, d);
            }
        }
        prop_assert_eq!(bits(&dense), bits(&expected));
        prop_assert_eq!(bits(&via_payload), bits(&expected));
    }

    /// A dense buffer of the wrong length is refused and left untouched.
    #[test]
    fn scatter_add_checks_the_dense_length((s, _c, _d, bytes) in payload(), delta in 1usize..5, longer in any::<bool>()) {
        let n = if longer { s.dense_len() + delta } else { s.dense_len().saturating_sub(delta) };
        prop_assume!(n != s.dense_len());
        let mut dense = vec![3.0f32; n];
        let r = wire::scatter_add(&bytes, &mut dense);
        prop_assert!(matches!(r, Err(CompressError::LengthMismatch { .. })), "{:?}", r);
        prop_assert!(dense.iter().all(|&x| x == 3.0));
    }

    /// Every truncation and every extension is refused: all shorter lengths
    /// of small payloads; of large ones every cut in the first and last
    /// 64 bytes and 64 random cuts in between.
    #[test]
    fn wrong_lengths_are_corrupt(
        (s, _c, _d, bytes) in payload(),
        cuts in proptest::collection::vec(any::<Index>(), 64),
        extra in proptest::collection::vec(any::<u8>(), 1..16),
    ) {
        let n = s.dense_len();
        let len = bytes.len();
        let mut lens: Vec<usize> = if len <= 1024 {
            (0..len).collect()
        } else {
            (0..64).chain(len - 64..len).collect()
        };
        lens.extend(cuts.iter().map(|c| c.index(len)));
        for cut in lens {
            assert_corrupt(&bytes[..cut], n, &format!("truncated to {cut} of {len}"))?;
        }
        let mut longer = bytes.clone();
        longer.extend_from_slice(&extra);
        assert_corrupt(&longer, n, "trailing bytes")?;
        let mut one_more = bytes.clone();
        one_more.push(extra[0]);
        assert_corrupt(&one_more, n, "one trailing byte")?;
    }

    /// Each header field, altered, is refused.
    #[test]
    fn header_defects_are_corrupt(
        (s, _c, d, bytes) in payload(),
        magic_pos in 0usize..4,
        magic_xor in 1u8..=255,
        version in any::<u8>().prop_filter("not the version", |&v| v != WIRE_VERSION),
        codec_byte in any::<u8>().prop_filter("unknown codec", |&v| !(1..=4).contains(&v)),
        dtype_byte in 3u8..=255,
        other_dtype in dtype(),
        reserved in 1u8..=255,
        huge_len in (u32::MAX as u64 + 2)..=u64::MAX,
        other_count in any::<u64>(),
        small_len in any::<Index>(),
    ) {
        let n = s.dense_len();
        let count = s.nnz() as u64;
        let with = |f: &dyn Fn(&mut Vec<u8>)| { let mut b = bytes.clone(); f(&mut b); b };

        assert_corrupt(&with(&|b| b[magic_pos] ^= magic_xor), n, "magic")?;
        assert_corrupt(&with(&|b| b[4] = version), n, "version")?;
        assert_corrupt(&with(&|b| b[5] = codec_byte), n, "codec")?;
        assert_corrupt(&with(&|b| b[6] = dtype_byte), n, "dtype")?;
        assert_corrupt(&with(&|b| b[7] = reserved), n, "reserved")?;
        if count > 0 && other_dtype.size_in_bytes() != d.size_in_bytes() {
            assert_corrupt(&with(&|b| b[6] = match other_dtype {
                DType::F32 => 0, DType::F16 => 1, DType::BF16 => 2,
            }), n, "dtype of another size")?;
        }
        assert_corrupt(&with(&|b| b[8..16].copy_from_slice(&huge_len.to_le_bytes())), n, "dense_len > u32 range")?;
        if let Some(&max) = s.indices().last() {
            // Any dense length that leaves the largest index out.
            let short = small_len.index(max as usize + 1) as u64;
            assert_corrupt(&with(&|b| b[8..16].copy_from_slice(&short.to_le_bytes())), n, "dense_len <= max index")?;
        }
        assert_corrupt(&with(&|b| b[16..24].copy_from_slice(&(count + 1).to_le_bytes())), n, "count + 1")?;
        if count > 0 {
            assert_corrupt(&with(&|b| b[16..24].copy_from_slice(&(count - 1).to_le_bytes())), n, "count - 1")?;
        }
        if other_count != count {
            assert_corrupt(&with(&|b| b[16..24].copy_from_slice(&other_count.to_le_bytes())), n, "other count")?;
        }
    }

    /// An index out of range, two indices swapped or made equal: refused.
    #[test]
    fn index_defects_are_corrupt(
        (s, _c, _d, bytes) in payload(),
        at in any::<Index>(),
        a in any::<Index>(),
        b in any::<Index>(),
        beyond in any::<u32>(),
    ) {
        let n = s.dense_len();
        let count = s.nnz();
        prop_assume!(count > 0);
        let k = at.index(count);
        // Out of range: some value in n..=u32::MAX.
        let bad = n as u64 + beyond as u64 % (u32::MAX as u64 + 1 - n as u64);
        let mut b1 = bytes.clone();
        set_index(&mut b1, k, bad as u32);
        assert_corrupt(&b1, n, &format!("index {bad} at {k}, dense length {n}"))?;

        if count >= 2 {
            let (i, j) = (a.index(count), b.index(count));
            prop_assume!(i != j);
            let (ii, jj) = (index_at(&bytes, i), index_at(&bytes, j));
            let mut swapped = bytes.clone();
            set_index(&mut swapped, i, jj);
            set_index(&mut swapped, j, ii);
            assert_corrupt(&swapped, n, &format!("positions {i} and {j} swapped"))?;
            let mut equal = bytes.clone();
            set_index(&mut equal, j, ii);
            assert_corrupt(&equal, n, &format!("position {j} set equal to {i}"))?;
            // The adjacent case, always.
            let k = at.index(count - 1);
            let mut adj = bytes.clone();
            set_index(&mut adj, k + 1, index_at(&bytes, k));
            assert_corrupt(&adj, n, "adjacent duplicate")?;
        }
    }

    /// Arbitrary bytes never panic; what decodes satisfies the invariants.
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(p) = wire::decode(&bytes) {
            check_valid(&p)?;
        }
        let mut dense = vec![0.0f32; 64];
        let _ = wire::scatter_add(&bytes, &mut dense);
    }

    /// A plausible header over a random body: reaches the deeper checks.
    #[test]
    fn random_bodies_never_panic(
        c in 0u8..=5,
        d in 0u8..=3,
        n in prop_oneof![0u64..64, any::<u64>()],
        count in prop_oneof![0u64..64, any::<u64>()],
        body in proptest::collection::vec(prop_oneof![3 => 0u8..8, 1 => any::<u8>()], 0..600),
    ) {
        let mut bytes = b"GWSP".to_vec();
        bytes.extend_from_slice(&[WIRE_VERSION, c, d, 0]);
        bytes.extend_from_slice(&n.to_le_bytes());
        bytes.extend_from_slice(&count.to_le_bytes());
        bytes.extend_from_slice(&body);
        if let Ok(p) = wire::decode(&bytes) {
            check_valid(&p)?;
        }
    }

    /// Random single-byte mutations of a valid payload never panic.
    #[test]
    fn mutations_never_panic((_s, _c, _d, bytes) in payload(), at in any::<Index>(), v in any::<u8>()) {
        let mut b = bytes;
        let k = at.index(b.len());
        b[k] = v;
        if let Ok(p) = wire::decode(&b) {
            check_valid(&p)?;
        }
    }

    /// should_send_dense is exactly `24 + count * (4 + size) > n * size`.
    #[test]
    fn should_send_dense_matches_sizes(count in 0usize..1 << 20, n in 0usize..1 << 22, d in dtype()) {
        let size = d.size_in_bytes();
        prop_assert_eq!(wire::should_send_dense(count, n, d), wire::encoded_len(count, d) > n * size);
        // At the boundary: equal sizes keep sparse, one element less sends dense.
        let sparse_bytes = wire::encoded_len(count, d);
        if sparse_bytes.is_multiple_of(size) {
            let m = sparse_bytes / size;
            prop_assert!(!wire::should_send_dense(count, m, d));
            prop_assert!(wire::should_send_dense(count, m - 1, d));
            prop_assert!(!wire::should_send_dense(count, m + 1, d));
        }
    }
}

#[test]
fn should_send_dense_boundaries() {
    // f32: 24 + 8c == 4n at n = 6 + 2c.
    for c in [0usize, 1, 2, 1000] {
        let n = 6 + 2 * c;
        assert!(
            !wire::should_send_dense(c, n, DType::F32),
            "equal sizes keep sparse"
        );
        assert!(wire::should_send_dense(c, n - 1, DType::F32));
        assert!(!wire::should_send_dense(c, n + 1, DType::F32));
    }
    // f16 / bf16: 24 + 6c == 2n at n = 12 + 3c.
    for d in [DType::F16, DType::BF16] {
        for c in [0usize, 1, 5, 999] {
            let n = 12 + 3 * c;
            assert!(!wire::should_send_dense(c, n, d));
            assert!(wire::should_send_dense(c, n - 1, d));
        }
    }
    // Empty buffers: the header alone outweighs nothing.
    assert!(wire::should_send_dense(0, 0, DType::F32));
    // Every entry selected: always dense.
    assert!(wire::should_send_dense(1 << 20, 1 << 20, DType::BF16));
    // No overflow at the extremes.
    assert!(wire::should_send_dense(usize::MAX, usize::MAX, DType::F32));
    assert!(!wire::should_send_dense(0, usize::MAX, DType::F16));
}

#[test]
fn real_sizes_match_encoded_len() {
    for d in DType::ALL {
        for k in [0usize, 1, 7, 1500] {
            let s = SparseVec::new(
                2 * k + 1,
                (0..k as u32).map(|i| 2 * i).collect(),
                vec![1.0; k],
            )
            .unwrap();
            assert_eq!(
                wire::encode(&s, CodecId::RandomK, d).len(),
                wire::encoded_len(k, d)
            );
        }
    }
}

#[test]
fn empty_payloads_are_valid() {
    for n in [0usize, 1, u32::MAX as usize + 1] {
        let s = SparseVec::empty(n).unwrap();
        let bytes = wire::encode(&s, CodecId::Threshold, DType::BF16);
        assert_eq!(bytes.len(), HEADER_LEN);
        let p = wire::decode(&bytes).unwrap();
        assert_eq!((p.dense_len(), p.count()), (n, 0));
        assert_eq!(p.to_sparse(), s);
    }
    // dense_len = u32::MAX + 2 is refused even with no entries.
    let mut bytes = wire::encode(&SparseVec::empty(0).unwrap(), CodecId::TopK, DType::F32);
    bytes[8..16].copy_from_slice(&(u32::MAX as u64 + 2).to_le_bytes());
    assert!(matches!(
        wire::decode(&bytes),
        Err(CompressError::Corrupt(_))
    ));
}
