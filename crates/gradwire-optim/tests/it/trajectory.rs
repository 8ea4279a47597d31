//! Trajectory snapshots through checkpoint files: parameters saved with
//! `set_parameters` come back flattened by `load_trajectory`, ready for
//! DimReduce's PCA.

use gradwire_algos::dimreduce::Pca;
use gradwire_optim::checkpoint::{self, Checkpoint};
use gradwire_optim::{OptimError, Optimizer, Sgd, SgdConfig};
use gradwire_tensor::Tensor;

#[test]
fn checkpoints_carry_parameters_for_a_trajectory() {
    let dir = tempfile::tempdir().unwrap();
    let mut sgd = Sgd::new(SgdConfig::default().lr(0.1)).unwrap();
    let mut w = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], vec![2, 2]).unwrap();
    let mut b = Tensor::from_vec(vec![0.5f32], 1).unwrap();
    let mut paths = Vec::new();
    let mut want = Vec::new();
    for step in 0..4 {
        let g = Tensor::from_vec(vec![0.1 * step as f32, -0.2, 0.3, 0.05], vec![2, 2]).unwrap();
        sgd.update("w", &mut w, &g).unwrap();
        sgd.update(
            "b",
            &mut b,
            &Tensor::from_vec(vec![0.01 * step as f32], 1).unwrap(),
        )
        .unwrap();
        sgd.step();
        let mut ckpt = Checkpoint::new(sgd.state().unwrap());
        ckpt.set_parameters([("w", &w), ("b", &b)]);
        let path = dir.path().join(format!("step{step}.ckpt"));
        checkpoint::save(&path, &ckpt).unwrap();
        paths.push(path);
        want.push([w.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap()].concat());
    }
    let rows = checkpoint::load_trajectory(&paths, &["w", "b"]).unwrap();
    assert_eq!(rows, want);
    let pca = Pca::fit(&rows, 2).unwrap();
    assert!(pca.n_components() >= 1);
    assert!(matches!(
        checkpoint::load_trajectory(&paths, &["w", "missing"]),
        Err(OptimError::StateMismatch(_))
    ));
}
