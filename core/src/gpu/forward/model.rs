//! A model's weights resident on the GPU: every matrix (packed blocks), norm and bias of the
//! blocks, the final norm and the LM head, and the predictors of a sparse file. The token
//! embedding stays on the CPU: one row per token is dequantised there and uploaded.

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

/// A whole model on the GPU, ready for [`super::GpuSession`]s.
pub struct GpuModel {
    pub(super) ctx: Arc<GpuContext>,
    pub(super) hp: HyperParams,
    pub(super) blocks: Vec<GpuBlock>,
    pub(super) output_norm: wgpu::Buffer,
    pub(super) output: GpuMatrix,
    /// `0..n_ff` on the CPU and on the GPU: the rows of the down axpy.
    pub(super) all_neurons: (Vec<u32>, wgpu::Buffer),
    /// The widest vector a product takes.
    pub(super) max_cols: usize,
    bytes: u64,
}

impl std::fmt::Debug for GpuModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuModel")
            .field("gpu", &self.ctx.describe())
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

/// Bytes of weight matrices [`GpuModel::upload`] puts on the GPU for `model` (norms and biases
/// aside): what a `--vram-budget` must hold for the resident pass.
pub fn resident_bytes(model: &Model) -> u64 {
    let bytes = |w: &Weight| (w.rows * (w.cols / w.ty.block_size() * w.ty.block_bytes())) as u64;
    let blocks: u64 = model
        .layers
        .iter()
        .flat_map(block_matrices)
        .map(bytes)
        .sum();
    blocks + bytes(&model.output)
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
        check_supported(model, mode)?;
        let blocks = model
            .layers
            .iter()
            .map(|l| upload_block(&ctx, model, l))
            .collect::<Result<Vec<_>>>()?;
        let output = GpuMatrix::upload(&ctx, &model.matrix(&model.output))?;
        let hp = model.hp.clone();
        let all: Vec<u32> = (0..hp.n_ff as u32).collect();
        let all_buf = ctx.storage("neurons", bytemuck::cast_slice(&all));
        let predictor_width = blocks.iter().filter_map(|b| b.predictor.as_ref());
        let max_cols = predictor_width.map(|(_, fc2)| fc2.cols).fold(
            hp.n_embd.max(hp.n_ff).max(hp.n_head * hp.head_dim_v),
            usize::max,
        );
        let bytes = resident_bytes(model);
        let output_norm = vector(&ctx, &model.output_norm.weight);
        Ok(GpuModel {
            ctx,
            hp,
            blocks,
            output_norm,
            output,
            all_neurons: (all, all_buf),
            max_cols,
            bytes,
        })
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
