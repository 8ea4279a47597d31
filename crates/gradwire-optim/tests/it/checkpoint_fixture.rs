//! Checkpoints of the first DistOpt format still load: the fixtures in
//! `tests/fixtures/distopt-v1/` were written by the version before the
//! strategy registry (`write_fixtures`, ignored, made them; it is run alone,
//! `cargo test -p gradwire-optim --test it -- --ignored write_fixtures`,
//! only to make a new format's fixtures). Each one restores
//! into today's front end of its loop, checkpoints again to the very same bytes, and
//! training goes on from it bitwise as it did when it was written.

use gradwire_algos::{HalfPrecision, PowerSgdConfig};
use gradwire_comm::{Communicator, LocalComm, local};
use gradwire_compress::{Quantizer, SparseCodec};
use gradwire_optim::checkpoint;
use gradwire_optim::{
    AnyLoop, DistOptConfig, OptimError, ParamSpec, Sgd, SgdConfig, StrategyConfig,
};
use gradwire_tensor::Tensor;
use std::path::PathBuf;

const SHAPES: &[&[usize]] = &[&[6, 5], &[4, 3], &[7]];
const WORLD: usize = 2;
/// Steps before the checkpoint, and after it.
const BEFORE: usize = 3;
const AFTER: usize = 2;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/distopt-v1")
}

/// Every strategy with state of its own, and the plain ones.
fn cases() -> Vec<(&'static str, StrategyConfig)> {
    vec![
        ("dense", StrategyConfig::Dense),
        (
            "fp16",
            StrategyConfig::Half {
                precision: HalfPrecision::F16,
                clip: None,
            },
        ),
        (
            "topk",
            StrategyConfig::Sparse {
                codec: SparseCodec::TopK(0.3),
                error_feedback: true,
            },
        ),
        (
            "powersgd",
            StrategyConfig::PowerSgd(PowerSgdConfig {
                rank: 1,
                start_step: 1,
                min_compression_rate: 1.0,
                ..PowerSgdConfig::default()
            }),
        ),
        (
            "onebit",
            StrategyConfig::Quantized {
                quantizer: Quantizer::Sign,
                error_feedback: true,
                momentum: Some(0.9),
            },
        ),
        (
            "partial",
            StrategyConfig::Partial {
                average_state: true,
            },
        ),
        ("adasum-delta", StrategyConfig::DeltaWeight { group: None }),
    ]
}

fn specs() -> Vec<ParamSpec> {
    SHAPES
        .iter()
        .enumerate()
        .map(|(k, dims)| ParamSpec::new(format!("p{k}"), dims.to_vec()))
        .collect()
}

fn gradient(rank: usize, step: usize, k: usize) -> Tensor {
    let dims = SHAPES[k].to_vec();
    let n: usize = dims.iter().product();
    let values = (0..n)
        .map(|i| (((rank * 131 + step * 17 + k * 5 + i) as f32) * 0.37).sin() * 0.05)
        .collect();
    Tensor::from_vec(values, dims).unwrap()
}

fn make(mode: StrategyConfig, comm: LocalComm) -> Result<AnyLoop<Sgd, LocalComm>, OptimError> {
    let sgd = Sgd::new(SgdConfig::default().lr(0.1).momentum(0.9))?;
    let config = DistOptConfig {
        strategy: mode,
        fusion_threshold: 40,
        ..DistOptConfig::default()
    };
    // AdaSum (adasum-delta) is prepared by DistOpt from the registry; the
    // fixtures were written with one given to `with_strategy`.
    AnyLoop::new(sgd, comm, specs(), config)
}

fn steps(
    dist: &mut AnyLoop<Sgd, LocalComm>,
    params: &mut [Tensor],
    range: std::ops::Range<usize>,
) -> Result<(), OptimError> {
    let rank = dist.rank();
    for step in range {
        for k in (0..SHAPES.len()).rev() {
            dist.push(&format!("p{k}"), gradient(rank, step, k))?;
        }
        let names: Vec<String> = (0..SHAPES.len()).map(|k| format!("p{k}")).collect();
        dist.finish(names.iter().map(String::as_str).zip(params.iter_mut()))?;
    }
    Ok(())
}

fn bits(params: &[Tensor]) -> Vec<u32> {
    params
        .iter()
        .flat_map(|p| p.to_vec::<f32>().unwrap())
        .map(f32::to_bits)
        .collect()
}

fn from_bits(bits: &[u32]) -> Vec<Tensor> {
    let mut at = 0;
    SHAPES
        .iter()
        .map(|dims| {
            let n: usize = dims.iter().product();
            let values = bits[at..at + n]
                .iter()
                .map(|&b| f32::from_bits(b))
                .collect();
            at += n;
            Tensor::from_vec(values, dims.to_vec()).unwrap()
        })
        .collect()
}

fn read_bits(path: PathBuf) -> Vec<u32> {
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).unwrap()
}

#[test]
#[ignore = "writes the fixtures of a new checkpoint format"]
fn write_fixtures() {
    std::fs::create_dir_all(dir()).unwrap();
    for (name, mode) in cases() {
        local::run(WORLD, |comm: LocalComm| -> Result<(), OptimError> {
            let rank = comm.rank();
            let mut dist = make(mode, comm)?;
            let mut params: Vec<Tensor> = SHAPES
                .iter()
                .map(|d| Tensor::from_vec(vec![0.01f32; d.iter().product()], d.to_vec()))
                .collect::<Result<_, _>>()?;
            steps(&mut dist, &mut params, 0..BEFORE)?;
            let file = |what: &str| dir().join(format!("{name}.rank{rank}.{what}"));
            std::fs::write(file("ckpt"), checkpoint::to_bytes(&dist.checkpoint()?)?)?;
            let at_save = serde_json::to_string(&bits(&params)).unwrap();
            std::fs::write(file("params.json"), at_save)?;
            steps(&mut dist, &mut params, BEFORE..BEFORE + AFTER)?;
            let after = serde_json::to_string(&bits(&params)).unwrap();
            std::fs::write(file("after.json"), after)?;
            Ok(())
        })
        .unwrap()
        .into_iter()
        .for_each(|r| r.unwrap());
    }
}

#[test]
fn first_format_checkpoints_load_and_resume_bitwise() {
    for (name, mode) in cases() {
        local::run(WORLD, |comm: LocalComm| -> Result<(), OptimError> {
            let rank = comm.rank();
            let file = |what: &str| dir().join(format!("{name}.rank{rank}.{what}"));
            let bytes = std::fs::read(file("ckpt"))?;
            let mut dist = make(mode, comm)?;
            dist.restore(&checkpoint::from_bytes(&bytes)?)?;
            // The same state, now written in the current format.
            let again = checkpoint::to_bytes(&dist.checkpoint()?)?;
            assert_eq!(
                checkpoint::from_bytes(&again)?,
                checkpoint::from_bytes(&bytes)?,
                "{name}, rank {rank}: the restored state checkpoints differently"
            );
            let mut params = from_bits(&read_bits(file("params.json")));
            steps(&mut dist, &mut params, BEFORE..BEFORE + AFTER)?;
            assert_eq!(
                bits(&params),
                read_bits(file("after.json")),
                "{name}, rank {rank}: training from the checkpoint went elsewhere"
            );
            Ok(())
        })
        .unwrap()
        .into_iter()
        .for_each(|r| r.unwrap());
    }
}
