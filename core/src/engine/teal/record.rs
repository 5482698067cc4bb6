//! Calibration for TEAL: a [`Linear`] and [`FfnOffload`] that computes every product densely and
//! records the magnitudes of each matrix's inputs in a [`MagnitudeHistogram`], weighted by the
//! squared norm of the weight column each input multiplies (the output error its zeroing adds).

use std::sync::Mutex;

use super::allocate::{allocate, Allocation};
use super::histogram::MagnitudeHistogram;
use crate::cpu;
use crate::engine::linear::{dense_project, Linear, Proj};
use crate::engine::offload::{CpuFfn, FfnOffload, FfnTensor};
use crate::model::Model;
use crate::{Error, Result};

/// Records the input histograms of every layer's seven matrices while computing densely.
pub struct TealRecorder {
    hists: Vec<[Mutex<MagnitudeHistogram>; 7]>,
    /// `‖W[:, i]‖²` per layer, matrix and input channel.
    col_norms: Vec<[Vec<f32>; 7]>,
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
    pub fn new(model: &Model) -> Result<TealRecorder> {
        let mut col_norms = Vec::with_capacity(model.hp.n_layer);
        let mut params = Vec::with_capacity(model.hp.n_layer);
        for (il, layer) in model.layers.iter().enumerate() {
            let mut norms: [Vec<f32>; 7] = Default::default();
            let mut p = [0f64; 7];
            for m in Proj::ALL {
                if let (Proj::Down, None, Some(w_t)) = (m, &layer.down, &layer.down_t) {
                    // neuron-major down: input channel i is row i
                    let mat = model.matrix(w_t);
                    let mut row = vec![0f32; w_t.cols];
                    let mut sq = vec![0f32; w_t.rows];
                    for (r, s) in sq.iter_mut().enumerate() {
                        cpu::dequantize_row(&mat, r, &mut row)?;
                        *s = row.iter().map(|v| v * v).sum();
                    }
                    norms[m.index()] = sq;
                    p[m.index()] = (w_t.rows * w_t.cols) as f64;
                    continue;
                }
                let w = m.weight(layer).ok_or_else(|| Error::Tensor {
                    tensor: format!("blk.{il}.{}.weight", m.name()),
                    message: "TEAL calibration needs every matrix of the block row-major".into(),
                })?;
                let mat = model.matrix(w);
                let mut sq = vec![0f32; w.cols];
                let mut row = vec![0f32; w.cols];
                for r in 0..w.rows {
                    cpu::dequantize_row(&mat, r, &mut row)?;
                    sq.iter_mut().zip(&row).for_each(|(s, &v)| *s += v * v);
                }
                norms[m.index()] = sq;
                p[m.index()] = (w.rows * w.cols) as f64;
            }
            col_norms.push(norms);
            params.push(p);
        }
        Ok(TealRecorder {
            hists: (0..model.hp.n_layer).map(|_| Default::default()).collect(),
            col_norms,
            params,
        })
    }

    fn record(&self, il: usize, which: Proj, x: &[f32]) {
        let norms = &self.col_norms[il][which.index()];
        let mut local = MagnitudeHistogram::default();
        for row in x.chunks_exact(norms.len()) {
            for (&v, &w) in row.iter().zip(norms) {
                local.add(v, w);
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
