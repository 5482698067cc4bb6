//! A model's weights resident on the GPU: every matrix (packed blocks), norm and bias of the
//! blocks, the final norm and the LM head, and the predictors of a sparse file. The token
//! embedding stays on the CPU: one row per token is dequantised there and uploaded.

use std::ops::Range;
use std::sync::Arc;

use super::acts::Kind;
use crate::engine::FfnMode;
use crate::gpu::context::GpuContext;
use crate::gpu::weights::{GpuMatrix, AXPY_TYPES};
use crate::model::{HyperParams, LayerWeights, Model, NormKind, Weight};
use crate::{Error, Result};

/// The down projection of one layer on the GPU.
pub(super) enum Down {
    /// Row-major `ffn_down` (a dense product).
    Rows(GpuMatrix),
    /// Neuron-major `ffn_down_t` (the sparse axpy, skipping zero activations).
    Neurons(GpuMatrix),
}

/// One block's weights on the GPU.
pub(super) struct GpuBlock {
    pub attn_norm: wgpu::Buffer,
    pub wq: GpuMatrix,
    pub wk: GpuMatrix,
    pub wv: GpuMatrix,
    pub bq: Option<wgpu::Buffer>,
    pub bk: Option<wgpu::Buffer>,
    pub bv: Option<wgpu::Buffer>,
    pub q_norm: Option<wgpu::Buffer>,
    pub k_norm: Option<wgpu::Buffer>,
    pub wo: GpuMatrix,
    pub bo: Option<wgpu::Buffer>,
    pub post_attn_norm: Option<wgpu::Buffer>,
    pub ffn_norm: wgpu::Buffer,
    pub gate: GpuMatrix,
    pub up: GpuMatrix,
    pub down: Down,
    /// PowerInfer's predictor (`fc1`, `fc2`), when the file has one.
    pub predictor: Option<(GpuMatrix, GpuMatrix)>,
    pub post_ffn_norm: Option<wgpu::Buffer>,
}

/// The final norm and the LM head on the GPU.
pub(super) struct GpuHead {
    pub norm: wgpu::Buffer,
    pub output: GpuMatrix,
}

/// A model on the GPU, ready for [`super::GpuSession`]s: the whole model (every block and the LM
/// head), or a segment of consecutive blocks whose residual stream the CPU hands over
/// ([`GpuModel::upload_segment`]).
pub struct GpuModel {
    pub(super) ctx: Arc<GpuContext>,
    pub(super) hp: HyperParams,
    /// The layers held: `blocks[i]` is layer `layers.start + i`.
    pub(super) layers: Range<usize>,
    pub(super) blocks: Vec<GpuBlock>,
    /// The final norm and LM head (whole models only).
    pub(super) head: Option<GpuHead>,
    /// `0..n_ff` on the CPU and on the GPU: the rows of the down axpy.
    pub(super) all_neurons: (Vec<u32>, wgpu::Buffer),
    /// The widest vector a product takes.
    pub(super) max_cols: usize,
    /// The predictors' widest hidden layer (1 without predictors).
    pub(super) hidden: usize,
    bytes: u64,
}

impl std::fmt::Debug for GpuModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuModel")
            .field("gpu", &self.ctx.describe())
            .field("layers", &self.layers)
            .field("bytes", &self.bytes)
            .finish()
    }
}

/// An error for what the resident forward pass does not run.
fn unsupported(what: &str) -> Error {
    Error::InvalidArgument(format!(
        "the GPU-resident forward pass does not run {what} yet (use a --vram-budget below the whole model for the hybrid path, or --device cpu)"
    ))
}

/// Checks that the resident forward pass runs `model` in FFN mode `mode`: RMSNorm, sequential
/// attention, token embeddings without learned positions, gated FFNs without biases, weight types
/// the GPU kernels read, and mode `Dense` or (with a predictor in every layer) `Sparse`.
///
/// Errors: [`Error::InvalidArgument`] naming what is not supported.
pub fn check_supported(model: &Model, mode: FfnMode) -> Result<()> {
    let hp = &model.hp;
    if hp.norm != NormKind::Rms {
        return Err(unsupported("LayerNorm models (Falcon, OPT)"));
    }
    if hp.arch.parallel_attention() {
        return Err(unsupported("parallel attention (Falcon)"));
    }
    if model.pos_embd.is_some() {
        return Err(unsupported("learned positions (OPT)"));
    }
    if !hp.k_width().is_multiple_of(2) || !hp.v_width().is_multiple_of(2) {
        return Err(unsupported("odd key/value widths"));
    }
    match mode {
        FfnMode::Dense => {}
        FfnMode::Sparse if model.layers.iter().all(|l| l.predictor.is_some()) => {}
        FfnMode::Sparse => {
            return Err(Error::InvalidArgument(
                "--ffn sparse needs a predictor (blk.N.fc1/fc2) in every layer".into(),
            ))
        }
        FfnMode::Oracle | FfnMode::Cats => {
            return Err(unsupported(&format!("--ffn {mode:?}").to_lowercase()))
        }
    }
    for (il, l) in model.layers.iter().enumerate() {
        if l.gate.is_none() || l.up_b.is_some() || l.down_b.is_some() || l.attn_norm_2.is_some() {
            return Err(unsupported("FFNs without gate or with biases"));
        }
        for w in block_matrices(l) {
            Kind::of(w.ty)
                .map_err(|_| unsupported(&format!("{} weights (layer {il})", w.ty.name())))?;
        }
        match (&l.down, &l.down_t) {
            (_, Some(t)) if AXPY_TYPES.contains(&t.ty) => {}
            (Some(_), _) => {}
            (None, t) => {
                return Err(unsupported(&format!(
                    "a {} ffn_down_t without ffn_down (layer {il})",
                    t.as_ref().map_or("missing", |t| t.ty.name())
                )))
            }
        }
    }
    Kind::of(model.output.ty).map_err(|_| unsupported("this LM head type"))?;
    Ok(())
}

/// The matrices of layer `l` the resident pass uploads: attention, gate, up, the down projection
/// it uses (the neuron-major copy when the axpy reads its type, else the row-major one), and the
/// predictor.
fn block_matrices(l: &LayerWeights) -> Vec<&Weight> {
    let mut w = vec![&l.wq, &l.wk, &l.wv, &l.wo, &l.up];
    w.extend(l.gate.as_ref());
    w.extend(match (&l.down_t, &l.down) {
        (Some(t), _) if AXPY_TYPES.contains(&t.ty) => Some(t),
        (_, d) => d.as_ref(),
    });
    if let Some(p) = &l.predictor {
        w.extend([&p.fc1, &p.fc2]);
    }
    w
}

/// Bytes of a weight's packed blocks.
fn weight_bytes(w: &Weight) -> u64 {
    (w.rows * (w.cols / w.ty.block_size() * w.ty.block_bytes())) as u64
}

/// Bytes of weights [`GpuModel::upload`] puts on the GPU for `model` (every block's
/// [`block_bytes`] and the LM head's matrix): what a `--vram-budget` must hold for the resident
/// pass, besides the KV cache and working vectors ([`super::session_bytes`]).
pub fn resident_bytes(model: &Model) -> u64 {
    let blocks: u64 = (0..model.hp.n_layer).map(|il| block_bytes(model, il)).sum();
    blocks + weight_bytes(&model.output)
}

/// Bytes layer `il`'s block takes on the GPU: its matrices ([`resident_bytes`]'s share) and its
/// norm weights and biases.
pub fn block_bytes(model: &Model, il: usize) -> u64 {
    let l = &model.layers[il];
    let vectors = [
        &l.bq,
        &l.bk,
        &l.bv,
        &l.q_norm,
        &l.k_norm,
        &l.bo,
        &l.post_attn_norm,
        &l.post_ffn_norm,
    ];
    let floats = l.attn_norm.weight.len()
        + l.ffn_norm.weight.len()
        + vectors
            .iter()
            .filter_map(|v| v.as_ref())
            .map(Vec::len)
            .sum::<usize>();
    block_matrices(l).into_iter().map(weight_bytes).sum::<u64>() + 4 * floats as u64
}

/// The widest vector a product of `model`'s pass takes, and its predictors' widest hidden layer
/// (1 without predictors).
pub(super) fn widths(model: &Model) -> (usize, usize) {
    let hp = &model.hp;
    let predictors = model.layers.iter().filter_map(|l| l.predictor.as_ref());
    let hidden = predictors.clone().map(|p| p.fc1.rows).fold(1, usize::max);
    let max_cols = predictors.map(|p| p.fc2.cols).fold(
        hp.n_embd.max(hp.n_ff).max(hp.n_head * hp.head_dim_v),
        usize::max,
    );
    (max_cols, hidden)
}

/// A vector of f32 on the GPU.
fn vector(ctx: &GpuContext, v: &[f32]) -> wgpu::Buffer {
    ctx.storage("vector", bytemuck::cast_slice(v))
}

fn optional(ctx: &GpuContext, v: &Option<Vec<f32>>) -> Option<wgpu::Buffer> {
    v.as_deref().map(|v| vector(ctx, v))
}

fn upload_block(ctx: &GpuContext, model: &Model, l: &LayerWeights) -> Result<GpuBlock> {
    let m = |w: &Weight| GpuMatrix::upload(ctx, &model.matrix(w));
    let gate = l
        .gate
        .as_ref()
        .ok_or_else(|| unsupported("FFNs without gate"))?;
    // The sparse axpy when the file has the neuron-major copy (as the CPU pass), else dense.
    let down = match (&l.down_t, &l.down) {
        (Some(t), _) if AXPY_TYPES.contains(&t.ty) => Down::Neurons(m(t)?),
        (_, Some(d)) => Down::Rows(m(d)?),
        _ => return Err(unsupported("this ffn_down_t type")),
    };
    let predictor = match &l.predictor {
        Some(p) => Some((m(&p.fc1)?, m(&p.fc2)?)),
        None => None,
    };
    Ok(GpuBlock {
        attn_norm: vector(ctx, &l.attn_norm.weight),
        wq: m(&l.wq)?,
        wk: m(&l.wk)?,
        wv: m(&l.wv)?,
        bq: optional(ctx, &l.bq),
        bk: optional(ctx, &l.bk),
        bv: optional(ctx, &l.bv),
        q_norm: optional(ctx, &l.q_norm),
        k_norm: optional(ctx, &l.k_norm),
        wo: m(&l.wo)?,
        bo: optional(ctx, &l.bo),
        post_attn_norm: optional(ctx, &l.post_attn_norm),
        ffn_norm: vector(ctx, &l.ffn_norm.weight),
        gate: m(gate)?,
        up: m(&l.up)?,
        down,
        predictor,
        post_ffn_norm: optional(ctx, &l.post_ffn_norm),
    })
}

impl GpuModel {
    /// Uploads every weight of `model` the forward pass reads in FFN mode `mode` (checked with
    /// [`check_supported`]); the predictors too when the file has them.
    ///
    /// Errors: those of [`check_supported`]; [`Error::Gpu`] when a buffer cannot be made.
    pub fn upload(ctx: Arc<GpuContext>, model: &Model, mode: FfnMode) -> Result<GpuModel> {
        GpuModel::upload_layers(ctx, model, mode, 0..model.hp.n_layer, true)
    }

    /// Uploads the blocks of the consecutive `layers` only (no LM head): a GPU segment that
    /// [`super::GpuSession::run_segment`] runs on a residual stream the CPU hands over, with the
    /// KV cache of those layers on the GPU (llama.cpp-style layer offload).
    ///
    /// Errors: [`Error::InvalidArgument`] for an empty range or one past the last layer; those
    /// of [`GpuModel::upload`].
    pub fn upload_segment(
        ctx: Arc<GpuContext>,
        model: &Model,
        mode: FfnMode,
        layers: Range<usize>,
    ) -> Result<GpuModel> {
        if layers.is_empty() || layers.end > model.hp.n_layer {
            return Err(Error::InvalidArgument(format!(
                "a GPU segment of layers {layers:?} in a model of {} layers",
                model.hp.n_layer
            )));
        }
        GpuModel::upload_layers(ctx, model, mode, layers, false)
    }

    fn upload_layers(
        ctx: Arc<GpuContext>,
        model: &Model,
        mode: FfnMode,
        layers: Range<usize>,
        with_head: bool,
    ) -> Result<GpuModel> {
        check_supported(model, mode)?;
        let blocks = model.layers[layers.clone()]
            .iter()
            .map(|l| upload_block(&ctx, model, l))
            .collect::<Result<Vec<_>>>()?;
        let head = match with_head {
            true => Some(GpuHead {
                norm: vector(&ctx, &model.output_norm.weight),
                output: GpuMatrix::upload(&ctx, &model.matrix(&model.output))?,
            }),
            false => None,
        };
        let hp = model.hp.clone();
        let all: Vec<u32> = (0..hp.n_ff as u32).collect();
        let all_buf = ctx.storage("neurons", bytemuck::cast_slice(&all));
        let (max_cols, hidden) = widths(model);
        let bytes = match with_head {
            true => resident_bytes(model),
            false => layers.clone().map(|il| block_bytes(model, il)).sum(),
        };
        Ok(GpuModel {
            ctx,
            hp,
            layers,
            blocks,
            head,
            all_neurons: (all, all_buf),
            max_cols,
            hidden,
            bytes,
        })
    }

    /// The layers on the GPU (all of them for a whole model).
    pub fn layers(&self) -> Range<usize> {
        self.layers.clone()
    }

    /// Whether this is the whole model (every block and the LM head), as [`GpuModel::upload`]
    /// makes it, rather than a segment.
    pub fn is_whole(&self) -> bool {
        self.head.is_some()
    }

    /// Bytes of weight matrices on the GPU ([`resident_bytes`]).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The GPU in use.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }
}
