//! Calibration for TEAL: a [`Linear`] and [`FfnOffload`] that computes every product densely and
//! records what the thresholds will compare for each matrix's inputs (their magnitudes, or under
//! WINA the magnitudes times their weight columns' norms) in a [`MagnitudeHistogram`], with the
//! output error each input's zeroing adds (`‖W[:, i]‖² x_i²`).

use std::sync::Mutex;

use super::allocate::{allocate, Allocation};
use super::criterion::{column_norms, ChannelRule};
use super::histogram::MagnitudeHistogram;
use crate::engine::linear::{dense_project, Linear, Proj};
use crate::engine::offload::{CpuFfn, FfnOffload, FfnTensor};
use crate::model::{Model, TealCriterion};
use crate::{Error, Result};

/// Records the input histograms of every layer's seven matrices while computing densely.
pub struct TealRecorder {
    hists: Vec<[Mutex<MagnitudeHistogram>; 7]>,
    /// `‖W[:, i]‖²` per layer, matrix and input channel.
    col_norms: Vec<[Vec<f32>; 7]>,
    /// The criterion the histograms record.
    rule: ChannelRule,
    params: Vec<[f64; 7]>,
}

/// Per-layer thresholds and the sparsity each stands for, from [`TealRecorder::thresholds`].
#[derive(Clone, Debug)]
pub struct TealCalibration {
    /// Thresholds per layer, in [`Proj::ALL`] order.
    pub thresholds: Vec<[f32; 7]>,
    /// The allocated sparsity per layer and matrix.
    pub sparsity: Vec<[f64; 7]>,
}

impl TealRecorder {
    /// A recorder for `model` (reads every block weight once for its column norms).
    pub fn new(model: &Model, criterion: TealCriterion) -> Result<TealRecorder> {
        let (mut col_norms, mut params) = (Vec::new(), Vec::new());
        for il in 0..model.hp.n_layer {
            let (norms, p) = column_norms(model, il)?;
            col_norms.push(norms);
            params.push(p);
        }
        Ok(TealRecorder {
            hists: (0..model.hp.n_layer).map(|_| Default::default()).collect(),
            rule: ChannelRule::from_squared_norms(criterion, &col_norms),
            col_norms,
            params,
        })
    }

    /// The criterion the histograms are recorded for, with its per-channel scales.
    pub fn rule(&self) -> &ChannelRule {
        &self.rule
    }

    fn record(&self, il: usize, which: Proj, x: &[f32]) {
        let norms = &self.col_norms[il][which.index()];
        let mut local = MagnitudeHistogram::default();
        for row in x.chunks_exact(norms.len()) {
            for (&v, &w) in row.iter().zip(norms) {
                // the histogram's value is what the threshold compares; the error its
                // zeroing adds is `‖W[:, i]‖² v²` either way
                match self.rule.criterion() {
                    TealCriterion::Magnitude => local.add(v, w),
                    TealCriterion::Wina => local.add(v.abs() * w.sqrt(), 1.0),
                }
            }
        }
        self.hists[il][which.index()]
            .lock()
            .expect("histogram lock")
            .merge(&local);
    }

    /// Layer `il`'s seven input histograms so far (an error when one has no samples).
    pub fn histograms(&self, il: usize) -> Result<[MagnitudeHistogram; 7]> {
        let layer = self
            .hists
            .get(il)
            .ok_or_else(|| Error::InvalidArgument(format!("no layer {il} in the TEAL recorder")))?;
        let hists: [MagnitudeHistogram; 7] =
            std::array::from_fn(|m| layer[m].lock().expect("histogram lock").clone());
        if let Some(m) = Proj::ALL.iter().find(|m| hists[m.index()].is_empty()) {
            return Err(Error::InvalidArgument(format!(
                "no calibration samples for blk.{il}.{}",
                m.name()
            )));
        }
        Ok(hists)
    }

    /// Parameters of layer `il`'s seven matrices.
    pub fn params(&self, il: usize) -> [f64; 7] {
        self.params[il]
    }

    /// Thresholds for the model-wide `target` sparsity: every block gets the target, shared among
    /// its matrices as `how` says.
    pub fn thresholds(&self, target: f64, how: Allocation) -> Result<TealCalibration> {
        if !(0.0..1.0).contains(&target) {
            return Err(Error::InvalidArgument(format!(
                "target sparsity {target} is outside [0, 1)"
            )));
        }
        let mut thresholds = Vec::with_capacity(self.hists.len());
        let mut sparsity = Vec::with_capacity(self.hists.len());
        for il in 0..self.hists.len() {
            let hists = self.histograms(il)?;
            let s = allocate(&hists, self.params[il], target, how);
            thresholds.push(std::array::from_fn(|m| hists[m].cut(s[m]).0));
            sparsity.push(s);
        }
        Ok(TealCalibration {
            thresholds,
            sparsity,
        })
    }
}

impl Linear for TealRecorder {
    fn project(
        &self,
        model: &Model,
        il: usize,
        which: Proj,
        x: &[f32],
        n: usize,
    ) -> Result<Vec<f32>> {
        self.record(il, which, x);
        dense_project(model, il, which, x, n)
    }
}

impl FfnOffload for TealRecorder {
    fn matmul(
        &self,
        model: &Model,
        il: usize,
        which: FfnTensor,
        x: &[f32],
        n: usize,
    ) -> Result<Vec<f32>> {
        let p = Proj::from(which);
        self.record(il, p, x);
        CpuFfn.matmul(model, il, which, x, n)
    }

    fn down_axpy(&self, model: &Model, il: usize, a: &[f32], n: usize) -> Result<Vec<f32>> {
        self.record(il, Proj::Down, a);
        CpuFfn.down_axpy(model, il, a, n)
    }
}
