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
//! - Required keys (`<arch>.` prefix): `context_length`, `embedding_length`,
//!   `feed_forward_length`, `attention.head_count`, `block_count`,
//!   `attention.layer_norm_rms_epsilon`, and `tokenizer.ggml.tokens`; optional:
//!   `attention.head_count_kv`, `rope.dimension_count` (must equal n_embd/n_head),
//!   `rope.freq_base`, `powerinfer.sparse_threshold` (f32, default 0; the env variable
//!   `LLAMA_SPARSE_PRED_THRESHOLD` overrides it). A neuron is skipped when its predictor output
//!   is `< threshold`.
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

mod layer;
pub mod rng;
pub mod vocab;

#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::path::Path;

use rayon::prelude::*;

use crate::gguf::{GgufWriter, Magic, MetaArray, MetaValue};
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
}

impl SynthArch {
    /// The GGUF `general.architecture` name.
    pub fn name(self) -> &'static str {
        match self {
            SynthArch::Llama => "llama",
            SynthArch::Bamboo => "bamboo",
        }
    }

    /// The value of `hotcold.ffn_activation`.
    pub fn activation(self) -> &'static str {
        match self {
            SynthArch::Llama => "relu",
            SynthArch::Bamboo => "drelu",
        }
    }

    /// Parses `llama` or `bamboo`.
    pub fn parse(name: &str) -> Result<SynthArch> {
        match name {
            "llama" => Ok(SynthArch::Llama),
            "bamboo" => Ok(SynthArch::Bamboo),
            _ => Err(Error::InvalidArgument(format!(
                "unknown synth architecture {name:?} (expected llama or bamboo)"
            ))),
        }
    }
}

/// The names [`SynthConfig::preset`] accepts.
pub const PRESETS: [&str; 3] = ["tiny", "small", "relullama-7b"];

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
}

impl SynthConfig {
    /// A preset:
    /// - `tiny`: n_embd 128, n_ff 512, 2 layers, 4 heads, vocab 1000, ctx 256, rank 16 (< 2 MB).
    /// - `small`: n_embd 1024, n_ff 4096, 5 layers, 16 heads (4 KV heads), vocab 3000, ctx 1024,
    ///   rank 64 (about 170 MB in F16, FFN ≈ 74% of the weight bytes).
    /// - `relullama-7b`: ReluLLaMA-7B's shape: n_embd 4096, n_ff 11008, 32 layers, 32 heads,
    ///   vocab 32000, ctx 2048, rank 512 (1024 stored hidden units; about 14 GB in F16, needs as
    ///   much memory to build).
    ///
    /// All default to `llama`, F16, sparsity 0.9, seed 0, Zipf exponent 1.2.
    pub fn preset(name: &str) -> Result<SynthConfig> {
        let (n_embd, n_ff, n_layer, n_head, n_head_kv, n_vocab, n_ctx, rank) = match name {
            "tiny" => (128, 512, 2, 4, 4, 1000, 256, 16),
            "small" => (1024, 4096, 5, 16, 4, 3000, 1024, 64),
            "relullama-7b" => (4096, 11008, 32, 32, 32, 32000, 2048, 512),
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
        })
    }

    fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
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

/// Builds the model `cfg` describes and writes it to `path` (PowerInfer's `PWRI` GGUF v3).
pub fn write(cfg: &SynthConfig, path: &Path) -> Result<SynthReport> {
    let (writer, report) = build(cfg)?;
    writer.write_file(path)?;
    let bytes = std::fs::metadata(path)
        .map_err(|source| Error::Io {
            path: path.to_owned(),
            source,
        })?
        .len();
    Ok(SynthReport { bytes, ..report })
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
/// until [`write`] writes the file).
pub fn build(cfg: &SynthConfig) -> Result<(GgufWriter<'static>, SynthReport)> {
    cfg.validate()?;
    let arch = cfg.arch.name();
    let mut w = GgufWriter::new(Magic::PowerInfer);
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
    w.set(key("context_length"), u32v(cfg.n_ctx));
    w.set(key("embedding_length"), u32v(cfg.n_embd));
    w.set(key("block_count"), u32v(cfg.n_layer));
    w.set(key("feed_forward_length"), u32v(cfg.n_ff));
    w.set(key("rope.dimension_count"), u32v(cfg.n_embd / cfg.n_head));
    w.set(key("attention.head_count"), u32v(cfg.n_head));
    w.set(key("attention.head_count_kv"), u32v(cfg.n_head_kv));
    w.set(
        key("attention.layer_norm_rms_epsilon"),
        MetaValue::F32(1e-5),
    );
    w.set(key("rope.freq_base"), MetaValue::F32(10000.0));
    let threshold = cfg.threshold();
    w.set("powerinfer.sparse_threshold", MetaValue::F32(threshold));
    w.set(
        "hotcold.ffn_activation",
        MetaValue::String(cfg.arch.activation().into()),
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

    let e = cfg.n_embd;
    let mut report = SynthReport {
        bytes: 0,
        weight_bytes: 0,
        ffn_bytes: 0,
        predictor_bytes: 0,
        n_tensors: 0,
        layer_density: Vec::new(),
        layer_top10_share: Vec::new(),
        threshold,
    };
    // embeddings: x[0] = c0, the rest N(0, 1)
    let mut embd = vec![0.0f32; cfg.n_vocab * e];
    embd.par_chunks_mut(e).enumerate().for_each(|(t, row)| {
        Rng::new(stream(cfg.seed, &[u64::MAX, 1, t as u64])).fill_normal(row, 1.0);
        row[0] = C0;
    });
    add(
        &mut w,
        &mut report,
        "token_embd.weight".into(),
        cfg.ty,
        &embd,
        e,
    )?;
    drop(embd);

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
        // residual RMS entering this block's FFN: each block adds alpha² of variance
        let sigma = (1.0 + ALPHA * ALPHA).powf(2.0 * il as f32 + 1.0).sqrt();
        let freq = target_frequencies(cfg.seed, il, cfg.n_ff, density, cfg.zipf_exponent);
        let lw = layer::build(&dims, cfg.arch, cfg.seed, il as u64, sigma, &freq);
        add_layer(&mut w, &mut report, cfg, il, &lw)?;
    }
    add(
        &mut w,
        &mut report,
        "output_norm.weight".into(),
        GgmlType::F32,
        &vec![1.0; e],
        e,
    )?;
    let output = {
        let mut m = vec![0.0f32; cfg.n_vocab * e];
        let scale = 3.0 / (e as f32).sqrt();
        m.par_chunks_mut(e).enumerate().for_each(|(t, row)| {
            Rng::new(stream(cfg.seed, &[u64::MAX, 2, t as u64])).fill_normal(row, scale);
        });
        m
    };
    add(
        &mut w,
        &mut report,
        "output.weight".into(),
        cfg.ty,
        &output,
        e,
    )?;
    Ok((w, report))
}

/// Encodes `data` (rows of `cols`) as `ty` and adds it to `w` as `name`; returns its bytes.
fn add(
    w: &mut GgufWriter<'static>,
    report: &mut SynthReport,
    name: String,
    ty: GgmlType,
    data: &[f32],
    cols: usize,
) -> Result<u64> {
    let bytes = encode(ty, data, cols)?;
    let n = bytes.len() as u64;
    let rows = (data.len() / cols) as u64;
    let shape: Vec<u64> = if rows == 1 {
        vec![cols as u64]
    } else {
        vec![cols as u64, rows]
    };
    w.add_tensor(name, ty, &shape, Cow::Owned(bytes))?;
    report.weight_bytes += n;
    report.n_tensors += 1;
    Ok(n)
}

fn add_layer(
    w: &mut GgufWriter<'static>,
    report: &mut SynthReport,
    cfg: &SynthConfig,
    il: usize,
    lw: &LayerWeights,
) -> Result<()> {
    let e = cfg.n_embd;
    let ty = cfg.ty;
    let n = |s: &str| format!("blk.{il}.{s}.weight");
    add(w, report, n("attn_norm"), GgmlType::F32, &lw.attn_norm, e)?;
    add(w, report, n("attn_q"), ty, &lw.wq, e)?;
    add(w, report, n("attn_k"), ty, &lw.wk, e)?;
    add(w, report, n("attn_v"), ty, &lw.wv, e)?;
    add(w, report, n("attn_output"), ty, &lw.wo, e)?;
    add(w, report, n("ffn_norm"), GgmlType::F32, &lw.ffn_norm, e)?;
    let mut ffn = add(w, report, n("ffn_gate"), ty, &lw.gate, e)?;
    ffn += add(w, report, n("ffn_up"), ty, &lw.up, e)?;
    ffn += add(w, report, n("ffn_down_t"), ty, &lw.down_t, e)?;
    report.ffn_bytes += ffn;
    let mut pred = add(w, report, n("fc1"), GgmlType::F16, &lw.fc1, e)?;
    pred += add(w, report, n("fc2"), GgmlType::F16, &lw.fc2, 2 * cfg.rank)?;
    report.predictor_bytes += pred;

    let total: f64 = lw.freq.iter().map(|&f| f64::from(f)).sum();
    let mut sorted = lw.freq.clone();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let top: f64 = sorted[..sorted.len().div_ceil(10)]
        .iter()
        .map(|&f| f64::from(f))
        .sum();
    report
        .layer_density
        .push((total / lw.freq.len() as f64) as f32);
    report.layer_top10_share.push((top / total) as f32);
    Ok(())
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
