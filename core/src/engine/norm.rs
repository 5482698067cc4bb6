//! The models' norms over rows of the residual stream: RMSNorm, or LayerNorm with bias (Falcon,
//! OPT), computed as ggml computes them.

use crate::cpu::ops;
use crate::model::{HyperParams, Norm, NormKind};

/// `norm(row)` for every row of `x` (rows of `norm.weight.len()`), into a new buffer.
pub(super) fn norm_rows(hp: &HyperParams, norm: &Norm, x: &[f32]) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    let width = norm.weight.len();
    for (o, row) in out.chunks_exact_mut(width).zip(x.chunks_exact(width)) {
        norm_row_into(hp, norm, row, o);
    }
    out
}

/// `norm(row)` for every row of `x`, in place.
pub(super) fn norm_rows_in_place(hp: &HyperParams, norm: &Norm, x: &mut [f32]) {
    let mut scratch = vec![0f32; norm.weight.len()];
    for row in x.chunks_exact_mut(norm.weight.len()) {
        norm_row_into(hp, norm, row, &mut scratch);
        row.copy_from_slice(&scratch);
    }
}

fn norm_row_into(hp: &HyperParams, norm: &Norm, x: &[f32], out: &mut [f32]) {
    match hp.norm {
        NormKind::Rms => ops::rms_norm_into(x, &norm.weight, hp.rms_eps, out),
        NormKind::Layer => layer_norm_into(x, &norm.weight, norm.bias.as_deref(), hp.rms_eps, out),
    }
}

/// `out = (x − mean) / sqrt(var + eps) · w + b` over one row: ggml's `norm` (sums in f64, the
/// centred values and the variance rounded to f32), then its `mul` and `add`.
fn layer_norm_into(x: &[f32], w: &[f32], b: Option<&[f32]>, eps: f32, out: &mut [f32]) {
    let n = x.len() as f64;
    let mean = (x.iter().map(|&v| f64::from(v)).sum::<f64>() / n) as f32;
    let mut sum2 = 0f64;
    for (o, &v) in out.iter_mut().zip(x) {
        let c = v - mean;
        *o = c;
        sum2 += f64::from(c * c);
    }
    let variance = (sum2 / n) as f32;
    let scale = 1.0 / (variance + eps).sqrt();
    for (o, &g) in out.iter_mut().zip(w) {
        *o = *o * scale * g;
    }
    if let Some(b) = b {
        out.iter_mut().zip(b).for_each(|(o, &c)| *o += c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_norm_centres_scales_and_shifts() {
        let x = [1.0f32, 2.0, 3.0, 6.0];
        let w = [1.0f32, 2.0, 1.0, 0.5];
        let b = [0.0f32, 1.0, -1.0, 0.0];
        let mut out = [0f32; 4];
        layer_norm_into(&x, &w, Some(&b), 0.0, &mut out);
        // mean 3, variance (4 + 1 + 0 + 9) / 4 = 3.5
        let s = 1.0 / 3.5f32.sqrt();
        let expected = [-2.0 * s, -s * 2.0 + 1.0, -1.0, 3.0 * s * 0.5];
        for (o, e) in out.iter().zip(expected) {
            assert!((o - e).abs() < 1e-6, "{out:?} vs {expected:?}");
        }
        let mean: f32 = {
            layer_norm_into(&x, &[1.0; 4], None, 1e-5, &mut out);
            out.iter().sum::<f32>() / 4.0
        };
        assert!(mean.abs() < 1e-6);
    }
}
