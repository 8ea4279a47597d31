//! End-to-end: the `gradwire` binary as a user runs it.
//!
//! `compare` with its default line-up and budget must show what each
//! strategy is for: every strategy reaches 90 % test accuracy, top-k 1 %
//! sends under 5 % of dense's bytes, and error feedback beats no error
//! feedback at the same ratio; its plots are real PNG and SVG files. `train`
//! resumes bitwise from its checkpoints; bad flags are messages with exit
//! code 2, never a panic; `bench` reports ratios against memcpy.

use serde_json::Value;
use std::path::Path;
use std::process::Output;

fn gradwire(args: &[&str]) -> Output {
    crate::gradwire_command()
        .args(args)
        .output()
        .expect("run gradwire")
}

fn json_lines(out: &Output) -> Vec<Value> {
    assert!(
        out.status.success(),
        "gradwire failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

fn accuracy(run: &Value) -> Vec<f64> {
    run["epochs"]
        .as_array()
        .expect("epochs")
        .iter()
        .map(|e| e["test_accuracy"].as_f64().expect("accuracy"))
        .collect()
}

fn last(run: &Value, key: &str) -> f64 {
    run["epochs"]
        .as_array()
        .and_then(|e| e.last())
        .and_then(|e| e[key].as_f64())
        .expect(key)
}

#[test]
fn compare_shows_what_each_strategy_is_for() {
    let dir = tempfile::tempdir().unwrap();
    let out = gradwire(&["compare", "--json", "--out", dir.path().to_str().unwrap()]);
    let lines = json_lines(&out);
    let runs = lines[0]["runs"].as_array().expect("runs").clone();
    let by_label = |label: &str| {
        runs.iter()
            .find(|r| r["label"] == label)
            .unwrap_or_else(|| panic!("no run {label}"))
    };
    assert_eq!(runs.len(), 11);
    for run in &runs {
        let acc = accuracy(run);
        let final_acc = *acc.last().unwrap();
        println!("{:<22} final {:.1} %", run["label"], final_acc * 100.0);
        assert!(final_acc >= 0.90, "{} ends at {final_acc}", run["label"]);
    }
    let dense = last(by_label("dense"), "bytes_total");
    let topk = last(by_label("topk 1 %"), "bytes_total");
    assert!(
        topk < 0.05 * dense,
        "top-k 1 % sent {topk} bytes, dense {dense}"
    );
    // Error feedback against none, top-k 1 % both: the mean accuracy of the
    // last five epochs (less noisy than one epoch) and the final loss.
    let tail_mean = |label: &str| {
        let acc = accuracy(by_label(label));
        acc[acc.len() - 5..].iter().sum::<f64>() / 5.0
    };
    let (ef, no_ef) = (tail_mean("topk 1 %"), tail_mean("topk 1 %, no EF"));
    assert!(ef > no_ef, "error feedback {ef}, none {no_ef}");
    let loss = |label: &str| last(by_label(label), "train_loss");
    assert!(loss("topk 1 %") < loss("topk 1 %, no EF"));
    // PowerSGD at rank 2 within a point of dense accuracy (the mean of the
    // last five epochs), sending a fraction of dense's bytes.
    let (powersgd, dense_acc) = (tail_mean("powersgd rank 2"), tail_mean("dense"));
    assert!(
        powersgd >= dense_acc - 0.01,
        "powersgd {powersgd}, dense {dense_acc}"
    );
    let powersgd_bytes = last(by_label("powersgd rank 2"), "bytes_total");
    assert!(
        powersgd_bytes < 0.25 * dense,
        "powersgd sent {powersgd_bytes} bytes, dense {dense}"
    );
    // 1 bit and 8 bits per entry both ways, with error feedback: within a
    // point of dense, at about 32 and 4 times fewer bytes (the votes and
    // scales cost a little).
    for (label, most) in [("onebit", 1.0 / 25.0), ("uint8", 1.0 / 3.5)] {
        let acc = tail_mean(label);
        assert!(acc >= dense_acc - 0.01, "{label} {acc}, dense {dense_acc}");
        let bytes = last(by_label(label), "bytes_total");
        assert!(
            bytes < most * dense,
            "{label} sent {bytes} bytes, dense {dense}"
        );
    }
    // The plots: PNG signatures with a 960 x 600 header, SVGs with every label.
    for name in ["accuracy_vs_epoch", "accuracy_vs_bytes", "accuracy_vs_time"] {
        let png = std::fs::read(dir.path().join(format!("{name}.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(u32::from_be_bytes(png[16..20].try_into().unwrap()), 960);
        assert_eq!(u32::from_be_bytes(png[20..24].try_into().unwrap()), 600);
        let svg = std::fs::read_to_string(dir.path().join(format!("{name}.svg"))).unwrap();
        assert!(svg.contains("<svg") && svg.contains("test accuracy (%)"));
        for run in &runs {
            let label = run["label"].as_str().unwrap();
            assert!(
                svg.contains(label),
                "{name}.svg has no legend entry {label}"
            );
        }
    }
}

#[test]
fn onebit_adam_keeps_adams_accuracy() {
    // Adam with dense averaging against 1-bit Adam (frozen after 100 of
    // the run's 460 steps): within a point, at about a quarter of the bytes.
    let dir = tempfile::tempdir().unwrap();
    let out = gradwire(&[
        "compare",
        "--json",
        "--strategies",
        "dense,onebit-adam",
        "--optimizer",
        "adam",
        "--lr",
        "0.002",
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    let lines = json_lines(&out);
    let runs = lines[0]["runs"].as_array().expect("runs").clone();
    let tail = |run: &Value| {
        let acc = accuracy(run);
        acc[acc.len() - 5..].iter().sum::<f64>() / 5.0
    };
    let (dense, onebit) = (tail(&runs[0]), tail(&runs[1]));
    println!("adam {dense}, 1-bit adam {onebit}");
    assert!(onebit >= dense - 0.01, "1-bit Adam {onebit}, Adam {dense}");
    let bytes = |run: &Value| last(run, "bytes_total");
    assert!(bytes(&runs[1]) < 0.3 * bytes(&runs[0]));
    // Not with another optimizer.
    let out = gradwire(&["train", "-s", "onebit-adam", "--epochs", "1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--optimizer adam"));
}

/// Per-epoch records without the timings (which differ run to run).
fn without_timings(records: &[Value]) -> Vec<Value> {
    records
        .iter()
        .map(|r| {
            let mut r = r.clone();
            for key in [
                "compute_secs",
                "comm_secs",
                "wall_secs",
                "eval_secs",
                "combine_secs",
                "coordination_secs",
                "network_secs",
                "waiting_secs",
                "busy_secs",
                "slowest_busy_secs",
                // Who arrived last is timing too.
                "straggler",
            ] {
                r.as_object_mut().unwrap().remove(key);
            }
            r
        })
        .collect()
}

fn train_json(args: &[&str]) -> (Vec<Value>, Value) {
    let mut all = vec!["train", "--json", "--epochs", "4"];
    all.extend_from_slice(args);
    let lines = json_lines(&gradwire(&all));
    let (summary, epochs) = lines.split_last().expect("a summary");
    assert_eq!(summary["type"], "summary");
    (epochs.to_vec(), summary.clone())
}

fn resume_matches(args: &[&str], dir: &Path) {
    let dir = dir.to_str().unwrap();
    let (_, straight) = train_json(args);
    let mut first = vec!["train", "--json", "--epochs", "2", "--checkpoint", dir];
    first.extend_from_slice(args);
    let lines = json_lines(&gradwire(&first));
    assert_eq!(lines.len(), 3);
    let mut rest = args.to_vec();
    rest.extend_from_slice(&["--checkpoint", dir, "--resume"]);
    let (resumed_epochs, resumed) = train_json(&rest);
    assert_eq!(resumed_epochs.len(), 2, "only epochs 3 and 4 run again");
    assert_eq!(
        straight["param_checksum"], resumed["param_checksum"],
        "{args:?}: resumed parameters differ"
    );
    let records = |v: &Value| without_timings(v["epochs"].as_array().unwrap());
    assert_eq!(
        records(&straight),
        records(&resumed),
        "{args:?}: histories differ"
    );
}

#[test]
fn train_resumes_bitwise_from_its_checkpoints() {
    for strategy in ["topk", "partial", "adasum-delta", "powersgd", "onebit"] {
        let dir = tempfile::tempdir().unwrap();
        resume_matches(&["-s", strategy], dir.path());
    }
    // The convolutional network with AdamW's two buffers per parameter
    // (gradwire-candle's optimizer state in the checkpoint).
    let dir = tempfile::tempdir().unwrap();
    let cnn = [
        "-s",
        "fp16",
        "--model",
        "cnn",
        "--channels",
        "4,8",
        "--optimizer",
        "adamw",
        "--lr",
        "0.01",
    ];
    resume_matches(&cnn, dir.path());
    // The transformer on a corpus of its own, in streaming DiLoCo (a
    // fragment in flight across the epoch's end: 13 steps an epoch).
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.txt");
    let text: String = (0..3000)
        .map(|i| ["the cat ", "sat on ", "a mat.\n", "A dog ran. "][i * 7 % 4])
        .collect();
    std::fs::write(&corpus, text).unwrap();
    let checkpoints = dir.path().join("checkpoints");
    let gpt = [
        "-s",
        "streaming-diloco:4:2:tau=1:uint8",
        "--model",
        "gpt",
        "--corpus",
        corpus.to_str().unwrap(),
        "--layers",
        "1",
        "--width",
        "16",
        "--heads",
        "2",
        "--context",
        "16",
        "--epoch-windows",
        "200",
        "--optimizer",
        "adamw",
        "--lr",
        "0.003",
    ];
    resume_matches(&gpt, &checkpoints);
    // DimReduce, stopped in its dense stage and resumed across the switch.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    let common = ["-s", "dimreduce", "--dimreduce-dense-epochs", "2"];
    let (_, straight) = train_json(&common);
    let mut first = vec!["train", "--json", "--epochs", "1", "--checkpoint", path];
    first.extend_from_slice(&common);
    json_lines(&gradwire(&first));
    let mut rest = common.to_vec();
    rest.extend_from_slice(&["--checkpoint", path, "--resume"]);
    let (_, resumed) = train_json(&rest);
    assert_eq!(straight["param_checksum"], resumed["param_checksum"]);
    // A checkpoint of another run is refused, naming what differs.
    let out = gradwire(&["train", "-s", "topk", "--checkpoint", path, "--resume"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("strategy was \"dimreduce\""), "{stderr}");
}

/// Checkpoints written before the strategy registry (`-s topk` with its
/// settings in flags of their own) resume bitwise under today's flags:
/// `tests/fixtures/train-v1/<strategy>/` holds one epoch's checkpoints of
/// `gradwire train -w 2 --hidden 8 -s <strategy>` and the checksum of a
/// straight two-epoch run of that version.
#[test]
fn first_format_checkpoints_resume_bitwise() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/train-v1");
    for strategy in ["topk", "powersgd", "adasum-delta"] {
        let dir = tempfile::tempdir().unwrap();
        for rank in ["rank0.ckpt", "rank1.ckpt"] {
            std::fs::copy(fixtures.join(strategy).join(rank), dir.path().join(rank)).unwrap();
        }
        let want = std::fs::read_to_string(fixtures.join(strategy).join("after-2-epochs.checksum"))
            .unwrap();
        let path = dir.path().to_str().unwrap();
        let lines = json_lines(&gradwire(&[
            "train",
            "--json",
            "-w",
            "2",
            "--hidden",
            "8",
            "-s",
            strategy,
            "--epochs",
            "2",
            "--checkpoint",
            path,
            "--resume",
        ]));
        let (summary, epochs) = lines.split_last().expect("a summary");
        assert_eq!(epochs.len(), 1, "{strategy}: only the second epoch runs");
        assert_eq!(summary["param_checksum"], want.trim(), "{strategy}");
    }
}

#[test]
fn bad_flags_are_messages_not_panics() {
    let cases: &[(&[&str], &str)] = &[
        (&["train", "-s", "zip"], "invalid value 'zip'"),
        (&["train", "-s", "topk:0"], "the ratio must be in (0, 1]"),
        (&["train", "-s", "topk:1.5"], "the ratio must be in (0, 1]"),
        (
            &["train", "-s", "topk:0.1:fast"],
            "is not a setting of topk",
        ),
        (&["train", "-w", "0"], "--world must be between"),
        (&["train", "--epochs", "0"], "--epochs"),
        (&["train", "--resume"], "--checkpoint"),
        (
            &["compare", "--strategies", "dense,nope"],
            "unknown strategy",
        ),
        (&["bench", "allreduce", "--sizes", "4XB"], "unknown unit"),
        (
            &["bench", "allreduce", "--secs", "inf"],
            "--secs must be between",
        ),
        (
            &["bench", "allreduce", "--secs", "NaN"],
            "--secs must be between",
        ),
        (
            &["bench", "allreduce", "-w", "100000"],
            "--world must be between",
        ),
        (
            &["bench", "allreduce", "--sizes", "0"],
            "--sizes must be from 1",
        ),
        (
            &["bench", "compress", "--sizes", "2G"],
            "--sizes must be from 1",
        ),
        (&["faults", "-w", "100000"], "--world must be between"),
        (
            &["faults", "--deadline", "0"],
            "--deadline must be at least",
        ),
        (
            &["train", "--hidden", "100000000,100000000"],
            "--hidden: a layer would hold",
        ),
        (
            &["project", "--workers", "2000000"],
            "--workers must be between",
        ),
        (
            &["train", "--model", "gpt", "--width", "10", "--heads", "3"],
            "--width (10) must be a multiple of --heads (3)",
        ),
        (
            &["train", "--model", "gpt", "--context", "100000000"],
            "--context must be at most",
        ),
        (
            &["train", "--model", "gpt", "--layers", "0"],
            "must be at least 1",
        ),
        (
            &["train", "--model", "gpt", "--width", "100000"],
            "--width: a layer would hold",
        ),
        (
            &["train", "--model", "gpt", "--corpus", "/nonexistent/text"],
            "apt-get install fortunes",
        ),
        (
            &["train", "--model", "gpt", "--target-loss", "0"],
            "--target-loss must be positive",
        ),
        (
            &["train", "--model", "gpt", "--epoch-windows", "0"],
            "--epoch-windows must be at least 1",
        ),
    ];
    for (args, message) in cases {
        let out = gradwire(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

/// `--backend nccl` without GPUs (this CI) is a message, never a panic: in
/// a default build it names the feature to build with; with `--features
/// nccl` on a machine without NCCL or a GPU it says what is missing.
#[test]
fn nccl_backend_without_gpus_is_a_message() {
    for args in [
        &["train", "--backend", "nccl", "--epochs", "1", "-w", "2"][..],
        &[
            "train",
            "--backend",
            "nccl",
            "--deterministic",
            "--epochs",
            "1",
            "-w",
            "2",
        ][..],
        &[
            "bench",
            "allreduce",
            "--backend",
            "nccl",
            "--sizes",
            "4KiB",
            "-w",
            "2",
        ][..],
    ] {
        let out = gradwire(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        if !cfg!(feature = "nccl") {
            assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
            assert!(stderr.contains("--features nccl"), "{args:?}: {stderr}");
        } else if !out.status.success() {
            // With two GPUs and NCCL the run succeeds; otherwise it must
            // say what is missing.
            assert!(
                stderr.contains("NCCL unavailable") || stderr.contains("CUDA"),
                "{args:?}: {stderr}"
            );
        }
    }
}

/// `gradwire bench kernels` without a GPU is a message, never a panic: a
/// build without `cuda` names the feature; a build with it says CUDA is
/// missing (or, on a GPU machine, measures); an unknown codec is refused.
#[test]
fn bench_kernels_without_a_gpu_is_a_message() {
    let args = ["bench", "kernels", "--sizes", "4K", "--secs", "0.01"];
    let out = gradwire(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    if !cfg!(feature = "cuda") {
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("--features cuda"), "{stderr}");
    } else if !out.status.success() {
        assert!(stderr.contains("CUDA"), "{stderr}");
    }
    let out = gradwire(&["bench", "kernels", "--codecs", "nope", "--sizes", "4K"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && !stderr.contains("panicked"),
        "{stderr}"
    );
}

#[test]
fn bench_reports_ratios_against_memcpy() {
    let out = gradwire(&[
        "bench",
        "allreduce",
        "--sizes",
        "4KiB,64KiB",
        "--world",
        "2,3",
        "--secs",
        "0.02",
        "--json",
    ]);
    let rows = json_lines(&out).remove(0);
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 4);
    for r in rows {
        let ratio = r["ratio"].as_f64().unwrap();
        let expected = r["busbw_gbs"].as_f64().unwrap() / r["memcpy_gbs"].as_f64().unwrap();
        assert!(ratio > 0.0 && (ratio - expected).abs() < 1e-9);
    }
    let out = gradwire(&[
        "bench", "compress", "--sizes", "10K", "--secs", "0.02", "--json",
    ]);
    let rows = json_lines(&out).remove(0);
    assert_eq!(rows.as_array().unwrap().len(), 7);
}

/// The runs of `compare --json --strategies STRATEGIES --epochs 2 -w 3`.
fn compare_runs(strategies: &str) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let out = gradwire(&[
        "compare",
        "--json",
        "--strategies",
        strategies,
        "--epochs",
        "2",
        "-w",
        "3",
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    let lines = json_lines(&out);
    lines[0]["runs"].as_array().expect("runs").clone()
}

/// The baseline (one fusion buffer, the communicator's own all-reduce, the
/// same optimizer) computes what DistOpt's dense mode computes: on LocalComm,
/// whose all-reduce is gradwire's rank-ordered sum, the models are bitwise
/// equal after training.
#[test]
fn the_baseline_loop_trains_the_same_model_as_dense_on_local() {
    let runs = compare_runs("baseline,dense");
    assert_eq!(runs[0]["label"], "baseline");
    assert_eq!(runs[1]["label"], "dense");
    assert_eq!(runs[0]["param_checksum"], runs[1]["param_checksum"]);
    assert_eq!(accuracy(&runs[0]), accuracy(&runs[1]));
}

/// The 16-bit baseline (`baseline:fp16`, `baseline:bf16`: Horovod's fp16
/// compression, the fused gradients cast, summed by the communicator's own
/// all-reduce in 16 bits, cast back) sends half the baseline's bytes and
/// trains as gradwire's 16-bit strategy of the same format does.
#[test]
fn the_16_bit_baseline_sends_half_the_bytes() {
    let runs = compare_runs("baseline,baseline:fp16,fp16,baseline:bf16,bf16");
    let labels: Vec<&str> = runs.iter().map(|r| r["label"].as_str().unwrap()).collect();
    assert_eq!(
        labels,
        ["baseline", "baseline fp16", "fp16", "baseline bf16", "bf16"]
    );
    let bytes = |run: &Value| last(run, "bytes_total");
    for half in [1, 3] {
        // Half, up to the ring model's rounding of each rank's chunk.
        let gap = (bytes(&runs[half]) * 2.0 - bytes(&runs[0])).abs();
        assert!(
            gap <= 1e-4 * bytes(&runs[0]),
            "{}: {gap} bytes off half",
            labels[half]
        );
        // The same steps up to where the 16-bit rounding happens (gradwire
        // averages before the cast, Horovod's compression after the sum).
        let (a, b) = (
            last(&runs[half], "train_loss"),
            last(&runs[half + 1], "train_loss"),
        );
        assert!(
            (a - b).abs() <= 0.01 * b,
            "{}: train loss {a} against {}'s {b}",
            labels[half],
            labels[half + 1]
        );
    }
}

/// `train --timeline FILE` writes the run's Chrome trace: every rank a
/// process, every world collective on every rank under one sequence
/// number, one `finish` span per step and rank, and the bucket jobs on
/// each rank's communication thread; and beside it the picture of the last
/// steps (where the font is there to draw it).
#[test]
fn train_writes_a_timeline_every_rank_shares() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("trace.json");
    let lines = json_lines(&gradwire(&[
        "train",
        "--json",
        "--epochs",
        "1",
        "-w",
        "3",
        "--hidden",
        "32",
        "-s",
        "topk:0.01",
        "--timeline",
        file.to_str().unwrap(),
    ]));
    let (summary, epochs) = lines.split_last().unwrap();
    let steps: u64 = epochs.iter().map(|e| e["steps"].as_u64().unwrap()).sum();
    assert!(summary["timeline"]["collectives"].as_u64().unwrap() > steps);
    let trace: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let meta = |name: &str| -> Vec<&Value> {
        events
            .iter()
            .filter(|e| e["ph"] == "M" && e["name"] == name)
            .collect()
    };
    let ranks: Vec<&str> = meta("process_name")
        .iter()
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(ranks, ["rank 0", "rank 1", "rank 2"]);
    let track = |pid: &Value, tid: &Value| -> String {
        meta("thread_name")
            .iter()
            .find(|m| m["pid"] == *pid && m["tid"] == *tid)
            .map(|m| m["args"]["name"].as_str().unwrap().to_string())
            .unwrap()
    };
    let mut world: std::collections::BTreeMap<u64, Vec<u64>> = Default::default();
    let mut finishes = [0u64; 3];
    let mut lane_buckets = [0u64; 3];
    for e in events.iter().filter(|e| e["ph"] == "X") {
        let rank = e["pid"].as_u64().unwrap();
        let name = track(&e["pid"], &e["tid"]);
        match e["cat"].as_str().unwrap() {
            "collective" if name == "collectives" => {
                world
                    .entry(e["args"]["seq"].as_u64().unwrap())
                    .or_default()
                    .push(rank);
            }
            "step" => finishes[rank as usize] += 1,
            "bucket" if name == "collectives (communication thread)" => {
                lane_buckets[rank as usize] += 1;
            }
            _ => {}
        }
    }
    let seqs: Vec<u64> = world.keys().copied().collect();
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>());
    assert!(world.values().all(|ranks| ranks == &[0, 1, 2]));
    assert_eq!(finishes, [steps; 3]);
    assert!(lane_buckets.iter().all(|&n| n >= steps));
    let picture = file.with_extension("png");
    if Path::new("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf").is_file() {
        let bytes = std::fs::read(&picture).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        assert_eq!(summary["timeline"]["picture"], picture.to_str().unwrap());
    } else {
        println!("SKIP the timeline's picture: no DejaVu Sans to draw text with");
    }
}
