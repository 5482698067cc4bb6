//! `hotcold inspect` on the real models (text and JSON) and on broken files (a clear error and a
//! non-zero exit, never a panic).

mod common;

use std::path::PathBuf;

use common::{hotcold, model};
use hotcold_core::models::DefaultModel;

fn reference_table(m: DefaultModel) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/gguf")
        .join(m.file_name().replace(".gguf", ".tensors.tsv"));
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn json_lists_every_tensor_as_the_gguf_package_does() {
    for m in DefaultModel::ALL {
        let out = hotcold(&["inspect", &model(m), "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["format"], "GGUF");
        assert!(v["metadata"]["general.architecture"]["value"].is_string());
        let ours: Vec<String> = v["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let shape: Vec<String> = t["shape"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.to_string())
                    .collect();
                format!(
                    "{}\t{}\t{}\t{}\t{}",
                    t["name"].as_str().unwrap(),
                    t["type"].as_str().unwrap(),
                    shape.join("x"),
                    t["bytes"],
                    t["offset"]
                )
            })
            .collect();
        let reference = reference_table(m);
        let theirs: Vec<&str> = reference.lines().collect();
        assert_eq!(ours, theirs, "{}", m.name());
    }
}

#[test]
fn text_shows_format_hyperparameters_tokenizer_and_tensors() {
    let out = hotcold(&["inspect", &model(DefaultModel::Gemma3_270m)]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "GGUF v3",
        "architecture:  gemma3",
        "block_count",
        "262144 tokens",
        "bos id:        2",
        "chat template: no",
        "blk.17.ffn_down.weight",
        "Q6_K",
        "totals per type",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    let out = hotcold(&["inspect", &model(DefaultModel::Qwen25Coder05bInstruct)]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("pre-tokenizer: qwen2") && text.contains("merges:        151387"));
    assert!(text.contains("chat template: yes"));
}

#[test]
fn broken_files_fail_cleanly() {
    let dir = std::env::temp_dir().join(format!("hotcold-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let real = std::fs::read(model(DefaultModel::Gemma3_270m)).unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty", vec![], "truncated"),
        ("magic", b"ABCD\x03\0\0\0".to_vec(), "not a GGUF file"),
        ("header", real[..5_000_000].to_vec(), "truncated"),
        ("data", real[..200_000_000].to_vec(), "data of tensor"),
    ];
    for (name, bytes, expected) in cases {
        let path = dir.join(format!("{name}.gguf"));
        std::fs::write(&path, bytes).unwrap();
        let out = hotcold(&["inspect", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {stderr}");
        assert!(stderr.contains(expected), "{name}: {stderr}");
        assert!(!stderr.contains("panicked"), "{name}: {stderr}");
    }
    let out = hotcold(&["inspect", dir.join("missing.gguf").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    std::fs::remove_dir_all(&dir).ok();
}
