//! Which input channels a threshold skips: TEAL's `|x_i| < t`, or WINA's `|x_i| · ‖W[:, i]‖₂ < t`
//! (the channel's input times the norm of the weight column it multiplies: the size of what it
//! adds to the output). Under WINA each channel in effect has its own threshold `t / ‖W[:, i]‖₂`,
//! so a matrix's channels whose columns are small are skipped at larger inputs.

use super::{block_weight, Proj};
use crate::cpu;
use crate::model::{Model, TealCriterion};
use crate::Result;

/// `‖W[:, i]‖²` of every input channel of each of layer `il`'s seven matrices, in [`Proj::ALL`]
/// order, and each matrix's parameter count (reads every block weight once).
pub(super) fn column_norms(model: &Model, il: usize) -> Result<([Vec<f32>; 7], [f64; 7])> {
    let mut norms: [Vec<f32>; 7] = Default::default();
    let mut params = [0f64; 7];
    for m in Proj::ALL {
        let (w, input_major) = block_weight(model, il, m)?;
        let mat = model.matrix(w);
        let mut row = vec![0f32; w.cols];
        let sq = if input_major {
            // input channel i is row i
            let mut sq = vec![0f32; w.rows];
            for (r, s) in sq.iter_mut().enumerate() {
                cpu::dequantize_row(&mat, r, &mut row)?;
                *s = row.iter().map(|v| v * v).sum();
            }
            sq
        } else {
            let mut sq = vec![0f32; w.cols];
            for r in 0..w.rows {
                cpu::dequantize_row(&mat, r, &mut row)?;
                sq.iter_mut().zip(&row).for_each(|(s, &v)| *s += v * v);
            }
            sq
        };
        norms[m.index()] = sq;
        params[m.index()] = (w.rows * w.cols) as f64;
    }
    Ok((norms, params))
}

/// A [`TealCriterion`] with what it needs per channel: applies thresholds to inputs.
#[derive(Clone, Debug)]
pub struct ChannelRule {
    criterion: TealCriterion,
    /// Under WINA, `‖W[:, i]‖₂` per layer, matrix and input channel; empty under magnitude.
    scales: Vec<[Vec<f32>; 7]>,
}

impl ChannelRule {
    /// TEAL's magnitude rule, which needs nothing of the weights.
    pub fn magnitude() -> ChannelRule {
        ChannelRule::from_squared_norms(TealCriterion::Magnitude, &[])
    }

    /// The rule of `criterion` for `model` (under WINA this reads every block weight once).
    pub fn new(model: &Model, criterion: TealCriterion) -> Result<ChannelRule> {
        match criterion {
            TealCriterion::Magnitude => Ok(ChannelRule::magnitude()),
            TealCriterion::Wina => {
                let norms: Vec<[Vec<f32>; 7]> = (0..model.hp.n_layer)
                    .map(|il| column_norms(model, il).map(|(n, _)| n))
                    .collect::<Result<_>>()?;
                Ok(ChannelRule::from_squared_norms(criterion, &norms))
            }
        }
    }

    /// The rule of `criterion` from the squared column norms of [`column_norms`] (unused under
    /// magnitude).
    pub(super) fn from_squared_norms(
        criterion: TealCriterion,
        norms: &[[Vec<f32>; 7]],
    ) -> ChannelRule {
        let scales = match criterion {
            TealCriterion::Magnitude => Vec::new(),
            TealCriterion::Wina => norms
                .iter()
                .map(|layer| std::array::from_fn(|m| layer[m].iter().map(|n| n.sqrt()).collect()))
                .collect(),
        };
        ChannelRule { criterion, scales }
    }

    /// The criterion.
    pub fn criterion(&self) -> TealCriterion {
        self.criterion
    }

    /// Zeroes the inputs of layer `il`'s matrix `which` (`x`: rows of its input channels) whose
    /// score is below `t`; returns how many it kept.
    pub(super) fn mask(&self, il: usize, which: Proj, t: f32, x: &mut [f32]) -> u64 {
        let mut kept = 0u64;
        let mut keep = |v: &mut f32, score: f32| {
            if score < t {
                *v = 0.0;
            } else {
                kept += 1;
            }
        };
        match self.criterion {
            TealCriterion::Magnitude => x.iter_mut().for_each(|v| keep(v, v.abs())),
            TealCriterion::Wina => {
                let scales = &self.scales[il][which.index()];
                for row in x.chunks_exact_mut(scales.len()) {
                    for (v, &c) in row.iter_mut().zip(scales) {
                        keep(v, v.abs() * c);
                    }
                }
            }
        }
        kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wina_scores_each_channel_by_its_column_norm() {
        // one layer; q's three input channels have column norms 1, 2 and 0
        let mut norms: [Vec<f32>; 7] = Default::default();
        norms[Proj::Q.index()] = vec![1.0, 4.0, 0.0];
        let wina = ChannelRule::from_squared_norms(TealCriterion::Wina, &[norms]);
        // two rows: scores 1.0, 1.0, 0 and 0.5, 3.0, 0
        let mut x = vec![1.0, -0.5, 7.0, 0.5, 1.5, -7.0];
        assert_eq!(wina.mask(0, Proj::Q, 0.9, &mut x), 3);
        assert_eq!(x, [1.0, -0.5, 0.0, 0.0, 1.5, 0.0]);
        let mut x = vec![1.0, -0.5, 7.0, 0.5, 1.5, -7.0];
        assert_eq!(ChannelRule::magnitude().mask(0, Proj::Q, 0.9, &mut x), 4);
        assert_eq!(x, [1.0, 0.0, 7.0, 0.0, 1.5, -7.0]);
    }
}
