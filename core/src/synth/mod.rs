//! Synthetic ReLU models in PowerInfer's file format, with controlled, power-law activation
//! sparsity and exact predictors, for tests and benchmarks.
//!
//! [`write`] builds a complete model from a [`SynthConfig`] ([`SynthConfig::preset`]: `tiny`,
//! `small`, `relullama-7b`): weights, a llama-style SentencePiece tokenizer ([`vocab`]), and a
//! predictor per layer; it is deterministic for a seed.
//!
//! # Construction
//! - Residual dimension 0 is an always-on channel: every token embedding has the constant `c0`
//!   there (4× the RMS of the other dimensions, which are Gaussian). Attention and FFN outputs are
//!   small (each adds about `alpha` = 10% RMS) and their output row 0 is zero, so `x[0] = c0`
//!   exactly at every layer and `h = rms_norm(x)·ffn_norm` keeps a near-constant `h[0] > 0`.
//! - Neuron i gets a target frequency `f_i` from a Zipf law over a random ranking (mean
//!   `1 − sparsity`, clamped to `[1e-4, 0.95]`). `G = W_gate·diag(ffn_norm) = B·A` is built with
//!   rank R: `A`'s row 0 is `e_0`, its other rows Gaussian over dimensions 1..; `B`'s row i is
//!   normalised so `(B·A)_i` has unit norm on dimensions 1.., and its column 0 is
//!   `β_i = σ_l·Φ⁻¹(f_i)/c0`, so that `P(gate_i·h > 0) = P(β_i·c0 + σ_l·Z > 0) = f_i` with `σ_l` the
//!   residual's expected RMS at layer l (it grows slowly through the blocks).
//! - The predictor is exact in sign: `fc1 = [A; −A]`, `fc2 = [B, −B]` give
//!   `fc2·relu(fc1·x) = B·A·x = G·x`, whose sign is that of `gate·h`. The threshold
//!   (`powerinfer.sparse_threshold`) is a small negative margin so that recall stays ≥ 0.99 after
//!   quantising `ffn_gate`.
//! - dReLU (`bamboo`): `up_i` gets a weight on dimension 0 so that `up_i·h > 0` for 97% of inputs,
//!   and the gate's frequency is `f_i / 0.97`, so the product's density is the target.
//! - `falcon` and `opt` (FFN `relu(up·h)`, LayerNorm with bias): `G` goes into `ffn_up`, and the
//!   predictor stays exact despite the centring and the biases (see `layer`). Falcon's FFN reads
//!   the block's input, so its residual RMS counts one addition fewer. OPT's LM head is the token
//!   embedding; its `output_norm` weight has random signs so that a token's logit does not favour
//!   the token itself (with tied embeddings and small block outputs, greedy text would repeat).
//! - `ffn_down_t` is scaled on random residuals so that the FFN adds `alpha` RMS.
//!
//! # What PowerInfer's loader requires (read from SJTU-IPADS/PowerInfer's `llama.cpp`)
//! - The `PWRI` magic alone switches on sparse inference; then `llm_load_sparse_model_tensors`
//!   creates, for `llama` and `bamboo` alike: `token_embd`, `output_norm`, `output` (no tied
//!   embedding), and per layer `attn_norm`, `attn_q`, `attn_k` {n_embd, n_embd_gqa}, `attn_v`,
//!   `attn_output`, `ffn_norm`, `ffn_gate`, `ffn_up`, `ffn_down_t` {n_embd, n_ff}, `fc1`
//!   {n_embd, *}, `fc2` {*, n_ff} (`*`: any rank). There is no `ffn_down` in the sparse path:
//!   a tensor it does not create is later looked up by name in its context and not found (a null
//!   pointer), so a file must hold exactly these tensors. `synth` therefore writes `ffn_down_t`
//!   only (hotcold's loader takes either).
//! - Required keys for `llama` and `bamboo` (`<arch>.` prefix): `context_length`, `embedding_length`,
//!   `feed_forward_length`, `attention.head_count`, `block_count`,
//!   `attention.layer_norm_rms_epsilon`, and `tokenizer.ggml.tokens`; optional:
//!   `attention.head_count_kv`, `rope.dimension_count` (must equal n_embd/n_head),
//!   `rope.freq_base`, `powerinfer.sparse_threshold` (f32, default 0; the env variable
//!   `LLAMA_SPARSE_PRED_THRESHOLD` overrides it). A neuron is skipped when its predictor output
//!   is `< threshold`.
//! - `falcon` (`build_falcon`, `llm_load_sparse_model_tensors`): `token_embd`, `output_norm`
//!   weight and bias, `output`; per layer `attn_norm` weight and bias (the FFN's norm too),
//!   `attn_qkv` {n_embd, n_embd + 2·n_embd_gqa} (all query heads, then the key heads, then the
//!   value heads: the converter's "jploski" layout), `attn_output`, `ffn_up`, `ffn_down_t`, `fc1`,
//!   `fc2`; key `attention.layer_norm_epsilon`; NEOX RoPE over whole heads; the predictor reads the
//!   block's input.
//! - `opt` (`build_opt`): `token_embd` (also the LM head: no `output`), `position_embd`
//!   {n_embd, 2050} (PowerInfer hard-codes `n_ctx_train = 2050` and indexes it with position + 2),
//!   `output_norm` weight and bias; per layer `attn_norm`, `ffn_norm` (weights and biases),
//!   `attn_q/k/v/output` weights and biases, `ffn_up` weight and bias, `ffn_down_t` weight and bias
//!   (`ffn_down_t.bias`: the converter renames every `ffn_down` tensor), `fc1`, `fc2`. Its OPT
//!   reads no epsilon (its LayerNorm uses 0); `synth` writes `attention.layer_norm_epsilon` = 1e-5,
//!   which hotcold reads.
//! - Types: its converter writes `fc1`/`fc2` like the other matrices (F16 in an F16 file) and its
//!   quantiser turns them into Q4_0 (Q4_0 files) or Q5_0; plain ggml matmuls run them, so F16
//!   works with any weight type. `synth` stores them F16, norms F32.
//! - The activation follows the architecture (`llama`: ReLU gate times up; `bamboo`: ReLU on both);
//!   hotcold reads it from `hotcold.ffn_activation` (`relu` or `drelu`).
//!
//! # Metadata hotcold adds
//! `hotcold.ffn_activation`, `hotcold.synth.preset`, `hotcold.synth.seed` (u64),
//! `hotcold.synth.sparsity` (f32 target), `hotcold.synth.zipf_exponent` (f32). Nothing else:
//! PowerInfer ignores unknown keys but not unknown tensors.
//!
//! # Dense SwiGLU (`dense_silu`)
//! For the training-free sparsity modes (CATS, TEAL), [`SynthConfig::dense_silu`] writes the same
//! `llama` weights as a plain llama.cpp file of a dense SwiGLU model: `GGUF` magic,
//! `hotcold.ffn_activation = silu` (`down(silu(gate·h) ⊙ up·h)`, no ReLU, so no neuron is
//! naturally zero), a row-major `ffn_down` (`ffn_down_t` transposed) and no predictor.
//!
//! # Dense twin (`SynthLayout::LlamaCpp`)
//! The same ReLU model (same seed, so the same float weights before quantisation, the same
//! tokenizer and `hotcold.ffn_activation`) as an ordinary llama.cpp file: `GGUF` magic, a
//! row-major `ffn_down` (OPT: `ffn_down.bias`), no predictor and no `powerinfer.sparse_threshold`.
//! What a user's dense engine reads: the fair baseline of a sparse-vs-dense benchmark (on the
//! PowerInfer file, hotcold's `--ffn dense` still skips the down rows of zero activations).
//! `dense_silu` files always have this layout.

mod layer;
pub mod rng;
pub mod vocab;

#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::path::Path;

use rayon::prelude::*;

use crate::gguf::{GgufStream, GgufWriter, Magic, MetaArray, MetaValue, TensorDecl};
use crate::quant::{quantize, GgmlType};
use crate::{Error, Result};
use layer::{Dims, LayerWeights};
use rng::{stream, Rng};

/// The FFN form of the synthetic model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynthArch {
    /// ReLU Llama-2 (ReluLLaMA, ProSparse): `down(relu(gate·h) ⊙ (up·h))`; architecture `llama`.
    Llama,
    /// dReLU (Bamboo, TurboSparse): `down(relu(gate·h) ⊙ relu(up·h))`; architecture `bamboo`.
    Bamboo,
    /// ReluFalcon: parallel attention, LayerNorm with bias, fused QKV, `down(relu(up·h))`;
    /// architecture `falcon`.
    Falcon,
    /// ReLU OPT: LayerNorm with bias, learned positions, biases on every linear layer,
    /// `down(relu(up·h + b)) + b`, tied LM head; architecture `opt`.
    Opt,
}

impl SynthArch {
    /// The GGUF `general.architecture` name.
    pub fn name(self) -> &'static str {
        match self {
            SynthArch::Llama => "llama",
            SynthArch::Bamboo => "bamboo",
            SynthArch::Falcon => "falcon",
            SynthArch::Opt => "opt",
        }
    }

    /// Whether the FFN has a gate (llama, bamboo) or is `relu(up·h)` (falcon, opt).
    pub fn gated(self) -> bool {
        matches!(self, SynthArch::Llama | SynthArch::Bamboo)
    }

    /// Whether the model uses LayerNorm with bias (falcon, opt) rather than RMSNorm.
    pub fn layer_norm(self) -> bool {
        !self.gated()
    }

    /// The value of `hotcold.ffn_activation`.
    pub fn activation(self) -> &'static str {
        match self {
            SynthArch::Bamboo => "drelu",
            _ => "relu",
        }
    }

    /// Parses `llama`, `bamboo`, `falcon` or `opt`.
    pub fn parse(name: &str) -> Result<SynthArch> {
        match name {
            "llama" => Ok(SynthArch::Llama),
            "bamboo" => Ok(SynthArch::Bamboo),
            "falcon" => Ok(SynthArch::Falcon),
            "opt" => Ok(SynthArch::Opt),
            _ => Err(Error::InvalidArgument(format!(
                "unknown synth architecture {name:?} (expected llama, bamboo, falcon or opt)"
            ))),
        }
    }
}

/// How the model is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynthLayout {
    /// PowerInfer's sparse file: `PWRI` magic, neuron-major `ffn_down_t`, predictors `fc1`/`fc2`.
    PowerInfer,
    /// An ordinary llama.cpp file: `GGUF` magic, row-major `ffn_down`, no predictor.
    LlamaCpp,
}

impl SynthLayout {
    /// Parses `powerinfer` or `llama.cpp` (also `dense`).
    pub fn parse(name: &str) -> Result<SynthLayout> {
        match name {
            "powerinfer" => Ok(SynthLayout::PowerInfer),
            "llama.cpp" | "dense" => Ok(SynthLayout::LlamaCpp),
            _ => Err(Error::InvalidArgument(format!(
                "unknown synth layout {name:?} (expected powerinfer or llama.cpp)"
            ))),
        }
    }
}

/// The names [`SynthConfig::preset`] accepts.
pub const PRESETS: [&str; 4] = ["tiny", "small", "relullama-7b", "llama2-7b-layers"];

/// Everything that defines a synthetic model.
#[derive(Clone, Debug)]
pub struct SynthConfig {
    /// The preset name recorded in the file.
    pub preset: String,
    /// FFN form and architecture name.
    pub arch: SynthArch,
    /// Type of the large matrices (F16, Q8_0 or Q4_0).
    pub ty: GgmlType,
    /// Target fraction of inactive FFN neurons per token.
    pub sparsity: f32,
    /// Seed of every random choice.
    pub seed: u64,
    /// Residual width.
    pub n_embd: usize,
    /// FFN neurons per layer.
    pub n_ff: usize,
    /// Blocks.
    pub n_layer: usize,
    /// Attention heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention when below `n_head`).
    pub n_head_kv: usize,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// Training context length written to the file.
    pub n_ctx: usize,
    /// Predictor rank R of `B·A`; `fc1`/`fc2` store 2R hidden units.
    pub rank: usize,
    /// Exponent of the Zipf law of per-neuron frequencies.
    pub zipf_exponent: f32,
    /// A dense SwiGLU `llama` in llama.cpp's layout instead of a ReLU PowerInfer file (see the
    /// module docs); always in [`SynthLayout::LlamaCpp`].
    pub dense_silu: bool,
    /// The file layout (see the module docs).
    pub layout: SynthLayout,
}

impl SynthConfig {
    /// A preset:
    /// - `tiny`: n_embd 128, n_ff 512, 2 layers, 4 heads, vocab 1000, ctx 256, rank 16 (< 2 MB).
    /// - `small`: n_embd 1024, n_ff 4096, 5 layers, 16 heads (4 KV heads), vocab 3000, ctx 1024,
    ///   rank 64 (about 170 MB in F16, FFN ≈ 74% of the weight bytes).
    /// - `relullama-7b`: ReluLLaMA-7B's shape: n_embd 4096, n_ff 11008, 32 layers, 32 heads,
    ///   vocab 32000, ctx 2048, rank 512 (1024 stored hidden units; about 14 GB in F16; [`write`]
    ///   streams it to disk one tensor at a time, holding about one layer in memory).
    /// - `llama2-7b-layers`: four layers of Llama-2-7B's shape (n_embd 4096, n_ff 11008, 32
    ///   heads), vocab 1000, ctx 512, rank 64: per-layer decode benchmarks (about 1.6 GB in F16).
    ///
    /// All default to `llama`, F16, sparsity 0.9, seed 0, Zipf exponent 1.2.
    pub fn preset(name: &str) -> Result<SynthConfig> {
        let (n_embd, n_ff, n_layer, n_head, n_head_kv, n_vocab, n_ctx, rank) = match name {
            "tiny" => (128, 512, 2, 4, 4, 1000, 256, 16),
            "small" => (1024, 4096, 5, 16, 4, 3000, 1024, 64),
            "relullama-7b" => (4096, 11008, 32, 32, 32, 32000, 2048, 512),
            "llama2-7b-layers" => (4096, 11008, 4, 32, 32, 1000, 512, 64),
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "unknown synth preset {name:?} (expected one of {})",
                    PRESETS.join(", ")
                )))
            }
        };
        Ok(SynthConfig {
            preset: name.to_owned(),
            arch: SynthArch::Llama,
            ty: GgmlType::F16,
            sparsity: 0.9,
            seed: 0,
            n_embd,
            n_ff,
            n_layer,
            n_head,
            n_head_kv,
            n_vocab,
            n_ctx,
            rank,
            zipf_exponent: 1.2,
            dense_silu: false,
            layout: SynthLayout::PowerInfer,
        })
    }

    fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if self.dense_silu && self.arch != SynthArch::Llama {
            return bad(format!(
                "a dense SiLU FFN is a llama (SwiGLU) option, not {}",
                self.arch.name()
            ));
        }
        if !matches!(self.ty, GgmlType::F16 | GgmlType::Q8_0 | GgmlType::Q4_0) {
            return bad(format!(
                "synth weight type {} (expected f16, q8_0 or q4_0)",
                self.ty
            ));
        }
        if !(0.0..1.0).contains(&self.sparsity) || self.sparsity < 0.05 {
            return bad(format!(
                "sparsity {} (expected 0.05 ≤ s < 1)",
                self.sparsity
            ));
        }
        if !self.n_embd.is_multiple_of(32) || !self.n_ff.is_multiple_of(32) {
            return bad("n_embd and n_ff must be multiples of 32".into());
        }
        if self.n_head == 0
            || self.n_head_kv == 0
            || !self.n_embd.is_multiple_of(self.n_head)
            || !self.n_head.is_multiple_of(self.n_head_kv)
        {
            return bad("n_head must divide n_embd and be a multiple of n_head_kv".into());
        }
        if self.rank < 2 || self.rank > self.n_embd {
            return bad(format!("rank {} (expected 2..=n_embd)", self.rank));
        }
        if self.n_vocab < 600 {
            return bad(format!("vocab {} (expected at least 600)", self.n_vocab));
        }
        Ok(())
    }

    /// Whether the file is in llama.cpp's layout (no predictor, row-major `ffn_down`).
    pub fn llama_cpp_layout(&self) -> bool {
        self.dense_silu || self.layout == SynthLayout::LlamaCpp
    }

    /// The predictor threshold written as `powerinfer.sparse_threshold`: a negative margin in
    /// units of the residual RMS, wider for coarser weight types.
    pub fn threshold(&self) -> f32 {
        match self.ty {
            GgmlType::Q4_0 => -0.25,
            GgmlType::Q8_0 => -0.05,
            _ => -0.03,
        }
    }
}

/// What [`write`] wrote.
#[derive(Clone, Debug)]
pub struct SynthReport {
    /// Size of the file.
    pub bytes: u64,
    /// Bytes of all tensors.
    pub weight_bytes: u64,
    /// Bytes of `ffn_gate`, `ffn_up` and `ffn_down_t`.
    pub ffn_bytes: u64,
    /// Bytes of `fc1` and `fc2`.
    pub predictor_bytes: u64,
    /// Number of tensors.
    pub n_tensors: usize,
    /// Per layer, the target FFN density (mean target frequency of its neurons).
    pub layer_density: Vec<f32>,
    /// Per layer, the share of all firings that its 10% most frequent neurons make (by target).
    pub layer_top10_share: Vec<f32>,
    /// The predictor threshold written.
    pub threshold: f32,
}

/// Constant on residual dimension 0, in units of the RMS of the other dimensions.
const C0: f32 = 4.0;
/// RMS each block adds to the residual's dimensions 1.., relative to it.
const ALPHA: f32 = 0.1;

/// Builds the model `cfg` describes and writes it to `path` (PowerInfer's `PWRI` GGUF v3),
/// streaming: the tensors are declared first (a pass that computes no data), then computed and
/// written one at a time, so that at most one layer's weights are in memory.
pub fn write(cfg: &SynthConfig, path: &Path) -> Result<SynthReport> {
    cfg.validate()?;
    let mut declared = Vec::new();
    emit(cfg, &mut declared, &mut SynthReport::new(cfg))?;
    let header = metadata(cfg);
    let mut report = SynthReport::new(cfg);
    crate::gguf::write_file_atomically(path, |out| {
        let mut stream = header.stream(declared, out)?;
        emit(cfg, &mut stream, &mut report)?;
        stream.finish().map(drop)
    })?;
    report.bytes = std::fs::metadata(path)
        .map_err(|source| Error::Io {
            path: path.to_owned(),
            source,
        })?
        .len();
    Ok(report)
}

/// The target firing frequency of each of the `n_ff` neurons of layer `il` of a model built with
/// `seed`, mean `density` (1 − sparsity) and Zipf exponent `zipf_exponent`: what [`build`] gives
/// that layer, so a planner can use a synthetic file's statistics without calibrating it.
pub fn target_frequencies(
    seed: u64,
    il: usize,
    n_ff: usize,
    density: f64,
    zipf_exponent: f32,
) -> Vec<f64> {
    let mut frng = Rng::new(stream(seed, &[il as u64, 0]));
    layer::zipf_frequencies(&mut frng, n_ff, density, f64::from(zipf_exponent))
}

/// Builds the model in memory: the writer holding every tensor, and the report (`bytes` is 0
/// until the file is written).
pub fn build(cfg: &SynthConfig) -> Result<(GgufWriter<'static>, SynthReport)> {
    cfg.validate()?;
    let mut w = metadata(cfg);
    let mut report = SynthReport::new(cfg);
    emit(cfg, &mut w, &mut report)?;
    Ok((w, report))
}

/// Rows of OPT's learned position table: PowerInfer's loader requires exactly 2050
/// (`n_ctx_train` is hard-coded for OPT), HF's 2048 positions plus its offset of 2.
pub const OPT_POSITIONS: usize = 2050;

/// A writer holding the file's metadata and no tensors.
fn metadata(cfg: &SynthConfig) -> GgufWriter<'static> {
    let arch = cfg.arch.name();
    let mut w = GgufWriter::new(match cfg.llama_cpp_layout() {
        true => Magic::Gguf,
        false => Magic::PowerInfer,
    });
    let key = |k: &str| format!("{arch}.{k}");
    let u32v = |v: usize| MetaValue::U32(v as u32);
    w.set("general.architecture", MetaValue::String(arch.into()));
    w.set(
        "general.name",
        MetaValue::String(format!("hotcold-synth-{}", cfg.preset)),
    );
    let file_type = match cfg.ty {
        GgmlType::Q4_0 => 2,
        GgmlType::Q8_0 => 7,
        _ => 1,
    };
    w.set("general.file_type", MetaValue::U32(file_type));
    let n_ctx = match cfg.arch {
        SynthArch::Opt => OPT_POSITIONS,
        _ => cfg.n_ctx,
    };
    w.set(key("context_length"), u32v(n_ctx));
    w.set(key("embedding_length"), u32v(cfg.n_embd));
    w.set(key("block_count"), u32v(cfg.n_layer));
    w.set(key("feed_forward_length"), u32v(cfg.n_ff));
    if cfg.arch != SynthArch::Opt {
        w.set(key("rope.dimension_count"), u32v(cfg.n_embd / cfg.n_head));
    }
    w.set(key("attention.head_count"), u32v(cfg.n_head));
    w.set(key("attention.head_count_kv"), u32v(cfg.n_head_kv));
    let eps_key = match cfg.arch.layer_norm() {
        true => "attention.layer_norm_epsilon",
        false => "attention.layer_norm_rms_epsilon",
    };
    w.set(key(eps_key), MetaValue::F32(1e-5));
    if cfg.arch != SynthArch::Opt {
        w.set(key("rope.freq_base"), MetaValue::F32(10000.0));
    }
    if !cfg.llama_cpp_layout() {
        w.set(
            "powerinfer.sparse_threshold",
            MetaValue::F32(cfg.threshold()),
        );
    }
    let activation = match cfg.dense_silu {
        true => "silu",
        false => cfg.arch.activation(),
    };
    w.set(
        "hotcold.ffn_activation",
        MetaValue::String(activation.into()),
    );
    w.set(
        "hotcold.synth.preset",
        MetaValue::String(cfg.preset.clone()),
    );
    w.set("hotcold.synth.seed", MetaValue::U64(cfg.seed));
    w.set("hotcold.synth.sparsity", MetaValue::F32(cfg.sparsity));
    w.set(
        "hotcold.synth.zipf_exponent",
        MetaValue::F32(cfg.zipf_exponent),
    );

    let pieces = vocab::build(cfg.n_vocab);
    w.set("tokenizer.ggml.model", MetaValue::String("llama".into()));
    w.set(
        "tokenizer.ggml.tokens",
        MetaValue::Array(MetaArray::String(
            pieces.iter().map(|p| p.text.clone()).collect(),
        )),
    );
    w.set(
        "tokenizer.ggml.scores",
        MetaValue::Array(MetaArray::F32(pieces.iter().map(|p| p.score).collect())),
    );
    w.set(
        "tokenizer.ggml.token_type",
        MetaValue::Array(MetaArray::I32(
            pieces.iter().map(|p| p.token_type).collect(),
        )),
    );
    w.set("tokenizer.ggml.bos_token_id", MetaValue::U32(1));
    w.set("tokenizer.ggml.eos_token_id", MetaValue::U32(2));
    w.set("tokenizer.ggml.unknown_token_id", MetaValue::U32(0));
    w.set("tokenizer.ggml.add_bos_token", MetaValue::Bool(true));
    w.set("tokenizer.ggml.add_eos_token", MetaValue::Bool(false));
    w
}

impl SynthReport {
    fn new(cfg: &SynthConfig) -> SynthReport {
        SynthReport {
            bytes: 0,
            weight_bytes: 0,
            ffn_bytes: 0,
            predictor_bytes: 0,
            n_tensors: 0,
            layer_density: Vec::new(),
            layer_top10_share: Vec::new(),
            threshold: cfg.threshold(),
        }
    }
}

/// Where [`emit`] puts tensors: a list of declarations (the data is not computed), an in-memory
/// writer, or a file being streamed.
trait TensorSink {
    /// Takes tensor `name`; `data` computes its bytes when the sink needs them.
    fn tensor(
        &mut self,
        name: String,
        ty: GgmlType,
        shape: Vec<u64>,
        data: &mut dyn FnMut() -> Result<Vec<u8>>,
    ) -> Result<()>;
}

impl TensorSink for Vec<TensorDecl> {
    fn tensor(
        &mut self,
        name: String,
        ty: GgmlType,
        shape: Vec<u64>,
        _data: &mut dyn FnMut() -> Result<Vec<u8>>,
    ) -> Result<()> {
        self.push(TensorDecl { name, ty, shape });
        Ok(())
    }
}

impl TensorSink for GgufWriter<'static> {
    fn tensor(
        &mut self,
        name: String,
        ty: GgmlType,
        shape: Vec<u64>,
        data: &mut dyn FnMut() -> Result<Vec<u8>>,
    ) -> Result<()> {
        self.add_tensor(name, ty, &shape, Cow::Owned(data()?))
    }
}

impl<W: std::io::Write> TensorSink for GgufStream<W> {
    fn tensor(
        &mut self,
        name: String,
        _ty: GgmlType,
        _shape: Vec<u64>,
        data: &mut dyn FnMut() -> Result<Vec<u8>>,
    ) -> Result<()> {
        self.write_tensor(&name, &data()?)
    }
}

/// Puts every tensor of the model into `sink`, in file order, computing each layer's weights
/// only when the sink first needs one of them.
fn emit(cfg: &SynthConfig, sink: &mut dyn TensorSink, report: &mut SynthReport) -> Result<()> {
    let e = cfg.n_embd;
    // embeddings: x[0] = c0, the rest N(0, 1)
    add(
        sink,
        report,
        "token_embd.weight",
        cfg.ty,
        cfg.n_vocab,
        e,
        || {
            let mut embd = vec![0.0f32; cfg.n_vocab * e];
            embd.par_chunks_mut(e).enumerate().for_each(|(t, row)| {
                Rng::new(stream(cfg.seed, &[u64::MAX, 1, t as u64])).fill_normal(row, 1.0);
                row[0] = C0;
            });
            embd
        },
    )?;
    if cfg.arch == SynthArch::Opt {
        // learned positions: small, zero on dimension 0
        add(
            sink,
            report,
            "position_embd.weight",
            cfg.ty,
            OPT_POSITIONS,
            e,
            || {
                let mut pos = vec![0.0f32; OPT_POSITIONS * e];
                pos.par_chunks_mut(e).enumerate().for_each(|(p, row)| {
                    Rng::new(stream(cfg.seed, &[u64::MAX, 3, p as u64])).fill_normal(row, 0.1);
                    row[0] = 0.0;
                });
                pos
            },
        )?;
    }

    let dims = Dims {
        n_embd: e,
        n_ff: cfg.n_ff,
        n_head: cfg.n_head,
        n_head_kv: cfg.n_head_kv,
        rank: cfg.rank,
        c0: C0,
        alpha: ALPHA,
    };
    let density = 1.0 - f64::from(cfg.sparsity);
    for il in 0..cfg.n_layer {
        // residual RMS entering this block's FFN: each attention or FFN adds alpha² of variance;
        // Falcon's FFN reads the block's input (parallel attention)
        let added = match cfg.arch {
            SynthArch::Falcon => 2 * il,
            _ => 2 * il + 1,
        };
        let sigma = (1.0 + ALPHA * ALPHA).powf(added as f32).sqrt();
        let freq = target_frequencies(cfg.seed, il, cfg.n_ff, density, cfg.zipf_exponent);
        let lw = std::cell::OnceCell::new();
        let weights =
            || lw.get_or_init(|| layer::build(&dims, cfg.arch, cfg.seed, il as u64, sigma, &freq));
        add_layer(sink, report, cfg, il, &weights)?;
        report_frequencies(report, &freq);
    }
    add(
        sink,
        report,
        "output_norm.weight",
        GgmlType::F32,
        1,
        e,
        || {
            match cfg.arch {
                // OPT's LM head is the token embedding: random signs (and the scale of the other
                // architectures' output matrix) keep a token's logit from favouring itself
                SynthArch::Opt => {
                    let mut rng = Rng::new(stream(cfg.seed, &[u64::MAX, 5]));
                    let scale = 3.0 / (e as f32).sqrt();
                    (0..e)
                        .map(|_| if rng.uniform() < 0.5 { -scale } else { scale })
                        .collect()
                }
                _ => vec![1.0; e],
            }
        },
    )?;
    if cfg.arch.layer_norm() {
        add(
            sink,
            report,
            "output_norm.bias",
            GgmlType::F32,
            1,
            e,
            || {
                let mut b = vec![0.0f32; e];
                Rng::new(stream(cfg.seed, &[u64::MAX, 4])).fill_normal(&mut b, 0.1);
                b
            },
        )?;
    }
    if cfg.arch != SynthArch::Opt {
        add(
            sink,
            report,
            "output.weight",
            cfg.ty,
            cfg.n_vocab,
            e,
            || {
                let mut m = vec![0.0f32; cfg.n_vocab * e];
                let scale = 3.0 / (e as f32).sqrt();
                m.par_chunks_mut(e).enumerate().for_each(|(t, row)| {
                    Rng::new(stream(cfg.seed, &[u64::MAX, 2, t as u64])).fill_normal(row, scale);
                });
                m
            },
        )?;
    }
    Ok(())
}

/// Puts tensor `name` (`rows` of `cols` values, computed by `data`, encoded as `ty`) into `sink`;
/// returns its bytes.
fn add<D: AsRef<[f32]>>(
    sink: &mut dyn TensorSink,
    report: &mut SynthReport,
    name: impl Into<String>,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    data: impl FnOnce() -> D,
) -> Result<u64> {
    let shape: Vec<u64> = if rows == 1 {
        vec![cols as u64]
    } else {
        vec![cols as u64, rows as u64]
    };
    let n = ty.row_bytes(cols as u64)? * rows as u64;
    let mut data = Some(data);
    sink.tensor(name.into(), ty, shape, &mut || {
        let values = data.take().expect("a sink takes a tensor's data once")();
        encode(ty, values.as_ref(), cols)
    })?;
    report.weight_bytes += n;
    report.n_tensors += 1;
    Ok(n)
}

fn add_layer<'w>(
    sink: &mut dyn TensorSink,
    report: &mut SynthReport,
    cfg: &SynthConfig,
    il: usize,
    lw: &dyn Fn() -> &'w LayerWeights,
) -> Result<()> {
    let (e, f, ty) = (cfg.n_embd, cfg.n_ff, cfg.ty);
    let n_kv = e / cfg.n_head * cfg.n_head_kv;
    let n = |s: &str| format!("blk.{il}.{s}");
    let f32t = GgmlType::F32;
    let bias = |v: &'w Option<Vec<f32>>| v.as_deref().expect("the architecture has this bias");
    let attn_bias = |k: usize| &lw().attn_biases.as_ref().expect("OPT has attention biases")[k];
    add(sink, report, n("attn_norm.weight"), f32t, 1, e, || {
        &lw().attn_norm
    })?;
    if cfg.arch.layer_norm() {
        add(sink, report, n("attn_norm.bias"), f32t, 1, e, || {
            bias(&lw().attn_norm_b)
        })?;
    }
    if cfg.arch == SynthArch::Falcon {
        // fused QKV: every query head, then the key heads, then the value heads
        add(
            sink,
            report,
            n("attn_qkv.weight"),
            ty,
            e + 2 * n_kv,
            e,
            || {
                let w = lw();
                [w.wq.as_slice(), &w.wk, &w.wv].concat()
            },
        )?;
    } else {
        let opt = cfg.arch == SynthArch::Opt;
        for (k, (role, rows)) in [("attn_q", e), ("attn_k", n_kv), ("attn_v", n_kv)]
            .into_iter()
            .enumerate()
        {
            add(
                sink,
                report,
                n(&format!("{role}.weight")),
                ty,
                rows,
                e,
                || {
                    let w = lw();
                    [&w.wq, &w.wk, &w.wv][k]
                },
            )?;
            if opt {
                add(
                    sink,
                    report,
                    n(&format!("{role}.bias")),
                    f32t,
                    1,
                    rows,
                    || attn_bias(k),
                )?;
            }
        }
    }
    add(sink, report, n("attn_output.weight"), ty, e, e, || &lw().wo)?;
    if cfg.arch == SynthArch::Opt {
        add(sink, report, n("attn_output.bias"), f32t, 1, e, || {
            attn_bias(3)
        })?;
    }
    if cfg.arch != SynthArch::Falcon {
        add(sink, report, n("ffn_norm.weight"), f32t, 1, e, || {
            &lw().ffn_norm
        })?;
    }
    let mut ffn = 0;
    let llama_cpp = cfg.llama_cpp_layout();
    if cfg.arch == SynthArch::Opt {
        add(sink, report, n("ffn_norm.bias"), f32t, 1, e, || {
            bias(&lw().ffn_norm_b)
        })?;
        ffn += add(sink, report, n("ffn_up.bias"), f32t, 1, f, || {
            bias(&lw().up_b)
        })?;
        let down_bias = match llama_cpp {
            true => "ffn_down.bias",
            false => "ffn_down_t.bias",
        };
        ffn += add(sink, report, n(down_bias), f32t, 1, e, || {
            bias(&lw().down_b)
        })?;
    }
    if cfg.arch.gated() {
        ffn += add(sink, report, n("ffn_gate.weight"), ty, f, e, || {
            lw().gate.as_deref().expect("a gated FFN has a gate")
        })?;
    }
    ffn += add(sink, report, n("ffn_up.weight"), ty, f, e, || &lw().up)?;
    if llama_cpp {
        ffn += add(sink, report, n("ffn_down.weight"), ty, e, f, || {
            transpose(&lw().down_t, f, e)
        })?;
        report.ffn_bytes += ffn;
        return Ok(());
    }
    ffn += add(sink, report, n("ffn_down_t.weight"), ty, f, e, || {
        &lw().down_t
    })?;
    report.ffn_bytes += ffn;
    let r2 = 2 * cfg.rank;
    let mut pred = add(sink, report, n("fc1.weight"), GgmlType::F16, r2, e, || {
        &lw().fc1
    })?;
    pred += add(sink, report, n("fc2.weight"), GgmlType::F16, f, r2, || {
        &lw().fc2
    })?;
    report.predictor_bytes += pred;
    Ok(())
}

/// Records a layer's target density and the share of firings of its 10% most frequent neurons.
fn report_frequencies(report: &mut SynthReport, freq: &[f64]) {
    let total: f64 = freq.iter().map(|&f| f as f32 as f64).sum();
    let mut sorted: Vec<f64> = freq.iter().map(|&f| f as f32 as f64).collect();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let top: f64 = sorted[..sorted.len().div_ceil(10)].iter().sum();
    report
        .layer_density
        .push((total / freq.len() as f64) as f32);
    report.layer_top10_share.push((top / total) as f32);
}

/// The `cols × rows` transpose of the row-major `rows × cols` matrix `m`.
fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; m.len()];
    t.par_chunks_mut(rows).enumerate().for_each(|(c, out)| {
        for (r, v) in out.iter_mut().enumerate() {
            *v = m[r * cols + c];
        }
    });
    t
}

/// Quantises rows of `cols` f32 values into `ty`, in parallel.
fn encode(ty: GgmlType, data: &[f32], cols: usize) -> Result<Vec<u8>> {
    let row_bytes = ty.row_bytes(cols as u64)? as usize;
    let rows = data.len() / cols;
    let mut out = vec![0u8; rows * row_bytes];
    out.par_chunks_mut(row_bytes)
        .zip(data.par_chunks(cols))
        .try_for_each(|(dst, src)| match ty {
            GgmlType::F32 => {
                for (d, s) in dst.chunks_exact_mut(4).zip(src) {
                    d.copy_from_slice(&s.to_le_bytes());
                }
                Ok(())
            }
            _ => quantize(ty, src, dst),
        })?;
    Ok(out)
}
