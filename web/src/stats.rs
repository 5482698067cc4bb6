//! Neuron firing statistics, recorded by an FFN observer during generation: how often each neuron
//! of each layer fired (non-zero activation) and which fraction of a layer fired for the last token.

use std::sync::{Arc, Mutex};

use hotcold_core::engine::{FfnObserver, FfnTrace};

/// Firing counts per neuron and the last token's per-layer firing fraction.
#[derive(Clone, Debug)]
pub struct FiringStats {
    n_ff: usize,
    /// `n_layer × n_ff` counts of tokens for which the neuron's activation was non-zero.
    counts: Vec<u32>,
    /// Tokens seen per layer.
    tokens: Vec<u32>,
    /// Fraction of each layer's neurons that fired for the last token seen.
    last: Vec<f32>,
}

impl FiringStats {
    /// Empty statistics for a model of `n_layer` layers of `n_ff` neurons.
    pub fn new(n_layer: usize, n_ff: usize) -> FiringStats {
        FiringStats {
            n_ff,
            counts: vec![0; n_layer * n_ff],
            tokens: vec![0; n_layer],
            last: vec![0.0; n_layer],
        }
    }

    /// Adds one layer's batch of activations (`n × n_ff`, row per token).
    pub fn record(&mut self, trace: &FfnTrace) {
        let n_ff = self.n_ff;
        let Some(counts) = self
            .counts
            .get_mut(trace.layer * n_ff..(trace.layer + 1) * n_ff)
        else {
            return;
        };
        let mut fired_last = 0;
        for row in trace.activations.chunks_exact(n_ff) {
            fired_last = 0;
            for (c, &a) in counts.iter_mut().zip(row) {
                if a != 0.0 {
                    *c += 1;
                    fired_last += 1;
                }
            }
            self.tokens[trace.layer] += 1;
        }
        self.last[trace.layer] = fired_last as f32 / n_ff as f32;
    }

    /// Fraction of each layer's neurons that fired for the last token (0 before any token).
    pub fn last_token_density(&self) -> &[f32] {
        &self.last
    }

    /// `n_layer × n_ff` firing frequencies: the fraction of tokens for which each neuron fired.
    pub fn frequencies(&self) -> Vec<f32> {
        self.counts
            .chunks_exact(self.n_ff)
            .zip(&self.tokens)
            .flat_map(|(row, &t)| row.iter().map(move |&c| c as f32 / t.max(1) as f32))
            .collect()
    }

    /// Tokens seen (by the first layer).
    pub fn tokens(&self) -> u32 {
        self.tokens.first().copied().unwrap_or(0)
    }
}

/// An observer that records into `stats`.
pub fn observer(stats: Arc<Mutex<FiringStats>>) -> FfnObserver {
    Box::new(move |trace: &FfnTrace| {
        if let Ok(mut s) = stats.lock() {
            s.record(trace);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace<'a>(layer: usize, input: &'a [f32], acts: &'a [f32]) -> FfnTrace<'a> {
        FfnTrace {
            layer,
            input,
            gate: None,
            activations: acts,
        }
    }

    #[test]
    fn counts_non_zero_activations_per_neuron_and_the_last_row() {
        let mut s = FiringStats::new(2, 4);
        // Two tokens in layer 1: neuron 0 fires twice, neuron 2 once (the last token fires 1 of 4).
        s.record(&trace(1, &[], &[1.0, 0.0, -2.0, 0.0, 0.5, 0.0, 0.0, 0.0]));
        s.record(&trace(0, &[], &[0.0, 0.0, 0.0, 3.0]));
        assert_eq!(s.last_token_density(), &[0.25, 0.25]);
        assert_eq!(
            s.frequencies(),
            vec![0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.5, 0.0]
        );
        assert_eq!(s.tokens(), 1);
    }

    #[test]
    fn a_layer_out_of_range_is_ignored() {
        let mut s = FiringStats::new(1, 2);
        s.record(&trace(5, &[], &[1.0, 1.0]));
        assert_eq!(s.frequencies(), vec![0.0, 0.0]);
    }
}
