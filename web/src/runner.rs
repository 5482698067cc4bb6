//! A model loaded from bytes and one generation over it, stepped token by token: what the page
//! drives through the bindings in `lib.rs`, written in plain Rust so that it is tested natively.
//!
//! All the work is hotcold-core's: [`GgufFile::from_bytes`], [`Model`], [`Tokenizer`],
//! [`Session`] (or, on a GPU, [`GpuModel`] and [`GpuSession`]), [`Generator`] and [`Sampler`];
//! this module only owns them together.
//!
//! Two compute paths: the CPU one is synchronous ([`Runner::start`], [`Runner::next_token`]); the
//! GPU one awaits each forward pass's logits ([`Runner::start_async`],
//! [`Runner::next_token_async`], which also run the CPU path), because in a browser WebGPU only
//! maps a buffer when control returns to the event loop.

use std::sync::{Arc, Mutex};

use hotcold_core::engine::{
    neuron_bytes, FfnMode, GenerateOptions, Generator, Logits, Session, StopReason,
};
use hotcold_core::gguf::GgufFile;
use hotcold_core::gpu::forward::{GpuModel, GpuSession, MAX_TOKENS_PER_SUBMIT};
use hotcold_core::gpu::GpuContext;
use hotcold_core::model::Model;
use hotcold_core::placement::{self, Problem};
use hotcold_core::sample::{Sampler, SamplerConfig};
use hotcold_core::tokenizer::Tokenizer;
use hotcold_core::{Error, Result};
use serde::Serialize;
use web_time::Instant;

use crate::stats::{observer, FiringStats};

/// Default context size in the browser (the model's own when smaller).
pub const DEFAULT_N_CTX: usize = 2048;

/// What the page shows about a loaded model, and what it needs to split neurons hot/cold.
#[derive(Clone, Debug, Serialize)]
pub struct ModelInfo {
    /// `general.architecture`.
    pub arch: String,
    /// `PWRI` (PowerInfer) or `GGUF`.
    pub format: String,
    /// Blocks.
    pub n_layer: usize,
    /// FFN neurons per block.
    pub n_ff: usize,
    /// Residual width.
    pub n_embd: usize,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// Context size of this engine.
    pub n_ctx: usize,
    /// Whether every layer has a PowerInfer predictor (the default FFN mode is then sparse).
    pub has_predictor: bool,
    /// Bytes of one neuron's FFN weights per layer (its gate and up rows and its down column).
    pub neuron_bytes: Vec<f64>,
    /// Bytes of the whole file.
    pub file_bytes: u64,
    /// Seconds the load took (parse, weights, tokenizer).
    pub load_secs: f64,
    /// The CPU kernels in use (`scalar` in the browser).
    pub simd: String,
}

/// The hot/cold split of the FFN neurons for a VRAM budget, as the page draws it.
#[derive(Clone, Debug, Serialize)]
pub struct Split {
    /// Hot neurons per layer (each layer's most frequently firing ones).
    pub hot: Vec<usize>,
    /// Per layer, the expected share of its firing neurons that the hot ones are.
    pub hit_rate: Vec<f64>,
    /// Bytes of FFN weights the split places on the GPU.
    pub bytes: u64,
}

/// Settings of one generation.
#[derive(Clone, Debug)]
pub struct StartOptions {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Sampling temperature (`<= 0`: greedy).
    pub temperature: f32,
    /// Seed of the sampler.
    pub seed: u64,
    /// The FFN mode (`None`: the model's default, sparse when it has predictors).
    pub ffn: Option<FfnMode>,
}

/// Counts and timings of the current generation.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Timings {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Seconds the prompt took.
    pub prompt_secs: f64,
    /// Tokens sampled.
    pub generated_tokens: usize,
    /// Seconds spent in the steps after the prompt.
    pub decode_secs: f64,
    /// Generated tokens per second.
    pub decode_tok_per_s: f64,
    /// Mean over the layers of the FFN neurons computed per token (1 for dense; `None` on the
    /// GPU, which does not count them).
    pub computed_density: Option<f64>,
}

/// The model and its tokenizer, boxed so that their addresses never change.
struct Weights {
    model: Model,
    tokenizer: Tokenizer,
}

/// The forward pass of one generation: a CPU session, or a GPU one with its FFN mode (both
/// boxed: their sizes differ a lot, and by target).
enum Forward {
    Cpu(Box<Session<'static>>),
    Gpu {
        session: Box<GpuSession>,
        model: &'static Model,
        mode: FfnMode,
    },
}

/// One generation: a session over the model, its sampler and the step-wise generator.
struct Run {
    forward: Forward,
    generator: Generator<'static>,
    sampler: Sampler,
    timings: Timings,
}

/// A loaded model and at most one generation over it.
pub struct Runner {
    // Declared (so dropped) before `weights`, which it borrows.
    run: Option<Run>,
    /// The model's weights on the GPU, when generations run there.
    gpu: Option<Arc<GpuModel>>,
    stats: Arc<Mutex<FiringStats>>,
    weights: Box<Weights>,
    info: ModelInfo,
}

impl Runner {
    /// Parses a GGUF (or PowerInfer) file from `bytes` and loads its weights and tokenizer, with
    /// a context of `n_ctx` tokens (0: the model's training context, at most [`DEFAULT_N_CTX`]).
    pub fn load(bytes: impl Into<Arc<[u8]>>, n_ctx: usize) -> Result<Runner> {
        let start = Instant::now();
        let bytes = bytes.into();
        let file_bytes = bytes.len() as u64;
        let file = Arc::new(GgufFile::from_bytes(bytes)?);
        let pool = crate::pool::shared_pool()?;
        // Everything runs inside the pool: on wasm32 a rayon call outside it would try to start
        // the global pool, which cannot take the thread this one already owns.
        let (model, tokenizer) = pool.install(|| {
            let model = Model::from_file(file)?;
            let tokenizer = Tokenizer::from_gguf(model.file())?;
            Ok::<_, Error>((model, tokenizer))
        })?;
        let hp = &model.hp;
        let n_ctx = if n_ctx == 0 {
            hp.n_ctx_train.min(DEFAULT_N_CTX)
        } else {
            n_ctx
        };
        let info = ModelInfo {
            arch: model.file().architecture()?.to_string(),
            format: model.file().magic().format_name().to_string(),
            n_layer: hp.n_layer,
            n_ff: hp.n_ff,
            n_embd: hp.n_embd,
            n_vocab: hp.n_vocab,
            n_ctx,
            has_predictor: model.layers.iter().all(|l| l.predictor.is_some()),
            neuron_bytes: (0..hp.n_layer)
                .map(|il| neuron_bytes(&model, il) as f64)
                .collect(),
            file_bytes,
            load_secs: start.elapsed().as_secs_f64(),
            simd: hotcold_core::cpu::simd_level().to_string(),
        };
        let stats = Arc::new(Mutex::new(FiringStats::new(hp.n_layer, hp.n_ff)));
        Ok(Runner {
            run: None,
            gpu: None,
            stats,
            weights: Box::new(Weights { model, tokenizer }),
            info,
        })
    }

    /// The model's description.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// Token ids of `text` (with BOS and special tokens parsed, as `hotcold run` encodes prompts).
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>> {
        self.weights.tokenizer.encode(text, true, true)
    }

    /// Moves the model's weights to `ctx`'s GPU: later generations run there (the current one is
    /// dropped). Returns the bytes uploaded.
    ///
    /// Errors: what the GPU-resident forward pass does not run (the architecture, a weight type)
    /// or a failed upload; the runner then stays on the CPU.
    // WebGPU's objects are neither Send nor Sync (a page runs them on one thread); the Arc is
    // what GpuSession takes.
    #[cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]
    pub fn use_gpu(&mut self, ctx: Arc<GpuContext>) -> Result<u64> {
        self.run = None;
        self.gpu = None;
        let gpu = GpuModel::upload(ctx, &self.weights.model, FfnMode::Dense)?;
        let bytes = gpu.bytes();
        self.gpu = Some(Arc::new(gpu));
        Ok(bytes)
    }

    /// Runs later generations on the CPU (frees the GPU's copy of the weights).
    pub fn use_cpu(&mut self) {
        self.run = None;
        self.gpu = None;
    }

    /// The GPU the runner uses, if any.
    pub fn gpu(&self) -> Option<&Arc<GpuContext>> {
        self.gpu.as_ref().map(|g| g.context())
    }

    /// Starts a new generation on the CPU (dropping any current one): evaluates `prompt` and
    /// resets the firing statistics. Returns the number of prompt tokens.
    ///
    /// Errors: [`Error::InvalidArgument`] on the GPU path, whose start must be awaited
    /// ([`Runner::start_async`]); a bad prompt.
    pub fn start(&mut self, prompt: &str, opts: &StartOptions) -> Result<usize> {
        if self.gpu.is_some() {
            return Err(Error::InvalidArgument(
                "the GPU path is asynchronous: use start_async".into(),
            ));
        }
        self.run = None;
        let tokens = self.prompt_tokens(prompt)?;
        let (model, tokenizer) = self.static_weights();
        let pool = crate::pool::shared_pool()?;
        let mut session = Session::new(model, self.info.n_ctx, pool);
        if let Some(mode) = opts.ffn {
            session.set_ffn_mode(mode)?;
        }
        session.set_ffn_observer(Some(observer(self.reset_stats())));
        let mut sampler = sampler(opts);
        let start = Instant::now();
        let generator = Generator::new(
            &mut session,
            tokenizer,
            &mut sampler,
            &tokens,
            generate_options(opts),
        )?;
        self.run = Some(Run {
            forward: Forward::Cpu(Box::new(session)),
            generator,
            sampler,
            timings: prompt_timings(tokens.len(), start),
        });
        Ok(tokens.len())
    }

    /// [`Runner::start`] on either path: on the GPU the prompt's forward passes (up to
    /// [`MAX_TOKENS_PER_SUBMIT`] tokens a submission) are awaited. The firing statistics are not
    /// gathered on the GPU (they are reset).
    pub async fn start_async(&mut self, prompt: &str, opts: &StartOptions) -> Result<usize> {
        let Some(gpu) = self.gpu.clone() else {
            return self.start(prompt, opts);
        };
        self.run = None;
        let tokens = self.prompt_tokens(prompt)?;
        let (model, tokenizer) = self.static_weights();
        let mode = match opts.ffn {
            Some(mode) => mode,
            None if self.info.has_predictor => FfnMode::Sparse,
            None => FfnMode::Dense,
        };
        self.reset_stats();
        let mut session = GpuSession::new(gpu, self.info.n_ctx)?;
        let start = Instant::now();
        let mut logits = Vec::new();
        for chunk in tokens.chunks(MAX_TOKENS_PER_SUBMIT) {
            logits = session.submit(model, chunk, Logits::Last, mode)?.await?;
        }
        let mut sampler = sampler(opts);
        let generator = Generator::with_prompt_logits(
            tokenizer,
            &mut sampler,
            &tokens,
            logits,
            generate_options(opts),
        );
        self.run = Some(Run {
            forward: Forward::Gpu {
                session: Box::new(session),
                model,
                mode,
            },
            generator,
            sampler,
            timings: prompt_timings(tokens.len(), start),
        });
        Ok(tokens.len())
    }

    /// The prompt's tokens, checked against the context.
    fn prompt_tokens(&self, prompt: &str) -> Result<Vec<u32>> {
        let tokens = self.tokenize(prompt)?;
        if tokens.is_empty() {
            return Err(Error::InvalidArgument("the prompt is empty".into()));
        }
        if tokens.len() >= self.info.n_ctx {
            return Err(Error::InvalidArgument(format!(
                "the prompt has {} tokens, more than the context of {}",
                tokens.len(),
                self.info.n_ctx
            )));
        }
        Ok(tokens)
    }

    /// The model and tokenizer, for a [`Run`] to hold.
    fn static_weights(&self) -> (&'static Model, &'static Tokenizer) {
        // SAFETY: `weights` is boxed, never moved out of its box nor mutated while `self` lives,
        // and `run`, the only holder of these references, is declared before it, so it is
        // dropped first (and replaced only through `self.run`). The references never leave
        // `Runner`.
        unsafe {
            let w: *const Weights = &*self.weights;
            (&(*w).model, &(*w).tokenizer)
        }
    }

    /// New, empty firing statistics (those the page reads from now on).
    fn reset_stats(&mut self) -> Arc<Mutex<FiringStats>> {
        self.stats = Arc::new(Mutex::new(FiringStats::new(
            self.info.n_layer,
            self.info.n_ff,
        )));
        self.stats.clone()
    }

    /// Samples the next token on the CPU: its text (possibly empty while a character is
    /// incomplete), or `None` once the generation has stopped (or none was started).
    ///
    /// Errors: [`Error::InvalidArgument`] for a GPU generation (use [`Runner::next_token_async`]).
    pub fn next_token(&mut self) -> Result<Option<String>> {
        let Some(run) = self.live_run() else {
            return Ok(None);
        };
        let start = Instant::now();
        let step = match &mut run.forward {
            Forward::Cpu(session) => run.generator.step(session, &mut run.sampler)?,
            Forward::Gpu { .. } => {
                return Err(Error::InvalidArgument(
                    "the GPU path is asynchronous: use next_token_async".into(),
                ))
            }
        };
        run.count_step(start);
        Ok(Some(step.text))
    }

    /// [`Runner::next_token`] on either path: on the GPU the previous token's forward pass is
    /// awaited.
    pub async fn next_token_async(&mut self) -> Result<Option<String>> {
        let Some(run) = self.live_run() else {
            return Ok(None);
        };
        let start = Instant::now();
        let step = match &mut run.forward {
            Forward::Cpu(session) => run.generator.step(session, &mut run.sampler)?,
            Forward::Gpu {
                session,
                model,
                mode,
            } => {
                if let Some(token) = run.generator.needs_eval() {
                    let logits = session
                        .submit(model, &[token], Logits::Last, *mode)?
                        .await?;
                    run.generator.set_logits(logits);
                }
                run.generator
                    .sample_step(&mut run.sampler, session.n_past(), session.n_ctx())?
            }
        };
        run.count_step(start);
        Ok(Some(step.text))
    }

    /// The current generation, unless it has stopped.
    fn live_run(&mut self) -> Option<&mut Run> {
        self.run
            .as_mut()
            .filter(|r| r.generator.stop_reason().is_none())
    }

    /// Stops the current generation; returns the text the decoder still held.
    pub fn stop(&mut self) -> String {
        self.run
            .as_mut()
            .map(|r| r.generator.cancel())
            .unwrap_or_default()
    }

    /// Why the current generation stopped, once it has.
    pub fn stop_reason(&self) -> Option<StopReason> {
        self.run.as_ref().and_then(|r| r.generator.stop_reason())
    }

    /// The tokens generated so far.
    pub fn generated(&self) -> &[u32] {
        self.run.as_ref().map_or(&[], |r| r.generator.tokens())
    }

    /// Counts and timings of the current generation.
    pub fn timings(&self) -> Timings {
        let Some(run) = &self.run else {
            return Timings::default();
        };
        let mut t = run.timings.clone();
        // The first token comes from the prompt's forward pass (as in `hotcold run`).
        t.decode_tok_per_s = t.generated_tokens.saturating_sub(1) as f64 / t.decode_secs.max(1e-9);
        if let Forward::Cpu(session) = &run.forward {
            t.computed_density = Some(session.ffn_density().mean());
        }
        t
    }

    /// FFN neurons computed per token, per layer, over the current generation (1 for dense;
    /// empty on the GPU, which does not count them).
    pub fn computed_density(&self) -> Vec<f64> {
        match self.run.as_ref().map(|r| &r.forward) {
            Some(Forward::Cpu(session)) => session.ffn_density().per_layer(),
            _ => Vec::new(),
        }
    }

    /// Fraction of each layer's FFN neurons that fired for the last token evaluated.
    pub fn last_token_density(&self) -> Vec<f32> {
        self.with_stats(|s| s.last_token_density().to_vec())
    }

    /// `n_layer × n_ff` firing frequencies over the tokens evaluated (prompt included).
    pub fn firing_frequencies(&self) -> Vec<f32> {
        self.with_stats(FiringStats::frequencies)
    }

    /// The placement planner's split ([`placement::solve`]) of the FFN neurons for `budget` bytes,
    /// from the firing frequencies observed so far. Only the FFN neurons are placed, as in the
    /// native hybrid pass.
    pub fn hot_cold_split(&self, budget: u64) -> Result<Split> {
        let model = &self.weights.model;
        let freqs = self.firing_frequencies();
        let layers = freqs
            .chunks_exact(model.hp.n_ff)
            .enumerate()
            .map(|(il, f)| placement::Layer {
                neuron_bytes: neuron_bytes(model, il),
                frequencies: f.to_vec(),
                dense_bytes: 0,
            })
            .collect();
        let problem = Problem {
            layers,
            globals: Vec::new(),
            budget,
        };
        let plan = placement::solve(&problem)?;
        Ok(Split {
            hot: plan.hot.iter().map(Vec::len).collect(),
            hit_rate: plan.layer_gpu_share(&problem),
            bytes: plan.gpu_bytes,
        })
    }

    fn with_stats<T: Default>(&self, f: impl FnOnce(&FiringStats) -> T) -> T {
        self.stats.lock().map(|s| f(&s)).unwrap_or_default()
    }
}

impl Run {
    /// Adds a step that began at `start` to the timings.
    fn count_step(&mut self, start: Instant) {
        self.timings.decode_secs += start.elapsed().as_secs_f64();
        self.timings.generated_tokens = self.generator.tokens().len();
    }
}

/// The sampler `opts` asks for.
fn sampler(opts: &StartOptions) -> Sampler {
    Sampler::new(SamplerConfig {
        temperature: opts.temperature,
        seed: opts.seed,
        ..SamplerConfig::default()
    })
}

/// The generator's limits for `opts`.
fn generate_options(opts: &StartOptions) -> GenerateOptions {
    GenerateOptions {
        max_tokens: opts.max_tokens,
        ignore_eos: false,
    }
}

/// The timings of a prompt of `n` tokens whose evaluation began at `start`.
fn prompt_timings(n: usize, start: Instant) -> Timings {
    Timings {
        prompt_tokens: n,
        prompt_secs: start.elapsed().as_secs_f64(),
        ..Timings::default()
    }
}
