//! PowerInfer-shape activation predictors: train them from calibration traces and measure them.
//!
//! A predictor for one ReLU FFN layer is a low-rank MLP `logits = fc2 · relu(fc1 · x)` over the
//! residual stream `x` entering the FFN (before its norm); neuron `i` is predicted active iff
//! `logits[i] >= threshold`. This is exactly what the engine computes from `blk.N.fc1.weight` /
//! `blk.N.fc2.weight`, so a [`TrainedPredictor`] needs no preprocessing at run time.
//!
//! - [`Samples`]: calibration inputs and active-neuron bitsets.
//! - [`train`] / [`TrainConfig`]: Adam on weighted binary cross-entropy, then a threshold for a
//!   target recall.
//! - [`evaluate`] / [`PredictorMetrics`]: micro-averaged recall, precision and density.

mod linalg;
mod metrics;
mod rng;
mod samples;
mod train;

#[cfg(test)]
mod tests;

pub use metrics::{evaluate, PredictorMetrics};
pub use samples::Samples;
pub use train::{train, TrainConfig};

/// A trained predictor: `logits = fc2 · relu(fc1 · x)`, neuron `i` active iff
/// `logits[i] >= threshold`.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainedPredictor {
    /// Hidden width `R`.
    pub rank: usize,
    /// `R × n_embd`, row-major (ggml shape `{n_embd, R}`, as `blk.N.fc1.weight`).
    pub fc1: Vec<f32>,
    /// `n_ff × R`, row-major (ggml shape `{R, n_ff}`, as `blk.N.fc2.weight`).
    pub fc2: Vec<f32>,
    /// Decision threshold on the logits.
    pub threshold: f32,
}

impl TrainedPredictor {
    /// Width of the input (`fc1.len() / rank`).
    pub fn n_embd(&self) -> usize {
        self.fc1.len().checked_div(self.rank).unwrap_or(0)
    }

    /// Number of neurons predicted (`fc2.len() / rank`).
    pub fn n_ff(&self) -> usize {
        self.fc2.len().checked_div(self.rank).unwrap_or(0)
    }

    /// Logits for `n` inputs `x` (`n × n_embd`, row-major); returns `n × n_ff`.
    ///
    /// # Panics
    /// If `x.len() != n · n_embd`.
    pub fn logits(&self, x: &[f32], n: usize) -> Vec<f32> {
        let (e, r, f) = (self.n_embd(), self.rank, self.n_ff());
        assert_eq!(x.len(), n * e, "x must be n × n_embd");
        let mut h = linalg::matmul_nt(x, &self.fc1, n, e, r);
        for v in &mut h {
            *v = v.max(0.0);
        }
        linalg::matmul_nt(&h, &self.fc2, n, r, f)
    }

    /// The same predictor with `fc2` scaled so that its threshold becomes `threshold` (for files
    /// that store one threshold for every layer, like `powerinfer.sparse_threshold`). Exact up to
    /// rounding; `None` unless both thresholds are finite, non-zero and of the same sign.
    pub fn with_threshold(&self, threshold: f32) -> Option<TrainedPredictor> {
        let c = threshold / self.threshold;
        if !(c.is_finite() && c > 0.0 && threshold.is_finite() && threshold != 0.0) {
            return None;
        }
        Some(TrainedPredictor {
            rank: self.rank,
            fc1: self.fc1.clone(),
            fc2: self.fc2.iter().map(|w| w * c).collect(),
            threshold,
        })
    }
}
