//! Flags and set-up shared by the subcommands that run a model.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use hotcold_core::engine::{default_ffn_mode, thread_pool, FfnMode, FfnOffload, Session};
use hotcold_core::gpu::forward::GpuModel;
use hotcold_core::model::Model;
use hotcold_core::models::DefaultModel;
use hotcold_core::quant::GgmlType;
use hotcold_core::sample::SamplerConfig;
use hotcold_core::tokenizer::Tokenizer;

use super::model_arg;

/// `-m`, `-t`, `-c`: which model, how many threads, how much context.
#[derive(clap::Args, Clone)]
pub struct ModelArgs {
    /// GGUF model file (default: the cached default model of the subcommand).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Worker threads (default: one per core).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Context size in tokens (default: the model's training context, at most 4096).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// How the FFN picks its neurons: every neuron, the predictor's set, or the exact active set
    /// (default: sparse when the file has predictors, else dense).
    #[arg(long = "ffn", value_enum)]
    pub ffn: Option<FfnArg>,
    /// `--device`, `--vram-budget`.
    #[command(flatten)]
    pub device: super::device::DeviceArgs,
    /// Keep the predictors as stored (`file`) or re-encode them as Q8_0 in memory (`q8_0`: about
    /// half the bytes of F16 ones per token; the file is untouched). `auto`: Q8_0 when the file
    /// stores them as floats (F32, F16, BF16), else as stored.
    #[arg(long = "predictor-type", value_enum, default_value = "auto")]
    pub predictor_type: PredictorTypeArg,
}

/// `--predictor-type` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PredictorTypeArg {
    /// Q8_0 for float predictors, else as stored.
    Auto,
    /// As stored in the file.
    File,
    /// Re-encoded as Q8_0 at load time.
    #[value(name = "q8_0")]
    Q8_0,
}

/// `--ffn` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum FfnArg {
    /// Every neuron.
    Dense,
    /// The neurons the file's predictor selects.
    Sparse,
    /// The neurons that really fire (gate dense, the rest sparse).
    Oracle,
    /// Training-free sparsity: skip neurons whose gate activation is below the calibrated threshold.
    Cats,
}

impl From<FfnArg> for FfnMode {
    fn from(arg: FfnArg) -> FfnMode {
        match arg {
            FfnArg::Dense => FfnMode::Dense,
            FfnArg::Sparse => FfnMode::Sparse,
            FfnArg::Oracle => FfnMode::Oracle,
            FfnArg::Cats => FfnMode::Cats,
        }
    }
}

/// Sampling flags, with llama.cpp's names and defaults.
#[derive(clap::Args, Clone)]
pub struct SamplingArgs {
    /// Temperature; 0 = greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temp: f32,
    /// Top-k (0 = off).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Top-p (1 = off).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Min-p (0 = off).
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Repetition penalty (1 = off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Tokens the repetition penalty looks back on.
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Random seed (default: from the clock).
    #[arg(short = 's', long = "seed")]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    /// The sampler settings these flags describe.
    pub fn config(&self) -> SamplerConfig {
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        });
        SamplerConfig {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            seed,
        }
    }
}

/// A model ready to run: weights, tokenizer, thread pool, context size.
pub struct Loaded {
    /// The weights.
    pub model: Model,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    /// The kernels' threads.
    pub pool: Arc<rayon::ThreadPool>,
    /// Context size.
    pub n_ctx: usize,
    /// Seconds the load took.
    pub load_secs: f64,
    /// `--ffn`, when given.
    pub ffn: Option<FfnMode>,
    /// Where the FFN runs (`--device`, `--vram-budget`).
    pub offload: Arc<dyn FfnOffload>,
    /// The whole model on the GPU (`--device gpu` without a smaller `--vram-budget`).
    pub gpu_model: Option<Arc<GpuModel>>,
}

impl Loaded {
    /// A new session of `n_ctx` positions with the `--ffn` mode applied.
    pub fn session_with_ctx(&self, n_ctx: usize) -> anyhow::Result<Session<'_>> {
        let mut session = Session::new(&self.model, n_ctx, self.pool.clone());
        session.set_ffn_offload(self.offload.clone());
        if let Some(mode) = self.ffn {
            session.set_ffn_mode(mode)?;
        }
        if let Some(gpu) = &self.gpu_model {
            session.set_gpu_model(gpu.clone())?;
        }
        Ok(session)
    }

    /// A new session of the configured context size.
    pub fn session(&self) -> anyhow::Result<Session<'_>> {
        self.session_with_ctx(self.n_ctx)
    }
}

/// A one-line summary of the FFN density of a session (for the timings on stderr).
pub fn density_summary(session: &Session) -> String {
    if session.on_gpu() {
        return format!(
            "ffn {:?}: density not counted on the GPU-resident path",
            session.ffn_mode()
        );
    }
    let density = session.ffn_density();
    let per_layer: Vec<String> = density
        .per_layer()
        .iter()
        .map(|d| format!("{d:.3}"))
        .collect();
    format!(
        "ffn {:?}: mean density {:.3} (per layer {})",
        session.ffn_mode(),
        density.mean(),
        per_layer.join(" ")
    )
}

impl ModelArgs {
    /// Loads the model (or `default`) with these flags, for one sequence at a time (the whole
    /// model may go to the GPU).
    pub fn load(&self, default: DefaultModel) -> anyhow::Result<Loaded> {
        self.load_with(default, true)
    }

    /// Loads the model for batched decoding (a GPU takes only the FFN).
    pub fn load_for_batches(&self, default: DefaultModel) -> anyhow::Result<Loaded> {
        self.load_with(default, false)
    }

    fn load_with(&self, default: DefaultModel, resident: bool) -> anyhow::Result<Loaded> {
        let start = Instant::now();
        let path = model_arg::resolve(self.model.clone(), default)?;
        let mut model =
            Model::open(&path).with_context(|| format!("cannot load {}", path.display()))?;
        if matches!(self.ffn, Some(FfnArg::Cats | FfnArg::Oracle)) {
            // The sparse axpy needs the down projection neuron-major.
            model.repack_down_t()?;
        }
        let float_predictors = model
            .layers
            .iter()
            .flat_map(|l| l.predictor.as_ref())
            .flat_map(|p| [p.fc1.ty, p.fc2.ty])
            .all(|ty| matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16));
        let q8_0 = match self.predictor_type {
            PredictorTypeArg::Auto => float_predictors,
            PredictorTypeArg::File => false,
            PredictorTypeArg::Q8_0 => true,
        };
        if q8_0 {
            model.quantize_predictors(GgmlType::Q8_0)?;
        }
        let tokenizer = Tokenizer::from_gguf(model.file()).context("cannot build the tokenizer")?;
        let threads = self
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        anyhow::ensure!(threads > 0, "-t must be at least 1");
        let pool = thread_pool(threads)?;
        let n_ctx = self.ctx_size.unwrap_or(model.hp.n_ctx_train.min(4096));
        anyhow::ensure!(n_ctx > 0, "-c must be at least 1");
        let ffn = self.ffn.map(FfnMode::from);
        let mode = ffn.unwrap_or_else(|| default_ffn_mode(&model));
        let placement = self.device.place(&model, mode, resident)?;
        let note = &placement.note;
        if self.device.device != super::device::DeviceArg::Auto || note != "device: cpu" {
            eprintln!("{note}");
        }
        Ok(Loaded {
            model,
            tokenizer,
            pool,
            n_ctx,
            load_secs: start.elapsed().as_secs_f64(),
            ffn,
            offload: placement.offload,
            gpu_model: placement.gpu_model,
        })
    }
}
