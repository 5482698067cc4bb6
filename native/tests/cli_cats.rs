//! Training-free sparsity (CATS) on the default dense model: `calibrate --target-sparsity` picks
//! per-layer thresholds, and on held-out text `--ffn cats` skips close to the target share of the
//! FFN neurons.

mod common;

use std::path::PathBuf;

use common::{hotcold, model};
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
    let dir = std::env::temp_dir().join(format!("hotcold-cats-{}", std::process::id()));
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
        dir.join("cats.gguf"),
    );
    std::fs::write(&cal_path, calibration).unwrap();
    std::fs::write(&held_path, held_out).unwrap();
    let gemma = model(DefaultModel::Gemma3_270m);
    let target = 0.4;
    let o = hotcold(&[
        "calibrate",
        "-m",
        &gemma,
        "-f",
        cal_path.to_str().unwrap(),
        "--target-sparsity",
        "0.4",
        "-o",
        out.to_str().unwrap(),
        "-t",
        "2",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = hotcold(&[
        "perplexity",
        "-m",
        out.to_str().unwrap(),
        "-f",
        held_path.to_str().unwrap(),
        "-c",
        "128",
        "--ffn",
        "cats",
        "--sparse-prefill",
        "-t",
        "2",
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    let density = mean_density(&stderr);
    assert!(
        (density - (1.0 - target)).abs() <= DENSITY_TOLERANCE,
        "held-out density {density} for target sparsity {target}"
    );
    // Without thresholds the mode is refused with a clear message.
    let o = hotcold(&["run", "-m", &gemma, "--ffn", "cats", "-n", "2"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--target-sparsity"));
    std::fs::remove_dir_all(&dir).ok();
}
