//! `--device` and `--vram-budget` end to end: the same greedy text on the GPU (any adapter;
//! lavapipe in CI) as on the CPU, on the default model (whole layers offloaded, or the whole model
//! resident) and on a `synth` sparse model (hot neurons split, or resident in `--ffn sparse` and
//! `dense`), and clear errors for bad values.

mod common;

use common::{hotcold, model};
use hotcold_core::models::DefaultModel;

fn greedy(model: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "run",
        "-m",
        model,
        "-p",
        "Water boils at",
        "-n",
        "8",
        "--temp",
        "0",
        "-t",
        "2",
    ];
    args.extend_from_slice(extra);
    let out = hotcold(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    if extra.contains(&"gpu") {
        let placed = if extra.contains(&"--vram-budget") {
            "of FFN weights on the GPU"
        } else {
            "the whole model on the GPU"
        };
        assert!(stderr.contains(placed), "{stderr}");
    }
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn gpu_runs_write_the_cpu_text() {
    let dir = std::env::temp_dir().join(format!("hotcold-gpu-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let synth = dir.join("tiny.gguf");
    let out = hotcold(&["synth", "--preset", "tiny", "-o", synth.to_str().unwrap()]);
    assert!(out.status.success());
    let gemma = model(DefaultModel::Gemma3_270m);
    for m in [gemma.as_str(), synth.to_str().unwrap()] {
        let cpu = greedy(m, &["--device", "cpu"]);
        assert!(cpu.len() > "Water boils at".len());
        for budget in ["30%", "100%"] {
            assert_eq!(
                greedy(m, &["--device", "gpu", "--vram-budget", budget]),
                cpu
            );
        }
        assert_eq!(greedy(m, &["--device", "gpu"]), cpu);
    }
    // The resident pass in both FFN modes of the sparse file.
    let synth = synth.to_str().unwrap();
    for ffn in ["sparse", "dense"] {
        let cpu = greedy(synth, &["--device", "cpu", "--ffn", ffn]);
        assert_eq!(greedy(synth, &["--device", "gpu", "--ffn", ffn]), cpu);
    }
    // What the resident pass does not run falls back to the hybrid FFN, with the reason.
    let out = hotcold(&[
        "run", "-m", synth, "-p", "x", "-n", "2", "--device", "gpu", "--ffn", "oracle",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("does not run --ffn oracle") && stderr.contains("hybrid instead"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_budgets_are_clear_errors() {
    let gemma = model(DefaultModel::Gemma3_270m);
    for (flags, message) in [
        (&["--vram-budget", "12XB"][..], "unknown unit"),
        (&["--vram-budget", "150%"][..], "between 0% and 100%"),
        (
            &["--device", "cpu", "--vram-budget", "1GiB"][..],
            "needs --device gpu",
        ),
    ] {
        let mut args = vec!["run", "-m", gemma.as_str(), "-p", "x", "-n", "1"];
        args.extend_from_slice(flags);
        let out = hotcold(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(message),
            "{stderr}"
        );
    }
}
