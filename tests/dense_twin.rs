//! `synth --layout llama.cpp`: the dense twin of a synthetic ReLU model, an ordinary GGUF (row-major
//! `ffn_down`, no predictor). hotcold's dense path runs it with the plain down matmul and gives the
//! PowerInfer file's dense (and oracle) greedy text: the fair dense baseline of the sparse benchmark.

mod common;

use std::sync::Arc;

use common::greedy_with_logits as greedy;
use hotcold::engine::{thread_pool, FfnMode, Session};
use hotcold::gguf::{GgufFile, Magic};
use hotcold::model::Model;
use hotcold::quant::GgmlType;
use hotcold::synth::{self, SynthArch, SynthConfig, SynthLayout};
use hotcold::tokenizer::Tokenizer;

/// Largest |twin dense − PowerInfer-file dense| of a logit on F16: the same weights (F16 rounds each
/// value on its own, so the transpose changes nothing), summed in another order (a row-major matmul
/// over every neuron against an axpy over the non-zero ones, on f16-rounded activations in both).
const TWIN_TOLERANCE: f32 = 1e-3;

fn tiny(arch: SynthArch, layout: SynthLayout) -> (Model, Tokenizer, Magic) {
    let mut cfg = SynthConfig::preset("tiny").unwrap();
    cfg.arch = arch;
    cfg.ty = GgmlType::F16;
    cfg.layout = layout;
    let (writer, _) = synth::build(&cfg).unwrap();
    let file = Arc::new(GgufFile::from_bytes(writer.to_bytes().unwrap()).unwrap());
    let tokenizer = Tokenizer::from_gguf(&file).unwrap();
    let magic = file.magic();
    (Model::from_file(file).unwrap(), tokenizer, magic)
}

const PROMPT: &str = "When in the course of human events, it becomes necessary for one people";

#[test]
fn dense_twin_gives_the_powerinfer_files_dense_text() {
    for arch in [
        SynthArch::Llama,
        SynthArch::Bamboo,
        SynthArch::Falcon,
        SynthArch::Opt,
    ] {
        let (sparse_file, tok, magic) = tiny(arch, SynthLayout::PowerInfer);
        assert_eq!(magic, Magic::PowerInfer);
        let (twin, twin_tok, twin_magic) = tiny(arch, SynthLayout::LlamaCpp);
        assert_eq!(twin_magic, Magic::Gguf, "{arch:?}");
        assert_eq!(twin.hp.ffn_act, sparse_file.hp.ffn_act, "{arch:?}");
        for (il, layer) in twin.layers.iter().enumerate() {
            // the dense path's down projection is the row-major matmul: there is no neuron-major copy
            assert!(
                layer.down.is_some() && layer.down_t.is_none(),
                "{arch:?} {il}"
            );
            assert!(layer.predictor.is_none(), "{arch:?} {il}");
            assert_eq!(
                layer.down_b.is_some(),
                arch == SynthArch::Opt,
                "{arch:?} {il}"
            );
        }
        let prompt = tok.encode(PROMPT, true, false).unwrap();
        assert_eq!(twin_tok.encode(PROMPT, true, false).unwrap(), prompt);
        let (want, want_logits) = greedy(&sparse_file, FfnMode::Dense, &prompt, 16, 2);
        let (oracle, _) = greedy(&sparse_file, FfnMode::Oracle, &prompt, 16, 2);
        assert_eq!(oracle, want, "{arch:?}: oracle");
        let (got, got_logits) = greedy(&twin, FfnMode::Dense, &prompt, 16, 2);
        assert_eq!(got, want, "{arch:?}: twin dense");
        let worst = got_logits
            .iter()
            .flatten()
            .zip(want_logits.iter().flatten())
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= TWIN_TOLERANCE,
            "{arch:?}: logits differ by {worst}"
        );
        // a twin has no predictor: asking for the predicted path is an error, not a panic
        let mut s = Session::new(&twin, 64, thread_pool(1).unwrap());
        assert!(s.set_ffn_mode(FfnMode::Sparse).is_err(), "{arch:?}");
    }
}
