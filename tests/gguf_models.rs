//! The GGUF reader on the two real default models: the facts the issue lists, the tensor table
//! as the `gguf` Python package reports it, and a byte-exact read → write round trip.

mod common;

use common::{data_path, model_path};
use hotcold::gguf::{GgufFile, GgufWriter, Magic};
use hotcold::models::DefaultModel;
use hotcold::quant::GgmlType;

fn u(file: &GgufFile, key: &str) -> u64 {
    file.require_u64(key).unwrap()
}

#[test]
fn gemma_facts() {
    let file = GgufFile::open(model_path(DefaultModel::Gemma3_270m)).unwrap();
    assert_eq!(file.magic(), Magic::Gguf);
    assert_eq!(file.version(), 3);
    assert_eq!(file.architecture().unwrap(), "gemma3");
    assert_eq!(file.tensors().len(), 236);
    assert_eq!(u(&file, "gemma3.block_count"), 18);
    assert_eq!(u(&file, "gemma3.embedding_length"), 640);
    assert_eq!(u(&file, "gemma3.feed_forward_length"), 2048);
    assert_eq!(u(&file, "gemma3.attention.head_count"), 4);
    assert_eq!(u(&file, "gemma3.attention.head_count_kv"), 1);
    assert_eq!(u(&file, "gemma3.attention.key_length"), 256);
    assert!(
        file.tensor("output.weight").is_none(),
        "the LM head is tied to the embedding"
    );
    assert_eq!(
        file.require_tensor("token_embd.weight").unwrap().ty,
        GgmlType::Q8_0
    );
    assert_eq!(file.require_str("tokenizer.ggml.model").unwrap(), "llama");
    let tokens = file.get_array("tokenizer.ggml.tokens").unwrap().unwrap();
    assert_eq!(tokens.len(), 262_144);
    assert_eq!(u(&file, "tokenizer.ggml.bos_token_id"), 2);
    assert_eq!(u(&file, "tokenizer.ggml.eos_token_id"), 1);
    assert!(file.get("tokenizer.chat_template").is_none());
}

#[test]
fn qwen_facts() {
    let file = GgufFile::open(model_path(DefaultModel::Qwen25Coder05bInstruct)).unwrap();
    assert_eq!(file.architecture().unwrap(), "qwen2");
    assert_eq!(file.tensors().len(), 291);
    assert_eq!(u(&file, "qwen2.block_count"), 24);
    assert_eq!(u(&file, "qwen2.embedding_length"), 896);
    assert_eq!(u(&file, "qwen2.feed_forward_length"), 4864);
    assert_eq!(u(&file, "qwen2.attention.head_count"), 14);
    assert_eq!(u(&file, "qwen2.attention.head_count_kv"), 2);
    assert_eq!(file.require_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(file.require_str("tokenizer.ggml.pre").unwrap(), "qwen2");
    assert_eq!(
        file.get_array("tokenizer.ggml.tokens")
            .unwrap()
            .unwrap()
            .len(),
        151_936
    );
    assert_eq!(
        file.get_array("tokenizer.ggml.merges")
            .unwrap()
            .unwrap()
            .len(),
        151_387
    );
    assert!(file.get_str("tokenizer.chat_template").unwrap().is_some());
}

#[test]
fn tensor_tables_match_the_gguf_package() {
    for model in DefaultModel::ALL {
        let file = GgufFile::open(model_path(model)).unwrap();
        let reference = std::fs::read_to_string(data_path(&format!(
            "gguf/{}",
            model.file_name().replace(".gguf", ".tensors.tsv")
        )))
        .unwrap();
        let ours: Vec<String> = file
            .tensors()
            .iter()
            .map(|t| {
                let shape = t
                    .shape
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join("x");
                format!(
                    "{}\t{}\t{shape}\t{}\t{}",
                    t.name,
                    t.ty.name().to_uppercase(),
                    t.n_bytes,
                    file.data_offset() + t.offset
                )
            })
            .collect();
        let theirs: Vec<&str> = reference.lines().collect();
        assert_eq!(ours, theirs, "{}", model.name());
    }
}

#[test]
fn real_files_round_trip_byte_for_byte() {
    for model in DefaultModel::ALL {
        let path = model_path(model);
        let original = std::fs::read(&path).unwrap();
        let file = GgufFile::open(&path).unwrap();
        let written = GgufWriter::from_file(&file).to_bytes().unwrap();
        assert!(
            written == original,
            "{}: rewritten file differs",
            model.name()
        );
        let reread = GgufFile::from_bytes(written).unwrap();
        assert_eq!(reread.metadata(), file.metadata());
        assert_eq!(reread.tensors(), file.tensors());
    }
}
