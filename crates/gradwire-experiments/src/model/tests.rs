//! The models' tests: the planned layer sizes against the built models,
//! gradients against central differences, the transformer's causality,
//! seeded initialisation and refused shapes.

use super::*;
use crate::data::{Corpus, Digits};
use crate::error::assert_usage;

/// `layer_weights` names the weights of the layers the models build
/// (their non-bias variables, in build order), for both kinds, one to
/// three widths, primes among them; and `None` past `usize`.
#[test]
fn layer_weights_are_the_built_models_weights() {
    for (kind, widths) in [
        (ModelKind::Mlp, vec![7]),
        (ModelKind::Mlp, vec![13, 5, 3]),
        (ModelKind::Cnn, vec![2]),
        (ModelKind::Cnn, vec![3, 5, 7]),
    ] {
        let config = TrainConfig {
            model: kind,
            hidden: widths.clone(),
            channels: widths.clone(),
            seed: 1,
            ..TrainConfig::default()
        };
        let model = Model::new(&config).unwrap();
        let mut built: Vec<(String, usize)> = model
            .vars()
            .iter()
            .filter(|(name, _)| !name.ends_with(".bias"))
            .map(|(name, var)| (name.clone(), var.elem_count()))
            .collect();
        // Build order: conv1.., fc last; layer0.., output last.
        built.sort_by_key(|(name, _)| {
            (
                name.starts_with("fc") || name.starts_with("out"),
                name.clone(),
            )
        });
        let built: Vec<usize> = built.into_iter().map(|(_, n)| n).collect();
        assert_eq!(
            Model::layer_weights(&config),
            Some(built),
            "{kind:?} {widths:?}"
        );
    }
    let huge = TrainConfig {
        hidden: vec![usize::MAX],
        ..TrainConfig::default()
    };
    assert_eq!(Model::layer_weights(&huge), None);
    // The transformer's: its matrices and embeddings (not the biases
    // and LayerNorms), as a multiset.
    let config = TrainConfig {
        model: ModelKind::Gpt,
        gpt: GptShape {
            layers: 3,
            width: 10,
            heads: 2,
            context: 7,
        },
        ..TrainConfig::default()
    };
    let model = Model::new(&config).unwrap();
    let mut built: Vec<usize> = model
        .vars()
        .iter()
        .filter(|(name, _)| !name.ends_with(".bias") && !name.contains("norm"))
        .map(|(_, var)| var.elem_count())
        .collect();
    let mut planned = Model::layer_weights(&config).unwrap();
    built.sort_unstable();
    planned.sort_unstable();
    assert_eq!(built, planned);
}

/// Central differences in f64 of the loss along a few coordinates of
/// every parameter, against candle's gradients, for both models. The
/// images get a little noise and the biases small values, so that no
/// ReLU sits exactly at its kink and no max-pool window has a tie (the
/// digits have large blank areas).
#[test]
fn gradients_match_finite_differences() {
    let mut digits = Digits::load(1);
    let mut state = 5u64;
    for x in &mut digits.train_x {
        *x += (xorshift(&mut state) >> 40) as f32 / (1u64 << 24) as f32 * 0.1;
    }
    let digits = Dataset::Digits(digits);
    let text: Vec<u8> = (0..400u32)
        .map(|i| b"the cat sat on a mat\n"[(i * 7 % 21) as usize])
        .collect();
    let text = Dataset::Text(Corpus::from_text(&text, 5, 1).unwrap());
    let samples: Vec<usize> = (0..13).collect();
    let gpt = GptShape {
        layers: 2,
        width: 8,
        heads: 2,
        context: 5,
    };
    for (model, data) in [
        (Model::mlp(&[7, 5], 3).unwrap(), &digits),
        (Model::cnn(&[3, 4], 3).unwrap(), &digits),
        (Model::gpt(gpt, 3).unwrap(), &text),
    ] {
        for (name, var) in model.vars() {
            // The transformer's weights scaled up, so that its
            // gradients stand well above f32's rounding of the loss.
            if matches!(model.layers, Layers::Gpt(_)) && !name.ends_with(".bias") {
                let base: Vec<f32> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
                let scaled: Vec<f32> = base.iter().map(|v| v * 5.0).collect();
                gradwire_candle::write_values(var, &scaled).unwrap();
            }
            if name.ends_with(".bias") {
                let values: Vec<f32> = (0..var.elem_count())
                    .map(|i| 0.05 * (i as f32 + 1.0).sin())
                    .collect();
                gradwire_candle::write_values(var, &values).unwrap();
            }
        }
        let (_, grads) = model.loss_and_grads(data, &samples).unwrap();
        for (name, var) in model.vars() {
            let base: Vec<f32> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
            let grad: Vec<f32> = grads
                .get(var)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            for j in [0, base.len() / 2, base.len() - 1] {
                // The transformer is smooth (no ReLU kink, no max
                // pooling): a wider step keeps f32's rounding of the
                // loss out of the difference.
                let h = if matches!(model.layers, Layers::Gpt(_)) {
                    3e-3f32
                } else {
                    1e-4
                };
                let at = |delta: f32| {
                    let mut v = base.clone();
                    v[j] += delta;
                    gradwire_candle::write_values(var, &v).unwrap();
                    f64::from(model.loss(data, &samples).unwrap())
                };
                let numeric = (at(h) - at(-h)) / (2.0 * f64::from(h));
                gradwire_candle::write_values(var, &base).unwrap();
                let analytic = f64::from(grad[j]);
                assert!(
                    (numeric - analytic).abs() <= 2e-3 + 2e-2 * analytic.abs(),
                    "{name}[{j}]: numeric {numeric}, analytic {analytic}"
                );
            }
        }
    }
}

/// The transformer is causal: changing the character at position p
/// leaves every prediction before p bitwise as it was, and changes the
/// ones from p on; its logits are one row of [`VOCAB`] per position.
#[test]
fn the_transformer_sees_only_the_past() {
    let shape = GptShape {
        layers: 2,
        width: 12,
        heads: 3,
        context: 7,
    };
    let model = Model::gpt(shape, 5).unwrap();
    let logits = |tokens: &[u32]| -> Vec<Vec<f32>> {
        let x = Tensor::from_vec(tokens.to_vec(), (1, tokens.len()), &Device::Cpu).unwrap();
        let out = model.forward(&x).unwrap();
        assert_eq!(out.dims(), [tokens.len(), crate::data::VOCAB]);
        out.to_vec2().unwrap()
    };
    let base: Vec<u32> = vec![5, 17, 42, 3, 97, 1, 60];
    let before = logits(&base);
    for p in 0..base.len() {
        let mut changed = base.clone();
        changed[p] = (changed[p] + 11) % crate::data::VOCAB as u32;
        let after = logits(&changed);
        for q in 0..base.len() {
            if q < p {
                assert_eq!(before[q], after[q], "position {q} saw position {p}");
            } else {
                assert_ne!(before[q], after[q], "position {q} ignored position {p}");
            }
        }
    }
    assert_usage(
        Model::gpt(GptShape { heads: 5, ..shape }, 1),
        "must be a multiple of --heads",
    );
    assert_usage(
        Model::gpt(GptShape { layers: 0, ..shape }, 1),
        "must be at least 1",
    );
    assert_usage(
        Model::gpt(
            GptShape {
                context: usize::MAX,
                ..shape
            },
            1,
        ),
        "--context must be at most 4096",
    );
    assert_usage(
        Model::gpt(
            GptShape {
                layers: 1 << 40,
                ..shape
            },
            1,
        ),
        "--layers must be at most 256",
    );
}

#[test]
fn seeded_models_are_equal_and_bad_widths_are_refused() {
    let a = Model::cnn(&[4], 9).unwrap();
    let b = Model::cnn(&[4], 9).unwrap();
    assert_eq!(a.checksum().unwrap(), b.checksum().unwrap());
    assert_ne!(
        a.checksum().unwrap(),
        Model::cnn(&[4], 10).unwrap().checksum().unwrap()
    );
    let names: Vec<&str> = a.vars().iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["conv1.bias", "conv1.weight", "fc.bias", "fc.weight"]
    );
    assert_eq!(a.len(), 4 * 9 + 4 + 4 * 16 * 10 + 10);
    assert_usage(
        Model::mlp(&[4, 0], 1),
        "a hidden layer needs at least one unit",
    );
    let widths = "--channels takes one to three convolution widths";
    assert_usage(Model::cnn(&[], 1), widths);
    assert_usage(Model::cnn(&[1, 1, 1, 1], 1), widths);
    let data = Dataset::Digits(Digits::load(2));
    let (loss, grads) = a.loss_and_grads(&data, &[]).unwrap();
    assert_eq!(loss, 0.0);
    assert!(grads.get(a.vars()[0].1.as_tensor()).is_none());
}
