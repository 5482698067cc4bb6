//! Text generation: evaluate a prompt, then sample, stream and stop, with timings.

use web_time::Instant;

use super::session::{Logits, Session};
use crate::sample::Sampler;
use crate::tokenizer::{StreamDecoder, Tokenizer};
use crate::{Error, Result};

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

/// What one [`Generator::step`] produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The token sampled (`None` when the generation had already stopped or `max_tokens` is 0).
    pub token: Option<u32>,
    /// The complete UTF-8 text this step adds (may be empty while a character is incomplete; on
    /// the last step it includes whatever the decoder still held).
    pub text: String,
    /// Set on the last step: why the generation stopped.
    pub stop: Option<StopReason>,
}

/// Generation one token at a time, for front-ends that stream and may stop between tokens (the
/// browser page): [`Generator::new`] evaluates the prompt, each [`Generator::step`] samples one
/// token (evaluating the previous one first). The session and sampler are passed to every call so
/// that the caller keeps owning them.
pub struct Generator<'t> {
    tokenizer: &'t Tokenizer,
    decoder: StreamDecoder<'t>,
    opts: GenerateOptions,
    logits: Vec<f32>,
    /// The last token sampled, not yet evaluated (evaluated at the start of the next step, so that
    /// a caller stopping after a step never pays for an evaluation it does not use).
    pending: Option<u32>,
    tokens: Vec<u32>,
    stop: Option<StopReason>,
}

impl<'t> Generator<'t> {
    /// Appends `prompt` to the session (the sampler sees its tokens) and evaluates it.
    pub fn new(
        session: &mut Session,
        tokenizer: &'t Tokenizer,
        sampler: &mut Sampler,
        prompt: &[u32],
        opts: GenerateOptions,
    ) -> Result<Generator<'t>> {
        let logits = session.eval(prompt, Logits::Last)?;
        Ok(Generator::with_prompt_logits(
            tokenizer, sampler, prompt, logits, opts,
        ))
    }

    /// A generation whose prompt another forward pass (the GPU's, awaited in a browser) has
    /// evaluated: `logits` are its last token's. The sampler sees the prompt's tokens. Drive it
    /// with [`Generator::needs_eval`], [`Generator::set_logits`] and [`Generator::sample_step`].
    pub fn with_prompt_logits(
        tokenizer: &'t Tokenizer,
        sampler: &mut Sampler,
        prompt: &[u32],
        logits: Vec<f32>,
        opts: GenerateOptions,
    ) -> Generator<'t> {
        for &t in prompt {
            sampler.accept(t);
        }
        Generator {
            tokenizer,
            decoder: tokenizer.stream_decoder(false),
            opts,
            logits,
            pending: None,
            tokens: Vec::new(),
            stop: None,
        }
    }

    /// Samples the next token and decodes it; once [`Step::stop`] has been returned, every later
    /// call returns it again without sampling.
    pub fn step(&mut self, session: &mut Session, sampler: &mut Sampler) -> Result<Step> {
        if let Some(prev) = self.needs_eval() {
            self.set_logits(session.eval(&[prev], Logits::Last)?);
        }
        self.sample_step(sampler, session.n_past(), session.n_ctx())
    }

    /// The token the previous step sampled, which the forward pass must evaluate (appending it at
    /// the next position) before [`Generator::sample_step`]; `None` when there is none.
    pub fn needs_eval(&self) -> Option<u32> {
        self.pending
    }

    /// Hands over the logits of the token [`Generator::needs_eval`] named.
    pub fn set_logits(&mut self, logits: Vec<f32>) {
        self.logits = logits;
        self.pending = None;
    }

    /// [`Generator::step`] for a caller that evaluates tokens itself: samples from the last
    /// logits, with `n_past` tokens of the `n_ctx` context filled.
    ///
    /// Errors: [`Error::InvalidArgument`] when the token of [`Generator::needs_eval`] has not
    /// been evaluated yet.
    pub fn sample_step(
        &mut self,
        sampler: &mut Sampler,
        n_past: usize,
        n_ctx: usize,
    ) -> Result<Step> {
        if let Some(stop) = self.stop {
            return Ok(Step {
                token: None,
                text: String::new(),
                stop: Some(stop),
            });
        }
        if let Some(prev) = self.pending {
            return Err(Error::InvalidArgument(format!(
                "token {prev} was sampled but not evaluated before the next step"
            )));
        }
        if self.tokens.len() >= self.opts.max_tokens {
            return Ok(self.finish_with(None, String::new(), StopReason::MaxTokens));
        }
        let next = sampler.sample(&self.logits);
        self.tokens.push(next);
        if !self.opts.ignore_eos && self.tokenizer.is_eog(next) {
            return Ok(self.finish_with(Some(next), String::new(), StopReason::EndOfGeneration));
        }
        let text = self.decoder.push(next);
        if self.tokens.len() >= self.opts.max_tokens {
            return Ok(self.finish_with(Some(next), text, StopReason::MaxTokens));
        }
        if n_past >= n_ctx {
            return Ok(self.finish_with(Some(next), text, StopReason::ContextFull));
        }
        self.pending = Some(next);
        Ok(Step {
            token: Some(next),
            text,
            stop: None,
        })
    }

    /// Stops the generation (the caller asked to) and returns what the decoder still held.
    pub fn cancel(&mut self) -> String {
        if self.stop.is_some() {
            return String::new();
        }
        self.stop = Some(StopReason::Callback);
        self.pending = None;
        self.decoder.finish()
    }

    /// Why the generation stopped, once it has.
    pub fn stop_reason(&self) -> Option<StopReason> {
        self.stop
    }

    /// The tokens sampled so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    fn finish_with(&mut self, token: Option<u32>, mut text: String, stop: StopReason) -> Step {
        self.stop = Some(stop);
        text.push_str(&self.decoder.finish());
        Step {
            token,
            text,
            stop: Some(stop),
        }
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
    let mut generator = Generator::new(session, tokenizer, sampler, prompt, opts)?;
    let prompt_secs = start.elapsed().as_secs_f64();
    let start = Instant::now();
    let stop = loop {
        let step = generator.step(session, sampler)?;
        if !step.text.is_empty() && !on_text(&step.text) {
            let rest = generator.cancel();
            if !rest.is_empty() {
                on_text(&rest);
            }
            break StopReason::Callback;
        }
        if let Some(stop) = step.stop {
            break stop;
        }
    };
    Ok(GenerationStats {
        prompt_tokens: prompt.len(),
        prompt_secs,
        generated_tokens: generator.tokens().len(),
        decode_secs: start.elapsed().as_secs_f64(),
        stop,
        tokens: generator.tokens().to_vec(),
    })
}
