//! Element-wise and normalisation kernels (RMSNorm, RoPE, softmax, activations), as ggml computes
//! them, so that the dense forward pass follows llama.cpp closely.

use std::sync::OnceLock;

use half::f16;

/// `x = x / rms(x) * w` over one row (`eps` inside the square root, as ggml's `rms_norm`).
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    debug_assert_eq!(x.len(), w.len());
    let scale = rms_scale(x, eps);
    for (v, &g) in x.iter_mut().zip(w) {
        *v = *v * scale * g;
    }
}

/// `out = x / rms(x) * w` over one row.
pub fn rms_norm_into(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let scale = rms_scale(x, eps);
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

fn rms_scale(x: &[f32], eps: f32) -> f32 {
    // ggml sums in f64 (ggml_float) for its norms.
    let sum: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let mean = (sum / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// How RoPE pairs the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i+1)` (ggml `LLAMA_ROPE_TYPE_NORM`: Llama, Mistral).
    Normal,
    /// Halves `(i, i + d/2)` (ggml `LLAMA_ROPE_TYPE_NEOX`: Gemma, Qwen2, GPT-NeoX).
    Neox,
}

/// RoPE parameters for one (base, scale, rotated dimensions) triple.
#[derive(Clone, Debug)]
pub struct Rope {
    style: RopeStyle,
    theta_scale: f32,
    freq_scale: f32,
    n_rot: usize,
}

impl Rope {
    /// RoPE over the first `n_rot` dimensions of each head with the given base and linear scale.
    pub fn new(style: RopeStyle, n_rot: usize, freq_base: f32, freq_scale: f32) -> Rope {
        Rope {
            style,
            theta_scale: freq_base.powf(-2.0 / n_rot as f32),
            freq_scale,
            n_rot,
        }
    }

    /// The (cos, sin) pairs for position `pos`, one per rotated pair, computed as ggml does
    /// (`theta = pos * theta_scale^i` as a running product, then times the linear scale).
    pub fn angles(&self, pos: usize, out: &mut Vec<(f32, f32)>) {
        out.clear();
        let mut theta = pos as f32;
        for _ in 0..self.n_rot / 2 {
            let (sin, cos) = (theta * self.freq_scale).sin_cos();
            out.push((cos, sin));
            theta *= self.theta_scale;
        }
    }

    /// Rotates every head of `x` (`n_heads` × `head_dim`, contiguous) by precomputed `angles`.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, angles: &[(f32, f32)]) {
        let half = self.n_rot / 2;
        for head in x.chunks_exact_mut(head_dim) {
            for (i, &(cos, sin)) in angles.iter().enumerate() {
                let (a, b) = match self.style {
                    RopeStyle::Normal => (2 * i, 2 * i + 1),
                    RopeStyle::Neox => (i, i + half),
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * cos - x1 * sin;
                head[b] = x0 * sin + x1 * cos;
            }
        }
    }
}

/// Partial sums of [`softmax`]'s total, one per lane, added in order at the end: the loop runs on
/// vectors of any width with the same bits.
const SOFTMAX_LANES: usize = 8;

/// In-place softmax of one row (max-subtracted, [`exp_f32`], sums in f64 as ggml does: lane `l`
/// of [`SOFTMAX_LANES`] sums the values at `l` mod the lanes of the whole chunks, then the lanes
/// and the tail are added in order).
#[inline]
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut lanes = [0f64; SOFTMAX_LANES];
    let mut chunks = x.chunks_exact_mut(SOFTMAX_LANES);
    for chunk in &mut chunks {
        for (lane, v) in lanes.iter_mut().zip(chunk) {
            *v = exp_f32(*v - max);
            *lane += f64::from(*v);
        }
    }
    let mut sum = lanes.into_iter().fold(0f64, |s, l| s + l);
    for v in chunks.into_remainder() {
        *v = exp_f32(*v - max);
        sum += f64::from(*v);
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `e^x` from plain multiplies and adds (Cephes' single-precision reduction and polynomial, about
/// 2e-7 relative error), so that loops over it vectorise and give the same bits on every CPU.
/// Below -87 it gives 0 (instead of a subnormal), above 88 `e^88`.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const MIN: f32 = -87.0;
    // adding 1.5 · 2^23 rounds to an integer (ties to even), kept in the low mantissa bits
    const ROUND: f32 = 12_582_912.0;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let below = x < MIN;
    let x = x.clamp(MIN, 88.0);
    let t = x * std::f32::consts::LOG2_E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_1e-4_f32;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let e = p * (r * r) + r + 1.0;
    let exponent = t.to_bits() as i32 - ROUND.to_bits() as i32 + 127;
    let y = e * f32::from_bits((exponent << 23) as u32);
    if below {
        0.0
    } else {
        y
    }
}

/// `x += y`.
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// `x *= s`.
pub fn scale(x: &mut [f32], s: f32) {
    for v in x {
        *v *= s;
    }
}

/// tanh-approximated GELU, exact formula.
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x)).tanh())
}

/// GELU as ggml's CPU backend evaluates it: through a table indexed by the f16 of the input,
/// holding the f16 of the result; identity above 10, zero below -10.
pub fn gelu_ggml(x: f32) -> f32 {
    static TABLE: OnceLock<Vec<f16>> = OnceLock::new();
    if x <= -10.0 {
        return 0.0;
    }
    if x >= 10.0 {
        return x;
    }
    let table = TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| f16::from_f32(gelu_tanh(f16::from_bits(bits).to_f32())))
            .collect()
    });
    table[f16::from_f32(x).to_bits() as usize].to_f32()
}

/// SiLU, `x * sigmoid(x)`.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `a · b` in f32 with sixteen independent partial sums (so that it vectorises).
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut acc = [0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (xa, xb) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] += xa[i] * xb[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_unit_weights_gives_unit_rms() {
        let mut x = vec![1.0, -2.0, 3.0, 4.0];
        rms_norm(&mut x, &[1.0; 4], 0.0);
        let rms = (x.iter().map(|v| v * v).sum::<f32>() / 4.0).sqrt();
        assert!((rms - 1.0).abs() < 1e-6);
    }

    #[test]
    fn rope_keeps_norm_and_position_zero_is_identity() {
        for style in [RopeStyle::Normal, RopeStyle::Neox] {
            let rope = Rope::new(style, 8, 10000.0, 1.0);
            let orig: Vec<f32> = (0..16).map(|i| i as f32 * 0.3 - 2.0).collect();
            let mut x = orig.clone();
            let mut angles = Vec::new();
            rope.angles(0, &mut angles);
            rope.apply(&mut x, 8, &angles);
            assert_eq!(x, orig);
            rope.angles(17, &mut angles);
            rope.apply(&mut x, 8, &angles);
            let n0: f32 = orig.iter().map(|v| v * v).sum();
            let n1: f32 = x.iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() < 1e-3);
        }
    }

    #[test]
    fn neox_rotates_halves() {
        let rope = Rope::new(RopeStyle::Neox, 4, 10000.0, 1.0);
        let mut x = vec![1.0, 0.0, 0.0, 0.0];
        let mut angles = Vec::new();
        rope.angles(1, &mut angles);
        rope.apply(&mut x, 4, &angles);
        assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[2] - 1f32.sin()).abs() < 1e-6);
    }

    #[test]
    fn dot_f32_matches_a_plain_sum() {
        let a: Vec<f32> = (0..37).map(|i| i as f32 * 0.25 - 3.0).collect();
        let b: Vec<f32> = (0..37).map(|i| 1.0 - i as f32 * 0.125).collect();
        let plain: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot_f32(&a, &b) - plain).abs() < 1e-3);
    }

    #[test]
    fn exp_f32_is_within_a_few_ulp_of_exp() {
        for i in -8700..8790 {
            let x = i as f32 / 100.0 + 0.003;
            let (got, want) = (exp_f32(x), f64::from(x).exp());
            let rel = ((f64::from(got) - want) / want).abs();
            assert!(rel < 4e-7, "exp({x}) = {got}, expected {want}");
        }
        assert_eq!(exp_f32(-100.0), 0.0);
        assert_eq!(exp_f32(0.0), 1.0);
    }

    #[test]
    fn softmax_sums_to_one() {
        let mut x = vec![1.0, 2.0, 3.0, -1000.0];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert_eq!(x[3], 0.0);
    }

    #[test]
    fn gelu_table_is_close_to_formula() {
        for i in -200..200 {
            let x = i as f32 * 0.07;
            assert!((gelu_ggml(x) - gelu_tanh(x)).abs() <= 2e-3 * (1.0 + x.abs()));
        }
        assert_eq!(gelu_ggml(12.0), 12.0);
        assert_eq!(gelu_ggml(-11.0), 0.0);
    }
}
