//! The browser engine's Rust side, run natively on the tiny synthetic model: its token-by-token
//! generation must give exactly hotcold-core's `generate` text (what `hotcold run` prints), its
//! statistics must agree with the engine's own FFN density, and bad input must be an error.

use std::sync::{Arc, Mutex};

use hotcold_core::engine::{
    generate, thread_pool, FfnMode, FfnTrace, GenerateOptions, Session, StopReason,
};
use hotcold_core::gguf::GgufFile;
use hotcold_core::model::Model;
use hotcold_core::sample::{Sampler, SamplerConfig};
use hotcold_core::synth::{build, SynthConfig};
use hotcold_core::tokenizer::Tokenizer;
use hotcold_web::{Runner, StartOptions};

const PROMPT: &str = "The capital of France is";

fn tiny_bytes() -> Vec<u8> {
    let cfg = SynthConfig::preset("tiny").unwrap();
    build(&cfg).unwrap().0.to_bytes().unwrap()
}

fn greedy(max_tokens: usize, ffn: Option<FfnMode>) -> StartOptions {
    StartOptions {
        max_tokens,
        temperature: 0.0,
        seed: 0,
        ffn,
    }
}

/// The text and tokens of `hotcold run --temp 0` through core's `generate`.
fn reference(bytes: Vec<u8>, max_tokens: usize) -> (String, Vec<u32>) {
    let model = Model::from_file(Arc::new(GgufFile::from_bytes(bytes).unwrap())).unwrap();
    let tok = Tokenizer::from_gguf(model.file()).unwrap();
    let mut session = Session::new(&model, model.hp.n_ctx_train, thread_pool(2).unwrap());
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: 0.0,
        ..SamplerConfig::default()
    });
    let prompt = tok.encode(PROMPT, true, true).unwrap();
    let mut text = String::new();
    let opts = GenerateOptions {
        max_tokens,
        ignore_eos: false,
    };
    let stats = generate(&mut session, &tok, &mut sampler, &prompt, opts, |t| {
        text.push_str(t);
        true
    })
    .unwrap();
    (text, stats.tokens)
}

fn drain(runner: &mut Runner) -> String {
    let mut text = String::new();
    while let Some(piece) = runner.next_token().unwrap() {
        text.push_str(&piece);
    }
    text
}

#[test]
fn token_by_token_text_equals_core_generate() {
    let bytes = tiny_bytes();
    let (want_text, want_tokens) = reference(bytes.clone(), 40);
    let mut runner = Runner::load(bytes, 0).unwrap();
    assert_eq!(runner.start(PROMPT, &greedy(40, None)).unwrap(), 13);
    let text = drain(&mut runner);
    assert_eq!(runner.generated(), &want_tokens[..]);
    assert_eq!(text, want_text);
    assert_eq!(runner.stop_reason(), Some(StopReason::MaxTokens));
    let t = runner.timings();
    assert_eq!((t.prompt_tokens, t.generated_tokens), (13, 40));
    // A second generation starts afresh and gives the same text.
    runner.start(PROMPT, &greedy(40, None)).unwrap();
    assert_eq!(drain(&mut runner), want_text);
}

#[test]
fn stop_ends_the_generation_between_tokens() {
    let mut runner = Runner::load(tiny_bytes(), 0).unwrap();
    runner.start(PROMPT, &greedy(40, None)).unwrap();
    for _ in 0..3 {
        assert!(runner.next_token().unwrap().is_some());
    }
    runner.stop();
    assert_eq!(runner.next_token().unwrap(), None);
    assert_eq!(runner.stop_reason(), Some(StopReason::Callback));
    assert_eq!(runner.generated().len(), 3);
}

/// The firing statistics must count exactly the non-zero activations the engine produced, which
/// an observer of a separate core session sees for the same tokens.
#[test]
fn firing_statistics_match_the_engine_activations() {
    let bytes = tiny_bytes();
    let mut runner = Runner::load(bytes.clone(), 0).unwrap();
    let info = runner.info().clone();
    assert!(info.has_predictor);
    runner.start(PROMPT, &greedy(8, None)).unwrap();
    drain(&mut runner);
    let generated = runner.generated().to_vec();

    // Replay prompt + generated tokens (the last one is sampled but never evaluated).
    let model = Model::from_file(Arc::new(GgufFile::from_bytes(bytes).unwrap())).unwrap();
    let mut session = Session::new(&model, 256, thread_pool(1).unwrap());
    let (n_layer, n_ff) = (info.n_layer, info.n_ff);
    let counts = Arc::new(Mutex::new((
        vec![0u32; n_layer * n_ff],
        vec![0f32; n_layer],
    )));
    let sink = counts.clone();
    session.set_ffn_observer(Some(Box::new(move |t: &FfnTrace| {
        let mut c = sink.lock().unwrap();
        for row in t.activations.chunks_exact(n_ff) {
            for (j, &a) in row.iter().enumerate() {
                c.0[t.layer * n_ff + j] += u32::from(a != 0.0);
            }
            c.1[t.layer] = row.iter().filter(|&&a| a != 0.0).count() as f32 / n_ff as f32;
        }
    })));
    let mut tokens = runner.tokenize(PROMPT).unwrap();
    tokens.extend_from_slice(&generated[..generated.len() - 1]);
    for &t in &tokens {
        session
            .eval(&[t], hotcold_core::engine::Logits::Last)
            .unwrap();
    }
    let c = counts.lock().unwrap();
    let n_tokens = tokens.len() as f32;
    let want: Vec<f32> = c.0.iter().map(|&k| k as f32 / n_tokens).collect();
    assert_eq!(runner.firing_frequencies(), want);
    assert_eq!(runner.last_token_density(), c.1);
    // What fired is a subset of what the predictor chose to compute.
    let computed = runner.computed_density();
    let fired = runner.firing_frequencies();
    for l in 0..n_layer {
        let mean_fired: f32 = fired[l * n_ff..(l + 1) * n_ff].iter().sum::<f32>() / n_ff as f32;
        assert!(
            f64::from(mean_fired) <= computed[l] + 1e-6,
            "layer {l}: fired {mean_fired} > computed {}",
            computed[l]
        );
        assert!(
            computed[l] > 0.0 && computed[l] < 0.5,
            "layer {l}: {}",
            computed[l]
        );
    }
}

#[test]
fn dense_mode_computes_every_neuron() {
    let mut runner = Runner::load(tiny_bytes(), 0).unwrap();
    runner
        .start(PROMPT, &greedy(4, Some(FfnMode::Dense)))
        .unwrap();
    drain(&mut runner);
    assert!(runner.computed_density().iter().all(|&d| d == 1.0));
}

#[test]
fn the_split_puts_the_most_frequent_neurons_within_the_budget() {
    let mut runner = Runner::load(tiny_bytes(), 0).unwrap();
    runner.start(PROMPT, &greedy(8, None)).unwrap();
    drain(&mut runner);
    let info = runner.info().clone();
    let per_neuron = info.neuron_bytes[0].round() as u64;
    let none = runner.hot_cold_split(0).unwrap();
    assert!(none.hot.iter().all(|&h| h == 0) && none.bytes == 0);
    let all = runner.hot_cold_split(u64::MAX / 2).unwrap();
    assert!(all.hot.iter().all(|&h| h == info.n_ff));
    assert!(all
        .hit_rate
        .iter()
        .all(|&r| (r - 1.0).abs() < 1e-9 || r == 0.0));
    // A tenth of the neurons: each layer's hot ones are its most frequent, and they serve more
    // than a tenth of the firing (the frequencies follow a power law).
    let budget = per_neuron * (info.n_layer * info.n_ff / 10) as u64;
    let some = runner.hot_cold_split(budget).unwrap();
    assert!(some.bytes <= budget && some.bytes > 0);
    assert_eq!(
        some.hot.iter().sum::<usize>(),
        info.n_layer * info.n_ff / 10
    );
    let freqs = runner.firing_frequencies();
    for (l, &h) in some.hot.iter().enumerate() {
        let mut f = freqs[l * info.n_ff..(l + 1) * info.n_ff].to_vec();
        f.sort_by(|a, b| b.total_cmp(a));
        let (top, total): (f32, f32) = (f[..h].iter().sum(), f.iter().sum());
        if total > 0.0 {
            assert!((some.hit_rate[l] - f64::from(top / total)).abs() < 1e-4);
        }
    }
    let mean_hit = some.hit_rate.iter().sum::<f64>() / some.hit_rate.len() as f64;
    assert!(mean_hit > 0.1, "hit rate {mean_hit}");
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    assert!(Runner::load(b"not a gguf file".to_vec(), 0).is_err());
    let mut bytes = tiny_bytes();
    bytes.truncate(bytes.len() / 2);
    assert!(Runner::load(bytes, 0).is_err());
    let mut runner = Runner::load(tiny_bytes(), 16).unwrap();
    let long = "word ".repeat(100);
    let err = runner.start(&long, &greedy(4, None)).unwrap_err();
    assert!(err.to_string().contains("context"), "{err}");
    assert_eq!(runner.next_token().unwrap(), None);
}
