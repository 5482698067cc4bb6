//! `hotcold plan` on a `synth --preset tiny` model (its own statistics: synth's targets).

mod common;

use std::path::{Path, PathBuf};

use common::hotcold;
use hotcold_core::gguf::GgufFile;
use hotcold_core::placement::gpuidx::GpuIndex;

fn tiny(dir: &Path) -> PathBuf {
    let path = dir.join("tiny.gguf");
    let out = hotcold(&["synth", "--preset", "tiny", "-o", path.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hotcold-cli-plan-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `plan`, expecting success; returns stdout.
fn plan(args: &[&str]) -> String {
    let out = hotcold(&[&["plan"], args].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The number after `prefix` on the line that starts with it.
fn number_after(text: &str, prefix: &str) -> f64 {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no line {prefix:?} in\n{text}"));
    line.split_whitespace().next().unwrap().parse().unwrap()
}

/// Per layer: (hot, neurons, GPU share).
fn layers(text: &str) -> Vec<(usize, usize, f64)> {
    text.lines()
        .filter(|l| l.starts_with("layer "))
        .map(|l| {
            let hot = l.split("hot ").nth(1).unwrap().split(' ').next().unwrap();
            let (h, n) = hot.split_once('/').unwrap();
            let share = l
                .split("activations ")
                .nth(1)
                .unwrap()
                .split(',')
                .next()
                .unwrap();
            (
                h.parse().unwrap(),
                n.parse().unwrap(),
                share.parse().unwrap(),
            )
        })
        .collect()
}

#[test]
fn plans_budgets_from_zero_to_everything() {
    let dir = tempdir("budgets");
    let model = tiny(&dir);
    let m = model.to_str().unwrap();
    let weights = {
        let f = GgufFile::open(&model).unwrap();
        f.tensors().iter().map(|t| t.n_bytes).sum::<u64>()
    };

    let none = plan(&["-m", m, "--vram-budget", "0"]);
    assert!(none.contains("statistics: synth's targets"), "{none}");
    assert_eq!(number_after(&none, "on GPU: "), 0.0);
    assert!(layers(&none)
        .iter()
        .all(|&(h, n, s)| h == 0 && n == 512 && s == 0.0));
    assert!(none.contains("predicted decode: "));

    let all = plan(&["-m", m, "--vram-budget", "1GiB"]);
    assert_eq!(number_after(&all, "on GPU: "), weights as f64, "{all}");
    assert!(layers(&all).iter().all(|&(h, n, s)| h == n && s == 1.0));

    // 900 KiB holds the dense tensors and part of the FFN: the hot neurons serve more than their share of firings
    let some = plan(&["-m", m, "--vram-budget", "900KiB"]);
    let on_gpu = number_after(&some, "on GPU: ");
    assert!(on_gpu > 0.0 && on_gpu <= 900.0 * 1024.0, "{some}");
    let layers = layers(&some);
    assert_eq!(layers.len(), 2);
    for &(h, n, s) in &layers {
        assert!(h < n && s > h as f64 / n as f64, "{some}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn writes_powerinfer_gpu_index() {
    let dir = tempdir("gpuidx");
    let model = tiny(&dir);
    let m = model.to_str().unwrap();
    let out = plan(&["-m", m, "--vram-budget", "300KiB", "--write-gpuidx"]);
    let side = GpuIndex::side_file_path(&model);
    assert!(out.contains(&format!("wrote {}", side.display())), "{out}");
    let index = GpuIndex::read(&GgufFile::open(&side).unwrap()).unwrap();
    assert_eq!(index.vram_capacity, 300 * 1024);
    assert_eq!(index.n_neurons, vec![512, 512]);
    let printed: Vec<usize> = layers(&out).iter().map(|l| l.0).collect();
    assert_eq!(index.hot.iter().map(Vec::len).collect::<Vec<_>>(), printed);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_sizes_and_missing_statistics_fail_clearly() {
    let dir = tempdir("bad");
    let model = tiny(&dir);
    let m = model.to_str().unwrap();
    for (size, why) in [
        ("12XB", "unknown unit"),
        ("12", "missing unit"),
        ("-3GiB", "negative"),
        ("lots", "expected a number"),
    ] {
        let out = hotcold(&["plan", "-m", m, "--vram-budget", size]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "{size}: {err}");
    }
    let out = hotcold(&["plan", "-m", m]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--vram-budget"));
    // --stats with a file that is not a model
    let junk = dir.join("junk.gguf");
    std::fs::write(&junk, b"not a gguf file at all").unwrap();
    let out = hotcold(&[
        "plan",
        "-m",
        m,
        "--vram-budget",
        "1MiB",
        "--stats",
        junk.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("junk.gguf"));
    let out = hotcold(&[
        "plan",
        "-m",
        m,
        "--vram-budget",
        "1MiB",
        "--cpu-bandwidth",
        "0",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("CPU bandwidth"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn known_setups_print_predictions_next_to_published_figures() {
    let out = plan(&["--known-setups"]);
    assert!(out.contains("Falcon(ReLU)-40B F16"), "{out}");
    assert!(out.contains("up to 11x"));
    assert!(out.contains("LLaMA(ReLU)-2-70B F16"));
    let falcon = out
        .lines()
        .find(|l| l.starts_with("Falcon(ReLU)-40B F16"))
        .unwrap();
    let speedup: f64 = falcon
        .split_whitespace()
        .find_map(|w| w.strip_suffix('x').and_then(|v| v.parse().ok()))
        .unwrap();
    assert!(speedup > 1.0, "{falcon}");
}

/// Calibrated statistics (`--stats`) pick nearly the same hot neurons as synth's targets.
#[test]
fn calibrated_statistics_agree_with_synth_targets() {
    let dir = tempdir("stats");
    let model = tiny(&dir);
    let m = model.to_str().unwrap();
    let calibrated = dir.join("cal.gguf");
    let text = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/text/declaration.txt");
    let out = hotcold(&[
        "calibrate",
        "-m",
        m,
        "-f",
        text.to_str().unwrap(),
        "-o",
        calibrated.to_str().unwrap(),
        "-c",
        "256",
        "--epochs",
        "1",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (by_synth, by_cal) = (dir.join("synth.gpuidx"), dir.join("cal.gpuidx"));
    let synth_out = plan(&[
        "-m",
        m,
        "--vram-budget",
        "900KiB",
        "--write-gpuidx",
        by_synth.to_str().unwrap(),
    ]);
    let cal_out = plan(&[
        "-m",
        m,
        "--vram-budget",
        "900KiB",
        "--stats",
        calibrated.to_str().unwrap(),
        "--write-gpuidx",
        by_cal.to_str().unwrap(),
    ]);
    assert!(
        cal_out.contains("statistics: measured by calibrate"),
        "{cal_out}"
    );
    assert!(synth_out.contains("statistics: synth's targets"));
    let read = |p: &Path| GpuIndex::read(&GgufFile::open(p).unwrap()).unwrap();
    let (a, b) = (read(&by_synth), read(&by_cal));
    for (il, (x, y)) in a.hot.iter().zip(&b.hot).enumerate() {
        let common = x.iter().filter(|i| y.binary_search(i).is_ok()).count();
        let overlap = common as f64 / x.len().max(y.len()).max(1) as f64;
        assert!(overlap > 0.7, "layer {il}: hot sets overlap {overlap:.2}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A dense model (the default Gemma 3 270M: GeGLU, tied embeddings) plans with every neuron
/// firing every token: the GPU share of a layer is its share of neurons.
#[test]
fn dense_default_model_plans_whole_neuron_shares() {
    let m = common::model(hotcold_core::models::DefaultModel::Gemma3_270m);
    let out = plan(&["-m", &m, "--vram-budget", "200MiB"]);
    assert!(out.contains("statistics: dense FFN"), "{out}");
    for (h, n, s) in layers(&out) {
        assert!((s - h as f64 / n as f64).abs() < 1e-3, "{out}");
    }
    // The tied embedding (170 MiB of the 235) is the LM head, read whole every token: it beats
    // the 65 MiB of everything else, which then only partly fits.
    let globals = out.lines().find(|l| l.starts_with("on GPU: ")).unwrap();
    assert!(globals.contains("token_embd.weight"), "{out}");
    assert!(layers(&out).iter().any(|&(h, n, _)| h < n), "{out}");
}
