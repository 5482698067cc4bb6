//! Counters of the input channels TEAL kept, and what they add up to: skipped fraction per layer
//! and matrix, parameter-weighted per layer and model-wide, and bytes of weights read per token.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::engine::linear::Proj;

/// Kept and seen input channels per layer and matrix (atomics: the projections of a layer run
/// concurrently).
pub(super) struct Counters {
    kept: Vec<[AtomicU64; 7]>,
    seen: Vec<[AtomicU64; 7]>,
}

impl Counters {
    pub(super) fn new(n_layer: usize) -> Counters {
        let zeros = || (0..n_layer).map(|_| Default::default()).collect();
        Counters {
            kept: zeros(),
            seen: zeros(),
        }
    }

    pub(super) fn add(&self, il: usize, p: Proj, kept: u64, seen: u64) {
        self.kept[il][p.index()].fetch_add(kept, Ordering::Relaxed);
        self.seen[il][p.index()].fetch_add(seen, Ordering::Relaxed);
    }

    pub(super) fn reset(&self) {
        for c in self.kept.iter().chain(&self.seen).flatten() {
            c.store(0, Ordering::Relaxed);
        }
    }

    /// The counts with each matrix's `(n_in, n_out, bytes per input column)`.
    pub(super) fn snapshot(&self, sizes: &[[(usize, usize, usize); 7]]) -> TealStats {
        let load = |c: &[AtomicU64; 7]| std::array::from_fn(|p| c[p].load(Ordering::Relaxed));
        TealStats {
            kept: self.kept.iter().map(load).collect(),
            seen: self.seen.iter().map(load).collect(),
            sizes: sizes.to_vec(),
        }
    }
}

/// What TEAL skipped so far (only the rows it thresholded: dense prefill is not counted).
#[derive(Clone, Debug)]
pub struct TealStats {
    kept: Vec<[u64; 7]>,
    seen: Vec<[u64; 7]>,
    sizes: Vec<[(usize, usize, usize); 7]>,
}

impl TealStats {
    /// Fraction of layer `il`'s matrix `p` input channels skipped (0 before any token).
    pub fn sparsity(&self, il: usize, p: Proj) -> f64 {
        let (k, s) = (self.kept[il][p.index()], self.seen[il][p.index()]);
        if s == 0 {
            0.0
        } else {
            1.0 - k as f64 / s as f64
        }
    }

    /// Layer `il`'s skipped fraction of weights (each matrix's sparsity weighted by its size).
    pub fn layer_sparsity(&self, il: usize) -> f64 {
        let params = |p: Proj| {
            let (i, o, _) = self.sizes[il][p.index()];
            (i * o) as f64
        };
        let total: f64 = Proj::ALL.iter().map(|&p| params(p)).sum();
        Proj::ALL
            .iter()
            .map(|&p| self.sparsity(il, p) * params(p))
            .sum::<f64>()
            / total.max(1.0)
    }

    /// The model's skipped fraction of block weights (every layer's matrices weighted by size).
    pub fn model_sparsity(&self) -> f64 {
        let mut num = 0.0;
        let mut den = 0.0;
        for (il, sizes) in self.sizes.iter().enumerate() {
            let params: f64 = sizes.iter().map(|&(i, o, _)| (i * o) as f64).sum();
            num += self.layer_sparsity(il) * params;
            den += params;
        }
        num / f64::max(den, 1.0)
    }

    /// Mean bytes of input-major weights read per thresholded token, all layers.
    pub fn bytes_per_token(&self) -> f64 {
        let mut bytes = 0.0;
        for (il, sizes) in self.sizes.iter().enumerate() {
            for p in Proj::ALL {
                let (n_in, _, col) = sizes[p.index()];
                let seen = self.seen[il][p.index()];
                if seen > 0 {
                    let tokens = seen as f64 / n_in as f64;
                    bytes += self.kept[il][p.index()] as f64 / tokens * col as f64;
                }
            }
        }
        bytes
    }

    /// One line per layer: the skipped fraction of each matrix and of the layer.
    pub fn per_layer_lines(&self) -> Vec<String> {
        (0..self.sizes.len())
            .map(|il| {
                let each: Vec<String> = Proj::ALL
                    .iter()
                    .map(|&p| format!("{} {:.3}", p.name(), self.sparsity(il, p)))
                    .collect();
                format!(
                    "layer {il:>3}: sparsity {:.3} ({})",
                    self.layer_sparsity(il),
                    each.join(" ")
                )
            })
            .collect()
    }
}
