//! The predictor's second layer stored rank-major, for the engine: `fc2 · hidden` as a sparse
//! axpy over the hidden units that `relu` left non-zero.
//!
//! In the file, `fc2` is `n_ff` rows of `R` (one row per neuron), so a matrix-vector product reads
//! all of it even though `relu(fc1 · x)` zeroes about half the hidden units (PowerInfer's trained
//! predictors and `synth`'s exact `[A; −A]` ones alike). Stored with one row per hidden unit,
//! `logits = Σ_{j : hidden_j ≠ 0} hidden_j · row_j` ([`sparse_axpy`]) reads only the rows of the
//! non-zero units. The rows are cut into spans of [`SPAN`](crate::cpu::sparse_ffn::SPAN) neurons, each span a contiguous
//! `R × SPAN` matrix, so that one task of the fused sparse FFN
//! ([`predicted_activations`](crate::cpu::sparse_ffn::predicted_activations)) computes the logits of
//! its own spans alone; a span's logits are the same bits whichever task or batch computes them.

use std::fmt;
use std::sync::Arc;

use crate::cpu::{dequantize_row, sparse_axpy, Matrix};
use crate::quant::{self, GgmlType};
use crate::{Error, Result};

use crate::cpu::sparse_ffn::SPAN;

/// `fc2` (`n_ff × R`) as `R × n_ff`, in spans of [`SPAN`](crate::cpu::sparse_ffn::SPAN) columns (neurons), each span's `R` rows
/// contiguous.
#[derive(Clone)]
pub struct RankMajorFc2 {
    /// Element type of the copy.
    pub ty: GgmlType,
    /// Hidden units `R` (rows of each span).
    pub rank: usize,
    /// Neurons (columns).
    pub n_ff: usize,
    data: Arc<[u8]>,
}

impl fmt::Debug for RankMajorFc2 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RankMajorFc2 {{ {} × {} {}, {} bytes }}",
            self.rank,
            self.n_ff,
            self.ty,
            self.data.len()
        )
    }
}

impl RankMajorFc2 {
    /// The rank-major copy of `fc2` (`n_ff` rows of `R`), encoded as `ty` (F32, F16 and BF16 keep
    /// the values; a block type rounds them once, in blocks along the neurons).
    ///
    /// Errors: [`Error::InvalidArgument`] when `n_ff` is not a whole number of `ty`'s blocks;
    /// [`Error::UnsupportedType`] for a type that cannot be dequantised or encoded.
    pub fn new(fc2: &Matrix, ty: GgmlType) -> Result<RankMajorFc2> {
        Matrix::new(fc2.ty, fc2.rows, fc2.cols, fc2.data)?;
        let (n_ff, rank) = (fc2.rows, fc2.cols);
        if !n_ff.is_multiple_of(ty.block_size()) {
            return Err(Error::InvalidArgument(format!(
                "{n_ff} neurons are not a whole number of {ty} blocks"
            )));
        }
        // transposed, span by span: t[span][j][i - span start]
        let mut t = vec![0f32; n_ff * rank];
        let mut row = vec![0f32; rank];
        for i in 0..n_ff {
            dequantize_row(fc2, i, &mut row)?;
            let (start, len) = span_bounds(i / SPAN, n_ff);
            let base = start * rank;
            for (j, &v) in row.iter().enumerate() {
                t[base + j * len + (i - start)] = v;
            }
        }
        let bytes = ty.row_bytes(n_ff as u64 * rank as u64)? as usize;
        let mut data = vec![0u8; bytes];
        quant::quantize(ty, &t, &mut data)?;
        Ok(RankMajorFc2 {
            ty,
            rank,
            n_ff,
            data: data.into(),
        })
    }

    /// The type of the copy of an `fc2` of type `ty` and `n_ff` neurons: float types as they are,
    /// the block types Q8_0 (whose axpy reads 8.5 bits per weight), or F16 where `n_ff` is not a
    /// whole number of Q8_0 blocks.
    pub fn type_for(ty: GgmlType, n_ff: usize) -> GgmlType {
        match ty {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => ty,
            _ if n_ff.is_multiple_of(GgmlType::Q8_0.block_size()) => GgmlType::Q8_0,
            _ => GgmlType::F16,
        }
    }

    /// Number of spans.
    pub fn n_spans(&self) -> usize {
        self.n_ff.div_ceil(SPAN)
    }

    /// Bytes of the copy.
    pub fn n_bytes(&self) -> u64 {
        self.data.len() as u64
    }

    /// Span `s` (neurons `s·SPAN ..`): `R` rows of its neurons' weights.
    pub fn span(&self, s: usize) -> Matrix<'_> {
        let (start, len) = span_bounds(s, self.n_ff);
        let per_value = |n: usize| n / self.ty.block_size() * self.ty.block_bytes();
        let from = per_value(start * self.rank);
        let data = &self.data[from..from + per_value(len * self.rank)];
        Matrix {
            ty: self.ty,
            rows: self.rank,
            cols: len,
            data,
        }
    }

    /// The logits of span `s` for one token: `out` (the span's neurons) `= Σ_j hidden[j] · row_j`
    /// over the non-zero `hidden` (`R` values).
    ///
    /// Errors: [`Error::InvalidArgument`] for wrong lengths.
    pub fn span_logits(&self, s: usize, hidden: &[f32], out: &mut [f32]) -> Result<()> {
        out.fill(0.0);
        sparse_axpy(&self.span(s), hidden, 1, out)
    }

    /// The logits of `n` tokens: `out` (`n × n_ff`) from `hidden` (`n × R`), span by span (each
    /// token's values are the bits [`RankMajorFc2::span_logits`] gives it).
    ///
    /// Errors: [`Error::InvalidArgument`] for wrong lengths.
    pub fn logits(&self, hidden: &[f32], n: usize, out: &mut [f32]) -> Result<()> {
        if hidden.len() != n * self.rank || out.len() != n * self.n_ff {
            return Err(Error::InvalidArgument(format!(
                "predictor logits: {} hidden values and {} outputs for {n} tokens of rank {} and \
                 {} neurons",
                hidden.len(),
                out.len(),
                self.rank,
                self.n_ff
            )));
        }
        let mut part = Vec::new();
        for s in 0..self.n_spans() {
            let (start, len) = span_bounds(s, self.n_ff);
            part.clear();
            part.resize(n * len, 0.0);
            sparse_axpy(&self.span(s), hidden, n, &mut part)?;
            for (dst, src) in out.chunks_exact_mut(self.n_ff).zip(part.chunks_exact(len)) {
                dst[start..start + len].copy_from_slice(src);
            }
        }
        Ok(())
    }
}

/// First neuron and length of span `s` of `n_ff` neurons.
fn span_bounds(s: usize, n_ff: usize) -> (usize, usize) {
    let start = s * SPAN;
    (start, SPAN.min(n_ff - start))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `rows × cols` F16 matrix of values from a small LCG in [-1, 1), and the values.
    fn f16_matrix(rows: usize, cols: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
        let mut s = seed;
        let v: Vec<f32> = (0..rows * cols)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                half::f16::from_f32((s >> 40) as f32 / (1u64 << 23) as f32 - 1.0).to_f32()
            })
            .collect();
        let mut bytes = vec![0u8; rows * cols * 2];
        quant::quantize(GgmlType::F16, &v, &mut bytes).unwrap();
        (bytes, v)
    }

    /// `fc2 · hidden` in f64 from the matrix's values.
    fn reference(v: &[f32], n_ff: usize, rank: usize, hidden: &[f32]) -> Vec<f64> {
        (0..n_ff)
            .map(|i| {
                (0..rank)
                    .map(|j| f64::from(v[i * rank + j]) * f64::from(hidden[j]))
                    .sum()
            })
            .collect()
    }

    #[test]
    fn logits_are_fc2_times_hidden_and_skip_zero_units() {
        // 600 neurons: two whole spans and a short one
        let (n_ff, rank) = (608, 48);
        let (bytes, v) = f16_matrix(n_ff, rank, 5);
        let fc2 = Matrix::new(GgmlType::F16, n_ff, rank, &bytes).unwrap();
        let mut hidden: Vec<f32> = (0..rank).map(|j| (j as f32 * 0.37).sin()).collect();
        // relu's zeros: the rows of these units must not be read (a NaN there would spread)
        for j in (0..rank).step_by(2) {
            hidden[j] = 0.0;
        }
        // F16 keeps the (f16) values; Q8_0 moves each weight (|w| < 1) by at most half a step of
        // 1/127
        let l1: f64 = hidden.iter().map(|&h| f64::from(h.abs())).sum();
        for (ty, tol) in [(GgmlType::F16, 1e-5), (GgmlType::Q8_0, l1 / 254.0 + 1e-5)] {
            let mut t = RankMajorFc2::new(&fc2, ty).unwrap();
            assert_eq!(t.n_spans(), 3);
            let want = reference(&v, n_ff, rank, &hidden);
            let mut got = vec![f32::NAN; n_ff];
            t.logits(&hidden, 1, &mut got).unwrap();
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(g) - w).abs() <= tol,
                    "{ty} neuron {i}: {g} vs {w}"
                );
            }
            // poison the zero units' rows: the logits must not change
            let data = Arc::get_mut(&mut t.data).unwrap();
            let poison = match ty {
                GgmlType::F16 => half::f16::NAN.to_bits().to_le_bytes().to_vec(),
                _ => vec![0xff; 34],
            };
            for s in 0..3 {
                let (start, len) = span_bounds(s, n_ff);
                let from = start * rank / ty.block_size() * ty.block_bytes();
                let rb = ty.row_bytes(len as u64).unwrap() as usize;
                for j in (0..rank).step_by(2) {
                    let row = &mut data[from + j * rb..from + (j + 1) * rb];
                    for chunk in row.chunks_exact_mut(poison.len()) {
                        chunk.copy_from_slice(&poison);
                    }
                }
            }
            let mut again = vec![0f32; n_ff];
            t.logits(&hidden, 1, &mut again).unwrap();
            assert!(again
                .iter()
                .zip(&got)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }

    #[test]
    fn a_batch_gives_each_token_its_single_token_bits() {
        let (n_ff, rank) = (512, 32);
        let (bytes, _) = f16_matrix(n_ff, rank, 9);
        let fc2 = Matrix::new(GgmlType::F16, n_ff, rank, &bytes).unwrap();
        let t = RankMajorFc2::new(&fc2, GgmlType::Q8_0).unwrap();
        let n = 3;
        let hidden: Vec<f32> = (0..n * rank)
            .map(|k| ((k as f32 * 0.91).cos()).max(0.0))
            .collect();
        let mut batch = vec![0f32; n * n_ff];
        t.logits(&hidden, n, &mut batch).unwrap();
        for tok in 0..n {
            for s in 0..t.n_spans() {
                let mut one = vec![0f32; SPAN];
                t.span_logits(s, &hidden[tok * rank..][..rank], &mut one)
                    .unwrap();
                let want = &batch[tok * n_ff + s * SPAN..][..SPAN];
                assert!(one
                    .iter()
                    .zip(want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()));
            }
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let (bytes, _) = f16_matrix(48, 16, 1);
        let fc2 = Matrix::new(GgmlType::F16, 48, 16, &bytes).unwrap();
        // 48 neurons are not whole Q8_0 blocks... they are (32 divides 48? no)
        assert!(RankMajorFc2::new(&fc2, GgmlType::Q8_0).is_err());
        let t = RankMajorFc2::new(&fc2, GgmlType::F16).unwrap();
        let mut out = vec![0f32; 48];
        assert!(t.logits(&[0.0; 15], 1, &mut out).is_err());
        assert!(t.logits(&[0.0; 16], 1, &mut out[..47]).is_err());
        assert!(t.logits(&[0.0; 16], 1, &mut out).is_ok());
    }
}
