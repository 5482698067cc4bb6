//! How a block's sparsity target is shared among its seven matrices.
//!
//! TEAL (Liu et al. 2024, §4.2) keeps the same sparsity target for every block and, inside a
//! block, allocates it greedily: start every matrix at 0% sparsity, and repeatedly raise by a
//! small step `δ` the sparsity of the one matrix whose step adds the least error, until the
//! block's parameter-weighted sparsity `Σ p_m s_m / Σ p_m` reaches the target. TEAL measures the
//! error on the block's output by running the block (that is [`super::measure`], `calibrate
//! --teal-allocation measured`); here, the fast option, the error a step adds to matrix `m` is
//! estimated from the calibration histograms as the squared output error of `W_m x` from the newly
//! zeroed inputs, `Σ ‖W_m[:, i]‖² x_i²` (exact in expectation when the dropped channels'
//! contributions are uncorrelated), divided by the same sum over all inputs so that matrices with
//! different output scales compare, and divided by the parameters the step skips (error per
//! skipped weight: a big matrix's step buys more sparsity). [`Allocation::Uniform`] gives every
//! matrix the target (`benches/teal.sh` compares both).

use super::histogram::MagnitudeHistogram;

/// Step of the greedy allocation, in sparsity.
const STEP: f64 = 0.005;
/// Highest sparsity given to one matrix.
const MAX_SPARSITY: f64 = 0.99;

/// How a block's target is shared among its matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allocation {
    /// TEAL's greedy allocation by added output error (see the module docs).
    Greedy,
    /// The same sparsity for every matrix.
    Uniform,
}

/// The sparsity of each of a block's matrices for the block-wide `target` (parameter-weighted),
/// from their input histograms and parameter counts.
pub fn allocate(
    hists: &[MagnitudeHistogram; 7],
    params: [f64; 7],
    target: f64,
    how: Allocation,
) -> [f64; 7] {
    match how {
        Allocation::Uniform => [target; 7],
        Allocation::Greedy => greedy(hists, params, target),
    }
}

fn greedy(hists: &[MagnitudeHistogram; 7], params: [f64; 7], target: f64) -> [f64; 7] {
    let total: f64 = params.iter().sum();
    let rel = |m: usize, s: f64| {
        let e = hists[m].total_energy();
        if e > 0.0 {
            hists[m].cut(s).1 / e
        } else {
            0.0
        }
    };
    let mut s = [0f64; 7];
    let mut err: [f64; 7] = [0.0; 7];
    let reached = |s: &[f64; 7]| {
        s.iter().zip(&params).map(|(a, p)| a * p).sum::<f64>() >= target * total - 1e-9
    };
    while !reached(&s) {
        let best = (0..7)
            .filter(|&m| params[m] > 0.0 && s[m] + STEP <= MAX_SPARSITY + 1e-12)
            .map(|m| {
                let e = rel(m, s[m] + STEP);
                (m, e, (e - err[m]) / (params[m] * STEP))
            })
            .min_by(|a, b| a.2.total_cmp(&b.2));
        let Some((m, e, _)) = best else { break };
        s[m] += STEP;
        err[m] = e;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A histogram of `n` values spread uniformly over `[0, scale)`, each zeroing costing `w·v²`.
    fn uniform(scale: f32, w: f32) -> MagnitudeHistogram {
        let mut h = MagnitudeHistogram::default();
        for i in 0..4000 {
            h.add(scale * (i as f32 + 0.5) / 4000.0, w);
        }
        h
    }

    #[test]
    fn greedy_meets_the_target_and_favours_cheap_matrices() {
        // Matrix 0's inputs are heavy-tailed (most values tiny relative to its largest), so
        // zeroing its small inputs costs little relative error; the others are uniform.
        let mut hists: [MagnitudeHistogram; 7] = Default::default();
        for (m, h) in hists.iter_mut().enumerate() {
            *h = uniform(1.0, 1.0);
            if m == 0 {
                for i in 0..4000 {
                    h.add(if i % 10 == 0 { 10.0 } else { 0.01 }, 1.0);
                }
            }
        }
        let params = [1.0; 7];
        let s = allocate(&hists, params, 0.4, Allocation::Greedy);
        let mean = s.iter().sum::<f64>() / 7.0;
        assert!((mean - 0.4).abs() <= STEP, "{s:?}");
        assert!(s[0] > s[1] + 0.1, "{s:?}");
        let err = |s: &[f64; 7]| {
            (0..7)
                .map(|m| hists[m].cut(s[m]).1 / hists[m].total_energy())
                .sum::<f64>()
        };
        let u = allocate(&hists, params, 0.4, Allocation::Uniform);
        assert!(err(&s) < err(&u), "greedy {} uniform {}", err(&s), err(&u));
    }
}
