//! hotcold's sparse path against PowerInfer's CPU build on files that `synth` wrote: the same
//! greedy tokens from the same prompt ids (reference: `tests/reference/make_powerinfer_refs.sh`,
//! PowerInfer run with one thread, no repetition penalty, EOS ignored), on every architecture
//! `synth` writes (llama, bamboo, falcon, opt). PowerInfer's OPT uses a LayerNorm epsilon of 0
//! (it reads none); hotcold reads the file's 1e-5: the greedy text is the same.
//!
//! F16 files: all 32 tokens, byte for byte (both add `f16(a_i) · w_i` with an FMA). Q4_0 files:
//! PowerInfer's axpy multiplies the integer `q_w · q_a` by `d_w · d_a` and adds without an FMA,
//! ours adds `(d_a q_a) · (d_w q_w)` with one, and our dense products sum in another order; the
//! random synthetic models have nearly flat logits, so a Q4_0 step may pick another token where
//! PowerInfer's is within [`TIE_MARGIN`] of ours (a near-tie; the run then follows PowerInfer's
//! token, the one whose piece continues its text), at most [`MAX_TIES`] times per file. Both runs
//! ignore EOS (PowerInfer ran with `--ignore-eos`).

mod common;

use std::sync::Arc;

use common::data_path;
use hotcold::engine::{thread_pool, FfnMode, Logits, Session};
use hotcold::gguf::GgufFile;
use hotcold::model::{Model, PredictorTypes};
use hotcold::placement::stats::frequencies;
use hotcold::quant::GgmlType;
use hotcold::sample::argmax;
use hotcold::synth::{self, SynthArch, SynthConfig};
use hotcold::tokenizer::Tokenizer;
use serde_json::Value;

/// On Q4_0 files a greedy step may pick another token than PowerInfer only where PowerInfer's is
/// within this much of our best logit (a near-tie that summation order decides); the run then
/// follows PowerInfer's token.
const TIE_MARGIN: f32 = 0.05;
/// Near-tie steps allowed per Q4_0 file (none on F16 files).
const MAX_TIES: usize = 3;

fn ggml_type(name: &str) -> GgmlType {
    match name {
        "f16" => GgmlType::F16,
        "q8_0" => GgmlType::Q8_0,
        "q4_0" => GgmlType::Q4_0,
        other => panic!("unknown type {other}"),
    }
}

#[test]
fn sparse_greedy_text_equals_powerinfer() {
    let refs = std::fs::read_to_string(data_path("powerinfer/greedy.jsonl")).unwrap();
    for line in refs.lines() {
        let r: Value = serde_json::from_str(line).unwrap();
        let mut cfg = SynthConfig::preset(r["preset"].as_str().unwrap()).unwrap();
        cfg.arch = SynthArch::parse(r["arch"].as_str().unwrap()).unwrap();
        cfg.ty = ggml_type(r["type"].as_str().unwrap());
        cfg.seed = r["seed"].as_u64().unwrap();
        let (writer, _) = synth::build(&cfg).unwrap();
        let file = Arc::new(GgufFile::from_bytes(writer.to_bytes().unwrap()).unwrap());
        let tokenizer = Tokenizer::from_gguf(&file).unwrap();
        let plain = Model::from_file(file.clone()).unwrap();
        // and as `hotcold run --ffn sparse` loads it on the CPU: quantised predictors (Q8_0, fc2
        // Q4_0 in a Q4_0 file; there also both Q4_0, `--predictor-type q4_0`), neurons
        // renumbered hottest first
        let as_run = |types: Option<PredictorTypes>| {
            let mut model = Model::from_file(file.clone()).unwrap();
            let types = types.unwrap_or_else(|| model.default_predictor_types().unwrap());
            model.quantize_predictors(types).unwrap();
            let (freq, _) = frequencies(model.file()).unwrap();
            model.order_neurons_by_frequency(&freq).unwrap();
            model
        };
        let mut loads = vec![(plain, "file as is"), (as_run(None), "as run loads it")];
        if cfg.ty == GgmlType::Q4_0 {
            let q4_0 = Some(PredictorTypes::both(GgmlType::Q4_0));
            loads.push((as_run(q4_0), "with Q4_0 predictors"));
        }
        for (model, load) in &loads {
            check_against_powerinfer(model, &tokenizer, &r, &format!("{load}: "));
        }
    }
}

/// Greedy decoding of `model` against PowerInfer's reference `r` (one line of greedy.jsonl).
fn check_against_powerinfer(model: &Model, tokenizer: &Tokenizer, r: &Value, label: &str) {
    let ty = ggml_type(r["type"].as_str().unwrap());
    let mut session = Session::new(model, 256, thread_pool(2).unwrap());
    assert_eq!(session.ffn_mode(), FfnMode::Sparse);
    let prompt: Vec<u32> = r["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let hex = r["generated_hex"].as_str().unwrap();
    let theirs: Vec<u8> = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let what = format!("{label}{} {} {}", r["preset"], r["arch"], r["type"]);
    let n = r["n"].as_u64().unwrap() as usize;
    let max_ties = if ty == GgmlType::F16 { 0 } else { MAX_TIES };
    // PowerInfer prints each token's piece as it comes (a leading space included).
    let piece = |t: u32| tokenizer.token_to_piece_with(t, false).to_vec();
    let mut logits = session.eval(&prompt, Logits::Last).unwrap();
    let (mut at, mut ties) = (0, 0);
    for step in 0..n {
        let rest = &theirs[at..];
        // a token that continues PowerInfer's text (the last one ends it)
        let continues = |&t: &u32| {
            let p = piece(t);
            !p.is_empty()
                && if step + 1 == n {
                    p == rest
                } else {
                    rest.starts_with(&p)
                }
        };
        if let Some(eos) = tokenizer.eos() {
            logits[eos as usize] = f32::NEG_INFINITY; // as PowerInfer's --ignore-eos
        }
        let best = argmax(&logits);
        let next = if continues(&best) {
            best
        } else {
            // PowerInfer's token: the best-scoring one that continues its text
            let pi = (0..logits.len() as u32)
                .filter(continues)
                .max_by(|&a, &b| logits[a as usize].total_cmp(&logits[b as usize]))
                .unwrap_or_else(|| panic!("{what}: no token continues PowerInfer's text"));
            let gap = logits[best as usize] - logits[pi as usize];
            ties += 1;
            assert!(
                gap <= TIE_MARGIN && ties <= max_ties,
                "{what}: token {step} differs ({best} vs PowerInfer's {pi}, logit gap {gap}); \
                 ours so far {:?}, PowerInfer's {:?}",
                String::from_utf8_lossy(&theirs[..at]),
                String::from_utf8_lossy(&theirs)
            );
            eprintln!("{what}: near-tie at token {step} (gap {gap})");
            pi
        };
        at += piece(next).len();
        logits = session.eval(&[next], Logits::Last).unwrap();
    }
    assert_eq!(at, theirs.len(), "{what}: the whole output is compared");
}
