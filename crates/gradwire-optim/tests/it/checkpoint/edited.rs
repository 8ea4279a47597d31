//! Files re-encoded with targeted edits to the header or the tensors: each is
//! refused with a reason naming it; the checksum catches unsealed edits.

use std::collections::{BTreeMap, HashMap};

use gradwire_optim::checkpoint::to_bytes;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde_json::{Value, json};

use super::{corrupt_reason, from_bytes, small};

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
