//! NaN and infinities in a buffer or a tensor of the state are refused on
//! load by default, naming the tensor and index, and load when allowed.

use gradwire_optim::OptimError;
use gradwire_optim::checkpoint::{self, save, to_bytes};
use gradwire_tensor::Tensor;

use super::{from_bytes, load, small};

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
