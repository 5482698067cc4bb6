//! Calibration samples: FFN inputs and which neurons fired, one row per token.

use super::rng::Rng;

/// Calibration samples for one FFN layer: the residual stream entering the FFN (before its norm)
/// and, per sample, the set of neurons whose activation was non-zero.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Samples {
    /// Width of the residual stream.
    pub n_embd: usize,
    /// Number of FFN neurons.
    pub n_ff: usize,
    /// `len() × n_embd` inputs, row-major.
    pub x: Vec<f32>,
    /// `len() × words_per_row()` bitset rows: bit `i % 64` of word `i / 64` is neuron `i`.
    pub active: Vec<u64>,
}

impl Samples {
    /// No samples yet, for a layer of the given shape.
    pub fn new(n_embd: usize, n_ff: usize) -> Self {
        Self {
            n_embd,
            n_ff,
            x: Vec::new(),
            active: Vec::new(),
        }
    }

    /// `u64` words per bitset row: `ceil(n_ff / 64)`.
    pub fn words_per_row(&self) -> usize {
        self.n_ff.div_ceil(64)
    }

    /// Appends one sample: `x_row` (`n_embd`) and the FFN activations (`n_ff`); a neuron is active
    /// iff its activation is non-zero.
    ///
    /// # Panics
    /// If a row has the wrong length.
    pub fn push(&mut self, x_row: &[f32], activations_row: &[f32]) {
        assert_eq!(x_row.len(), self.n_embd, "x row length");
        assert_eq!(activations_row.len(), self.n_ff, "activation row length");
        self.x.extend_from_slice(x_row);
        let start = self.active.len();
        self.active.resize(start + self.words_per_row(), 0);
        let row = &mut self.active[start..];
        for (i, &a) in activations_row.iter().enumerate() {
            if a != 0.0 {
                row[i / 64] |= 1 << (i % 64);
            }
        }
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.active
            .len()
            .checked_div(self.words_per_row())
            .unwrap_or(0)
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.active.is_empty()
    }

    /// Input row of sample `s`.
    pub fn x_row(&self, s: usize) -> &[f32] {
        &self.x[s * self.n_embd..(s + 1) * self.n_embd]
    }

    /// Bitset row of sample `s`.
    pub fn active_row(&self, s: usize) -> &[u64] {
        let w = self.words_per_row();
        &self.active[s * w..(s + 1) * w]
    }

    /// Whether neuron `i` fired in sample `s`.
    pub fn is_active(&self, s: usize, i: usize) -> bool {
        self.active_row(s)[i / 64] >> (i % 64) & 1 == 1
    }

    /// The samples at `indices`, in that order.
    pub fn select(&self, indices: &[usize]) -> Samples {
        let mut out = Samples::new(self.n_embd, self.n_ff);
        out.x.reserve(indices.len() * self.n_embd);
        out.active.reserve(indices.len() * self.words_per_row());
        for &s in indices {
            out.x.extend_from_slice(self.x_row(s));
            out.active.extend_from_slice(self.active_row(s));
        }
        out
    }

    /// Splits into `(train, holdout)`: `round(len · holdout_fraction)` samples drawn at random
    /// (seeded) go to `holdout`; both keep the original relative order. Deterministic for a seed.
    pub fn split(&self, holdout_fraction: f64, seed: u64) -> (Samples, Samples) {
        let n = self.len();
        let n_hold = ((n as f64 * holdout_fraction.clamp(0.0, 1.0)).round() as usize).min(n);
        let mut order: Vec<usize> = (0..n).collect();
        Rng::new(seed).shuffle(&mut order);
        let mut hold = vec![false; n];
        for &s in &order[..n_hold] {
            hold[s] = true;
        }
        let (h, t): (Vec<usize>, Vec<usize>) = (0..n).partition(|&s| hold[s]);
        (self.select(&t), self.select(&h))
    }

    /// Per-neuron firing frequency over all samples (`n_ff` values in `[0, 1]`; zeros if empty).
    pub fn frequencies(&self) -> Vec<f32> {
        let mut counts = vec![0u64; self.n_ff];
        let w = self.words_per_row();
        for row in self.active.chunks_exact(w.max(1)) {
            for (wi, &word) in row.iter().enumerate() {
                let mut bits = word;
                while bits != 0 {
                    let b = bits.trailing_zeros() as usize;
                    counts[wi * 64 + b] += 1;
                    bits &= bits - 1;
                }
            }
        }
        let n = self.len().max(1) as f64;
        counts.iter().map(|&c| (c as f64 / n) as f32).collect()
    }

    /// Fraction of all (sample, neuron) pairs that fired.
    pub fn density(&self) -> f64 {
        let total = self.len() * self.n_ff;
        if total == 0 {
            return 0.0;
        }
        let ones: u64 = self.active.iter().map(|w| w.count_ones() as u64).sum();
        ones as f64 / total as f64
    }
}
