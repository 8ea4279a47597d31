//! Checkpoint files: bitwise round trips, validation of every kind of
//! corruption (truncation, byte flips, edited headers and tensors) without
//! panics, the checksum, the refusal of non-finite values, and atomic saves.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};
use std::path::Path;

use gradwire_optim::checkpoint::{
    self, CHECKPOINT_FORMAT, CHECKPOINT_VERSION, Checkpoint, LoadOptions, save, save_bytes_with,
    to_bytes,
};
use gradwire_optim::{OptimError, OptimizerState, ParamState, StateDict};
use gradwire_tensor::{Tensor, bf16, f16};
use proptest::prelude::*;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde_json::{Value, json};

/// The loader as most of these tests use it: every check of the format,
/// with the NaN and infinities `rich()` holds on purpose accepted (their
/// refusal by default is tested on its own).
const ANY_VALUE: LoadOptions = LoadOptions {
    allow_non_finite: true,
};

fn from_bytes(bytes: &[u8]) -> gradwire_optim::Result<Checkpoint> {
    checkpoint::from_bytes_with(bytes, &ANY_VALUE)
}

fn load(path: impl AsRef<Path>) -> gradwire_optim::Result<Checkpoint> {
    checkpoint::load_with(path, &ANY_VALUE)
}

fn param(shape: &[usize], updates: u64, buffers: &[(&str, Vec<f32>)]) -> ParamState {
    ParamState {
        shape: shape.to_vec(),
        updates,
        buffers: buffers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect(),
    }
}

fn seq(n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|i| (i as f32 - 3.5) * scale).collect()
}

/// A state exercising everything: names with '/' and unicode, several
/// buffers, zero-size and scalar parameters, a parameter without buffers,
/// special floats, overrides, values and extra tensors of every dtype.
fn rich() -> Checkpoint {
    let mut params = BTreeMap::new();
    params.insert(
        "layer1/weight".to_owned(),
        param(
            &[3, 4],
            7,
            &[
                ("m", seq(12, 0.125)),
                ("v", seq(12, 1e-3)),
                ("a/b", seq(12, -2.0)),
            ],
        ),
    );
    let mut specials = vec![
        f32::from_bits(0x7fc0_1234), // NaN with a payload
        f32::from_bits(0xffa0_0001), // signalling-pattern NaN, negative
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::from_bits(1), // smallest subnormal
        f32::MAX,
    ];
    specials.resize(8, 0.0);
    params.insert(
        "блок/γ/bias 😀".to_owned(),
        param(&[8], u64::MAX, &[("m", specials), ("v", seq(8, 3.0))]),
    );
    params.insert("empty".to_owned(), param(&[0, 7], 2, &[("m", vec![])]));
    params.insert(
        "scalar".to_owned(),
        param(&[], 1, &[("momentum", vec![42.5])]),
    );
    params.insert("no buffers".to_owned(), param(&[5, 5], 3, &[]));
    let mut overrides = BTreeMap::new();
    overrides.insert(
        "layer1/weight".to_owned(),
        json!({"lr": {"Constant": {"value": 0.01}}, "nesterov": true}),
    );
    let optimizer = OptimizerState {
        kind: "adam".to_owned(),
        step: 1234,
        config: json!({"lr": {"ExponentialDecay": {"init": 0.1, "decay_steps": 10,
            "rate": 0.5, "staircase": true}}, "beta1": 0.9, "eps": 1e-8, "none": null}),
        overrides,
        params,
    };
    let mut tensors = BTreeMap::new();
    tensors.insert(
        "residual/0".to_owned(),
        Tensor::from_vec(seq(6, 0.5), [2, 3]).unwrap(),
    );
    tensors.insert(
        "residual/γ".to_owned(),
        Tensor::from_vec(
            vec![
                f16::from_f32(1.5),
                f16::NAN,
                f16::from_bits(0x8001),
                f16::MAX,
            ],
            [4],
        )
        .unwrap(),
    );
    tensors.insert(
        "bf".to_owned(),
        Tensor::from_vec(
            vec![
                bf16::from_f32(-2.25),
                bf16::from_bits(0x7fc1),
                bf16::from_f32(3e38),
                bf16::ZERO,
            ],
            [2, 2],
        )
        .unwrap(),
    );
    tensors.insert(
        "empty".to_owned(),
        Tensor::from_vec(Vec::<f16>::new(), [0]).unwrap(),
    );
    let mut values = BTreeMap::new();
    values.insert("partial_update_counter".to_owned(), json!(3));
    values.insert(
        "nested/thing".to_owned(),
        json!({"a": [1, 2.5, "x", null], "b": u64::MAX}),
    );
    Checkpoint {
        optimizer,
        state: StateDict { tensors, values },
    }
}

/// A small checkpoint, so that every truncation and many flips are cheap.
fn small() -> Checkpoint {
    let mut params = BTreeMap::new();
    params.insert(
        "w/0".to_owned(),
        param(&[2, 2], 1, &[("m", seq(4, 0.5)), ("v", seq(4, 0.25))]),
    );
    params.insert("b".to_owned(), param(&[0], 1, &[("m", vec![])]));
    let mut ckpt = Checkpoint::new(OptimizerState {
        kind: "sgd".to_owned(),
        step: 5,
        config: json!({"lr": 0.5, "momentum": 0.9}),
        overrides: BTreeMap::from([("b".to_owned(), json!({"lr": 0.25}))]),
        params,
    });
    ckpt.state.tensors.insert(
        "r".to_owned(),
        Tensor::from_vec(vec![f16::from_f32(0.5), f16::from_f32(-1.0)], [2]).unwrap(),
    );
    ckpt.state.values.insert("counter".to_owned(), json!(2));
    ckpt
}

/// A checkpoint with one large parameter.
fn big() -> Checkpoint {
    let mut params = BTreeMap::new();
    params.insert(
        "big".to_owned(),
        param(
            &[300, 100],
            9,
            &[("m", seq(30_000, 1e-2)), ("v", seq(30_000, 1e-4))],
        ),
    );
    Checkpoint::new(OptimizerState {
        kind: "adam".to_owned(),
        step: 9,
        config: json!({"lr": 0.001}),
        overrides: BTreeMap::new(),
        params,
    })
}

fn corrupt_reason(r: gradwire_optim::Result<Checkpoint>) -> String {
    match r {
        Err(OptimError::CorruptCheckpoint(reason)) => reason,
        Err(e) => panic!("expected CorruptCheckpoint, got error {e:?}"),
        Ok(_) => panic!("expected CorruptCheckpoint, got Ok"),
    }
}

#[test]
fn round_trip_is_bitwise() {
    for ckpt in [rich(), small(), big(), Checkpoint::new(small().optimizer)] {
        let bytes = to_bytes(&ckpt).unwrap();
        let back = from_bytes(&bytes).unwrap();
        assert_eq!(back, ckpt);
        // Encoding is deterministic, so decode-then-encode is the identity.
        assert_eq!(to_bytes(&back).unwrap(), bytes);
    }
    // Check a few bit patterns explicitly, independently of Checkpoint's ==.
    let back = from_bytes(&to_bytes(&rich()).unwrap()).unwrap();
    let m = &back.optimizer.params["блок/γ/bias 😀"].buffers["m"];
    assert_eq!(m[0].to_bits(), 0x7fc0_1234);
    assert_eq!(m[1].to_bits(), 0xffa0_0001);
    assert_eq!(m[2].to_bits(), 0x8000_0000);
    assert_eq!(m[5].to_bits(), 1);
    let r = back.state.tensors["residual/γ"].as_slice::<f16>().unwrap();
    assert_eq!(r[1].to_bits(), f16::NAN.to_bits());
    assert_eq!(r[2].to_bits(), 0x8001);
    let b = &back.state.tensors["bf"];
    assert_eq!(b.dims(), &[2, 2]);
    assert_eq!(b.as_slice::<bf16>().unwrap()[1].to_bits(), 0x7fc1);
    assert_eq!(back.state.tensors["empty"].dims(), &[0]);
    assert_eq!(back.optimizer.params["empty"].shape, vec![0, 7]);
    assert_eq!(back.optimizer.params["scalar"].shape, Vec::<usize>::new());
    assert!(back.optimizer.params["no buffers"].buffers.is_empty());
    assert_eq!(back.optimizer.params["блок/γ/bias 😀"].updates, u64::MAX);
    assert_eq!(back.state.values["nested/thing"]["b"], json!(u64::MAX));
}

#[test]
fn zeroed_extra_tensor_saves_as_zeros() {
    let mut ckpt = small();
    let mut t = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
    t.zero_();
    ckpt.state.tensors.insert("z".to_owned(), t);
    let back = from_bytes(&to_bytes(&ckpt).unwrap()).unwrap();
    assert_eq!(
        back.state.tensors["z"].to_vec::<f32>().unwrap(),
        vec![0.0, 0.0]
    );
}

#[test]
fn equality_is_bitwise() {
    let a = rich();
    assert_eq!(a, a.clone());
    // One bit in one buffer.
    let mut b = a.clone();
    let buf = b
        .optimizer
        .params
        .get_mut("layer1/weight")
        .unwrap()
        .buffers
        .get_mut("v")
        .unwrap();
    buf[3] = f32::from_bits(buf[3].to_bits() ^ 1);
    assert_ne!(a, b);
    // 0.0 and -0.0 differ; a NaN equals itself.
    let z = |v: f32| {
        let mut c = small();
        c.optimizer
            .params
            .get_mut("w/0")
            .unwrap()
            .buffers
            .get_mut("m")
            .unwrap()[0] = v;
        c
    };
    assert_ne!(z(0.0), z(-0.0));
    assert_eq!(z(f32::NAN), z(f32::NAN));
    // Extra tensors: bits, dtype and dims all count.
    let t = |t: Tensor| {
        let mut c = small();
        c.state.tensors.insert("r".to_owned(), t);
        c
    };
    let h = |v: f32| f16::from_f32(v);
    assert_ne!(
        t(Tensor::from_vec(vec![h(0.5), h(-1.0)], [2]).unwrap()),
        t(Tensor::from_vec(vec![h(0.5), h(-0.5)], [2]).unwrap())
    );
    assert_ne!(
        small(),
        t(Tensor::from_vec(vec![0.5f32, -1.0], [2]).unwrap())
    );
    assert_ne!(
        small(),
        t(Tensor::from_vec(vec![h(0.5), h(-1.0)], [1, 2]).unwrap())
    );
    assert_eq!(
        small(),
        t(Tensor::from_vec(vec![h(0.5), h(-1.0)], [2]).unwrap())
    );
    // Values, step, updates, shapes.
    let mut c = small();
    c.state.values.insert("counter".to_owned(), json!(3));
    assert_ne!(small(), c);
    let mut c = small();
    c.optimizer.step += 1;
    assert_ne!(small(), c);
    let mut c = small();
    c.optimizer.params.get_mut("b").unwrap().updates = 2;
    assert_ne!(small(), c);
}

#[test]
fn file_layout_is_the_documented_one() {
    let bytes = to_bytes(&rich()).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut names = st.names();
    names.sort_unstable();
    assert_eq!(
        names,
        vec![
            "extra/bf",
            "extra/empty",
            "extra/residual/0",
            "extra/residual/γ",
            "optim/empty/m",
            "optim/layer1/weight/a/b",
            "optim/layer1/weight/m",
            "optim/layer1/weight/v",
            "optim/scalar/momentum",
            "optim/блок/γ/bias 😀/m",
            "optim/блок/γ/bias 😀/v",
        ]
    );
    let w = st.tensor("optim/layer1/weight/v").unwrap();
    assert_eq!(w.dtype(), Dtype::F32);
    assert_eq!(w.shape(), &[3, 4]);
    assert_eq!(w.data()[..4], seq(12, 1e-3)[0].to_le_bytes());
    assert_eq!(st.tensor("extra/bf").unwrap().dtype(), Dtype::BF16);
    assert_eq!(st.tensor("extra/residual/γ").unwrap().dtype(), Dtype::F16);
    assert_eq!(
        st.tensor("optim/scalar/momentum").unwrap().shape(),
        &[] as &[usize]
    );

    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let header: Value =
        serde_json::from_str(&meta.metadata().as_ref().unwrap()["gradwire"]).unwrap();
    assert_eq!(header["format"], CHECKPOINT_FORMAT);
    assert_eq!(header["version"], CHECKPOINT_VERSION);
    assert_eq!(header["kind"], "adam");
    assert_eq!(header["step"], 1234);
    assert_eq!(
        header["params"]["layer1/weight"],
        json!({"shape": [3, 4], "updates": 7, "buffers": ["a/b", "m", "v"]})
    );
    assert_eq!(header["values"]["partial_update_counter"], 3);
}

#[test]
fn save_and_load_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ckpt.safetensors");
    save(&path, &rich()).unwrap();
    assert_eq!(load(&path).unwrap(), rich());
    // Overwriting replaces the file.
    save(&path, &small()).unwrap();
    assert_eq!(load(&path).unwrap(), small());
    assert_eq!(std::fs::read(&path).unwrap(), to_bytes(&small()).unwrap());
    assert_eq!(dir_entries(dir.path()), vec!["ckpt.safetensors".to_owned()]);
    // A missing file is an I/O error.
    assert!(matches!(
        load(dir.path().join("missing")),
        Err(OptimError::Io(_))
    ));
}

#[test]
fn save_to_a_bare_file_name() {
    // `Path::parent` of a bare file name is "", which must mean ".". The
    // current directory is process-wide, but no other test uses relative
    // paths.
    let dir = tempfile::tempdir().unwrap();
    let old = std::env::current_dir().unwrap();
    std::env::set_current_dir(dir.path()).unwrap();
    let saved = save("ckpt", &small());
    let loaded = load("ckpt");
    std::env::set_current_dir(old).unwrap();
    saved.unwrap();
    assert_eq!(loaded.unwrap(), small());
    assert_eq!(dir_entries(dir.path()), vec!["ckpt".to_owned()]);
}

fn dir_entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn interrupted_save_leaves_the_previous_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ckpt");
    save(&path, &small()).unwrap();
    let b = to_bytes(&rich()).unwrap();
    let err = save_bytes_with(&path, |f| {
        f.write_all(&b[..b.len() / 2])?;
        Err(io::Error::other("simulated crash halfway"))
    })
    .unwrap_err();
    assert!(matches!(err, OptimError::Io(ref e) if e.to_string().contains("simulated")));
    assert_eq!(load(&path).unwrap(), small());
    assert_eq!(dir_entries(dir.path()), vec!["ckpt".to_owned()]);

    // The writer succeeding makes the save happen.
    save_bytes_with(&path, |f| f.write_all(&b)).unwrap();
    assert_eq!(load(&path).unwrap(), rich());
    assert_eq!(dir_entries(dir.path()), vec!["ckpt".to_owned()]);
}

#[test]
fn failing_rename_leaves_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    // A non-empty directory where the file should go: the rename fails.
    let path = dir.path().join("taken");
    std::fs::create_dir(&path).unwrap();
    std::fs::write(path.join("inside"), b"x").unwrap();
    assert!(matches!(save(&path, &small()), Err(OptimError::Io(_))));
    assert_eq!(dir_entries(dir.path()), vec!["taken".to_owned()]);
    // A missing parent directory.
    let missing = dir.path().join("no/such/dir/ckpt");
    assert!(matches!(save(&missing, &small()), Err(OptimError::Io(_))));
}

#[test]
fn invalid_states_are_refused_on_save() {
    let mut c = small();
    c.optimizer
        .params
        .get_mut("w/0")
        .unwrap()
        .buffers
        .get_mut("m")
        .unwrap()
        .pop();
    assert!(matches!(
        to_bytes(&c),
        Err(OptimError::ShapeMismatch { .. })
    ));

    // "a/b" + "c" and "a" + "b/c" both name "optim/a/b/c".
    let mut c = small();
    c.optimizer
        .params
        .insert("a/b".to_owned(), param(&[1], 1, &[("c", vec![1.0])]));
    c.optimizer
        .params
        .insert("a".to_owned(), param(&[1], 1, &[("b/c", vec![2.0])]));
    assert!(matches!(to_bytes(&c), Err(OptimError::InvalidArgument(_))));

    let mut c = small();
    c.optimizer
        .params
        .insert("huge".to_owned(), param(&[usize::MAX, 2], 1, &[]));
    assert!(matches!(to_bytes(&c), Err(OptimError::InvalidArgument(_))));
}

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

/// A tensor of a re-encoded file: dtype, shape, raw bytes.
type Raw = (Dtype, Vec<usize>, Vec<u8>);

/// Decodes `bytes` with safetensors, lets the test edit the metadata map and
/// the tensors, and encodes the result.
fn reencode(
    bytes: &[u8],
    edit: impl FnOnce(&mut Option<HashMap<String, String>>, &mut BTreeMap<String, Raw>),
) -> Vec<u8> {
    reencode_sealed(bytes, true, edit)
}

/// [`reencode`], with the checksum made again after the edit when `reseal`.
fn reencode_sealed(
    bytes: &[u8],
    reseal: bool,
    edit: impl FnOnce(&mut Option<HashMap<String, String>>, &mut BTreeMap<String, Raw>),
) -> Vec<u8> {
    let (_, meta) = SafeTensors::read_metadata(bytes).unwrap();
    let mut metadata = meta.metadata().clone();
    let st = SafeTensors::deserialize(bytes).unwrap();
    let mut tensors: BTreeMap<String, Raw> = st
        .tensors()
        .into_iter()
        .map(|(k, v)| (k, (v.dtype(), v.shape().to_vec(), v.data().to_vec())))
        .collect();
    edit(&mut metadata, &mut tensors);
    // The edited file carries its own checksum (when it still has one), so
    // that what is tested is the check after it.
    if reseal
        && let Some(m) = metadata.as_mut()
        && let Some(json) = m.get("gradwire")
        && let Ok(Value::Object(mut header)) = serde_json::from_str::<Value>(json)
        && header.remove("crc32c").is_some()
    {
        let m2 = m;
        let body = Value::Object(header).to_string();
        m2.insert("gradwire".to_owned(), seal(&body, &tensors));
    }
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(k, (d, s, b))| (k.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize(views, metadata).unwrap()
}

/// The header `body` (a JSON object without its checksum) with the
/// checksum of it and `tensors` as its last member, as the writer seals it.
fn seal(body: &str, tensors: &BTreeMap<String, Raw>) -> String {
    let crc = tensors
        .iter()
        .fold(crc32c::crc32c(body.as_bytes()), |crc, (k, (_, _, b))| {
            crc32c::crc32c_append(crc32c::crc32c_append(crc, k.as_bytes()), b)
        });
    let open = body.strip_suffix('}').unwrap();
    format!("{open},\"crc32c\":\"{crc:08x}\"}}")
}

/// Re-encodes `small()` with the JSON header edited.
fn with_header(edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    reencode(&to_bytes(&small()).unwrap(), |meta, _| {
        let m = meta.as_mut().unwrap();
        let mut h: Value = serde_json::from_str(&m["gradwire"]).unwrap();
        edit(&mut h);
        m.insert("gradwire".to_owned(), h.to_string());
    })
}

fn with_tensors(edit: impl FnOnce(&mut BTreeMap<String, Raw>)) -> Vec<u8> {
    reencode(&to_bytes(&small()).unwrap(), |_, t| edit(t))
}

fn assert_corrupt(bytes: &[u8], keyword: &str) {
    let reason = corrupt_reason(from_bytes(bytes));
    assert!(
        reason.contains(keyword),
        "reason {reason:?} does not mention {keyword:?}"
    );
}

#[test]
fn unedited_reencoding_is_valid() {
    // The corruption helpers themselves produce valid files when they edit
    // nothing, so the errors below come from the edits.
    assert_eq!(from_bytes(&with_header(|_| {})).unwrap(), small());
    assert_eq!(from_bytes(&with_tensors(|_| {})).unwrap(), small());
}

#[test]
fn targeted_header_corruptions() {
    assert_corrupt(b"", "safetensors");
    assert_corrupt(b"hello, world", "safetensors");
    assert_corrupt(&to_bytes(&small()).unwrap()[1..], "safetensors");

    let bytes = to_bytes(&small()).unwrap();
    assert_corrupt(&reencode(&bytes, |m, _| *m = None), "metadata");
    assert_corrupt(
        &reencode(&bytes, |m, _| {
            let v = m.as_mut().unwrap().remove("gradwire").unwrap();
            m.as_mut().unwrap().insert("other".to_owned(), v);
        }),
        "metadata",
    );
    assert_corrupt(
        &reencode(&bytes, |m, _| {
            m.as_mut()
                .unwrap()
                .insert("gradwire".to_owned(), "{\"format\": ".to_owned());
        }),
        "JSON",
    );
    assert_corrupt(&with_header(|h| h["format"] = json!("pytorch")), "format");
    assert_corrupt(&with_header(|h| h["format"] = json!(1)), "format");
    assert_corrupt(
        &with_header(|h| {
            h.as_object_mut().unwrap().remove("format");
        }),
        "format",
    );
    assert_corrupt(&with_header(|h| h["version"] = json!(3)), "version 3");
    assert_corrupt(&with_header(|h| h["version"] = json!("1")), "version");
    assert_corrupt(&with_header(|h| h["version"] = json!(1.5)), "version");
    assert_corrupt(
        &with_header(|h| {
            h.as_object_mut().unwrap().remove("version");
        }),
        "version",
    );
    assert_corrupt(&with_header(|h| h["step"] = json!(-1)), "step");
    assert_corrupt(&with_header(|h| h["step"] = json!(1.5)), "step");
    assert_corrupt(&with_header(|h| h["step"] = json!("5")), "step");
    assert_corrupt(&with_header(|h| h["step"] = json!(1e20)), "step");
    assert_corrupt(
        &with_header(|h| h["params"]["w/0"]["updates"] = json!(-3)),
        "updates",
    );
    assert_corrupt(
        &with_header(|h| {
            h.as_object_mut().unwrap().remove("kind");
        }),
        "kind",
    );
    assert_corrupt(&with_header(|h| h["surprise"] = json!(1)), "surprise");
    assert_corrupt(&with_header(|h| h["params"] = json!([1, 2])), "header");
}

#[test]
fn targeted_tensor_corruptions() {
    // A listed buffer is missing.
    assert_corrupt(
        &with_tensors(|t| {
            t.remove("optim/w/0/v").unwrap();
        }),
        "missing",
    );
    assert_corrupt(
        &with_header(|h| h["params"]["w/0"]["buffers"] = json!(["m", "v", "extra_buf"])),
        "missing",
    );
    assert_corrupt(
        &with_header(|h| h["tensors"] = json!(["r", "ghost"])),
        "missing",
    );
    // A buffer listed twice.
    assert_corrupt(
        &with_header(|h| h["params"]["w/0"]["buffers"] = json!(["m", "v", "m"])),
        "twice",
    );
    // Wrong shape: the tensor's (same element count) or the listed one.
    assert_corrupt(
        &with_tensors(|t| t.get_mut("optim/w/0/m").unwrap().1 = vec![4]),
        "shape",
    );
    assert_corrupt(
        &with_header(|h| h["params"]["w/0"]["shape"] = json!([4, 1])),
        "shape",
    );
    assert_corrupt(
        &with_header(|h| h["params"]["b"]["shape"] = json!([usize::MAX, 4])),
        "overflow",
    );
    // Wrong dtype: a buffer stored as f16, or an extra tensor as i32.
    assert_corrupt(
        &with_tensors(|t| {
            let e = t.get_mut("optim/w/0/m").unwrap();
            e.0 = Dtype::F16;
            e.2.truncate(8);
        }),
        "dtype",
    );
    assert_corrupt(
        &with_tensors(|t| {
            let e = t.get_mut("extra/r").unwrap();
            e.0 = Dtype::I32;
            e.1 = vec![1];
        }),
        "dtype",
    );
    assert_corrupt(
        &with_tensors(|t| {
            let e = t.get_mut("optim/w/0/v").unwrap();
            e.0 = Dtype::F64;
            e.1 = vec![2, 1];
        }),
        "dtype",
    );
    // Unexpected tensors: unlisted buffers, unlisted extras, anything else.
    for name in ["optim/w/0/x", "optim/w/0", "extra/unlisted", "other", ""] {
        assert_corrupt(
            &with_tensors(|t| {
                t.insert(name.to_owned(), (Dtype::F32, vec![1], vec![0; 4]));
            }),
            "unexpected",
        );
    }
    // A tensor renamed: both missing and unexpected; missing is reported.
    assert_corrupt(
        &with_tensors(|t| {
            let v = t.remove("optim/w/0/m").unwrap();
            t.insert("optim/w/0/M".to_owned(), v);
        }),
        "missing",
    );
    // Colliding names in the header: "a/b" + "c" and "a" + "b/c".
    assert_corrupt(
        &reencode(&to_bytes(&small()).unwrap(), |m, t| {
            let m = m.as_mut().unwrap();
            let mut h: Value = serde_json::from_str(&m["gradwire"]).unwrap();
            h["params"]["a/b"] = json!({"shape": [1], "updates": 1, "buffers": ["c"]});
            h["params"]["a"] = json!({"shape": [1], "updates": 1, "buffers": ["b/c"]});
            m.insert("gradwire".to_owned(), h.to_string());
            t.insert("optim/a/b/c".to_owned(), (Dtype::F32, vec![1], vec![0; 4]));
        }),
        "twice",
    );
}

#[test]
fn corrupt_checkpoint_error_displays_its_reason() {
    let e = from_bytes(&with_header(|h| h["version"] = json!(3))).unwrap_err();
    let s = e.to_string();
    assert!(
        s.contains("corrupt checkpoint") && s.contains("version 3"),
        "{s}"
    );
}

#[test]
fn module_constants() {
    assert_eq!(CHECKPOINT_FORMAT, "gradwire-checkpoint");
    assert_eq!(CHECKPOINT_VERSION, 2);
    // The module path is public as documented.
    let _: fn(&[u8]) -> gradwire_optim::Result<Checkpoint> = checkpoint::from_bytes;
}

/// f64 values whose shortest decimal form has 17 digits or a large exponent
/// (typical of computed learning rates) only survive JSON bitwise when
/// serde_json parses floats exactly: its `float_roundtrip` feature, enabled
/// in the workspace's Cargo.toml. Without it about one such value in ten comes
/// back 1 ULP off and this test fails.
#[test]
fn config_floats_round_trip_bitwise() {
    let mut c = small();
    let awkward = [
        0.000_394_301_338_356_336_77,
        0.000_985_690_694_632_869_5,
        0.1 + 0.2,
        f64::from(0.1f32),
        3.026_199_944_157_320_3e-52,
        -1.603_964_615_428_183e143,
        f64::MIN_POSITIVE,
        f64::MAX,
    ];
    c.optimizer.config = json!({ "lr": awkward });
    c.state.values.insert("x".to_owned(), json!(awkward));
    let back = from_bytes(&to_bytes(&c).unwrap()).unwrap();
    for (i, &x) in awkward.iter().enumerate() {
        assert_eq!(
            back.optimizer.config["lr"][i].as_f64().unwrap().to_bits(),
            x.to_bits(),
            "{x:e}"
        );
    }
    assert_eq!(back, c);
}

#[test]
fn the_checksum_covers_the_header_and_every_tensor() {
    let bytes = to_bytes(&small()).unwrap();
    // A flipped bit in the data: it would decode, but not to what was saved.
    let mut flipped = bytes.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x01;
    let reason = corrupt_reason(from_bytes(&flipped));
    assert!(reason.contains("checksum mismatch"), "{reason}");
    // An edited header value that stays valid JSON, its checksum left as
    // it was.
    let step = small().optimizer.step;
    let stale = reencode_sealed(&bytes, false, |meta, _| {
        let m = meta.as_mut().unwrap();
        let h = m["gradwire"].replacen(
            &format!("\"step\":{step},"),
            &format!("\"step\":{},", step + 100),
            1,
        );
        assert_ne!(h, m["gradwire"], "the header holds the step");
        m.insert("gradwire".to_owned(), h);
    });
    let reason = corrupt_reason(from_bytes(&stale));
    assert!(reason.contains("checksum mismatch"), "{reason}");
    // The same edit with the checksum made again loads, with the new step:
    // the edit, not the re-encoding, is what the checksum caught.
    let resealed = with_header(|h| h["step"] = json!(100 + step));
    assert_eq!(from_bytes(&resealed).unwrap().optimizer.step, 100 + step);
    // A version 2 header without its checksum, or with a malformed one.
    let unsealed = reencode(&bytes, |meta, _| {
        let m = meta.as_mut().unwrap();
        let mut h: Value = serde_json::from_str(&m["gradwire"]).unwrap();
        h.as_object_mut().unwrap().remove("crc32c");
        m.insert("gradwire".to_owned(), h.to_string());
    });
    assert_corrupt(&unsealed, "no checksum");
    let malformed = reencode_sealed(&bytes, false, |meta, _| {
        let m = meta.as_mut().unwrap();
        let (body, _) = m["gradwire"].rsplit_once(",\"crc32c\":").unwrap();
        let h = format!("{body},\"crc32c\":\"12345\"}}");
        m.insert("gradwire".to_owned(), h);
    });
    assert_corrupt(&malformed, "hex");
}

#[test]
fn a_first_version_file_loads_without_a_checksum() {
    let v1 = reencode(&to_bytes(&small()).unwrap(), |meta, _| {
        let m = meta.as_mut().unwrap();
        let mut h: Value = serde_json::from_str(&m["gradwire"]).unwrap();
        h.as_object_mut().unwrap().remove("crc32c");
        h["version"] = json!(1);
        m.insert("gradwire".to_owned(), h.to_string());
    });
    assert_eq!(from_bytes(&v1).unwrap(), small());
    // A checksum claimed by a version 1 header is a corruption.
    let claimed = with_header(|h| h["version"] = json!(1));
    assert_corrupt(&claimed, "version 1 header with a checksum");
}

#[test]
fn non_finite_values_are_refused_unless_allowed() {
    for (bad, what) in [
        (f32::NAN, "NaN"),
        (f32::INFINITY, "inf"),
        (f32::NEG_INFINITY, "-inf"),
    ] {
        // In an optimizer buffer.
        let mut c = small();
        let (name, buffer, values) = c
            .optimizer
            .params
            .iter_mut()
            .flat_map(|(n, p)| {
                p.buffers
                    .iter_mut()
                    .map(move |(b, v)| (n.clone(), b.clone(), v))
            })
            .find(|(_, _, v)| v.len() >= 2)
            .expect("a buffer of two elements or more");
        values[1] = bad;
        let bytes = to_bytes(&c).unwrap();
        match checkpoint::from_bytes(&bytes) {
            Err(OptimError::NonFiniteCheckpoint { tensor, index, .. }) => {
                assert_eq!(tensor, format!("optim/{name}/{buffer}"), "{what}");
                assert_eq!(index, 1, "{what}");
            }
            other => panic!("{what} in a buffer: {other:?}"),
        }
        let err = checkpoint::from_bytes(&bytes).unwrap_err();
        assert_eq!(err.kind(), gradwire_tensor::ErrorKind::NonFinite, "{what}");
        assert_eq!(from_bytes(&bytes).unwrap(), c, "{what}: allowed, it loads");
        // In a tensor of the state (a parameter, a residual).
        let mut c = small();
        c.state.tensors.insert(
            "param/w".to_owned(),
            Tensor::from_vec(vec![0.5f32, 1.0, bad], 3).unwrap(),
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ckpt");
        save(&path, &c).unwrap();
        match checkpoint::load(&path) {
            Err(OptimError::NonFiniteCheckpoint { tensor, index, .. }) => {
                assert_eq!((tensor.as_str(), index), ("extra/param/w", 2), "{what}");
            }
            other => panic!("{what} in a tensor: {other:?}"),
        }
        assert_eq!(load(&path).unwrap(), c, "{what}: allowed, it loads");
    }
}
