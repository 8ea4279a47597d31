//! The character-level transformer on the text of Debian's `fortunes`
//! package (`cargo xtask test` installs it): DiLoCo keeps synchronous
//! training's test loss while sending a twentieth of its bytes.

use serde_json::Value;

/// Where `fortunes` puts its text, and what to do without it.
const CORPUS: &str = "/usr/share/games/fortunes";

/// `gradwire compare --json` with `args`: the runs.
fn compare(args: &[&str]) -> Vec<Value> {
    assert!(
        std::path::Path::new(CORPUS).is_dir(),
        "no corpus at {CORPUS}: install Debian's fortunes package (cargo xtask test does)"
    );
    let plots = tempfile::tempdir().expect("a directory for the plots");
    let out = crate::gradwire_command()
        .args(["compare", "--json", "--corpus", CORPUS, "--out"])
        .arg(plots.path())
        .args(args)
        .output()
        .expect("run gradwire");
    assert!(
        out.status.success(),
        "gradwire failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .map(|l| serde_json::from_str::<Value>(l).expect("a JSON line"))
        .expect("a line");
    first["runs"].as_array().expect("runs").clone()
}

/// Per epoch, a run's field `key`.
fn series(run: &Value, key: &str) -> Vec<f64> {
    run["epochs"]
        .as_array()
        .expect("epochs")
        .iter()
        .map(|e| e[key].as_f64().expect(key))
        .collect()
}

/// DiLoCo with H = 20 (dense pseudo-gradients, the paper's outer Nesterov)
/// ends within 2 % of synchronous AdamW's test loss after the same 480
/// inner steps (24 rounds; the epochs end on round boundaries, so both
/// evaluate a model every rank holds), sending at most a fifteenth of its
/// bytes; both learn (the loss falls well below the uniform guess's
/// ln 98 = 4.58 nats). Measured with seeds 7, 11 and 13: DiLoCo 1.05 %,
/// 0.63 % and 1.08 % above (a one-block model, so that 480 steps bring
/// both close to what it can learn; on a larger one that far from
/// converged, where the run-to-run spread of the synchronous loss alone is
/// 4 %, the comparison would measure the seed). At 640 steps the gaps were
/// 1.1 to 1.3 %, at 320 steps 1.4 to 1.7 %: 480 is the cheapest run with a
/// margin.
#[test]
fn diloco_keeps_synchronous_training_s_loss_on_the_transformer() {
    let runs = compare(&[
        "--model",
        "gpt",
        "--layers",
        "1",
        "--width",
        "32",
        "--heads",
        "2",
        "--context",
        "32",
        "--epoch-windows",
        "1920",
        "-w",
        "2",
        "--optimizer",
        "adamw",
        "--lr",
        "0.003",
        "--epochs",
        "8",
        "--strategies",
        "dense,diloco:20",
    ]);
    let (dense, diloco) = (&runs[0], &runs[1]);
    assert_eq!(diloco["label"], "diloco 20");
    for run in [dense, diloco] {
        let loss = series(run, "test_loss");
        assert_eq!(loss.len(), 8);
        assert!(loss[0] < 4.0, "{}: {loss:?}", run["label"]);
        assert!(loss[7] < loss[0] - 0.2, "{}: {loss:?}", run["label"]);
        let steps: f64 = series(run, "steps").iter().sum();
        assert_eq!(steps, 480.0);
    }
    let final_loss = |run: &Value| *series(run, "test_loss").last().unwrap();
    println!(
        "test loss: dense {}, diloco {}",
        final_loss(dense),
        final_loss(diloco)
    );
    assert!(
        final_loss(diloco) <= final_loss(dense) * 1.02,
        "DiLoCo {}, dense {}",
        final_loss(diloco),
        final_loss(dense)
    );
    let sent = |run: &Value| *series(run, "bytes_total").last().unwrap();
    assert!(sent(diloco) * 15.0 <= sent(dense));
}
