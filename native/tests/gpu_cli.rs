//! `--device` and `--vram-budget` end to end: the same greedy text on the GPU (any adapter;
//! lavapipe in CI) as on the CPU, on the default model (its last layers on the GPU as a segment,
//! or the whole model resident) and on a `synth` sparse model (hot neurons split, or resident in `--ffn sparse` and
//! `dense`), and clear errors for bad values; `--vram-budget` takes its hot neurons from
//! PowerInfer's side file `<model>.generated.gpuidx` when one fits the budget.

mod common;

use common::{hotcold, model};
use hotcold_core::gguf::GgufFile;
use hotcold_core::models::DefaultModel;
use hotcold_core::placement::gpuidx::GpuIndex;

fn greedy(model: &str, extra: &[&str]) -> String {
    greedy_with_stderr(model, extra).0
}

/// [`greedy`]'s text and stderr.
fn greedy_with_stderr(model: &str, extra: &[&str]) -> (String, String) {
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
        let placed: &[&str] = if extra.contains(&"--vram-budget") {
            // hot neurons, or a dense model's last layers (a segment)
            &[
                "of FFN weights on the GPU",
                "the residual crosses the bus once",
            ]
        } else {
            &["the whole model on the GPU"]
        };
        assert!(placed.iter().any(|p| stderr.contains(p)), "{stderr}");
    }
    (String::from_utf8(out.stdout).unwrap(), stderr.into_owned())
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

#[test]
fn a_gpuidx_side_file_gives_the_hot_set() {
    let dir = std::env::temp_dir().join(format!("hotcold-gpuidx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let synth = dir.join("tiny.gguf");
    let m = synth.to_str().unwrap();
    assert!(hotcold(&["synth", "--preset", "tiny", "-o", m])
        .status
        .success());
    let cpu = greedy(m, &["--device", "cpu"]);
    // The planner's split for 64 KiB, written where PowerInfer looks for it.
    let out = hotcold(&["plan", "-m", m, "--vram-budget", "64KiB", "--write-gpuidx"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let side = GpuIndex::side_file_path(&synth);
    let index = GpuIndex::read(&GgufFile::open(&side).unwrap()).unwrap();
    let hot: usize = index.hot.iter().map(Vec::len).sum();
    let all: usize = index.n_neurons.iter().sum();
    assert!(0 < hot && hot < all, "{hot} of {all}");
    // A budget that holds the whole FFN: the file's neurons, not all of them.
    let (text, stderr) = greedy_with_stderr(m, &["--device", "gpu", "--vram-budget", "100%"]);
    let used = format!("{hot} of {all} neurons; hot set from {}", side.display());
    assert!(stderr.contains(&used), "{stderr}");
    assert_eq!(text, cpu);
    // A budget the file's neurons do not fit: a warning, and the planner's set.
    let (text, stderr) = greedy_with_stderr(m, &["--device", "gpu", "--vram-budget", "16KiB"]);
    assert!(
        stderr.contains("not used (its hot neurons take") && !stderr.contains("hot set from"),
        "{stderr}"
    );
    assert_eq!(text, cpu);
    // A broken side file: a warning naming the problem, and the planner's set.
    std::fs::write(&side, b"not a gguf").unwrap();
    let (text, stderr) = greedy_with_stderr(m, &["--device", "gpu", "--vram-budget", "50%"]);
    assert!(
        stderr.contains("warning:") && stderr.contains("not used"),
        "{stderr}"
    );
    assert_eq!(text, cpu);
    std::fs::remove_dir_all(&dir).ok();
}

/// A dense model under a partial budget: `run` says which layers went to the GPU and `plan`
/// shows the same segment with its bytes (weights, KV cache, working vectors).
#[test]
fn dense_budgets_place_the_last_layers() {
    let gemma = model(DefaultModel::Gemma3_270m);
    let (_, stderr) = greedy_with_stderr(
        &gemma,
        &["--device", "gpu", "--vram-budget", "50MiB", "-c", "4096"],
    );
    assert!(
        stderr.contains("layers 12..18 of 18 on the GPU"),
        "{stderr}"
    );
    let out = hotcold(&["plan", "-m", &gemma, "--vram-budget", "50MiB", "-c", "4096"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        stdout.contains("layers 12..18 (6 of 18) on the GPU"),
        "{stdout}"
    );
    assert!(stdout.contains("dense GPU bytes:"), "{stdout}");
}
