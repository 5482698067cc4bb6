//! Training-free sparsity (TEAL) on the default dense model: `calibrate --target-sparsity
//! --sparsity-mode teal` picks per-layer, per-matrix thresholds, and on held-out text
//! `--ffn sparse` skips close to the target share of the block weights (by TEAL's magnitudes or
//! WINA's weighted scores); bad flags and files
//! without thresholds are refused with clear messages.

mod common;

use common::{hotcold, model, HeldOut};
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

/// WINA's criterion (`--teal-criterion wina`): its thresholds are on `|x_i| · ‖W[:, i]‖₂`, far
/// from the magnitudes, so held-out sparsity near the target shows the file's criterion was read
/// and applied.
#[test]
fn wina_thresholds_meet_the_target_on_held_out_text() {
    let target = 0.4;
    let flags = ["--sparsity-mode", "teal", "--teal-criterion", "wina"];
    let files = HeldOut::calibrate("teal-wina", target, &flags);
    let sparsity = model_sparsity(&files.perplexity(&["--ffn", "sparse"]));
    assert!(
        (sparsity - target).abs() <= SPARSITY_TOLERANCE,
        "held-out sparsity {sparsity} for target {target}"
    );
}

#[test]
fn calibrated_thresholds_meet_the_target_on_held_out_text() {
    // Calibrate on the Declaration, measure on the Gettysburg Address that follows it.
    let target = 0.4;
    let files = HeldOut::calibrate("teal", target, &["--sparsity-mode", "teal"]);
    let sparsity = model_sparsity(&files.perplexity(&["--ffn", "sparse"]));
    assert!(
        (sparsity - target).abs() <= SPARSITY_TOLERANCE,
        "held-out sparsity {sparsity} for target {target}"
    );
    let gemma = model(DefaultModel::Gemma3_270m);
    let (cal, out) = (files.calibration.as_str(), files.calibrated.as_str());

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
}
