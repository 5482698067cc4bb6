//! A dense model's GPU segment under a VRAM budget: llama.cpp-style layer offload, the number of
//! layers (`--n-gpu-layers`) chosen from bytes. A dense FFN cannot be split by neuron, so the GPU
//! takes whole layers (attention and FFN) and their KV cache; the CPU runs the other layers and
//! the LM head, and the residual stream crosses the bus once each way per segment.
//!
//! # Objective and constraint ([`dense_segment`])
//! Layer `l` costs `w_l` bytes of weights and `k_l` bytes of KV cache on the GPU; a segment also
//! needs `s` bytes of working vectors, whatever its length. Choose the last `m` layers (as
//! llama.cpp offloads the last ones) to
//!
//! ```text
//! maximise   m
//! subject to s + Σ_{l ≥ L−m} (w_l + k_l) ≤ B       (or m = 0, which costs nothing)
//! ```
//!
//! The left side grows with `m`, so the longest suffix that fits is found by adding layers from
//! the last one while they fit; that is optimal (tested against trying every `m`).

use std::ops::Range;

/// What one layer costs on the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerCost {
    /// Bytes of its weights (matrices, norms, biases).
    pub weights: u64,
    /// Bytes of its KV cache for the context size in use.
    pub kv_cache: u64,
}

impl LayerCost {
    /// Both.
    pub fn bytes(&self) -> u64 {
        self.weights.saturating_add(self.kv_cache)
    }
}

/// The layers of a dense model on the GPU and what they take there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentPlan {
    /// The layers on the GPU (empty: none, the CPU runs everything).
    pub layers: Range<usize>,
    /// Bytes of their weights.
    pub weights: u64,
    /// Bytes of their KV cache.
    pub kv_cache: u64,
    /// Bytes of the segment's working vectors (0 without a segment).
    pub scratch: u64,
}

impl SegmentPlan {
    /// Bytes on the GPU in all.
    pub fn bytes(&self) -> u64 {
        self.weights + self.kv_cache + self.scratch
    }
}

/// The longest run of last layers of `layers` that fits `budget` bytes with `scratch` bytes of
/// working vectors (see the module's docs).
pub fn dense_segment(layers: &[LayerCost], scratch: u64, budget: u64) -> SegmentPlan {
    let n = layers.len();
    let mut plan = SegmentPlan {
        layers: n..n,
        weights: 0,
        kv_cache: 0,
        scratch: 0,
    };
    let mut used = scratch;
    for (il, l) in layers.iter().enumerate().rev() {
        match used.checked_add(l.bytes()) {
            Some(total) if total <= budget => used = total,
            _ => break,
        }
        plan.layers.start = il;
        plan.weights += l.weights;
        plan.kv_cache += l.kv_cache;
        plan.scratch = scratch;
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Brute force: every suffix length, the longest that fits.
    fn brute(layers: &[LayerCost], scratch: u64, budget: u64) -> usize {
        (0..=layers.len())
            .filter(|&m| {
                m == 0
                    || scratch
                        + layers[layers.len() - m..]
                            .iter()
                            .map(LayerCost::bytes)
                            .sum::<u64>()
                        <= budget
            })
            .max()
            .unwrap_or(0)
    }

    #[test]
    fn the_longest_fitting_suffix_is_chosen() {
        let mut seed = 7u64;
        let mut next = |m: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % m
        };
        for _ in 0..2000 {
            let layers: Vec<LayerCost> = (0..next(7))
                .map(|_| LayerCost {
                    weights: next(100),
                    kv_cache: next(20),
                })
                .collect();
            let (scratch, budget) = (next(50), next(500));
            let plan = dense_segment(&layers, scratch, budget);
            let m = brute(&layers, scratch, budget);
            assert_eq!(
                plan.layers,
                layers.len() - m..layers.len(),
                "{layers:?} {scratch} {budget}"
            );
            assert!(plan.bytes() <= budget || m == 0);
            let on: &[LayerCost] = &layers[plan.layers.clone()];
            assert_eq!(plan.weights, on.iter().map(|l| l.weights).sum::<u64>());
            assert_eq!(plan.kv_cache, on.iter().map(|l| l.kv_cache).sum::<u64>());
            assert_eq!(plan.scratch, if m == 0 { 0 } else { scratch });
        }
    }

    #[test]
    fn equal_layers_fill_the_budget_and_huge_ones_do_not_overflow() {
        let layers = [LayerCost {
            weights: 90,
            kv_cache: 10,
        }; 6];
        assert_eq!(dense_segment(&layers, 50, 349).layers, 4..6);
        assert_eq!(dense_segment(&layers, 50, 350).layers, 3..6);
        assert_eq!(dense_segment(&layers, 50, 149).layers, 6..6);
        assert_eq!(dense_segment(&layers, 50, u64::MAX).layers, 0..6);
        let huge = [LayerCost {
            weights: u64::MAX,
            kv_cache: 1,
        }];
        assert_eq!(dense_segment(&huge, 1, u64::MAX).layers, 1..1);
    }
}
