//! The registry's own tests: every example and setting round-trips through
//! its text, and bad text names its cause.

use super::*;
use gradwire_algos::{HalfPrecision, PowerSgdConfig};
use gradwire_compress::{Quantizer, SparseCodec};

#[test]
fn every_example_prints_and_parses_back() {
    let examples = StrategyConfig::examples();
    let names: Vec<&str> = examples.iter().map(|s| s.name()).collect();
    assert_eq!(
        names,
        REGISTRY.map(|s| s.name()),
        "one example per registered name, in order"
    );
    for s in examples {
        let text = s.to_string();
        assert_eq!(text.parse::<StrategyConfig>(), Ok(s), "{text}");
        assert_eq!(s.validate(), Ok(()), "{text}");
    }
}

#[test]
fn every_setting_round_trips() {
    let seeded = [
        "randomk:0.25:seed=9",
        "qsgd:levels=15:seed=3:momentum=0.5:no-ef",
        "qsgd:seed=3:max-norm",
        "e3m0:seed=3:momentum=0.5:no-ef",
        "powersgd:4:start=0:min-rate=1.5:cold:seed=11:no-ef",
        "onebit-adam:freeze=7:beta1=0.8",
        "adasum-delta:group=2",
        "adasum-grad:group=4",
        "fp16:clip=0.25",
        "threshold:0.001",
        "sampled-topk:0.001:no-ef",
        "diloco:4:e3m0:warmup=100:adam",
        "streaming-diloco:4:2:tau=1:uint8:warmup=3",
        "diloco:8:qsgd:grad-warmup=5:lr=0.5",
        "streaming-diloco:4:2:e3m0:grad-warmup=2",
    ];
    for text in seeded {
        let s: StrategyConfig = text.parse().unwrap();
        assert_eq!(s.to_string(), text);
    }
    // Defaults are left out; explicit defaults parse to the same value.
    assert_eq!(
        "topk:0.01:ef"
            .parse::<StrategyConfig>()
            .unwrap()
            .to_string(),
        "topk:0.01"
    );
    assert_eq!(
        "powersgd".parse::<StrategyConfig>().unwrap(),
        StrategyConfig::PowerSgd(PowerSgdConfig::default())
    );
    assert_eq!(
        "randomk:0.5"
            .parse::<StrategyConfig>()
            .unwrap()
            .with_seed(5),
        "randomk:0.5:seed=5".parse().unwrap()
    );
}

#[test]
fn random_settings_round_trip() {
    // A deterministic walk over many bit patterns of the settings.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let unit = (x >> 11) as f64 / (1u64 << 53) as f64;
        let ratio = unit.max(f64::MIN_POSITIVE);
        let small = f32::from_bits((x as u32) & 0x3F7F_FFFF);
        for s in [
            StrategyConfig::Sparse {
                codec: SparseCodec::TopK(ratio),
                error_feedback: x & 1 == 0,
            },
            StrategyConfig::Sparse {
                codec: SparseCodec::Threshold(small),
                error_feedback: true,
            },
            StrategyConfig::Half {
                precision: HalfPrecision::BF16,
                clip: Some(small.max(f32::MIN_POSITIVE)),
            },
            StrategyConfig::Quantized {
                quantizer: Quantizer::Sign,
                error_feedback: true,
                momentum: Some(small.min(0.999)),
            },
        ] {
            let text = s.to_string();
            assert_eq!(text.parse::<StrategyConfig>(), Ok(s), "{text}");
        }
    }
}

#[test]
fn bad_text_names_its_cause() {
    assert!(matches!(
        "gzip".parse::<StrategyConfig>(),
        Err(StrategyError::UnknownName { .. })
    ));
    assert!(matches!(
        "custom".parse::<StrategyConfig>(),
        Err(StrategyError::UnknownName { .. })
    ));
    for text in [
        "topk:x",
        "topk:0.1:fast",
        "dense:1",
        "powersgd:two",
        "powersgd:0.5",
        "qsgd:levels=300",
        "randomk:0.1:seed=-1",
        "diloco:4:warmup=-1",
        "diloco:4:warmup",
        "diloco:4:grad-warmup",
        "diloco:4:grad-warmup=x",
    ] {
        assert!(
            matches!(
                text.parse::<StrategyConfig>(),
                Err(StrategyError::BadPart { .. })
            ),
            "{text}"
        );
    }
    for text in [
        "topk:0",
        "topk:1.5",
        "randomk:NaN",
        "threshold:-1",
        "fp16:clip=inf",
        "powersgd:0",
        "qsgd:levels=0",
        "onebit:momentum=1",
        "onebit-adam:beta1=1",
        "adasum-grad:group=0",
    ] {
        assert!(
            matches!(
                text.parse::<StrategyConfig>(),
                Err(StrategyError::OutOfRange { .. })
            ),
            "{text}: {:?}",
            text.parse::<StrategyConfig>()
        );
    }
}

#[test]
fn serde_uses_the_printed_form() {
    let s: StrategyConfig = "topk:0.05:no-ef".parse().unwrap();
    let json = serde_json::to_string(&s).unwrap();
    assert_eq!(json, "\"topk:0.05:no-ef\"");
    assert_eq!(serde_json::from_str::<StrategyConfig>(&json).unwrap(), s);
    let err = serde_json::from_str::<StrategyConfig>("\"topk:2\"").unwrap_err();
    assert!(
        err.to_string().contains("the ratio must be in (0, 1]"),
        "{err}"
    );
}

#[test]
fn diloco_forms_round_trip_and_bad_ones_name_their_cause() {
    for text in [
        "diloco:50",
        "diloco:50:uint8",
        "diloco:8:fp16",
        "diloco:8:bf16",
        "diloco:8:onebit",
        "diloco:8:qsgd",
        "diloco:8:qsgd=7",
        "streaming-diloco:16:2:tau=2:qsgd=7",
        "diloco:16:qsgd=7:max-norm",
        "diloco:16:qsgd:max-norm",
        "diloco:16:e3m0",
        "streaming-diloco:16:2:tau=2:e3m0",
        "diloco:20:topk=0.05",
        "diloco:20:powersgd=4",
        "diloco:4:lr=0.5:momentum=0.8",
        "diloco:4:adam",
        "diloco:4:adam:lr=0.01",
    ] {
        let s: StrategyConfig = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(s.to_string(), text);
        assert_eq!(s.training_loop(), TrainingLoop::LocalSteps, "{text}");
    }
    // Settings in any order mean the same.
    assert_eq!(
        "diloco:4:lr=0.01:adam".parse::<StrategyConfig>(),
        "diloco:4:adam:lr=0.01".parse::<StrategyConfig>()
    );
    assert_eq!(
        "diloco".parse::<StrategyConfig>(),
        Ok(StrategyConfig::DiLoCo(DiLoCoConfig::DEFAULT))
    );
    for (text, cause) in [
        ("diloco:0", "at least one inner step"),
        ("diloco:4:momentum=1", "momentum must be in [0, 1)"),
        ("diloco:4:lr=0", "lr must be positive"),
        ("diloco:4:lr=nan", "lr must be positive"),
        ("diloco:4:topk=1.5", "the ratio must be in (0, 1]"),
        ("diloco:4:powersgd=0", "rank"),
        ("diloco:4:qsgd=0", "QSGD's levels must be 1 to 127, got 0"),
        (
            "diloco:4:qsgd=128",
            "QSGD's levels must be 1 to 127, got 128",
        ),
    ] {
        let result = text.parse::<StrategyConfig>();
        assert!(
            matches!(&result, Err(StrategyError::OutOfRange { strategy: "diloco", reason }) if reason.contains(cause)),
            "{text}: {result:?}"
        );
    }
    for text in [
        "diloco:4:adam:momentum=0.5",
        "diloco:4:nosuch",
        "diloco:4:topk",
        "diloco:4:qsgd=300",
        "diloco:4:qsgd=four",
        "diloco:4:uint8:max-norm",
        "diloco:4:e3m0:max-norm",
        "diloco:4:e3m0=3",
        "diloco:4:max-norm",
    ] {
        let result = text.parse::<StrategyConfig>();
        assert!(
            matches!(&result, Err(StrategyError::BadPart { .. })),
            "{text}: {result:?}"
        );
    }
}
