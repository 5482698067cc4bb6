//! Flags and set-up shared by the subcommands that run a model.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use hotcold_core::engine::{
    default_ffn_mode, thread_pool, FfnMode, FfnOffload, Session, Teal, TealOptions,
};
use hotcold_core::gpu::forward::GpuModel;
use hotcold_core::model::{Model, PredictorTypes};
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
    /// (default: sparse when the file has predictors, else dense). `sparse` on a file without
    /// predictors uses its calibrated training-free thresholds (see `--sparsity-mode`).
    #[arg(long = "ffn", value_enum)]
    pub ffn: Option<FfnArg>,
    /// Training-free sparsity for `--ffn sparse` (and for `calibrate --target-sparsity`): `cats`
    /// (FFN neurons by gate activation) or `teal` (the input of every matrix); default: the
    /// file's, TEAL when it has both.
    #[arg(long = "sparsity-mode", value_enum)]
    pub sparsity_mode: Option<SparsityModeArg>,
    /// Apply training-free sparsity to prompt processing too (default: prompts run dense).
    #[arg(long = "sparse-prefill")]
    pub sparse_prefill: bool,
    /// Keep a sparse model's FFN neurons in file order (default on the CPU: hottest first when
    /// the file records how often they fire, so that the often-chosen rows are read together).
    #[arg(long = "file-neuron-order")]
    pub file_neuron_order: bool,
    /// Type of TEAL's input-major weight copies (default: q8_0 for quantised matrices, f16/f32
    /// for float ones).
    #[arg(long = "teal-type", value_enum)]
    pub teal_type: Option<TealTypeArg>,
    /// `--device`, `--vram-budget`.
    #[command(flatten)]
    pub device: super::device::DeviceArgs,
    /// Keep the predictors as stored (`file`) or re-encode them in memory as Q8_0 (`q8_0`: about
    /// half the bytes of F16 ones per token) or Q4_0 (`q4_0`: a quarter, as PowerInfer's
    /// `quantize` stores the predictors of a Q4_0 model; faster, at some recall); the file is
    /// untouched. `auto`: for predictors stored as floats (F32, F16, BF16), Q8_0, with fc2 as
    /// Q4_0 in a model whose FFN weights are Q4_0; else as stored.
    #[arg(long = "predictor-type", value_enum, default_value = "auto")]
    pub predictor_type: PredictorTypeArg,
}

/// `--predictor-type` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PredictorTypeArg {
    /// Q8_0 for float predictors (fc2 Q4_0 in a Q4_0 model), else as stored.
    Auto,
    /// As stored in the file.
    File,
    /// Re-encoded as Q8_0 at load time.
    #[value(name = "q8_0")]
    Q8_0,
    /// Re-encoded as Q4_0 at load time (PowerInfer's choice for Q4_0 models).
    #[value(name = "q4_0")]
    Q4_0,
}

/// `--sparsity-mode` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SparsityModeArg {
    /// CATS: gate dense, FFN neurons with a small gate activation skipped in up and down.
    Cats,
    /// TEAL: every matrix's input channels below their calibrated threshold skipped.
    Teal,
}

/// `--teal-type` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TealTypeArg {
    /// 32-bit floats.
    F32,
    /// 16-bit floats.
    F16,
    /// ggml Q8_0 blocks over 32 outputs.
    #[value(name = "q8_0")]
    Q8_0,
    /// ggml Q5_0 blocks over 32 outputs.
    #[value(name = "q5_0")]
    Q5_0,
    /// ggml Q4_0 blocks over 32 outputs.
    #[value(name = "q4_0")]
    Q4_0,
}

impl From<TealTypeArg> for GgmlType {
    fn from(t: TealTypeArg) -> GgmlType {
        match t {
            TealTypeArg::F32 => GgmlType::F32,
            TealTypeArg::F16 => GgmlType::F16,
            TealTypeArg::Q8_0 => GgmlType::Q8_0,
            TealTypeArg::Q5_0 => GgmlType::Q5_0,
            TealTypeArg::Q4_0 => GgmlType::Q4_0,
        }
    }
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
    /// Training-free sparsity: skip neurons whose gate activation is below the calibrated
    /// threshold (the same as `--ffn sparse --sparsity-mode cats`).
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
    /// TEAL's operators, when `--ffn sparse` chose TEAL.
    pub teal: Option<Arc<Teal>>,
    /// `--sparse-prefill`.
    pub sparse_prefill: bool,
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
        if let Some(teal) = &self.teal {
            session.set_teal(teal.clone());
        }
        session.set_sparse_prefill(self.sparse_prefill);
        Ok(session)
    }

    /// A new session of the configured context size.
    pub fn session(&self) -> anyhow::Result<Session<'_>> {
        self.session_with_ctx(self.n_ctx)
    }
}

/// The FFN density of a session and, in TEAL mode, the skipped share of every layer's inputs
/// (for the timings on stderr).
pub fn sparsity_summary(loaded: &Loaded, session: &Session) -> String {
    let mut out = density_summary(session);
    if let Some(teal) = &loaded.teal {
        let stats = teal.stats();
        out.push_str(&format!(
            "\nteal: model sparsity {:.3}, input-major weights read per token {:.2} MiB",
            stats.model_sparsity(),
            stats.bytes_per_token() / (1 << 20) as f64
        ));
        for line in stats.per_layer_lines() {
            out.push_str("\nteal ");
            out.push_str(&line);
        }
    }
    out
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
        let ffn = self.resolve_ffn(&model)?;
        if matches!(ffn, Some(Ffn::Mode(FfnMode::Cats | FfnMode::Oracle))) {
            // The sparse axpy needs the down projection neuron-major.
            model.repack_down_t()?;
        }
        let predictor_types = match self.predictor_type {
            PredictorTypeArg::Auto => model.default_predictor_types(),
            PredictorTypeArg::File => None,
            PredictorTypeArg::Q8_0 => Some(PredictorTypes::both(GgmlType::Q8_0)),
            PredictorTypeArg::Q4_0 => Some(PredictorTypes::both(GgmlType::Q4_0)),
        };
        if let Some(types) = predictor_types {
            model.quantize_predictors(types)?;
        }
        let tokenizer = Tokenizer::from_gguf(model.file()).context("cannot build the tokenizer")?;
        let threads = self
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        anyhow::ensure!(threads > 0, "-t must be at least 1");
        let pool = thread_pool(threads)?;
        let n_ctx = self.ctx_size.unwrap_or(model.hp.n_ctx_train.min(4096));
        anyhow::ensure!(n_ctx > 0, "-c must be at least 1");
        let teal = match ffn {
            Some(Ffn::Teal) => {
                let opts = TealOptions {
                    repack: self.teal_type.map(GgmlType::from),
                    sparse_prefill: self.sparse_prefill,
                };
                let teal = pool.install(|| Teal::new(&model, opts))?;
                eprintln!(
                    "teal: input-major copies {:.1} MiB",
                    teal.repacked_bytes() as f64 / (1 << 20) as f64
                );
                Some(Arc::new(teal))
            }
            _ => None,
        };
        let placement = match (&teal, ffn) {
            (Some(_), _) => {
                anyhow::ensure!(
                    self.device.device != super::device::DeviceArg::Gpu,
                    "TEAL's input-sparse operators run on the CPU: use --device cpu or auto"
                );
                super::device::Placement::cpu("device: cpu (TEAL runs on the CPU)")
            }
            (None, Some(Ffn::Mode(mode))) => {
                self.device.place(&path, &model, mode, resident, n_ctx)?
            }
            (None, _) => {
                let mode = default_ffn_mode(&model);
                self.device.place(&path, &model, mode, resident, n_ctx)?
            }
        };
        let ffn_mode = match ffn {
            Some(Ffn::Mode(mode)) => Some(mode),
            Some(Ffn::Teal) => None,
            None => Some(default_ffn_mode(&model)),
        };
        if placement.cpu_only() && ffn_mode == Some(FfnMode::Sparse) && !self.file_neuron_order {
            order_neurons(&mut model)?;
        }
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
            ffn: match ffn {
                Some(Ffn::Mode(mode)) => Some(mode),
                Some(Ffn::Teal) | None => None,
            },
            offload: placement.offload,
            gpu_model: placement.gpu_model,
            teal,
            sparse_prefill: self.sparse_prefill,
        })
    }

    /// What `--ffn` and `--sparsity-mode` ask of `model`: `--ffn sparse` is PowerInfer's
    /// predictor when every layer has one, else the training-free mode `--sparsity-mode` names
    /// or the file has thresholds for (TEAL first); `--ffn cats` is CATS.
    fn resolve_ffn(&self, model: &Model) -> anyhow::Result<Option<Ffn>> {
        let hp = &model.hp;
        let chosen = match (self.ffn, self.sparsity_mode) {
            (Some(FfnArg::Cats), None | Some(SparsityModeArg::Cats)) => SparsityModeArg::Cats,
            (Some(FfnArg::Cats), Some(SparsityModeArg::Teal)) => {
                anyhow::bail!("--ffn cats contradicts --sparsity-mode teal (use --ffn sparse)")
            }
            (Some(FfnArg::Sparse), Some(mode)) => mode,
            (Some(FfnArg::Sparse), None) => {
                if model.layers.iter().all(|l| l.predictor.is_some()) {
                    return Ok(Some(Ffn::Mode(FfnMode::Sparse)));
                }
                if hp.teal_thresholds.is_some() {
                    SparsityModeArg::Teal
                } else if hp.cats_thresholds.is_some() {
                    SparsityModeArg::Cats
                } else {
                    anyhow::bail!(
                        "--ffn sparse needs a predictor (blk.N.fc1/fc2) in every layer or training-free thresholds from `hotcold calibrate --target-sparsity`; use --ffn oracle or dense"
                    )
                }
            }
            (_, Some(_)) => {
                anyhow::bail!("--sparsity-mode applies to --ffn sparse")
            }
            (ffn, _) => return Ok(ffn.map(|f| Ffn::Mode(f.into()))),
        };
        Ok(Some(match chosen {
            SparsityModeArg::Cats => Ffn::Mode(FfnMode::Cats),
            SparsityModeArg::Teal => Ffn::Teal,
        }))
    }
}

/// The FFN set-up `--ffn` and `--sparsity-mode` resolve to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ffn {
    /// A session FFN mode.
    Mode(FfnMode),
    /// TEAL's operators on every matrix.
    Teal,
}

/// Renumbers the neurons of a sparse model hottest first (see
/// [`Model::order_neurons_by_frequency`]) when its file says how often they fire (`calibrate`'s
/// statistics or `synth`'s targets); a model without statistics runs in file order.
fn order_neurons(model: &mut Model) -> anyhow::Result<()> {
    use hotcold_core::placement::stats::{frequencies, records_frequencies, FrequencySource};
    let file = model.file();
    if !records_frequencies(file) {
        return Ok(());
    }
    let (freq, source) = frequencies(file).context("cannot read the neuron statistics")?;
    if source != FrequencySource::Dense {
        model.order_neurons_by_frequency(&freq)?;
    }
    Ok(())
}
