//! One transformer block's weights, built so that its FFN is sparse at a target density with a
//! power-law spread of per-neuron firing frequencies, and so that PowerInfer's predictor
//! (`fc1`/`fc2`) is exact in sign.
//!
//! With `G = W_gate·diag(ffn_norm) = B·A` (rank R), `sign(gate·h) = sign(G·x)` because
//! `h = rms_norm(x)·ffn_norm` only rescales `x` by a positive number; `fc1 = [A; −A]` and
//! `fc2 = [B, −B]` give `fc2·relu(fc1·x) = B·A·x` exactly, since `relu(z) − relu(−z) = z`.
//!
//! FFNs without gate (Falcon, OPT) put `G` in `ffn_up`. Their LayerNorm
//! `h = C·x·s ⊙ w + b` (C = I − 11ᵀ/n centres, s > 0 rescales) adds two terms, both cancelled:
//! the centring is linear, so `fc1 = [A·C; −A·C]` (only row 0 of A changes: A's other rows sum
//! to zero); the bias adds `U·b` to neuron i's pre-activation, which is zero for Falcon because
//! `b` is drawn orthogonal to the rows of `A·diag(1/w)`, and cancelled by OPT's up bias
//! `b_up = −U·b`.

use rayon::prelude::*;

use super::rng::{inv_normal_cdf, stream, Rng};
use super::SynthArch;

/// Shapes and scales shared by all blocks.
#[derive(Clone, Debug)]
pub struct Dims {
    /// Residual width.
    pub n_embd: usize,
    /// FFN width (neurons).
    pub n_ff: usize,
    /// Attention heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Predictor rank R (the stored `fc1`/`fc2` have 2R hidden units).
    pub rank: usize,
    /// The constant on residual dimension 0.
    pub c0: f32,
    /// RMS of each block's (attention or FFN) output on dimensions 1.., relative to the residual.
    pub alpha: f32,
}

/// One block's weights in f32, rows in ggml order (each row one output, `n_embd` or `2R` inputs).
pub struct LayerWeights {
    /// `attn_norm` (n_embd; for Falcon the FFN's norm too).
    pub attn_norm: Vec<f32>,
    /// `attn_norm.bias` (LayerNorm architectures).
    pub attn_norm_b: Option<Vec<f32>>,
    /// `ffn_norm.bias` (OPT).
    pub ffn_norm_b: Option<Vec<f32>>,
    /// Q, K, V and output biases (OPT; the output bias is zero on dimension 0).
    pub attn_biases: Option<[Vec<f32>; 4]>,
    /// `ffn_up.bias` (OPT).
    pub up_b: Option<Vec<f32>>,
    /// `ffn_down_t.bias` (OPT; zero on dimension 0).
    pub down_b: Option<Vec<f32>>,
    /// `attn_q` (n_embd rows of n_embd).
    pub wq: Vec<f32>,
    /// `attn_k` (n_embd_kv rows of n_embd).
    pub wk: Vec<f32>,
    /// `attn_v` (n_embd_kv rows of n_embd).
    pub wv: Vec<f32>,
    /// `attn_output` (n_embd rows of n_embd; row 0 zero so that dimension 0 stays constant).
    pub wo: Vec<f32>,
    /// `ffn_norm` (n_embd).
    pub ffn_norm: Vec<f32>,
    /// `ffn_gate` (n_ff rows of n_embd; none for Falcon and OPT).
    pub gate: Option<Vec<f32>>,
    /// `ffn_up` (n_ff rows of n_embd; `G` itself for Falcon and OPT).
    pub up: Vec<f32>,
    /// `ffn_down_t` (n_ff rows of n_embd: neuron i's down column; element 0 zero).
    pub down_t: Vec<f32>,
    /// `fc1` (2R rows of n_embd): `[A; −A]`.
    pub fc1: Vec<f32>,
    /// `fc2` (n_ff rows of 2R): `[B, −B]`.
    pub fc2: Vec<f32>,
}

/// Per-neuron target frequencies: a Zipf law `k·r^(−exponent)` over a random ranking of the
/// neurons, clamped to `[1e-4, 0.95]`, with `k` chosen (by bisection) so the mean is `density`.
pub fn zipf_frequencies(rng: &mut Rng, n: usize, density: f64, exponent: f64) -> Vec<f64> {
    let (lo_f, hi_f) = (1e-4, 0.95);
    let base: Vec<f64> = (1..=n).map(|r| (r as f64).powf(-exponent)).collect();
    let mean_for = |k: f64| base.iter().map(|b| (k * b).clamp(lo_f, hi_f)).sum::<f64>() / n as f64;
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    while mean_for(hi) < density && hi < 1e12 {
        hi *= 2.0;
    }
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if mean_for(mid) < density {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let k = 0.5 * (lo + hi);
    let perm = rng.permutation(n);
    let mut f = vec![0.0; n];
    for (r, &i) in perm.iter().enumerate() {
        f[i] = (k * base[r]).clamp(lo_f, hi_f);
    }
    f
}

fn gaussian_rows(rows: usize, cols: usize, scale: f32, seed: u64, path: &[u64]) -> Vec<f32> {
    let mut m = vec![0.0f32; rows * cols];
    m.par_chunks_mut(cols).enumerate().for_each(|(r, row)| {
        let mut p = path.to_vec();
        p.push(r as u64);
        Rng::new(stream(seed, &p)).fill_normal(row, scale);
    });
    m
}

pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Probability that up·h > 0 for a dReLU neuron (the gate alone then sets its frequency).
const DRELU_UP_FREQ: f64 = 0.97;

/// Builds block `layer`. `sigma` is the expected RMS of the residual's dimensions 1.. entering its
/// FFN; `freq` the target frequency of each neuron.
pub fn build(
    d: &Dims,
    arch: SynthArch,
    seed: u64,
    layer: u64,
    sigma: f32,
    freq: &[f64],
) -> LayerWeights {
    let (e, f, r) = (d.n_embd, d.n_ff, d.rank);
    let n_kv = e / d.n_head * d.n_head_kv;
    let inv = 1.0 / (e as f32).sqrt();
    let path = |k: u64| [layer, k];
    let ln = arch.layer_norm();

    let wq = gaussian_rows(e, e, inv, seed, &path(1));
    let wk = gaussian_rows(n_kv, e, inv, seed, &path(2));
    let wv = gaussian_rows(n_kv, e, inv, seed, &path(3));
    let mut wo = gaussian_rows(e, e, d.alpha * sigma * inv, seed, &path(4));
    wo[..e].fill(0.0);
    let mut nrng = Rng::new(stream(seed, &path(5)));
    let ffn_norm: Vec<f32> = (0..e).map(|_| 0.8 + 0.4 * nrng.uniform() as f32).collect();
    // Falcon's FFN reads the attention norm: one norm.
    let attn_norm = match arch {
        SynthArch::Falcon => ffn_norm.clone(),
        _ => vec![1.0; e],
    };

    // A: row 0 = e_0, rows 1..R Gaussian over dimensions 1.. (summing to zero under LayerNorm)
    let mut a = gaussian_rows(r, e, inv, seed, &path(6));
    for k in 0..r {
        a[k * e] = 0.0;
        if ln {
            let mean = a[k * e + 1..(k + 1) * e].iter().sum::<f32>() / (e - 1) as f32;
            a[k * e + 1..(k + 1) * e]
                .iter_mut()
                .for_each(|v| *v -= mean);
        }
    }
    a[..e].fill(0.0);
    a[0] = 1.0;
    // Under LayerNorm the constant reaches the FFN centred: (C·x)_0 = c0·(1 − 1/n) − noise/n.
    let c0_seen = if ln {
        d.c0 * (1.0 - 1.0 / e as f32)
    } else {
        d.c0
    };
    // B: Gaussian over columns 1..R, each row scaled so that (B·A)_i has unit norm over 1.., then
    // column 0 (the weight on the constant) set for the neuron's frequency.
    let mut b = gaussian_rows(f, r, 1.0, seed, &path(7));
    let mut g = vec![0.0f32; f * e];
    g.par_chunks_mut(e)
        .zip(b.par_chunks_mut(r))
        .enumerate()
        .for_each(|(i, (grow, brow))| {
            brow[0] = 0.0;
            for (k, &bk) in brow.iter().enumerate().skip(1) {
                for (gv, av) in grow.iter_mut().zip(&a[k * e..(k + 1) * e]) {
                    *gv += bk * av;
                }
            }
            let norm = dot(grow, grow).sqrt().max(1e-12);
            grow.iter_mut().for_each(|v| *v /= norm);
            brow.iter_mut().for_each(|v| *v /= norm);
            // P(β·c0 + sigma·Z > 0) = f  ⇔  β = sigma·Φ⁻¹(f)/c0
            let fg = match arch {
                SynthArch::Bamboo => (freq[i] / DRELU_UP_FREQ).min(0.99),
                _ => freq[i],
            };
            let beta = sigma * inv_normal_cdf(fg) as f32 / c0_seen;
            brow[0] = beta;
            grow[0] = beta;
        });
    let decider: Vec<f32> = g
        .par_chunks(e)
        .flat_map_iter(|row| row.iter().zip(&ffn_norm).map(|(v, n)| v / n))
        .collect();

    let (gate, mut up) = if arch.gated() {
        (Some(decider), gaussian_rows(f, e, inv, seed, &path(8)))
    } else {
        (None, decider)
    };
    if arch == SynthArch::Bamboo {
        let z = inv_normal_cdf(DRELU_UP_FREQ) as f32;
        up.par_chunks_mut(e).for_each(|row| {
            row[0] = 0.0;
            let s: f32 = row.iter().zip(&ffn_norm).map(|(u, n)| u * u * n * n).sum();
            row[0] = sigma * s.sqrt() * z / (d.c0 * ffn_norm[0]);
        });
    }
    let biases = biases(d, arch, seed, layer, sigma, &a, &ffn_norm, &up);
    let mut down_t = gaussian_rows(f, e, 1.0, seed, &path(9));
    down_t.par_chunks_mut(e).for_each(|row| row[0] = 0.0);

    let mut lw = LayerWeights {
        attn_norm,
        attn_norm_b: biases.attn_norm_b,
        ffn_norm_b: biases.ffn_norm_b,
        attn_biases: biases.attn,
        up_b: biases.up_b,
        down_b: biases.down_b,
        wq,
        wk,
        wv,
        wo,
        ffn_norm,
        gate,
        up,
        down_t,
        fc1: Vec::new(),
        fc2: Vec::new(),
    };
    scale_down(d, arch, seed, layer, sigma, &mut lw);

    // predictor: fc1 = [A·C; −A·C] (C = I under RMSNorm), fc2 = [B, −B]
    if ln {
        a[..e].iter_mut().for_each(|v| *v -= 1.0 / e as f32);
    }
    let mut fc1 = a.clone();
    fc1.extend(a.iter().map(|v| -v));
    lw.fc1 = fc1;
    lw.fc2 = b
        .par_chunks(r)
        .flat_map_iter(|row| row.iter().copied().chain(row.iter().map(|v| -v)))
        .collect();
    lw
}

/// The biases of the LayerNorm architectures (all `None` for llama and bamboo).
struct Biases {
    attn_norm_b: Option<Vec<f32>>,
    ffn_norm_b: Option<Vec<f32>>,
    attn: Option<[Vec<f32>; 4]>,
    up_b: Option<Vec<f32>>,
    down_b: Option<Vec<f32>>,
}

/// Draws the biases so that the predictor stays exact (see the module's documentation): Falcon's
/// norm bias orthogonal to the rows of `A·diag(1/w)`, OPT's up bias `−up·b_ffn_norm`.
#[allow(clippy::too_many_arguments)]
fn biases(
    d: &Dims,
    arch: SynthArch,
    seed: u64,
    layer: u64,
    sigma: f32,
    a: &[f32],
    ffn_norm: &[f32],
    up: &[f32],
) -> Biases {
    let e = d.n_embd;
    let n_kv = e / d.n_head * d.n_head_kv;
    let small = |len: usize, scale: f32, k: u64| gaussian_rows(1, len, scale, seed, &[layer, k]);
    let residual = |k: u64| {
        let mut v = small(e, 0.3 * d.alpha * sigma, k);
        v[0] = 0.0;
        v
    };
    match arch {
        SynthArch::Llama | SynthArch::Bamboo => Biases {
            attn_norm_b: None,
            ffn_norm_b: None,
            attn: None,
            up_b: None,
            down_b: None,
        },
        SynthArch::Falcon => {
            let scaled: Vec<f32> = a
                .chunks_exact(e)
                .flat_map(|row| row.iter().zip(ffn_norm).map(|(v, w)| v / w))
                .collect();
            Biases {
                attn_norm_b: Some(orthogonal_to_rows(small(e, 0.1, 11), &scaled, e)),
                ffn_norm_b: None,
                attn: None,
                up_b: None,
                down_b: None,
            }
        }
        SynthArch::Opt => {
            let ffn_norm_b = small(e, 0.1, 12);
            let up_b = up.par_chunks(e).map(|row| -dot(row, &ffn_norm_b)).collect();
            Biases {
                attn_norm_b: Some(small(e, 0.1, 11)),
                ffn_norm_b: Some(ffn_norm_b),
                attn: Some([
                    small(e, 0.1, 13),
                    small(n_kv, 0.1, 14),
                    small(n_kv, 0.1, 15),
                    residual(16),
                ]),
                up_b: Some(up_b),
                down_b: Some(residual(17)),
            }
        }
    }
}

/// `v` minus its projection on the span of `rows` (rows of `cols`), by Gram–Schmidt.
fn orthogonal_to_rows(mut v: Vec<f32>, rows: &[f32], cols: usize) -> Vec<f32> {
    let mut basis: Vec<Vec<f32>> = Vec::new();
    for row in rows.chunks_exact(cols) {
        let mut q = row.to_vec();
        for _ in 0..2 {
            for b in &basis {
                let c = dot(&q, b);
                q.iter_mut().zip(b).for_each(|(x, y)| *x -= c * y);
            }
        }
        let norm = dot(&q, &q).sqrt();
        if norm > 1e-6 {
            q.iter_mut().for_each(|x| *x /= norm);
            basis.push(q);
        }
    }
    for _ in 0..2 {
        for b in &basis {
            let c = dot(&v, b);
            v.iter_mut().zip(b).for_each(|(x, y)| *x -= c * y);
        }
    }
    v
}

/// The FFN's input for a residual row `x`: its norm (RMSNorm, or LayerNorm with the FFN norm's
/// bias), as the engine computes it up to rounding.
pub(super) fn ffn_input(arch: SynthArch, lw: &LayerWeights, x: &[f32]) -> Vec<f32> {
    let e = x.len() as f32;
    if !arch.layer_norm() {
        let ms = dot(x, x) / e;
        return x
            .iter()
            .zip(&lw.ffn_norm)
            .map(|(v, n)| v / (ms + 1e-5).sqrt() * n)
            .collect();
    }
    let bias = match arch {
        SynthArch::Falcon => lw.attn_norm_b.as_deref(),
        _ => lw.ffn_norm_b.as_deref(),
    }
    .expect("LayerNorm architectures have a norm bias");
    let mean = x.iter().sum::<f32>() / e;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / e;
    let s = 1.0 / (var + 1e-5).sqrt();
    x.iter()
        .zip(&lw.ffn_norm)
        .zip(bias)
        .map(|((v, w), b)| (v - mean) * s * w + b)
        .collect()
}

/// Neuron `i`'s activation for the FFN input `h`.
pub(super) fn activation(arch: SynthArch, lw: &LayerWeights, i: usize, h: &[f32]) -> f32 {
    let e = h.len();
    let up = || dot(&lw.up[i * e..(i + 1) * e], h);
    match (&lw.gate, arch) {
        (Some(gate), _) => {
            let gv = dot(&gate[i * e..(i + 1) * e], h).max(0.0);
            if gv == 0.0 {
                return 0.0;
            }
            match arch {
                SynthArch::Bamboo => gv * up().max(0.0),
                _ => gv * up(),
            }
        }
        (None, _) => (up() + lw.up_b.as_ref().map_or(0.0, |b| b[i])).max(0.0),
    }
}

/// Scales `down_t` so that the FFN adds `alpha·sigma` RMS on dimensions 1.., measured on random
/// inputs.
fn scale_down(d: &Dims, arch: SynthArch, seed: u64, layer: u64, sigma: f32, lw: &mut LayerWeights) {
    let (e, f) = (d.n_embd, d.n_ff);
    let samples = 8;
    let mut rms2 = 0.0f64;
    for s in 0..samples {
        let mut x = vec![0.0f32; e];
        Rng::new(stream(seed, &[layer, 10, s])).fill_normal(&mut x, sigma);
        x[0] = d.c0;
        let h = ffn_input(arch, lw, &x);
        let act: Vec<f32> = (0..f)
            .into_par_iter()
            .map(|i| activation(arch, lw, i, &h))
            .collect();
        let mut out = vec![0.0f32; e];
        for (i, &ai) in act.iter().enumerate() {
            if ai != 0.0 {
                for (o, w) in out.iter_mut().zip(&lw.down_t[i * e..(i + 1) * e]) {
                    *o += ai * w;
                }
            }
        }
        rms2 += f64::from(dot(&out, &out)) / (e - 1) as f64;
    }
    let rms = (rms2 / samples as f64).sqrt() as f32;
    let scale = if rms > 0.0 {
        d.alpha * sigma / rms
    } else {
        0.0
    };
    lw.down_t.par_iter_mut().for_each(|v| *v *= scale);
}
