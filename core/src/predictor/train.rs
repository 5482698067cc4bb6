//! Training a predictor: Adam on weighted binary cross-entropy, then a recall-targeted threshold.

use rayon::prelude::*;

use super::linalg::{matmul_nn, matmul_nt, matmul_tn};
use super::rng::Rng;
use super::{Samples, TrainedPredictor};

/// Samples per batch when computing logits for the threshold.
const LOGIT_BATCH: usize = 256;

/// Training hyper-parameters. `Default` gives rank 0 (automatic), 30 epochs, batch 256,
/// learning rate 3e-3, target recall 0.99, seed 0, an automatic positive-class weight and 10% of
/// the samples kept back to calibrate the threshold.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainConfig {
    /// Hidden width `R`; 0 picks `min(1024, max(1, n_embd / 4))`.
    pub rank: usize,
    /// Passes over the training samples.
    pub epochs: usize,
    /// Samples per Adam step.
    pub batch: usize,
    /// Adam step size.
    pub learning_rate: f32,
    /// Recall the threshold is chosen to reach on the calibration samples.
    pub target_recall: f64,
    /// Seed for initialisation and shuffling (results are identical at any thread count).
    pub seed: u64,
    /// Weight of the active (positive) class in the loss; 0 picks `sqrt((1 - d) / d)` clamped to
    /// `[1, 32]`, with `d` the training set's active density.
    pub pos_weight: f32,
    /// Fraction of the samples (drawn with `seed`) kept out of the gradient steps and used only to
    /// pick the threshold, so that recall on unseen inputs lands near `target_recall` (on the
    /// fitted samples the tail of the positive logits is optimistic). 0 fits and calibrates on
    /// all samples.
    pub calibration_fraction: f64,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            rank: 0,
            epochs: 30,
            batch: 256,
            learning_rate: 3e-3,
            target_recall: 0.99,
            seed: 0,
            pos_weight: 0.0,
            calibration_fraction: 0.1,
        }
    }
}

impl TrainConfig {
    /// The hidden width this configuration gives for inputs of width `n_embd`.
    pub fn effective_rank(&self, n_embd: usize) -> usize {
        if self.rank > 0 {
            self.rank
        } else {
            (n_embd / 4).clamp(1, 1024)
        }
    }

    /// The positive-class weight this configuration gives for an active density `density`.
    pub fn effective_pos_weight(&self, density: f64) -> f32 {
        if self.pos_weight > 0.0 {
            return self.pos_weight;
        }
        let d = density.clamp(1e-6, 1.0);
        (((1.0 - d) / d).sqrt() as f32).clamp(1.0, 32.0)
    }
}

/// Adam state for one parameter tensor.
struct Adam {
    m: Vec<f32>,
    v: Vec<f32>,
}

impl Adam {
    fn new(n: usize) -> Self {
        Self {
            m: vec![0.0; n],
            v: vec![0.0; n],
        }
    }

    /// One step at (1-based) step `t`.
    fn step(&mut self, w: &mut [f32], g: &[f32], lr: f32, t: i32) {
        const B1: f32 = 0.9;
        const B2: f32 = 0.999;
        const EPS: f32 = 1e-8;
        let c1 = 1.0 - B1.powi(t);
        let c2 = 1.0 - B2.powi(t);
        let step = lr * c2.sqrt() / c1;
        const CHUNK: usize = 4096;
        w.par_chunks_mut(CHUNK)
            .zip(g.par_chunks(CHUNK))
            .zip(
                self.m
                    .par_chunks_mut(CHUNK)
                    .zip(self.v.par_chunks_mut(CHUNK)),
            )
            .for_each(|((w, g), (m, v))| {
                for (((w, &g), m), v) in w.iter_mut().zip(g).zip(m).zip(v) {
                    *m = B1 * *m + (1.0 - B1) * g;
                    *v = B2 * *v + (1.0 - B2) * g * g;
                    *w -= step * *m / (v.sqrt() + EPS * c2.sqrt());
                }
            });
    }
}

/// `ln(1 + e^z)` without overflow.
#[inline]
fn softplus(z: f32) -> f32 {
    z.max(0.0) + (-z.abs()).exp().ln_1p()
}

/// Trains a predictor on `samples` and picks its threshold for `cfg.target_recall`.
///
/// `cfg.calibration_fraction` of the samples are kept back from fitting and the threshold is the
/// largest one reaching the target recall on them (on all samples when the fraction is 0 or
/// leaves either part empty).
///
/// Inputs are scaled per dimension to unit RMS while training; the scale is folded into `fc1`
/// before returning, so the result runs on raw `x` exactly as the engine does. `progress` is
/// called after every epoch with its index and the mean per-(sample, neuron) loss.
///
/// # Panics
/// If `samples` is empty or `cfg.batch` is 0.
pub fn train(
    samples: &Samples,
    cfg: &TrainConfig,
    mut progress: impl FnMut(usize, f32),
) -> TrainedPredictor {
    assert!(!samples.is_empty(), "no training samples");
    assert!(cfg.batch > 0, "batch must be positive");
    let split;
    let (train, calibration) = if cfg.calibration_fraction > 0.0 {
        split = samples.split(cfg.calibration_fraction, cfg.seed ^ 0xca11_b4a7e);
        if split.0.is_empty() || split.1.is_empty() {
            (samples, samples)
        } else {
            (&split.0, &split.1)
        }
    } else {
        (samples, samples)
    };
    let (n, e, f) = (train.len(), train.n_embd, train.n_ff);
    let r = cfg.effective_rank(e);
    let w_pos = cfg.effective_pos_weight(train.density());

    // Per-dimension input scale: 1 / RMS (serial f64 sums: deterministic).
    let mut sq = vec![0f64; e];
    for row in train.x.chunks_exact(e) {
        for (s, &v) in sq.iter_mut().zip(row) {
            *s += (v as f64) * (v as f64);
        }
    }
    let scale: Vec<f32> = sq
        .iter()
        .map(|&s| {
            let rms = (s / n as f64).sqrt();
            if rms > 1e-12 {
                (1.0 / rms) as f32
            } else {
                1.0
            }
        })
        .collect();

    let mut rng = Rng::new(cfg.seed);
    let std1 = (2.0 / e as f32).sqrt();
    let mut fc1: Vec<f32> = (0..r * e).map(|_| rng.normal() * std1).collect();
    let std2 = (1.0 / r as f32).sqrt();
    let mut fc2: Vec<f32> = (0..f * r).map(|_| rng.normal() * std2).collect();
    let (mut adam1, mut adam2) = (Adam::new(fc1.len()), Adam::new(fc2.len()));

    let mut order: Vec<usize> = (0..n).collect();
    let mut t = 0i32;
    let mut xb = Vec::with_capacity(cfg.batch.min(n) * e);
    for epoch in 0..cfg.epochs {
        rng.shuffle(&mut order);
        let mut epoch_loss = 0f64;
        for batch in order.chunks(cfg.batch) {
            let b = batch.len();
            xb.clear();
            for &s in batch {
                xb.extend(train.x_row(s).iter().zip(&scale).map(|(v, c)| v * c));
            }
            // Forward.
            let pre = matmul_nt(&xb, &fc1, b, e, r);
            let h: Vec<f32> = pre.iter().map(|v| v.max(0.0)).collect();
            let mut g = matmul_nt(&h, &fc2, b, r, f);
            // Loss and its gradient w.r.t. the logits, in place (mean over the batch).
            let inv_b = 1.0 / b as f32;
            let losses: Vec<f64> = g
                .par_chunks_mut(f)
                .zip(batch.par_iter())
                .map(|(row, &s)| {
                    let bits = train.active_row(s);
                    let mut loss = 0f64;
                    for (i, l) in row.iter_mut().enumerate() {
                        let z = *l;
                        let sig = 1.0 / (1.0 + (-z).exp());
                        if bits[i / 64] >> (i % 64) & 1 == 1 {
                            loss += (w_pos * softplus(-z)) as f64;
                            *l = w_pos * (sig - 1.0) * inv_b;
                        } else {
                            loss += softplus(z) as f64;
                            *l = sig * inv_b;
                        }
                    }
                    loss
                })
                .collect();
            epoch_loss += losses.iter().sum::<f64>();
            // Backward.
            let g2 = matmul_tn(&g, &h, b, f, r);
            let mut dh = matmul_nn(&g, &fc2, b, f, r);
            for (d, &p) in dh.iter_mut().zip(&pre) {
                if p <= 0.0 {
                    *d = 0.0;
                }
            }
            let g1 = matmul_tn(&dh, &xb, b, r, e);
            t += 1;
            adam1.step(&mut fc1, &g1, cfg.learning_rate, t);
            adam2.step(&mut fc2, &g2, cfg.learning_rate, t);
        }
        progress(epoch, (epoch_loss / (n * f) as f64) as f32);
    }

    // Fold the input scale into fc1 so the predictor runs on raw x.
    for row in fc1.chunks_exact_mut(e) {
        for (w, c) in row.iter_mut().zip(&scale) {
            *w *= c;
        }
    }
    let mut p = TrainedPredictor {
        rank: r,
        fc1,
        fc2,
        threshold: 0.0,
    };
    p.threshold = recall_threshold(&p, calibration, cfg.target_recall);
    p
}

/// The largest threshold at which at least `ceil(target · P)` of the `P` active pairs of `s` are
/// predicted active (`f32::MAX` when that count is 0).
fn recall_threshold(p: &TrainedPredictor, s: &Samples, target: f64) -> f32 {
    let (n, e, f) = (s.len(), s.n_embd, s.n_ff);
    let mut pos = Vec::new();
    for b0 in (0..n).step_by(LOGIT_BATCH) {
        let b1 = (b0 + LOGIT_BATCH).min(n);
        let logits = p.logits(&s.x[b0 * e..b1 * e], b1 - b0);
        for (k, row) in logits.chunks_exact(f).enumerate() {
            let bits = s.active_row(b0 + k);
            pos.extend(
                row.iter()
                    .enumerate()
                    .filter(|(i, _)| bits[i / 64] >> (i % 64) & 1 == 1)
                    .map(|(_, &l)| l),
            );
        }
    }
    let need = ((target.clamp(0.0, 1.0) * pos.len() as f64).ceil() as usize).min(pos.len());
    if need == 0 {
        return f32::MAX;
    }
    let k = pos.len() - need;
    *pos.select_nth_unstable_by(k, f32::total_cmp).1
}
