//! Text generation: evaluate a prompt, then sample, stream and stop, with timings.

use std::time::Instant;

use super::session::{Logits, Session};
use crate::sample::Sampler;
use crate::tokenizer::Tokenizer;
use crate::Result;

/// Limits of one generation.
#[derive(Clone, Copy, Debug)]
pub struct GenerateOptions {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
}

/// Why a generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced an end-of-generation token.
    EndOfGeneration,
    /// `max_tokens` were generated.
    MaxTokens,
    /// The context is full.
    ContextFull,
    /// The text callback asked to stop.
    Callback,
}

/// Counts and timings of one generation.
#[derive(Clone, Debug)]
pub struct GenerationStats {
    /// Prompt tokens evaluated.
    pub prompt_tokens: usize,
    /// Seconds spent on the prompt.
    pub prompt_secs: f64,
    /// Tokens generated.
    pub generated_tokens: usize,
    /// Seconds spent generating (each step: one forward pass and one sample).
    pub decode_secs: f64,
    /// Why it stopped.
    pub stop: StopReason,
    /// The generated token ids.
    pub tokens: Vec<u32>,
}

impl GenerationStats {
    /// Prompt tokens per second.
    pub fn prompt_tok_per_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prompt_secs.max(1e-9)
    }

    /// Generated tokens per second (the first token's forward pass belongs to the prompt).
    pub fn decode_tok_per_s(&self) -> f64 {
        self.generated_tokens.saturating_sub(1) as f64 / self.decode_secs.max(1e-9)
    }
}

/// Appends `prompt` to the session, then samples up to `opts.max_tokens` tokens, handing each
/// complete piece of UTF-8 text to `on_text` (which returns `false` to stop).
pub fn generate(
    session: &mut Session,
    tokenizer: &Tokenizer,
    sampler: &mut Sampler,
    prompt: &[u32],
    opts: GenerateOptions,
    mut on_text: impl FnMut(&str) -> bool,
) -> Result<GenerationStats> {
    let start = Instant::now();
    for &t in prompt {
        sampler.accept(t);
    }
    let mut logits = session.eval(prompt, Logits::Last)?;
    let prompt_secs = start.elapsed().as_secs_f64();
    let start = Instant::now();
    let mut decoder = tokenizer.stream_decoder(false);
    let mut tokens = Vec::new();
    let stop = loop {
        if tokens.len() >= opts.max_tokens {
            break StopReason::MaxTokens;
        }
        let next = sampler.sample(&logits);
        tokens.push(next);
        if !opts.ignore_eos && tokenizer.is_eog(next) {
            break StopReason::EndOfGeneration;
        }
        let text = decoder.push(next);
        if !text.is_empty() && !on_text(&text) {
            break StopReason::Callback;
        }
        if tokens.len() >= opts.max_tokens {
            break StopReason::MaxTokens;
        }
        if session.n_past() >= session.n_ctx() {
            break StopReason::ContextFull;
        }
        logits = session.eval(&[next], Logits::Last)?;
    };
    let rest = decoder.finish();
    if !rest.is_empty() {
        on_text(&rest);
    }
    Ok(GenerationStats {
        prompt_tokens: prompt.len(),
        prompt_secs,
        generated_tokens: tokens.len(),
        decode_secs: start.elapsed().as_secs_f64(),
        stop,
        tokens,
    })
}
