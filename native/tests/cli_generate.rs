//! `hotcold run` and `hotcold perplexity` end to end: greedy text as llama.cpp writes it,
//! perplexity within 1% of `llama-perplexity`, and clear errors for bad input.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{hotcold, model};
use hotcold_core::gguf::{GgufWriter, Magic, MetaValue};
use hotcold_core::models::DefaultModel;

fn repo_file(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(relative)
}

#[test]
fn greedy_run_streams_llama_cpp_text() {
    let out = hotcold(&[
        "run",
        "-m",
        &model(DefaultModel::Gemma3_270m),
        "-p",
        "Water boils at",
        "-n",
        "12",
        "--temp",
        "0",
        "-t",
        "2",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    // llama.cpp's greedy continuation (tests/data/llama_cpp/gemma-3-270m.jsonl).
    assert!(
        text.starts_with("Water boils at 100 degrees Celsius.\n\nWater boils at"),
        "{text:?}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("decode 12 tokens") && stderr.contains("tok/s"),
        "{stderr}"
    );
}

#[test]
fn perplexity_agrees_with_llama_cpp_within_one_percent() {
    let reference: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo_file("tests/data/llama_cpp/perplexity.json")).unwrap(),
    )
    .unwrap();
    let text = repo_file("tests/data/text/declaration.txt");
    for m in DefaultModel::ALL {
        let out = hotcold(&[
            "perplexity",
            "-m",
            &model(m),
            "-f",
            text.to_str().unwrap(),
            "-c",
            "256",
            "-t",
            "2",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8(out.stdout).unwrap();
        let ours: f64 = stdout
            .trim()
            .strip_prefix("PPL = ")
            .unwrap()
            .parse()
            .unwrap();
        let theirs = reference["ppl"][m.file_name()].as_f64().unwrap();
        let rel = (ours - theirs).abs() / theirs;
        assert!(
            rel < 0.01,
            "{}: PPL {ours} vs llama.cpp {theirs} ({:.2}%)",
            m.name(),
            rel * 100.0
        );
    }
}

#[test]
fn prompt_longer_than_the_context_is_a_clear_error() {
    let long = "word ".repeat(300);
    let out = hotcold(&[
        "run",
        "-m",
        &model(DefaultModel::Gemma3_270m),
        "-p",
        &long,
        "-c",
        "64",
        "-n",
        "4",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("more than the context of 64"), "{stderr}");
}

#[test]
fn unknown_architecture_is_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("hotcold-arch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mamba.gguf");
    let mut w = GgufWriter::new(Magic::Gguf);
    w.set("general.architecture", MetaValue::String("mamba".into()));
    w.write_file(&path).unwrap();
    let out = hotcold(&["run", "-m", path.to_str().unwrap(), "-p", "hi"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("unsupported architecture \"mamba\"") && stderr.contains("gemma3"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn chat_holds_a_conversation_and_reuses_the_cache() {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_hotcold"))
        .args([
            "chat",
            "-m",
            &model(DefaultModel::Qwen25Coder05bInstruct),
            "--temp",
            "0",
            "-n",
            "120",
            "-t",
            "2",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"Write a Python function that returns the square of a number.\nNow make it cube instead.\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let (first, second) = text
        .split_once("\n> ")
        .and_then(|(_, rest)| rest.split_once("\n> "))
        .unwrap();
    assert!(first.contains("def ") && first.contains("** 2"), "{first}");
    assert!(
        second.contains("** 3"),
        "the second turn must see the first: {second}"
    );
    // The second turn evaluates only what the first did not leave in the cache.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let prompt_counts: Vec<usize> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix('[')?.split(' ').next()?.parse().ok())
        .collect();
    assert_eq!(prompt_counts.len(), 2, "{stderr}");
    assert!(
        prompt_counts[1] < 30,
        "second turn re-evaluated {} tokens",
        prompt_counts[1]
    );
}
