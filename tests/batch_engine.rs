//! Batched decoding (`engine::Batch`): a sequence evaluated in a batch with others gets exactly the
//! logits it gets alone in a `Session`, whatever the batch size (1 to 12 rows, so both the tiled
//! and the AVX-512 packed matmul paths run), whether its prompt is read whole or in chunks next to
//! other sequences' decode steps, on a dense real model and on a neuron-sparse synthetic one.

mod common;

use std::sync::Arc;

use common::model_path;
use hotcold::engine::{thread_pool, Batch, FfnMode, Logits, Session, Work};
use hotcold::gguf::GgufFile;
use hotcold::model::Model;
use hotcold::models::DefaultModel;
use hotcold::quant::GgmlType;
use hotcold::sample::argmax;
use hotcold::synth::{self, SynthConfig};
use hotcold::tokenizer::Tokenizer;

const PROMPTS: [&str; 12] = [
    "The capital of France is",
    "Once upon a time, in a land far away,",
    "def fibonacci(n):",
    "The quick brown fox",
    "In 1492, Columbus",
    "Water boils at",
    "My favourite colour is",
    "The theory of relativity states that",
    "fn main() {",
    "Paris, London, Berlin and",
    "A haiku about the sea:",
    "To be or not to be,",
];

/// Greedy steps after each prompt.
const N_GEN: usize = 6;

/// Greedy continuation of `prompt` alone in a session, with the logits of every step.
fn alone(model: &Model, mode: FfnMode, prompt: &[u32]) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut session = Session::new(model, 128, thread_pool(2).unwrap());
    session.set_ffn_mode(mode).unwrap();
    let mut logits = session.eval(prompt, Logits::Last).unwrap();
    let (mut tokens, mut all) = (Vec::new(), Vec::new());
    for _ in 0..N_GEN {
        let next = argmax(&logits);
        tokens.push(next);
        all.push(logits);
        logits = session.eval(&[next], Logits::Last).unwrap();
    }
    (tokens, all)
}

/// The same greedy continuations for all `prompts` in one batch. Sequence `i` joins at step `i`
/// (so each prompt is read while the earlier sequences decode) and reads its prompt in chunks of
/// `chunk` tokens.
fn batched(
    model: &Model,
    mode: FfnMode,
    prompts: &[Vec<u32>],
    chunk: usize,
) -> Vec<(Vec<u32>, Vec<Vec<f32>>)> {
    let mut batch = Batch::new(model, prompts.len(), 128, thread_pool(2).unwrap());
    batch.set_ffn_mode(mode).unwrap();
    let n = prompts.len();
    let mut seqs = Vec::new();
    let mut read = vec![0usize; n];
    let mut out: Vec<(Vec<u32>, Vec<Vec<f32>>)> = vec![(Vec::new(), Vec::new()); n];
    let mut step = 0;
    while out.iter().any(|(t, _)| t.len() < N_GEN) {
        if seqs.len() < n && step >= seqs.len() {
            seqs.push(batch.acquire().unwrap());
        }
        let mut work = Vec::new();
        let mut whose = Vec::new();
        for (i, &seq) in seqs.iter().enumerate() {
            if out[i].0.len() == N_GEN {
                continue;
            }
            let tokens = if read[i] < prompts[i].len() {
                let end = (read[i] + chunk).min(prompts[i].len());
                let t = &prompts[i][read[i]..end];
                read[i] = end;
                t
            } else {
                std::slice::from_ref(out[i].0.last().unwrap())
            };
            work.push(Work {
                seq,
                tokens,
                logits: read[i] == prompts[i].len(),
            });
            whose.push(i);
        }
        let logits = batch.step(&work).unwrap();
        for (i, l) in whose.into_iter().zip(logits) {
            if let Some(l) = l {
                out[i].0.push(argmax(&l));
                out[i].1.push(l);
            }
        }
        step += 1;
    }
    assert!(
        batch.ffn_density().mean() > 0.0,
        "the batch counts its FFN work"
    );
    out
}

fn check(model: &Model, tok: &Tokenizer, mode: FfnMode, n_prompts: usize, chunk: usize) {
    let prompts: Vec<Vec<u32>> = PROMPTS[..n_prompts]
        .iter()
        .map(|p| tok.encode(p, true, false).unwrap())
        .collect();
    let together = batched(model, mode, &prompts, chunk);
    for (i, prompt) in prompts.iter().enumerate() {
        let (tokens, logits) = alone(model, mode, prompt);
        assert_eq!(
            together[i].0, tokens,
            "prompt {i} ({mode:?}, {n_prompts} sequences, chunks of {chunk}): greedy tokens differ"
        );
        for (s, (a, b)) in logits.iter().zip(&together[i].1).enumerate() {
            let diff = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            assert!(
                diff == 0.0,
                "prompt {i} step {s} ({mode:?}, {n_prompts} sequences): logits differ by {diff}"
            );
        }
    }
}

#[test]
fn a_sequence_in_a_batch_equals_the_sequence_alone_on_gemma() {
    let path = model_path(DefaultModel::Gemma3_270m);
    let model = Model::open(&path).unwrap();
    let tok = Tokenizer::from_gguf(model.file()).unwrap();
    check(&model, &tok, FfnMode::Dense, 12, 3);
}

#[test]
fn a_sequence_in_a_sparse_batch_equals_the_sequence_alone() {
    let mut cfg = SynthConfig::preset("tiny").unwrap();
    cfg.ty = GgmlType::Q4_0;
    let (writer, _) = synth::build(&cfg).unwrap();
    let file = Arc::new(GgufFile::from_bytes(writer.to_bytes().unwrap()).unwrap());
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let model = Model::from_file(file).unwrap();
    for (n_prompts, chunk) in [(1, 4), (4, 1), (12, 5)] {
        check(&model, &tok, FfnMode::Sparse, n_prompts, chunk);
    }
}

#[test]
fn bad_batch_steps_are_errors() {
    let cfg = SynthConfig::preset("tiny").unwrap();
    let (writer, _) = synth::build(&cfg).unwrap();
    let file = Arc::new(GgufFile::from_bytes(writer.to_bytes().unwrap()).unwrap());
    let model = Model::from_file(file).unwrap();
    let mut batch = Batch::new(&model, 2, 8, thread_pool(1).unwrap());
    assert!(batch.step(&[]).is_err(), "empty batch");
    let a = batch.acquire().unwrap();
    let b = batch.acquire().unwrap();
    assert!(batch.acquire().is_none(), "only two slots");
    let w = |seq, tokens| Work {
        seq,
        tokens,
        logits: true,
    };
    let err = batch.step(&[w(a, &[1]), w(a, &[2])]).unwrap_err();
    assert!(err.to_string().contains("twice"), "{err}");
    let err = batch.step(&[w(a, &[1; 9])]).unwrap_err();
    assert!(err.to_string().contains("context"), "{err}");
    let err = batch.step(&[w(b, &[])]).unwrap_err();
    assert!(err.to_string().contains("no tokens"), "{err}");
    let err = batch.step(&[w(b, &[5000])]).unwrap_err();
    assert!(err.to_string().contains("vocabulary"), "{err}");
    batch.release(b);
    let err = batch.step(&[w(b, &[1])]).unwrap_err();
    assert!(err.to_string().contains("not active"), "{err}");
    let out = batch.step(&[w(a, &[1, 2, 3])]).unwrap();
    assert_eq!(batch.n_past(a).unwrap(), 3);
    assert_eq!(out[0].as_ref().unwrap().len(), model.hp.n_vocab);
    assert_eq!(batch.n_active(), 1);
}
