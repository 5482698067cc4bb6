//! A model loaded from bytes and one generation over it, stepped token by token: what the page
//! drives through the bindings in `lib.rs`, written in plain Rust so that it is tested natively.
//!
//! All the work is hotcold-core's: [`GgufFile::from_bytes`], [`Model`], [`Tokenizer`],
//! [`Session`], [`Generator`] and [`Sampler`]; this module only owns them together.

use std::sync::{Arc, Mutex};

use hotcold_core::engine::{
    neuron_bytes, FfnMode, GenerateOptions, Generator, Session, StopReason,
};
use hotcold_core::gguf::GgufFile;
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
    /// Mean over the layers of the FFN neurons computed per token (1 for dense).
    pub computed_density: f64,
}

/// The model and its tokenizer, boxed so that their addresses never change.
struct Weights {
    model: Model,
    tokenizer: Tokenizer,
}

/// One generation: a session over the model, its sampler and the step-wise generator.
struct Run {
    session: Session<'static>,
    generator: Generator<'static>,
    sampler: Sampler,
    timings: Timings,
}

/// A loaded model and at most one generation over it.
pub struct Runner {
    // Declared (so dropped) before `weights`, which it borrows.
    run: Option<Run>,
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

    /// Starts a new generation (dropping any current one): evaluates `prompt` and resets the
    /// firing statistics. Returns the number of prompt tokens.
    pub fn start(&mut self, prompt: &str, opts: &StartOptions) -> Result<usize> {
        self.run = None;
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
        // SAFETY: `weights` is boxed, never moved out of its box nor mutated while `self` lives,
        // and `run`, the only holder of these references, is declared before it, so it is
        // dropped first (and replaced only through `self.run`). The references never leave
        // `Runner`.
        let (model, tokenizer): (&'static Model, &'static Tokenizer) = unsafe {
            let w: *const Weights = &*self.weights;
            (&(*w).model, &(*w).tokenizer)
        };
        let pool = crate::pool::shared_pool()?;
        let mut session = Session::new(model, self.info.n_ctx, pool);
        if let Some(mode) = opts.ffn {
            session.set_ffn_mode(mode)?;
        }
        let stats = Arc::new(Mutex::new(FiringStats::new(
            self.info.n_layer,
            self.info.n_ff,
        )));
        session.set_ffn_observer(Some(observer(stats.clone())));
        self.stats = stats;
        let mut sampler = Sampler::new(SamplerConfig {
            temperature: opts.temperature,
            seed: opts.seed,
            ..SamplerConfig::default()
        });
        let gen_opts = GenerateOptions {
            max_tokens: opts.max_tokens,
            ignore_eos: false,
        };
        let start = Instant::now();
        let generator = Generator::new(&mut session, tokenizer, &mut sampler, &tokens, gen_opts)?;
        let timings = Timings {
            prompt_tokens: tokens.len(),
            prompt_secs: start.elapsed().as_secs_f64(),
            ..Timings::default()
        };
        self.run = Some(Run {
            session,
            generator,
            sampler,
            timings,
        });
        Ok(tokens.len())
    }

    /// Samples the next token: its text (possibly empty while a character is incomplete), or
    /// `None` once the generation has stopped (or none was started).
    pub fn next_token(&mut self) -> Result<Option<String>> {
        let Some(run) = self.run.as_mut() else {
            return Ok(None);
        };
        if run.generator.stop_reason().is_some() {
            return Ok(None);
        }
        let start = Instant::now();
        let step = run.generator.step(&mut run.session, &mut run.sampler)?;
        let t = &mut run.timings;
        t.decode_secs += start.elapsed().as_secs_f64();
        t.generated_tokens = run.generator.tokens().len();
        Ok(Some(step.text))
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
        t.computed_density = run.session.ffn_density().mean();
        t
    }

    /// FFN neurons computed per token, per layer, over the current generation (1 for dense).
    pub fn computed_density(&self) -> Vec<f64> {
        self.run
            .as_ref()
            .map(|r| r.session.ffn_density().per_layer())
            .unwrap_or_default()
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
