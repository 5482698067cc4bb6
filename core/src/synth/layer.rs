//! One transformer block's weights, built so that its FFN is sparse at a target density with a
//! power-law spread of per-neuron firing frequencies, and so that PowerInfer's predictor
//! (`fc1`/`fc2`) is exact in sign.
//!
//! With `G = W_gate·diag(ffn_norm) = B·A` (rank R), `sign(gate·h) = sign(G·x)` because
//! `h = rms_norm(x)·ffn_norm` only rescales `x` by a positive number; `fc1 = [A; −A]` and
//! `fc2 = [B, −B]` give `fc2·relu(fc1·x) = B·A·x` exactly, since `relu(z) − relu(−z) = z`.

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
    /// `attn_norm` (n_embd).
    pub attn_norm: Vec<f32>,
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
    /// `ffn_gate` (n_ff rows of n_embd).
    pub gate: Vec<f32>,
    /// `ffn_up` (n_ff rows of n_embd).
    pub up: Vec<f32>,
    /// `ffn_down_t` (n_ff rows of n_embd: neuron i's down column; element 0 zero).
    pub down_t: Vec<f32>,
    /// `fc1` (2R rows of n_embd): `[A; −A]`.
    pub fc1: Vec<f32>,
    /// `fc2` (n_ff rows of 2R): `[B, −B]`.
    pub fc2: Vec<f32>,
    /// The target firing frequency of each neuron (gate > 0, and up > 0 for dReLU).
    pub freq: Vec<f32>,
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

fn dot(a: &[f32], b: &[f32]) -> f32 {
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

    let attn_norm = vec![1.0; e];
    let wq = gaussian_rows(e, e, inv, seed, &path(1));
    let wk = gaussian_rows(n_kv, e, inv, seed, &path(2));
    let wv = gaussian_rows(n_kv, e, inv, seed, &path(3));
    let mut wo = gaussian_rows(e, e, d.alpha * sigma * inv, seed, &path(4));
    wo[..e].fill(0.0);
    let mut nrng = Rng::new(stream(seed, &path(5)));
    let ffn_norm: Vec<f32> = (0..e).map(|_| 0.8 + 0.4 * nrng.uniform() as f32).collect();

    // A: row 0 = e_0, rows 1..R Gaussian over dimensions 1..
    let mut a = gaussian_rows(r, e, inv, seed, &path(6));
    for k in 0..r {
        a[k * e] = 0.0;
    }
    a[..e].fill(0.0);
    a[0] = 1.0;
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
                SynthArch::Llama => freq[i],
                SynthArch::Bamboo => (freq[i] / DRELU_UP_FREQ).min(0.99),
            };
            let beta = sigma * inv_normal_cdf(fg) as f32 / d.c0;
            brow[0] = beta;
            grow[0] = beta;
        });
    let gate: Vec<f32> = g
        .par_chunks(e)
        .flat_map_iter(|row| row.iter().zip(&ffn_norm).map(|(v, n)| v / n))
        .collect();

    let mut up = gaussian_rows(f, e, inv, seed, &path(8));
    if arch == SynthArch::Bamboo {
        let z = inv_normal_cdf(DRELU_UP_FREQ) as f32;
        up.par_chunks_mut(e).for_each(|row| {
            row[0] = 0.0;
            let s: f32 = row.iter().zip(&ffn_norm).map(|(u, n)| u * u * n * n).sum();
            row[0] = sigma * s.sqrt() * z / (d.c0 * ffn_norm[0]);
        });
    }
    let mut down_t = gaussian_rows(f, e, 1.0, seed, &path(9));
    down_t.par_chunks_mut(e).for_each(|row| row[0] = 0.0);

    // scale down so the FFN adds `alpha·sigma` RMS on dimensions 1.., measured on random inputs
    let samples = 8;
    let mut rms2 = 0.0f64;
    for s in 0..samples {
        let mut x = vec![0.0f32; e];
        Rng::new(stream(seed, &[layer, 10, s])).fill_normal(&mut x, sigma);
        x[0] = d.c0;
        let ms = dot(&x, &x) / e as f32;
        let h: Vec<f32> = x
            .iter()
            .zip(&ffn_norm)
            .map(|(v, n)| v / (ms + 1e-5).sqrt() * n)
            .collect();
        let act: Vec<f32> = (0..f)
            .into_par_iter()
            .map(|i| {
                let gv = dot(&gate[i * e..(i + 1) * e], &h).max(0.0);
                if gv == 0.0 {
                    return 0.0;
                }
                let uv = dot(&up[i * e..(i + 1) * e], &h);
                match arch {
                    SynthArch::Llama => gv * uv,
                    SynthArch::Bamboo => gv * uv.max(0.0),
                }
            })
            .collect();
        let mut out = vec![0.0f32; e];
        for (i, &ai) in act.iter().enumerate() {
            if ai != 0.0 {
                for (o, w) in out.iter_mut().zip(&down_t[i * e..(i + 1) * e]) {
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
    down_t.par_iter_mut().for_each(|v| *v *= scale);

    // predictor: fc1 = [A; −A], fc2 = [B, −B]
    let mut fc1 = a.clone();
    fc1.extend(a.iter().map(|v| -v));
    let fc2: Vec<f32> = b
        .par_chunks(r)
        .flat_map_iter(|row| row.iter().copied().chain(row.iter().map(|v| -v)))
        .collect();

    LayerWeights {
        attn_norm,
        wq,
        wk,
        wv,
        wo,
        ffn_norm,
        gate,
        up,
        down_t,
        fc1,
        fc2,
        freq: freq.iter().map(|&v| v as f32).collect(),
    }
}
