//! hotcold-core's step-wise [`Generator`] driven by a caller that evaluates tokens itself (the
//! WebGPU path awaits its forward pass, so it cannot let the generator call `Session::eval`):
//! the same tokens and text as [`generate`], and a step before the evaluation is an error.

use std::sync::Arc;

use hotcold_core::engine::{
    generate, thread_pool, GenerateOptions, Generator, Logits, Session, StopReason,
};
use hotcold_core::gguf::GgufFile;
use hotcold_core::model::Model;
use hotcold_core::sample::{Sampler, SamplerConfig};
use hotcold_core::synth::{build, SynthConfig};
use hotcold_core::tokenizer::Tokenizer;

const PROMPT: &str = "The capital of France is";

fn tiny() -> Model {
    let bytes = build(&SynthConfig::preset("tiny").unwrap())
        .unwrap()
        .0
        .to_bytes()
        .unwrap();
    Model::from_file(Arc::new(GgufFile::from_bytes(bytes).unwrap())).unwrap()
}

fn sampler() -> Sampler {
    // A temperature, so that the sampler's history and random state matter too.
    Sampler::new(SamplerConfig {
        temperature: 0.8,
        seed: 7,
        ..SamplerConfig::default()
    })
}

#[test]
fn outside_evaluation_gives_the_generate_text() {
    let model = tiny();
    let tok = Tokenizer::from_gguf(model.file()).unwrap();
    let prompt = tok.encode(PROMPT, true, true).unwrap();
    let opts = GenerateOptions {
        max_tokens: 24,
        ignore_eos: false,
    };
    let mut session = Session::new(&model, 64, thread_pool(1).unwrap());
    let mut want = String::new();
    let stats = generate(&mut session, &tok, &mut sampler(), &prompt, opts, |t| {
        want.push_str(t);
        true
    })
    .unwrap();

    let mut session = Session::new(&model, 64, thread_pool(1).unwrap());
    let mut sampler = sampler();
    let logits = session.eval(&prompt, Logits::Last).unwrap();
    let mut generator = Generator::with_prompt_logits(&tok, &mut sampler, &prompt, logits, opts);
    let mut text = String::new();
    let stop = loop {
        if let Some(t) = generator.needs_eval() {
            generator.set_logits(session.eval(&[t], Logits::Last).unwrap());
        }
        let step = generator
            .sample_step(&mut sampler, session.n_past(), session.n_ctx())
            .unwrap();
        text.push_str(&step.text);
        if let Some(stop) = step.stop {
            break stop;
        }
    };
    assert_eq!(generator.tokens(), &stats.tokens[..]);
    assert_eq!(text, want);
    assert_eq!(stop, stats.stop);
}

#[test]
fn a_step_before_the_evaluation_is_an_error() {
    let model = tiny();
    let tok = Tokenizer::from_gguf(model.file()).unwrap();
    let prompt = tok.encode(PROMPT, true, true).unwrap();
    let mut sampler = sampler();
    let logits = vec![0.0; model.hp.n_vocab];
    let opts = GenerateOptions {
        max_tokens: 4,
        ignore_eos: true,
    };
    let mut generator = Generator::with_prompt_logits(&tok, &mut sampler, &prompt, logits, opts);
    let first = generator.sample_step(&mut sampler, 14, 64).unwrap();
    assert_eq!(generator.needs_eval(), first.token);
    let err = generator.sample_step(&mut sampler, 14, 64).unwrap_err();
    assert!(err.to_string().contains("not evaluated"), "{err}");
    // Context full: the step after the last free position stops.
    generator.set_logits(vec![0.0; model.hp.n_vocab]);
    let step = generator.sample_step(&mut sampler, 64, 64).unwrap();
    assert_eq!(step.stop, Some(StopReason::ContextFull));
    assert_eq!(generator.needs_eval(), None);
}
