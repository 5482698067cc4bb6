//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod gpu;
pub mod mutate;
pub mod relabel;

use std::path::PathBuf;

use hotcold::models::DefaultModel;

/// The cached path of a default model; fails the test (never skips it) when it is missing.
pub fn model_path(model: DefaultModel) -> PathBuf {
    match model.locate() {
        Ok(path) => path,
        Err(e) => panic!("{e} (the tests need both default models: bash scripts/fetch-models.sh)"),
    }
}

/// A file under `tests/data/`.
pub fn data_path(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(relative)
}

/// Greedy continuation of `prompt` for `n` tokens on `threads` threads in FFN mode `mode`, and
/// the logits of every step.
pub fn greedy_with_logits(
    model: &hotcold::model::Model,
    mode: hotcold::engine::FfnMode,
    prompt: &[u32],
    n: usize,
    threads: usize,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    greedy_with_setup(model, |s| s.set_ffn_mode(mode).unwrap(), prompt, n, threads)
}

/// Greedy continuation of `prompt` for `n` tokens on `threads` threads on a session `setup`
/// configures, and the logits of every step.
pub fn greedy_with_setup(
    model: &hotcold::model::Model,
    setup: impl FnOnce(&mut hotcold::engine::Session),
    prompt: &[u32],
    n: usize,
    threads: usize,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    use hotcold::engine::{thread_pool, Logits, Session};
    let mut session = Session::new(model, 256, thread_pool(threads).unwrap());
    setup(&mut session);
    let mut logits = session.eval(prompt, Logits::Last).unwrap();
    let (mut tokens, mut all) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let next = hotcold::sample::argmax(&logits);
        tokens.push(next);
        all.push(logits);
        logits = session.eval(&[next], Logits::Last).unwrap();
    }
    (tokens, all)
}
