//! The neuron-sparse FFN on synthetic ReLU / dReLU models (`synth`): the oracle equals the dense
//! path, the predictor path is deterministic at every thread count, computes about the density
//! `synth` promised, and keeps perplexity within 2% of dense.

mod common;

use std::sync::Arc;

use common::{data_path, greedy_with_logits as greedy};
use hotcold::engine::{perplexity, thread_pool, FfnMode, Logits, Session};
use hotcold::gguf::GgufFile;
use hotcold::model::Model;
use hotcold::placement::stats::{frequencies, FrequencySource};
use hotcold::quant::GgmlType;
use hotcold::synth::{self, SynthArch, SynthConfig};
use hotcold::tokenizer::Tokenizer;

/// Largest |oracle − dense| of a logit. Both compute the same neurons with the same kernels; the
/// oracle only skips neurons that are exactly zero.
const ORACLE_TOLERANCE: f32 = 1e-4;

/// Largest |ordered − file order| of a sparse logit (logits of these models reach ±12): float
/// reordering for F16 weights; for quantised ones the down projection's input is also rounded to
/// Q8_0 over other blocks of 32 neurons (seen: up to 0.071).
fn order_tolerance(ty: GgmlType) -> f32 {
    match ty {
        GgmlType::F16 => 1e-3,
        _ => 0.1,
    }
}

fn tiny(arch: SynthArch, ty: GgmlType) -> (Model, Tokenizer) {
    let mut cfg = SynthConfig::preset("tiny").unwrap();
    cfg.arch = arch;
    cfg.ty = ty;
    let (writer, _) = synth::build(&cfg).unwrap();
    let file = Arc::new(GgufFile::from_bytes(writer.to_bytes().unwrap()).unwrap());
    let tokenizer = Tokenizer::from_gguf(&file).unwrap();
    (Model::from_file(file).unwrap(), tokenizer)
}

const PROMPT: &str = "When in the course of human events, it becomes necessary for one people";

#[test]
fn oracle_equals_dense_on_every_architecture_and_type() {
    for arch in [SynthArch::Llama, SynthArch::Bamboo] {
        for ty in [GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0] {
            let (model, tok) = tiny(arch, ty);
            let prompt = tok.encode(PROMPT, true, false).unwrap();
            let (dense_tokens, dense_logits) = greedy(&model, FfnMode::Dense, &prompt, 16, 2);
            let (oracle_tokens, oracle_logits) = greedy(&model, FfnMode::Oracle, &prompt, 16, 2);
            assert_eq!(oracle_tokens, dense_tokens, "{arch:?} {ty}");
            let worst = dense_logits
                .iter()
                .flatten()
                .zip(oracle_logits.iter().flatten())
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                worst <= ORACLE_TOLERANCE,
                "{arch:?} {ty}: logits differ by {worst}"
            );
        }
    }
}

#[test]
fn sparse_path_is_deterministic_at_every_thread_count() {
    let (model, tok) = tiny(SynthArch::Llama, GgmlType::Q4_0);
    assert_same_bits_at_every_thread_count(&model, &tok);
}

/// Greedy sparse decoding of `model` gives the same tokens and logit bits on 1, 2 and 3 threads.
fn assert_same_bits_at_every_thread_count(model: &Model, tok: &Tokenizer) {
    let prompt = tok.encode(PROMPT, true, false).unwrap();
    let (tokens, logits) = greedy(model, FfnMode::Sparse, &prompt, 12, 1);
    for threads in [2, 3] {
        let (t, l) = greedy(model, FfnMode::Sparse, &prompt, 12, threads);
        assert_eq!(t, tokens, "{threads} threads");
        let same_bits = l
            .iter()
            .flatten()
            .zip(logits.iter().flatten())
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same_bits, "{threads} threads: logits differ from 1 thread");
    }
}

#[test]
fn predictor_density_is_what_synth_promised() {
    for arch in [SynthArch::Llama, SynthArch::Bamboo] {
        let (model, tok) = tiny(arch, GgmlType::F16);
        let prompt = tok.encode(PROMPT, true, false).unwrap();
        let mut oracle = Session::new(&model, 256, thread_pool(2).unwrap());
        oracle.set_ffn_mode(FfnMode::Oracle).unwrap();
        oracle.eval(&prompt, Logits::Last).unwrap();
        let mut sparse = Session::new(&model, 256, thread_pool(2).unwrap());
        sparse.eval(&prompt, Logits::Last).unwrap();
        assert_eq!(
            sparse.ffn_mode(),
            FfnMode::Sparse,
            "a file with predictors defaults to sparse"
        );
        let (real, predicted) = (oracle.ffn_density().mean(), sparse.ffn_density().mean());
        assert!(
            (0.07..=0.13).contains(&real),
            "{arch:?}: true density {real}"
        );
        assert!(
            predicted >= real && predicted <= real + 0.06,
            "{arch:?}: predicted {predicted}, true {real}"
        );
    }
}

#[test]
fn sparse_perplexity_is_within_two_percent_of_dense() {
    let text = std::fs::read_to_string(data_path("text/declaration.txt")).unwrap();
    for ty in [GgmlType::F16, GgmlType::Q4_0] {
        let (model, tok) = tiny(SynthArch::Llama, ty);
        let tokens = tok.encode(&text, true, false).unwrap();
        let ppl = |mode| {
            let mut s = Session::new(&model, 128, thread_pool(2).unwrap());
            s.set_ffn_mode(mode).unwrap();
            perplexity(&mut s, &tokens, tok.bos(), usize::MAX, |_| {}).unwrap()
        };
        let (dense, sparse) = (ppl(FfnMode::Dense), ppl(FfnMode::Sparse));
        let rel = (sparse - dense).abs() / dense;
        assert!(
            rel < 0.02,
            "{ty}: sparse PPL {sparse} vs dense {dense} ({:.2}%)",
            rel * 100.0
        );
    }
}

/// A copy of `tiny(arch, ty)` as `hotcold run --ffn sparse` loads it on the CPU: quantised
/// predictors (Q8_0, fc2 Q4_0 in a Q4_0 model), neurons renumbered hottest first from synth's targets (with interleaved copies of
/// the hot rows and of fc2 where the CPU runs that layout fast).
fn tiny_ordered(arch: SynthArch, ty: GgmlType) -> Model {
    let (mut model, _) = tiny(arch, ty);
    let predictor_types = model.default_predictor_types().unwrap();
    model.quantize_predictors(predictor_types).unwrap();
    let (freq, source) = frequencies(model.file()).unwrap();
    assert_eq!(source, FrequencySource::SynthTargets);
    let layers = model.order_neurons_by_frequency(&freq).unwrap();
    assert_eq!(layers, model.layers.len());
    assert!(
        model.order_neurons_by_frequency(&freq).is_err(),
        "a second renumbering by the file's frequencies"
    );
    model
}

#[test]
fn hottest_first_order_keeps_the_sparse_results() {
    for arch in [SynthArch::Llama, SynthArch::Bamboo] {
        for ty in [GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0] {
            let (mut plain, tok) = tiny(arch, ty);
            let predictor_types = plain.default_predictor_types().unwrap();
            plain.quantize_predictors(predictor_types).unwrap();
            let ordered = tiny_ordered(arch, ty);
            let hot_layers = ordered.layers.iter().filter(|l| l.hot.is_some()).count();
            if hotcold::cpu::Interleaved::is_fast_for(ty) {
                assert!(hot_layers > 0, "{arch:?} {ty}: no hot rows");
            }
            let prompt = tok.encode(PROMPT, true, false).unwrap();
            let (want, want_logits) = greedy(&plain, FfnMode::Sparse, &prompt, 16, 2);
            // the ordered model on the same tokens (teacher forcing), step by step
            let mut session = Session::new(&ordered, 256, thread_pool(2).unwrap());
            let mut logits = session.eval(&prompt, Logits::Last).unwrap();
            for (step, (&next, expected)) in want.iter().zip(&want_logits).enumerate() {
                // the same neurons in another order: another float order, and for a quantised
                // down projection other 32-neuron blocks when its input is rounded to Q8_0
                let worst = expected
                    .iter()
                    .zip(&logits)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(
                    worst <= order_tolerance(ty),
                    "{arch:?} {ty} step {step}: logits differ by {worst}"
                );
                let best = hotcold::sample::argmax(&logits);
                let gap = expected[next as usize] - expected[best as usize];
                assert!(
                    best == next || gap <= 2.0 * order_tolerance(ty),
                    "{arch:?} {ty} step {step}: token {best} instead of {next} (gap {gap})"
                );
                logits = session.eval(&[next], Logits::Last).unwrap();
            }
        }
    }
}

#[test]
fn hottest_first_order_is_deterministic_at_every_thread_count() {
    let model = tiny_ordered(SynthArch::Llama, GgmlType::Q4_0);
    let (_, tok) = tiny(SynthArch::Llama, GgmlType::Q4_0);
    assert_same_bits_at_every_thread_count(&model, &tok);
}

#[test]
fn frequencies_of_the_wrong_shape_are_errors() {
    let (mut model, _) = tiny(SynthArch::Llama, GgmlType::Q4_0);
    let (mut freq, _) = frequencies(model.file()).unwrap();
    let one_layer_short = freq[..freq.len() - 1].to_vec();
    assert!(model.order_neurons_by_frequency(&one_layer_short).is_err());
    freq[0].pop();
    assert!(model.order_neurons_by_frequency(&freq).is_err());
}
