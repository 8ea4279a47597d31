//! The wire format's unit tests: hand-built payloads decoded, the exact
//! bytes encoded, 16-bit values rounded to nearest even, every header
//! defect named, and the sizes that choose dense over sparse.

use super::*;

/// A hand-built payload: f32, threshold codec, dense length 10,
/// entries (2, 1.5) and (7, -0.25).
fn hand_built_f32() -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"GWSP");
    b.extend_from_slice(&[1, 1, 0, 0]);
    b.extend_from_slice(&[10, 0, 0, 0, 0, 0, 0, 0]);
    b.extend_from_slice(&[2, 0, 0, 0, 0, 0, 0, 0]);
    b.extend_from_slice(&[2, 0, 0, 0, 7, 0, 0, 0]);
    b.extend_from_slice(&[0x00, 0x00, 0xc0, 0x3f]); // 1.5
    b.extend_from_slice(&[0x00, 0x00, 0x80, 0xbe]); // -0.25
    b
}

#[test]
fn hand_built_payload_decodes() {
    let bytes = hand_built_f32();
    assert_eq!(bytes.len(), 40);
    let p = decode(&bytes).unwrap();
    assert_eq!(p.codec(), CodecId::Threshold);
    assert_eq!(p.value_dtype(), DType::F32);
    assert_eq!(p.dense_len(), 10);
    assert_eq!(p.count(), 2);
    assert_eq!(p.indices().collect::<Vec<_>>(), [2, 7]);
    assert_eq!(p.values_f32().collect::<Vec<_>>(), [1.5, -0.25]);
    let mut dense = vec![1.0f32; 10];
    p.scatter_add(&mut dense).unwrap();
    assert_eq!(dense, [1.0, 1.0, 2.5, 1.0, 1.0, 1.0, 1.0, 0.75, 1.0, 1.0]);
    assert_eq!(
        p.to_sparse(),
        SparseVec::new(10, vec![2, 7], vec![1.5, -0.25]).unwrap()
    );
    assert_eq!(
        encode(&p.to_sparse(), CodecId::Threshold, DType::F32),
        bytes
    );
}

#[test]
fn hand_built_half_payloads_decode() {
    // f16 1.0 = 0x3c00, -2.0 = 0xc000; bf16 1.0 = 0x3f80, -2.0 = 0xc000.
    for (code, one, dtype) in [
        (1u8, [0x00, 0x3c], DType::F16),
        (2, [0x80, 0x3f], DType::BF16),
    ] {
        let mut b = Vec::new();
        b.extend_from_slice(b"GWSP");
        b.extend_from_slice(&[1, 4, code, 0]);
        b.extend_from_slice(&3u64.to_le_bytes());
        b.extend_from_slice(&2u64.to_le_bytes());
        b.extend_from_slice(&[0, 0, 0, 0, 2, 0, 0, 0]);
        b.extend_from_slice(&one);
        b.extend_from_slice(&[0x00, 0xc0]);
        let p = decode(&b).unwrap();
        assert_eq!(p.codec(), CodecId::RandomK);
        assert_eq!(p.value_dtype(), dtype);
        assert_eq!(p.values_f32().collect::<Vec<_>>(), [1.0, -2.0]);
        let mut dense = vec![0.0f32; 3];
        p.scatter_add(&mut dense).unwrap();
        assert_eq!(dense, [1.0, 0.0, -2.0]);
    }
}

#[test]
fn encode_gives_the_exact_bytes() {
    let s = SparseVec::new(5, vec![0, 3], vec![1.0, -2.0]).unwrap();
    let header = |codec: u8, dtype: u8| {
        let mut h = b"GWSP".to_vec();
        h.extend_from_slice(&[
            1, codec, dtype, 0, 5, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0,
        ]);
        h.extend_from_slice(&[0, 0, 0, 0, 3, 0, 0, 0]);
        h
    };
    let mut f32_bytes = header(2, 0);
    f32_bytes.extend_from_slice(&[0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0]);
    assert_eq!(encode(&s, CodecId::TopK, DType::F32), f32_bytes);

    let mut f16_bytes = header(3, 1);
    f16_bytes.extend_from_slice(&[0x00, 0x3c, 0x00, 0xc0]);
    assert_eq!(encode(&s, CodecId::SampledTopK, DType::F16), f16_bytes);

    let mut bf16_bytes = header(1, 2);
    bf16_bytes.extend_from_slice(&[0x80, 0x3f, 0x00, 0xc0]);
    assert_eq!(encode(&s, CodecId::Threshold, DType::BF16), bf16_bytes);

    // encode_into reuses and clears the buffer.
    let mut out = vec![0xff; 100];
    encode_into(&s, CodecId::TopK, DType::F32, &mut out);
    assert_eq!(out, f32_bytes);
}

#[test]
fn narrowing_rounds_to_nearest_even() {
    // 1 + 2^-11 is halfway between f16 1.0 and 1 + 2^-10: ties to even (1.0).
    // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 and 1 + 2^-9: to 1 + 2^-9.
    let tie_low = 1.0 + 2f32.powi(-11);
    let tie_high = 1.0 + 3.0 * 2f32.powi(-11);
    let s = SparseVec::new(2, vec![0, 1], vec![tie_low, tie_high]).unwrap();
    let p16 = encode(&s, CodecId::TopK, DType::F16);
    let v: Vec<f32> = decode(&p16).unwrap().values_f32().collect();
    assert_eq!(v, [1.0, 1.0 + 2f32.powi(-9)]);
    // bf16: 1 + 2^-8 ties to 1.0, 1 + 3 * 2^-8 ties to 1 + 2^-6.
    let s = SparseVec::new(
        2,
        vec![0, 1],
        vec![1.0 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8)],
    )
    .unwrap();
    let pb = encode(&s, CodecId::TopK, DType::BF16);
    let v: Vec<f32> = decode(&pb).unwrap().values_f32().collect();
    assert_eq!(v, [1.0, 1.0 + 2f32.powi(-6)]);
}

#[test]
fn large_f16_payload_crosses_narrow_blocks() {
    let n = 2 * NARROW_BLOCK + 17;
    let values: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 100.0).collect();
    let s = SparseVec::new(n, (0..n as u32).collect(), values.clone()).unwrap();
    let p = encode(&s, CodecId::TopK, DType::F16);
    assert_eq!(p.len(), encoded_len(n, DType::F16));
    let got: Vec<f32> = decode(&p).unwrap().values_f32().collect();
    let want: Vec<f32> = values.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
    assert_eq!(got, want);
}

#[test]
fn every_header_defect_is_named() {
    let good = hand_built_f32();
    let reason = |b: &[u8]| match decode(b) {
        Err(CompressError::Corrupt(r)) => r,
        other => panic!("expected Corrupt, got {other:?}"),
    };
    assert!(reason(&good[..23]).contains("header"));
    let mut b = good.clone();
    b[0] = b'X';
    assert!(reason(&b).contains("magic"));
    let mut b = good.clone();
    b[4] = 2;
    assert!(reason(&b).contains("version"));
    let mut b = good.clone();
    b[5] = 0;
    assert!(reason(&b).contains("codec"));
    let mut b = good.clone();
    b[6] = 3;
    assert!(reason(&b).contains("dtype"));
    let mut b = good.clone();
    b[7] = 1;
    assert!(reason(&b).contains("reserved"));
    let mut b = good.clone();
    b[8..16].copy_from_slice(&(MAX_DENSE_LEN + 1).to_le_bytes());
    assert!(reason(&b).contains("u32 index range"));
    let mut b = good.clone();
    b[16..24].copy_from_slice(&11u64.to_le_bytes());
    assert!(reason(&b).contains("exceeds the dense length"));
    let mut b = good.clone();
    b[16..24].copy_from_slice(&3u64.to_le_bytes());
    assert!(reason(&b).contains("expected exactly"));
    let mut b = good.clone();
    b[28] = 10;
    assert!(reason(&b).contains("out of range"));
    let mut b = good.clone();
    b[28] = 2;
    assert!(reason(&b).contains("strictly increase"));
}

#[test]
fn dense_length_mismatch_writes_nothing() {
    let bytes = hand_built_f32();
    let mut dense = vec![0.0f32; 9];
    assert!(matches!(
        scatter_add(&bytes, &mut dense),
        Err(CompressError::LengthMismatch {
            expected: 10,
            got: 9,
            ..
        })
    ));
    assert!(dense.iter().all(|&x| x == 0.0));
}

#[test]
fn codec_ids_round_trip() {
    for c in CodecId::ALL {
        assert_eq!(CodecId::try_from(c as u8).unwrap(), c);
        assert_eq!(c.to_string(), c.as_str());
    }
    assert!(matches!(
        CodecId::try_from(0),
        Err(CompressError::Corrupt(_))
    ));
    assert!(matches!(
        CodecId::try_from(5),
        Err(CompressError::Corrupt(_))
    ));
}

#[test]
fn sizes() {
    assert_eq!(encoded_len(0, DType::F32), HEADER_LEN);
    assert_eq!(encoded_len(3, DType::F32), 48);
    assert_eq!(encoded_len(3, DType::BF16), 42);
    assert_eq!(encoded_len(usize::MAX, DType::F16), usize::MAX);
    // 24 + 2 * 8 = 40 = 10 * 4: equal, keep sparse.
    assert!(!should_send_dense(2, 10, DType::F32));
    assert!(should_send_dense(2, 9, DType::F32));
    assert!(should_send_dense(usize::MAX, usize::MAX, DType::F16));
}
