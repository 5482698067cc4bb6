//! Training-free sparsity (TEAL) on the default dense model: `calibrate --target-sparsity
//! --sparsity-mode teal` picks per-layer, per-matrix thresholds, and on held-out text
//! `--ffn sparse` skips close to the target share of the block weights; bad flags and files
//! without thresholds are refused with clear messages.

mod common;

use std::path::PathBuf;

use common::{hotcold, model};
use hotcold_core::models::DefaultModel;

/// How far the held-out sparsity may fall from the target (the bound: 5 points).
const SPARSITY_TOLERANCE: f64 = 0.05;

fn model_sparsity(stderr: &str) -> f64 {
    let line = stderr
        .lines()
        .find(|l| l.contains("teal: model sparsity"))
        .unwrap_or_else(|| panic!("{stderr}"));
    line.split("model sparsity ").nth(1).unwrap()[..5]
        .parse()
        .unwrap()
}

#[test]
fn calibrated_thresholds_meet_the_target_on_held_out_text() {
    let dir = std::env::temp_dir().join(format!("hotcold-teal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/text/declaration.txt"),
    )
    .unwrap();
    // Calibrate on the Declaration, measure on the Gettysburg Address that follows it.
    let (calibration, held_out) = text.split_at(text.find("Four score").unwrap());
    let (cal_path, held_path, out) = (
        dir.join("cal.txt"),
        dir.join("held.txt"),
        dir.join("teal.gguf"),
    );
    std::fs::write(&cal_path, calibration).unwrap();
    std::fs::write(&held_path, held_out).unwrap();
    let gemma = model(DefaultModel::Gemma3_270m);
    let (cal, held, out) = (
        cal_path.to_str().unwrap(),
        held_path.to_str().unwrap(),
        out.to_str().unwrap(),
    );
    let target = 0.4;
    let o = hotcold(&[
        "calibrate",
        "-m",
        &gemma,
        "-f",
        cal,
        "--target-sparsity",
        "0.4",
        "--sparsity-mode",
        "teal",
        "-o",
        out,
        "-t",
        "2",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = hotcold(&[
        "perplexity",
        "-m",
        out,
        "-f",
        held,
        "-c",
        "128",
        "--ffn",
        "sparse",
        "--sparse-prefill",
        "-t",
        "2",
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    let sparsity = model_sparsity(&stderr);
    assert!(
        (sparsity - target).abs() <= SPARSITY_TOLERANCE,
        "held-out sparsity {sparsity} for target {target}"
    );

    // Clear errors: target out of range, unknown mode, TEAL on a file without its thresholds.
    let fails_with = |args: &[&str], needle: &str| {
        let o = hotcold(args);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    };
    fails_with(
        &[
            "calibrate",
            "-m",
            &gemma,
            "-f",
            cal,
            "--target-sparsity",
            "1.5",
            "--sparsity-mode",
            "teal",
            "-o",
            out,
        ],
        "--target-sparsity must be in [0, 1)",
    );
    fails_with(
        &[
            "run",
            "-m",
            out,
            "--ffn",
            "sparse",
            "--sparsity-mode",
            "dense",
        ],
        "invalid value 'dense'",
    );
    fails_with(
        &[
            "run",
            "-m",
            &gemma,
            "--ffn",
            "sparse",
            "--sparsity-mode",
            "teal",
            "-n",
            "2",
        ],
        "hotcold.teal.thresholds",
    );
    fails_with(
        &["run", "-m", &gemma, "--ffn", "sparse", "-n", "2"],
        "--target-sparsity",
    );
    std::fs::remove_dir_all(&dir).ok();
}
