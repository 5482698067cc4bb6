//! Training-free sparsity (CATS) on the default dense model: `calibrate --target-sparsity` picks
//! per-layer thresholds, and on held-out text `--ffn cats` skips close to the target share of the
//! FFN neurons.

mod common;

use common::{hotcold, model, HeldOut};
use hotcold_core::models::DefaultModel;

/// How far the held-out density may fall from `1 - target` (the bound: 5 points).
const DENSITY_TOLERANCE: f64 = 0.05;

fn mean_density(stderr: &str) -> f64 {
    let line = stderr
        .lines()
        .find(|l| l.contains("mean density"))
        .unwrap_or_else(|| panic!("{stderr}"));
    line.split("mean density ")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn calibrated_thresholds_meet_the_target_on_held_out_text() {
    // Calibrate on the Declaration, measure on the Gettysburg Address that follows it.
    let target = 0.4;
    let files = HeldOut::calibrate("cats", target, &[]);
    let density = mean_density(&files.perplexity(&["--ffn", "cats"]));
    assert!(
        (density - (1.0 - target)).abs() <= DENSITY_TOLERANCE,
        "held-out density {density} for target sparsity {target}"
    );
    // Without thresholds the mode is refused with a clear message.
    let gemma = model(DefaultModel::Gemma3_270m);
    let o = hotcold(&["run", "-m", &gemma, "--ffn", "cats", "-n", "2"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--target-sparsity"));
}
