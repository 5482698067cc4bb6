//! Measuring a predictor against recorded activations.

use rayon::prelude::*;

use super::{Samples, TrainedPredictor};

/// Samples per logits batch while measuring (bounds memory at `EVAL_BATCH · n_ff` floats).
const EVAL_BATCH: usize = 256;

/// Quality of a predictor, micro-averaged over all (sample, neuron) pairs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PredictorMetrics {
    /// Truly active pairs predicted active / truly active pairs (1 when none are active).
    pub recall: f64,
    /// Truly active pairs predicted active / pairs predicted active (1 when none are predicted).
    pub precision: f64,
    /// Fraction of pairs predicted active (the work the sparse FFN will do).
    pub density: f64,
    /// Fraction of pairs truly active.
    pub true_density: f64,
}

/// Counts of (true positive, predicted, actual) pairs, exact integers so any summation order agrees.
#[derive(Clone, Copy, Default)]
struct Counts {
    tp: u64,
    predicted: u64,
    actual: u64,
}

/// Measures `p` on `s`: for every sample, neuron `i` is predicted active iff
/// `logits[i] >= p.threshold`.
///
/// # Panics
/// If the shapes of `p` and `s` disagree.
pub fn evaluate(p: &TrainedPredictor, s: &Samples) -> PredictorMetrics {
    assert_eq!(
        p.n_embd(),
        s.n_embd,
        "predictor and samples disagree on n_embd"
    );
    assert_eq!(p.n_ff(), s.n_ff, "predictor and samples disagree on n_ff");
    let (n, e, f) = (s.len(), s.n_embd, s.n_ff);
    let mut c = Counts::default();
    for b0 in (0..n).step_by(EVAL_BATCH) {
        let b1 = (b0 + EVAL_BATCH).min(n);
        let logits = p.logits(&s.x[b0 * e..b1 * e], b1 - b0);
        let part = logits
            .par_chunks(f.max(1))
            .enumerate()
            .map(|(k, row)| {
                let bits = s.active_row(b0 + k);
                let mut c = Counts::default();
                for (i, &l) in row.iter().enumerate() {
                    let pred = l >= p.threshold;
                    let act = bits[i / 64] >> (i % 64) & 1 == 1;
                    c.tp += (pred && act) as u64;
                    c.predicted += pred as u64;
                    c.actual += act as u64;
                }
                c
            })
            .reduce(Counts::default, |a, b| Counts {
                tp: a.tp + b.tp,
                predicted: a.predicted + b.predicted,
                actual: a.actual + b.actual,
            });
        c.tp += part.tp;
        c.predicted += part.predicted;
        c.actual += part.actual;
    }
    let total = (n * f) as f64;
    let ratio = |a: u64, b: u64| if b == 0 { 1.0 } else { a as f64 / b as f64 };
    PredictorMetrics {
        recall: ratio(c.tp, c.actual),
        precision: ratio(c.tp, c.predicted),
        density: if total > 0.0 {
            c.predicted as f64 / total
        } else {
            0.0
        },
        true_density: if total > 0.0 {
            c.actual as f64 / total
        } else {
            0.0
        },
    }
}
