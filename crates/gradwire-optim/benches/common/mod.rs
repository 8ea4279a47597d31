//! What the optimizer benchmarks share: ResNet-50's parameter shapes.

/// ResNet-50's parameter tensors in forward order: the stem, four stages of
/// bottleneck blocks (1x1, 3x3, 1x1 convolutions, batch-norm scales and
/// shifts, projection shortcuts), and the classifier: 161 tensors, 25.6 M
/// parameters.
pub fn resnet50_shapes() -> Vec<Vec<usize>> {
    let mut shapes = vec![vec![64, 3, 7, 7], vec![64], vec![64]];
    let mut c_in = 64;
    for (width, blocks) in [(64, 3), (128, 4), (256, 6), (512, 3)] {
        for block in 0..blocks {
            let out = width * 4;
            for shape in [
                vec![width, c_in, 1, 1],
                vec![width, width, 3, 3],
                vec![out, width, 1, 1],
            ] {
                let c = shape[0];
                shapes.push(shape);
                shapes.push(vec![c]);
                shapes.push(vec![c]);
            }
            if block == 0 {
                shapes.extend([vec![out, c_in, 1, 1], vec![out], vec![out]]);
            }
            c_in = out;
        }
    }
    shapes.push(vec![1000, 2048]);
    shapes.push(vec![1000]);
    shapes
}
