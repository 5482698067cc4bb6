//! TEAL's block-wise greedy allocation with the error measured, as TEAL does it (Liu et al. 2024,
//! §4.2 and `teal/greedyopt.py`): the block's inputs on a sample of calibration tokens are
//! recorded from the dense pass, and each candidate step (one matrix's sparsity raised by a step
//! worth the same number of skipped weights) is scored by running the whole block (attention and
//! FFN, on the CPU kernels, every matrix's input thresholded at the threshold its sparsity stands
//! for in the calibration histograms) and measuring the squared distance of its output from the
//! dense output. The step that adds the least error per skipped weight is taken, until the
//! block's parameter-weighted sparsity reaches the target.
//!
//! Rows in the first quarter of each sample sequence run (they are the later rows' keys and
//! values) but are not scored: the first positions carry attention-sink activations whose error
//! says little about the rest (TEAL scores only the last quarter).
//!
//! Cost: about `7 × steps` block evaluations per layer on the sample (`steps ≈ target / `
//! [`BLOCK_STEP`]); the thresholds of a sparsity come from the histograms, so nothing else runs.

use std::sync::{Arc, Mutex};

use super::criterion::ChannelRule;
use super::histogram::MagnitudeHistogram;
use super::record::{TealCalibration, TealRecorder};
use crate::engine::kv_cache::KvCache;
use crate::engine::linear::{dense_project, Linear, Proj};
use crate::engine::offload::{CpuFfn, FfnOffload, FfnTensor};
use crate::engine::session::{Forward, SeqRows};
use crate::model::Model;
use crate::{Error, Result};

/// Block sparsity (parameter-weighted) one greedy step adds: a step of matrix `m` raises its
/// sparsity by `BLOCK_STEP · Σp / p_m` (TEAL's `base_step_size / weight`, about 0.005 of the block
/// for Llama-2-7B; twice that here to halve the calibration time).
const BLOCK_STEP: f64 = 0.01;
/// The largest step of one matrix (small matrices such as K and V would otherwise jump).
const MAX_STEP: f64 = 0.1;
/// Highest sparsity given to one matrix.
const MAX_SPARSITY: f64 = 0.99;

/// Every projection with its input thresholded (the channels `rule` scores below `t` zeroed) and
/// then the dense product: the block under trial thresholds, on the dense kernels.
struct Masked {
    thresholds: Mutex<[f32; 7]>,
    rule: ChannelRule,
}

impl Masked {
    fn masked(&self, il: usize, which: Proj, x: &[f32]) -> Vec<f32> {
        let t = self.thresholds.lock().expect("threshold lock")[which.index()];
        let mut xs = x.to_vec();
        self.rule.mask(il, which, t, &mut xs);
        xs
    }
}

impl Linear for Masked {
    fn project(
        &self,
        model: &Model,
        il: usize,
        which: Proj,
        x: &[f32],
        n: usize,
    ) -> Result<Vec<f32>> {
        dense_project(model, il, which, &self.masked(il, which, x), n)
    }
}

impl FfnOffload for Masked {
    fn matmul(
        &self,
        model: &Model,
        il: usize,
        which: FfnTensor,
        x: &[f32],
        n: usize,
    ) -> Result<Vec<f32>> {
        let xs = self.masked(il, Proj::from(which), x);
        CpuFfn.matmul(model, il, which, &xs, n)
    }

    fn down_axpy(&self, model: &Model, il: usize, a: &[f32], n: usize) -> Result<Vec<f32>> {
        CpuFfn.down_axpy(model, il, &self.masked(il, Proj::Down, a), n)
    }
}

/// One layer's measured allocation: the sparsity per matrix and the block's relative output
/// error at it (`‖y − y*‖² / ‖y* − x‖²` over the scored rows, `y*` the dense output).
#[derive(Clone, Debug)]
pub struct LayerAllocation {
    /// Sparsity per matrix, in [`Proj::ALL`] order.
    pub sparsity: [f64; 7],
    /// Relative output error of the block at that sparsity.
    pub error: f64,
    /// Block evaluations it took.
    pub evaluations: usize,
}

/// The block under evaluation: its layer, input rows and the sample's sequences.
struct Probe<'m> {
    fwd: Forward<'m>,
    masked: Arc<Masked>,
    caches: Vec<KvCache>,
    lens: Vec<usize>,
    /// Scored rows (global row indices).
    scored: Vec<usize>,
}

impl<'m> Probe<'m> {
    fn new(model: &'m Model, samples: &[&[u32]], rule: &ChannelRule) -> Probe<'m> {
        let masked = Arc::new(Masked {
            thresholds: Mutex::new([0.0; 7]),
            rule: rule.clone(),
        });
        let mut fwd = Forward::new(model);
        fwd.set_operators(masked.clone(), masked.clone());
        let lens: Vec<usize> = samples.iter().map(|s| s.len()).collect();
        let mut scored = Vec::new();
        let mut row0 = 0;
        for &n in &lens {
            scored.extend(row0 + n / 4..row0 + n);
            row0 += n;
        }
        Probe {
            fwd,
            masked,
            caches: lens.iter().map(|&n| KvCache::new(&model.hp, n)).collect(),
            lens,
            scored,
        }
    }

    /// The sample's embeddings (the first block's input).
    fn embed(&mut self, samples: &[&[u32]]) -> Result<Vec<f32>> {
        let tokens: Vec<u32> = samples.iter().flat_map(|s| s.iter().copied()).collect();
        let seqs = seq_rows(&mut self.caches, &self.lens);
        self.fwd.embed(&tokens, &seqs)
    }

    /// Block `il`'s output for input `x` under `thresholds`.
    fn run(&mut self, il: usize, x: &[f32], thresholds: [f32; 7]) -> Result<Vec<f32>> {
        *self.masked.thresholds.lock().expect("threshold lock") = thresholds;
        let mut y = x.to_vec();
        let mut seqs = seq_rows(&mut self.caches, &self.lens);
        self.fwd.block(il, &mut y, &mut seqs)?;
        Ok(y)
    }

    /// `Σ ‖y − target‖²` over the scored rows.
    fn error(&self, y: &[f32], target: &[f32]) -> f64 {
        let d = y.len() / self.lens.iter().sum::<usize>().max(1);
        self.scored
            .iter()
            .map(|&r| {
                let rows = r * d..(r + 1) * d;
                y[rows.clone()]
                    .iter()
                    .zip(&target[rows])
                    .map(|(&a, &b)| {
                        let e = f64::from(a) - f64::from(b);
                        e * e
                    })
                    .sum::<f64>()
            })
            .sum()
    }
}

/// Each sample sequence from position 0 on its cache.
fn seq_rows<'c>(caches: &'c mut [KvCache], lens: &[usize]) -> Vec<SeqRows<'c>> {
    caches
        .iter_mut()
        .zip(lens)
        .map(|(cache, &n)| SeqRows {
            cache,
            n_past: 0,
            n,
        })
        .collect()
}

/// Thresholds and sparsity for the model-wide `target` with TEAL's greedy steps measured on the
/// block outputs of `samples` (token sequences from the calibration text; each evaluated as its
/// own sequence), the thresholds of a sparsity read from `recorder`'s histograms (record them
/// first). `done(il, &allocation)` is called after each layer.
pub fn measured_allocation(
    model: &Model,
    recorder: &TealRecorder,
    samples: &[&[u32]],
    target: f64,
    mut done: impl FnMut(usize, &LayerAllocation),
) -> Result<TealCalibration> {
    if !(0.0..1.0).contains(&target) {
        return Err(Error::InvalidArgument(format!(
            "target sparsity {target} is outside [0, 1)"
        )));
    }
    check_samples(samples)?;
    let mut probe = Probe::new(model, samples, recorder.rule());
    let mut x = probe.embed(samples)?;
    let mut thresholds = Vec::with_capacity(model.hp.n_layer);
    let mut sparsity = Vec::with_capacity(model.hp.n_layer);
    for il in 0..model.hp.n_layer {
        let hists = recorder.histograms(il)?;
        let params = recorder.params(il);
        let (alloc, dense_out) = greedy_layer(&mut probe, il, &x, &hists, params, target)?;
        done(il, &alloc);
        thresholds.push(std::array::from_fn(|m| hists[m].cut(alloc.sparsity[m]).0));
        sparsity.push(alloc.sparsity);
        // the next block's input is this block's dense output (TEAL records dense activations)
        x = dense_out;
    }
    Ok(TealCalibration {
        thresholds,
        sparsity,
    })
}

/// Each block's relative output error (`‖y − y*‖² / ‖y* − x‖²` over the scored rows) on
/// `samples` under `thresholds` (one row of seven per layer), every block run on the dense
/// output of the blocks before it, the thresholds applied as `rule` says: how an allocation from
/// any method does on TEAL's measure.
pub fn block_errors(
    model: &Model,
    samples: &[&[u32]],
    thresholds: &[[f32; 7]],
    rule: &ChannelRule,
) -> Result<Vec<f64>> {
    check_samples(samples)?;
    if thresholds.len() != model.hp.n_layer {
        return Err(Error::InvalidArgument(format!(
            "{} rows of thresholds for {} layers",
            thresholds.len(),
            model.hp.n_layer
        )));
    }
    let mut probe = Probe::new(model, samples, rule);
    let mut x = probe.embed(samples)?;
    let mut errors = Vec::with_capacity(thresholds.len());
    for (il, t) in thresholds.iter().enumerate() {
        let dense = probe.run(il, &x, [0.0; 7])?;
        let y = probe.run(il, &x, *t)?;
        let scale = probe.error(&x, &dense).max(f64::MIN_POSITIVE);
        errors.push(probe.error(&y, &dense) / scale);
        x = dense;
    }
    Ok(errors)
}

/// Sample sequences must exist and hold at least 4 tokens each (a quarter is not scored).
fn check_samples(samples: &[&[u32]]) -> Result<()> {
    if samples.is_empty() || samples.iter().any(|s| s.len() < 4) {
        return Err(Error::InvalidArgument(
            "the measured TEAL allocation needs sample sequences of at least 4 tokens".into(),
        ));
    }
    Ok(())
}

/// The greedy allocation of one layer, and the block's dense output on the sample.
fn greedy_layer(
    probe: &mut Probe,
    il: usize,
    x: &[f32],
    hists: &[MagnitudeHistogram; 7],
    params: [f64; 7],
    target: f64,
) -> Result<(LayerAllocation, Vec<f32>)> {
    let dense = probe.run(il, x, [0.0; 7])?;
    let scale = probe.error(x, &dense).max(f64::MIN_POSITIVE);
    let total: f64 = params.iter().sum();
    let step: [f64; 7] = std::array::from_fn(|m| {
        if params[m] > 0.0 {
            (BLOCK_STEP * total / params[m]).min(MAX_STEP)
        } else {
            0.0
        }
    });
    let reached = |s: &[f64; 7]| {
        s.iter().zip(&params).map(|(a, p)| a * p).sum::<f64>() >= target * total - 1e-9
    };
    let thresholds_of = |s: &[f64; 7]| std::array::from_fn(|m| hists[m].cut(s[m]).0);
    let mut s = [0f64; 7];
    let mut err = 0.0;
    let mut evaluations = 1;
    while !reached(&s) {
        let mut best: Option<([f64; 7], f64, f64)> = None;
        for m in 0..7 {
            if params[m] <= 0.0 || s[m] >= MAX_SPARSITY - 1e-12 {
                continue;
            }
            let mut trial = s;
            trial[m] = (s[m] + step[m]).min(MAX_SPARSITY);
            let y = probe.run(il, x, thresholds_of(&trial))?;
            evaluations += 1;
            let e = probe.error(&y, &dense);
            let per_weight = (e - err) / ((trial[m] - s[m]) * params[m]);
            if best.is_none_or(|(_, _, b)| per_weight < b) {
                best = Some((trial, e, per_weight));
            }
        }
        let Some((trial, e, _)) = best else { break };
        s = trial;
        err = e;
    }
    Ok((
        LayerAllocation {
            sparsity: s,
            error: err / scale,
            evaluations,
        },
        dense,
    ))
}
