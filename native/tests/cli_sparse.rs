//! `hotcold synth`, `hotcold calibrate` and `--ffn` end to end on a tiny synthetic ReLU model.

mod common;

use std::path::PathBuf;

use common::hotcold;
use hotcold_core::gguf::{GgufFile, Magic};

fn text() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/text/declaration.txt")
}

#[test]
fn synth_calibrate_and_run_sparse() {
    let dir = std::env::temp_dir().join(format!("hotcold-sparse-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("tiny.gguf");
    let calibrated = dir.join("tiny-calibrated.gguf");
    let out = hotcold(&[
        "synth",
        "--preset",
        "tiny",
        "--type",
        "q8_0",
        "--seed",
        "7",
        "-o",
        model.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = GgufFile::open(&model).unwrap();
    assert_eq!(file.magic(), Magic::PowerInfer);
    assert!(
        file.tensor("blk.0.fc1.weight").is_some()
            && file.tensor("blk.0.ffn_down_t.weight").is_some()
    );
    assert!(
        file.tensor("blk.0.ffn_down.weight").is_none(),
        "PowerInfer's sparse loader rejects ffn_down"
    );
    assert!(
        std::fs::metadata(&model).unwrap().len() < 2 << 20,
        "tiny is under 2 MB"
    );

    let out = hotcold(&[
        "calibrate",
        "-m",
        model.to_str().unwrap(),
        "-f",
        text().to_str().unwrap(),
        "-o",
        calibrated.to_str().unwrap(),
        "-c",
        "256",
        "-t",
        "2",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // `mean recall R precision P density D`
    let fields: Vec<&str> = stdout
        .trim()
        .lines()
        .last()
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        (fields[0], fields[1], fields[3], fields[5]),
        ("mean", "recall", "precision", "density"),
        "{stdout}"
    );
    let (recall, density): (f64, f64) = (fields[2].parse().unwrap(), fields[6].parse().unwrap());
    assert!(recall >= 0.97, "held-out recall {recall}");
    assert!(
        density < 0.3,
        "predicted density {density} (synth's target is 0.1)"
    );
    let file = GgufFile::open(&calibrated).unwrap();
    assert_eq!(file.magic(), Magic::PowerInfer);
    assert!(file.get("hotcold.activation_frequency.0").is_some());
    assert!(file.get("hotcold.predictor.thresholds").is_some());

    for ffn in ["dense", "oracle", "sparse"] {
        let out = hotcold(&[
            "run",
            "-m",
            calibrated.to_str().unwrap(),
            "-p",
            "We hold these truths",
            "-n",
            "8",
            "--temp",
            "0",
            "--ffn",
            ffn,
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{ffn}: {stderr}");
        assert!(stderr.contains("mean density"), "{ffn}: {stderr}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bench_at_depth_labels_its_tests_and_refuses_past_the_context_or_no_test() {
    let dir = std::env::temp_dir().join(format!("hotcold-bench-depth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("tiny.gguf");
    let model = model.to_str().unwrap();
    let out = hotcold(&["synth", "--preset", "tiny", "--seed", "3", "-o", model]);
    assert!(out.status.success());
    let bench = |depth: &str| {
        hotcold(&[
            "bench", "-m", model, "-t", "1", "-p", "8", "-n", "4", "-d", depth, "-r", "1",
        ])
    };
    let out = bench("24");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("| pp8 @ d24 |") && stdout.contains("| tg4 @ d24 |"),
        "{stdout}"
    );
    let ctx = GgufFile::open(dir.join("tiny.gguf"))
        .unwrap()
        .get_u64("llama.context_length")
        .unwrap()
        .unwrap() as usize;
    let out = bench(&(ctx - 7).to_string());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "past the context");
    assert!(stderr.contains("exceed the model's context"), "{stderr}");
    let out = hotcold(&["bench", "-m", model, "-p", "0", "-n", "0"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "no test to run");
    assert!(
        stderr.contains("no test to run") && !stderr.contains("panicked"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
