//! The neuron-sparse FFN on synthetic ReLU / dReLU models (`synth`): the oracle equals the dense
//! path, the predictor path is deterministic at every thread count, computes about the density
//! `synth` promised, and keeps perplexity within 2% of dense.

mod common;

use std::sync::Arc;

use common::{data_path, greedy_with_logits as greedy};
use hotcold::engine::{perplexity, thread_pool, FfnMode, Logits, Session};
use hotcold::gguf::GgufFile;
use hotcold::model::Model;
use hotcold::quant::GgmlType;
use hotcold::synth::{self, SynthArch, SynthConfig};
use hotcold::tokenizer::Tokenizer;

/// Largest |oracle − dense| of a logit. Both compute the same neurons with the same kernels; the
/// oracle only skips neurons that are exactly zero.
const ORACLE_TOLERANCE: f32 = 1e-4;

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
    let prompt = tok.encode(PROMPT, true, false).unwrap();
    let (tokens, logits) = greedy(&model, FfnMode::Sparse, &prompt, 12, 1);
    for threads in [2, 3] {
        let (t, l) = greedy(&model, FfnMode::Sparse, &prompt, 12, threads);
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
