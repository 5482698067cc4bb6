//! The tokenizers against llama.cpp: for every case in `tests/data/tokenizer/<model>.json`
//! (written by `tests/reference/make_tokenizer_refs.sh` with llama-tokenize), the ids must be
//! identical, the concatenated pieces must equal llama.cpp's, and `decode(encode(text)) == text`
//! wherever llama.cpp's pieces give the text back. Variants of Qwen's vocabulary with other
//! pre-tokenizers (llama-bpe, gpt-2, default) are built in memory from the real file.

mod common;

use std::path::PathBuf;
use std::time::Instant;

use common::{data_path, model_path};
use hotcold::gguf::{GgufFile, GgufWriter, MetaValue};
use hotcold::models::DefaultModel;
use hotcold::tokenizer::{ChatMessage, ChatTemplate, PreTokenizer, Tokenizer};
use serde::Deserialize;

#[derive(Deserialize)]
struct Reference {
    model: String,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    add_special: bool,
    parse_special: bool,
    ids: Vec<u32>,
    detok: String,
}

fn reference(name: &str) -> Reference {
    let path = data_path(&format!("tokenizer/{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let r: Reference = serde_json::from_str(&text).unwrap();
    assert_eq!(r.model, name);
    assert!(!r.cases.is_empty());
    r
}

/// The Qwen vocabulary with `tokenizer.ggml.pre` replaced, and no tensors.
fn qwen_variant(pre: &str) -> Vec<u8> {
    let file = GgufFile::open(model_path(DefaultModel::Qwen25Coder05bInstruct)).unwrap();
    let mut w = GgufWriter::from_file(&file);
    for t in file.tensors() {
        w.remove_tensor(&t.name);
    }
    w.set("tokenizer.ggml.pre", MetaValue::String(pre.into()));
    w.to_bytes().unwrap()
}

const VARIANTS: [&str; 3] = ["llama-bpe", "gpt-2", "default"];

/// Checks every case; returns how many cases round-trip.
fn check(tok: &Tokenizer, r: &Reference, check_decode: bool) -> usize {
    let mut failures = Vec::new();
    let mut round_trips = 0;
    for (i, case) in r.cases.iter().enumerate() {
        let ids = tok
            .encode(&case.text, case.add_special, case.parse_special)
            .unwrap();
        if ids != case.ids {
            failures.push(format!(
                "case {i} {:?} (add_special {}, parse_special {}):\n  llama.cpp {:?}\n  hotcold   {:?}",
                case.text, case.add_special, case.parse_special, case.ids, ids
            ));
            continue;
        }
        let pieces: Vec<u8> = ids
            .iter()
            .flat_map(|&id| tok.token_to_piece(id).to_vec())
            .collect();
        if String::from_utf8_lossy(&pieces) != case.detok {
            failures.push(format!(
                "case {i} {:?}: pieces {:?} != llama.cpp {:?}",
                case.text,
                String::from_utf8_lossy(&pieces),
                case.detok
            ));
        }
        if check_decode {
            let decoded = tok.decode(&ids);
            assert_eq!(
                decoded, case.detok,
                "case {i} {:?}: decode differs from llama.cpp",
                case.text
            );
            if case.detok == case.text {
                round_trips += 1;
            }
            // Streaming gives the same text, one token at a time.
            let mut stream = tok.stream_decoder(true);
            let mut streamed: String = ids.iter().map(|&id| stream.push(id)).collect();
            streamed.push_str(&stream.finish());
            assert_eq!(streamed, decoded, "case {i} {:?}: streaming", case.text);
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases of {} differ:\n{}",
        failures.len(),
        r.cases.len(),
        r.model,
        failures.join("\n")
    );
    round_trips
}

#[test]
fn gemma_matches_llama_cpp() {
    let file = GgufFile::open(model_path(DefaultModel::Gemma3_270m)).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let r = reference("gemma-3-270m");
    let round_trips = check(&tok, &r, true);
    assert!(
        round_trips >= r.cases.len() / 3,
        "only {round_trips} cases round-trip"
    );
    assert_eq!(tok.vocab_size(), 262_144);
    assert_eq!(
        (tok.bos(), tok.eos(), tok.eot()),
        (Some(2), Some(1), Some(106))
    );
    assert_eq!(tok.eog_ids(), [1, 106, 212]);
    assert!(tok.is_eog(106) && !tok.is_eog(2));
    println!(
        "gemma: {} cases identical, {round_trips} round-trip",
        r.cases.len()
    );
}

#[test]
fn qwen_matches_llama_cpp() {
    let file = GgufFile::open(model_path(DefaultModel::Qwen25Coder05bInstruct)).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    assert_eq!(tok.pre_tokenizer(), Some(PreTokenizer::Qwen2));
    let r = reference("qwen2.5-coder-0.5b-instruct");
    let round_trips = check(&tok, &r, true);
    assert!(
        round_trips >= r.cases.len() / 2,
        "only {round_trips} cases round-trip"
    );
    assert_eq!(tok.vocab_size(), 151_936);
    assert_eq!(
        (tok.bos(), tok.eos(), tok.eot()),
        (Some(151_643), Some(151_645), Some(151_645))
    );
    assert_eq!(
        tok.eog_ids(),
        [128_247, 151_643, 151_645, 151_662, 151_663, 151_664]
    );
    println!(
        "qwen: {} cases identical, {round_trips} round-trip",
        r.cases.len()
    );
}

#[test]
fn qwen_vocab_with_other_pre_tokenizers_matches_llama_cpp() {
    for pre in VARIANTS {
        let file = GgufFile::from_bytes(qwen_variant(pre)).unwrap();
        let tok = Tokenizer::from_gguf(&file).unwrap();
        let r = reference(&format!("qwen-vocab-{pre}"));
        // These pre-tokenizers clean up spaces when decoding, which llama-tokenize's pieces don't.
        check(&tok, &r, false);
        println!(
            "qwen vocabulary with pre {pre}: {} cases identical",
            r.cases.len()
        );
    }
}

/// Writes the variant files that `make_tokenizer_refs.sh` runs llama-tokenize on.
#[test]
#[ignore = "run by tests/reference/make_tokenizer_refs.sh"]
fn write_variants() {
    let dir =
        PathBuf::from(std::env::var_os("HOTCOLD_VARIANT_DIR").expect("set HOTCOLD_VARIANT_DIR"));
    for pre in VARIANTS {
        std::fs::write(
            dir.join(format!("qwen-vocab-{pre}.gguf")),
            qwen_variant(pre),
        )
        .unwrap();
    }
}

#[test]
fn qwen_chat_template_renders_chatml() {
    let file = GgufFile::open(model_path(DefaultModel::Qwen25Coder05bInstruct)).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let template = ChatTemplate::from_gguf(&file).unwrap();
    assert!(template.source().is_some());
    let messages = [
        ChatMessage::new("system", "You are a helpful coder."),
        ChatMessage::new("user", "Write hello world in Rust."),
    ];
    let text = template.render_for(&tok, &messages, true).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nYou are a helpful coder.<|im_end|>\n<|im_start|>user\nWrite hello world in Rust.<|im_end|>\n<|im_start|>assistant\n"
    );
    // Without a system message the template supplies Qwen's default one.
    let text = template.render_for(&tok, &messages[1..], false).unwrap();
    assert!(
        text.starts_with("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud."),
        "{text}"
    );
    assert!(text.ends_with("Rust.<|im_end|>\n"), "{text}");
    // The rendered prompt tokenizes with the control tokens as single tokens.
    let ids = tok.encode(&text, true, true).unwrap();
    assert_eq!(ids[0], tok.token_id("<|im_start|>").unwrap());

    let gemma = GgufFile::open(model_path(DefaultModel::Gemma3_270m)).unwrap();
    let template = ChatTemplate::from_gguf(&gemma).unwrap();
    assert_eq!(
        template
            .render(&messages[1..], true, "<bos>", "<eos>")
            .unwrap(),
        "<start_of_turn>user\nWrite hello world in Rust.<end_of_turn>\n<start_of_turn>model\n"
    );
}

#[test]
fn build_and_encode_timings() {
    for model in DefaultModel::ALL {
        let file = GgufFile::open(model_path(model)).unwrap();
        let start = Instant::now();
        let tok = Tokenizer::from_gguf(&file).unwrap();
        let build = start.elapsed();
        let r = reference(model.name());
        let mut text = String::new();
        while text.len() < 10_000 {
            for case in &r.cases {
                text.push_str(&case.text);
            }
        }
        let start = Instant::now();
        let ids = tok.encode(&text, true, false).unwrap();
        let encode = start.elapsed();
        assert_eq!(tok.decode(&ids[usize::from(tok.add_bos())..]), text);
        println!(
            "{}: build {:.1} ms, encode {} bytes -> {} tokens in {:.2} ms",
            model.name(),
            build.as_secs_f64() * 1e3,
            text.len(),
            ids.len(),
            encode.as_secs_f64() * 1e3
        );
    }
}
