//! TEAL (Liu et al. 2024, "Training-Free Activation Sparsity in Large Language Models"): the input
//! of every matrix of a block is thresholded by magnitude, `x_i := 0` when `|x_i| < t`, with one
//! calibrated threshold per layer and matrix (or by WINA's weight-informed score, see
//! [`ChannelRule`]); a zero input channel `i` skips column `i` of the weight. To make that skip a
//! skip of memory, [`Teal::new`] repacks the weights of `Q`, `K`, `V`, `O`, gate, up and down input-major at load (one contiguous row of `n_out` values per input
//! channel, quantised along the output dimension, see [`repack_type`]) and each product becomes
//! the column-sparse `y = Σ_{i kept} x_i · W[:, i]`, i.e. [`cpu::sparse_axpy`] over the repacked
//! matrix (AVX2/AVX-512 with a scalar fallback, parallel over fixed output ranges, deterministic:
//! the same kernel as the FFN's neuron-major down projection). Q4_0 copies instead go to
//! [`cpu::sparse_axpy_int8`] where the CPU has its kernels (x86-64 with AVX2): the kept inputs
//! times the block scales are rounded to 8 bits, as a dense matmul rounds its inputs, and the
//! products run as integer dot products (the float axpy that unpacks nibbles is compute-bound).
//! Only a session in TEAL mode pays the memory of the copies.
//!
//! Prompt processing (a forward batch with more than one row for a sequence) stays dense unless
//! the session asks for sparse prefill (TEAL reports that sparsifying prefill hurts).
//!
//! ## Metadata (written by `hotcold calibrate --sparsity-mode teal`)
//! - [`TEAL_THRESHOLDS_KEY`] `hotcold.teal.thresholds`: `n_layer × 7` f32, layer-major, in
//!   [`Proj::ALL`] order (q, k, v, o, gate, up, down): channel `i` of the matrix's input is
//!   skipped when its score (`|x_i|` under the default criterion) is below the threshold.
//! - [`TEAL_CRITERION_KEY`] `hotcold.teal.criterion`: `magnitude` (TEAL's `|x_i|`, the default
//!   when absent) or `wina` (`|x_i| · ‖W[:, i]‖₂` is compared with the threshold instead, see
//!   [`ChannelRule`]).
//! - [`TEAL_TARGET_KEY`] `hotcold.teal.target_sparsity`: the model-wide target the thresholds were
//!   calibrated for (f32, informational).
//! - [`TEAL_SPARSITY_KEY`] `hotcold.teal.sparsity`: the calibrated skipped fraction per layer and
//!   matrix, same layout as the thresholds (informational).

mod allocate;
mod criterion;
mod histogram;
mod measure;
mod record;
mod stats;

use rayon::prelude::*;

pub use allocate::Allocation;
pub use criterion::ChannelRule;
pub use histogram::MagnitudeHistogram;
pub use measure::{block_errors, measured_allocation, LayerAllocation};
pub use record::{TealCalibration, TealRecorder};
use stats::Counters;
pub use stats::TealStats;

use super::linear::{dense_project, Linear, Proj};
use super::offload::{CpuFfn, FfnOffload, FfnTensor};
use crate::cpu::{self, Matrix};
use crate::model::{Model, Weight};
use crate::quant::GgmlType;
use crate::{Error, Result};

pub use crate::model::{TealCriterion, TEAL_CRITERION_KEY, TEAL_THRESHOLDS_KEY};
/// Metadata key of the model-wide target sparsity the TEAL thresholds were calibrated for.
pub const TEAL_TARGET_KEY: &str = "hotcold.teal.target_sparsity";
/// Metadata key of the calibrated skipped fraction per layer and matrix.
pub const TEAL_SPARSITY_KEY: &str = "hotcold.teal.sparsity";

/// The error for TEAL on a file without calibrated thresholds.
pub const TEAL_NEEDS_THRESHOLDS: &str =
    "TEAL needs thresholds from `hotcold calibrate --target-sparsity S --sparsity-mode teal` (hotcold.teal.thresholds)";

/// How [`Teal::new`] builds its operators.
#[derive(Clone, Copy, Debug, Default)]
pub struct TealOptions {
    /// The type of the input-major copies (default: [`repack_type`] of each matrix).
    pub repack: Option<GgmlType>,
    /// Threshold prompt processing too (default: batches of more than one row run dense).
    pub sparse_prefill: bool,
}

/// One matrix stored input-major: `n_in` rows of `n_out` values.
struct InputMajor {
    n_in: usize,
    n_out: usize,
    weights: Weights,
}

/// The weights of an input-major copy.
enum Weights {
    /// ggml blocks, for [`cpu::sparse_axpy`] (exact per term).
    Blocks(GgmlType, Vec<u8>),
    /// Q4_0 with the scales split out, for [`cpu::sparse_axpy_int8`] (8-bit coefficients on
    /// integer dot products), chosen for Q4_0 copies where the CPU has its kernel.
    Int8(cpu::SplitQ4_0),
}

impl InputMajor {
    /// The copy of `bytes` (`n_in` rows of `n_out` values of `ty`): Q4_0 copies go to the
    /// integer kernel where this CPU has it.
    fn new(ty: GgmlType, n_in: usize, n_out: usize, bytes: Vec<u8>) -> Result<InputMajor> {
        let weights = if ty == GgmlType::Q4_0 && cpu::sparse_axpy_int8_is_fast() {
            Weights::Int8(cpu::SplitQ4_0::new(&Matrix::new(ty, n_in, n_out, &bytes)?)?)
        } else {
            Weights::Blocks(ty, bytes)
        };
        Ok(InputMajor {
            n_in,
            n_out,
            weights,
        })
    }

    /// Bytes of the copy.
    fn bytes(&self) -> usize {
        match &self.weights {
            Weights::Blocks(_, b) => b.len(),
            Weights::Int8(s) => s.bytes(),
        }
    }

    /// Bytes of one input channel's column.
    fn column_bytes(&self) -> usize {
        self.bytes() / self.n_in.max(1)
    }

    /// `y += Σ_i xs_i · row_i` for `n` rows of thresholded inputs.
    fn axpy(&self, xs: &[f32], n: usize, y: &mut [f32]) -> Result<()> {
        match &self.weights {
            Weights::Blocks(ty, bytes) => {
                let m = Matrix::new(*ty, self.n_in, self.n_out, bytes)?;
                cpu::sparse_axpy(&m, xs, n, y)
            }
            Weights::Int8(split) => xs
                .chunks_exact(self.n_in)
                .zip(y.chunks_exact_mut(self.n_out))
                .try_for_each(|(x, y)| cpu::sparse_axpy_int8(split, x, y)),
        }
    }
}

/// TEAL's sparse operators for one model: thresholds, input-major weights and counters of the
/// channels kept. Install it on a session with [`Session::set_teal`](super::Session::set_teal).
pub struct Teal {
    thresholds: Vec<[f32; 7]>,
    rule: ChannelRule,
    mats: Vec<[InputMajor; 7]>,
    sparse_prefill: bool,
    counters: Counters,
}

/// The input-major type for a matrix of `src` weights with `n_out` outputs: F32 stays F32, F16 and
/// BF16 become F16; a legacy 4-bit file (Q4_0, Q4_1) gets Q4_0 copies (blocks of 32 outputs of one
/// input channel, so a skipped channel skips its bytes at the file's 4.5 bits per weight); any
/// other quantised type becomes Q8_0; F16 when 32 does not divide `n_out`.
///
/// Re-quantising regroups the values into new blocks and rounds them a second time. Measured on
/// Gemma 3 270M Q4_K_M (mostly Q5_0 tensors) at threshold 0, perplexity on
/// `tests/data/text/origin.txt` (dense 21.34): Q8_0 copies 21.40, Q4_0 copies 27.97 (at the 40%
/// thresholds: 30.9 and 42.1); so K-quant files keep Q8_0 copies (about as many bytes per token
/// as their dense product: no speed-up on them, see `benches/teal.sh`), and `--teal-type q4_0`
/// trades that quality for the bytes.
pub fn repack_type(src: GgmlType, n_out: usize) -> GgmlType {
    match src {
        GgmlType::F32 => GgmlType::F32,
        GgmlType::F16 | GgmlType::BF16 => GgmlType::F16,
        _ if !n_out.is_multiple_of(32) => GgmlType::F16,
        GgmlType::Q4_0 | GgmlType::Q4_1 => GgmlType::Q4_0,
        _ => GgmlType::Q8_0,
    }
}

impl Teal {
    /// TEAL for `model` with the file's thresholds and criterion (an error when it has no
    /// thresholds).
    pub fn new(model: &Model, opts: TealOptions) -> Result<Teal> {
        let thresholds = model
            .hp
            .teal_thresholds
            .clone()
            .ok_or_else(|| Error::InvalidArgument(TEAL_NEEDS_THRESHOLDS.into()))?;
        let rule = ChannelRule::new(model, model.hp.teal_criterion)?;
        Teal::with_thresholds(model, thresholds, rule, opts)
    }

    /// TEAL for `model` with the given thresholds (one row of seven per layer), applied as `rule`
    /// says.
    pub fn with_thresholds(
        model: &Model,
        thresholds: Vec<[f32; 7]>,
        rule: ChannelRule,
        opts: TealOptions,
    ) -> Result<Teal> {
        let n_layer = model.hp.n_layer;
        if thresholds.len() != n_layer {
            return Err(Error::InvalidArgument(format!(
                "{} rows of TEAL thresholds for {n_layer} layers",
                thresholds.len()
            )));
        }
        if let Some(t) = thresholds
            .iter()
            .flatten()
            .find(|t| t.is_nan() || **t < 0.0)
        {
            return Err(Error::InvalidArgument(format!(
                "TEAL threshold {t} is not a non-negative number"
            )));
        }
        let mats = (0..n_layer)
            .into_par_iter()
            .map(|il| repack_layer(model, il, opts.repack))
            .collect::<Result<Vec<_>>>()?;
        Ok(Teal {
            thresholds,
            rule,
            mats,
            sparse_prefill: opts.sparse_prefill,
            counters: Counters::new(n_layer),
        })
    }

    /// The channels kept and the bytes read so far, per layer and matrix.
    pub fn stats(&self) -> TealStats {
        let sizes: Vec<[(usize, usize, usize); 7]> = self
            .mats
            .iter()
            .map(|l| std::array::from_fn(|p| (l[p].n_in, l[p].n_out, l[p].column_bytes())))
            .collect();
        self.counters.snapshot(&sizes)
    }

    /// Forgets the counts so far (e.g. after a warm-up).
    pub fn reset_stats(&self) {
        self.counters.reset();
    }

    /// Bytes of the input-major copies.
    pub fn repacked_bytes(&self) -> u64 {
        self.mats.iter().flatten().map(|m| m.bytes() as u64).sum()
    }

    /// `W · x` with the inputs below the threshold skipped (`n` rows; dense for a batch of more
    /// than one row unless sparse prefill is on).
    fn sparse_project(
        &self,
        model: &Model,
        il: usize,
        which: Proj,
        x: &[f32],
        n: usize,
    ) -> Result<Vec<f32>> {
        if n > 1 && !self.sparse_prefill {
            return dense_project(model, il, which, x, n);
        }
        self.column_sparse(il, which, x, n)
    }

    /// The column-sparse product: `x` thresholded (see [`ChannelRule`]), then
    /// `Σ_{i kept} x_i · W[:, i]` over the input-major copy.
    fn column_sparse(&self, il: usize, which: Proj, x: &[f32], n: usize) -> Result<Vec<f32>> {
        let m = &self.mats[il][which.index()];
        if x.len() != n * m.n_in {
            return Err(Error::InvalidArgument(format!(
                "{} inputs for {n} rows of {} (blk.{il}.{})",
                x.len(),
                m.n_in,
                which.name()
            )));
        }
        let t = self.thresholds[il][which.index()];
        let mut xs = x.to_vec();
        let kept = self.rule.mask(il, which, t, &mut xs);
        self.counters.add(il, which, kept, (n * m.n_in) as u64);
        let mut y = vec![0f32; n * m.n_out];
        m.axpy(&xs, n, &mut y)?;
        Ok(y)
    }
}

/// Layer `il`'s matrix `p` as TEAL reads it, and whether it is stored input-major: PowerInfer's
/// files keep down only neuron-major (`ffn_down_t`, whose rows are its input channels); every
/// other matrix must be row-major.
fn block_weight(model: &Model, il: usize, p: Proj) -> Result<(&Weight, bool)> {
    let layer = &model.layers[il];
    if let (Proj::Down, None, Some(w_t)) = (p, &layer.down, &layer.down_t) {
        return Ok((w_t, true));
    }
    let w = p.weight(layer).ok_or_else(|| Error::Tensor {
        tensor: format!("blk.{il}.{}.weight", p.name()),
        message: "TEAL needs every matrix of the block row-major (gate, up and ffn_down)".into(),
    })?;
    Ok((w, false))
}

/// Layer `il`'s seven matrices input-major.
fn repack_layer(model: &Model, il: usize, ty: Option<GgmlType>) -> Result<[InputMajor; 7]> {
    let mut out = Vec::with_capacity(7);
    for p in Proj::ALL {
        let (w, input_major) = block_weight(model, il, p)?;
        if input_major {
            let ty = ty.unwrap_or_else(|| repack_type(w.ty, w.cols));
            let bytes = reencode(&model.matrix(w), ty)?;
            out.push(InputMajor::new(ty, w.rows, w.cols, bytes)?);
            continue;
        }
        let ty = ty.unwrap_or_else(|| repack_type(w.ty, w.rows));
        let bytes =
            crate::model::transposed_as(&model.matrix(w), ty).map_err(|e| Error::Tensor {
                tensor: w.name.clone(),
                message: format!("cannot repack input-major as {}: {e}", ty.name()),
            })?;
        out.push(InputMajor::new(ty, w.cols, w.rows, bytes)?);
    }
    Ok(out
        .try_into()
        .unwrap_or_else(|_| unreachable!("seven matrices")))
}

/// The rows of `m` re-encoded as `ty` (a copy when it already is `ty`).
fn reencode(m: &Matrix, ty: GgmlType) -> Result<Vec<u8>> {
    if m.ty == ty {
        return Ok(m.data.to_vec());
    }
    let row_bytes = ty.row_bytes(m.cols as u64)? as usize;
    let mut bytes = vec![0u8; row_bytes * m.rows];
    let mut row = vec![0f32; m.cols];
    for (r, dst) in bytes.chunks_exact_mut(row_bytes).enumerate() {
        cpu::dequantize_row(m, r, &mut row)?;
        crate::quant::quantize(ty, &row, dst)?;
    }
    Ok(bytes)
}

impl Linear for Teal {
    fn project(
        &self,
        model: &Model,
        il: usize,
        which: Proj,
        x: &[f32],
        n: usize,
    ) -> Result<Vec<f32>> {
        self.sparse_project(model, il, which, x, n)
    }
}

/// The FFN's products: gate, up and down through the sparse operator; the gathers of the
/// predictor-driven modes stay on the CPU's dense rows.
impl FfnOffload for Teal {
    fn matmul(
        &self,
        model: &Model,
        il: usize,
        which: FfnTensor,
        x: &[f32],
        n: usize,
    ) -> Result<Vec<f32>> {
        let p = Proj::from(which);
        self.sparse_project(model, il, p, x, n)
    }

    /// Files with a neuron-major down (no row-major one) reach down here: thresholded like the
    /// other inputs, over TEAL's copy of it.
    fn down_axpy(&self, model: &Model, il: usize, a: &[f32], n: usize) -> Result<Vec<f32>> {
        if n > 1 && !self.sparse_prefill {
            return CpuFfn.down_axpy(model, il, a, n);
        }
        self.column_sparse(il, Proj::Down, a, n)
    }
}

#[cfg(test)]
mod tests;
