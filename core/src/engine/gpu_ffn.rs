//! The hybrid FFN: each layer's hot neurons (gate/up rows and down columns) live on the GPU and
//! are computed there while the CPU computes the cold ones; the partial results are merged (gate
//! and up) or summed (down). Layers whose every neuron is hot and whose down projection is
//! row-major run whole on the GPU (llama.cpp-style layer offload for dense models).
//!
//! Exactness: the GPU kernels take activations quantised by the CPU's own code and the down
//! coefficients rounded by the forward pass before the split, so each output differs from the
//! CPU-only pass only by float summation order.

use std::sync::{Arc, Mutex, MutexGuard};

use super::offload::{down_t, ffn_weight, hot_neurons, CpuFfn, FfnOffload, FfnTensor};
use crate::cpu;
use crate::gpu::{GpuContext, GpuMatrix, Workspace, AXPY_TYPES, MATVEC_TYPES};
use crate::model::Model;
use crate::Result;

/// Marks a neuron that is not on the GPU in [`GpuLayer::local`].
const COLD: u32 = u32::MAX;

/// One layer's weights on the GPU.
struct GpuLayer {
    /// The hot neurons, sorted.
    hot: Vec<u32>,
    /// For each neuron, its row among the held rows (or [`COLD`]).
    local: Vec<u32>,
    gate: GpuMatrix,
    up: GpuMatrix,
    /// The hot rows of `ffn_down_t`, when the model has it.
    down_t: Option<GpuMatrix>,
    /// All of `ffn_down` (row-major), when every neuron is hot and there is no `ffn_down_t`.
    down: Option<GpuMatrix>,
}

/// The FFN split between a GPU (hot neurons) and the CPU (the rest).
pub struct GpuFfn {
    ctx: Arc<GpuContext>,
    layers: Vec<Option<GpuLayer>>,
    /// The buffers and bind groups every call reuses (one call at a time: a call holds it from
    /// its submission to its read-back), so that a decode step creates no wgpu object but its
    /// command encoders.
    space: Mutex<Workspace>,
    /// `0..n_ff`: the held rows of a whole layer's down axpy.
    all_rows: Vec<u32>,
}

impl std::fmt::Debug for GpuFfn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuFfn")
            .field("gpu", &self.ctx.describe())
            .field("bytes", &self.bytes())
            .finish()
    }
}

/// Whether layer `il`'s FFN weights have GPU kernels.
pub fn layer_fits_kernels(model: &Model, il: usize) -> bool {
    let l = &model.layers[il];
    let mv = |ty| MATVEC_TYPES.contains(&ty);
    // A gateless FFN (Falcon, OPT: up with a bias) stays on the CPU for now.
    l.gate.as_ref().is_some_and(|g| mv(g.ty))
        && l.up_b.is_none()
        && mv(l.up.ty)
        && match (&l.down_t, &l.down) {
            (Some(t), _) => AXPY_TYPES.contains(&t.ty),
            (None, Some(d)) => mv(d.ty),
            (None, None) => false,
        }
}

impl GpuFfn {
    /// Uploads the hot neurons `hot[il]` (sorted ids) of every layer. A layer without
    /// `ffn_down_t` must be all hot or all cold.
    ///
    /// Errors: [`crate::Error::InvalidArgument`] for a bad hot set, [`crate::Error::Gpu`] or
    /// [`crate::Error::UnsupportedType`] when the weights cannot go to the GPU.
    pub fn new(ctx: Arc<GpuContext>, model: &Model, hot: &[Vec<u32>]) -> Result<GpuFfn> {
        let n_ff = model.hp.n_ff;
        if hot.len() != model.hp.n_layer {
            return Err(crate::Error::InvalidArgument(format!(
                "a hot set for {} layers, the model has {}",
                hot.len(),
                model.hp.n_layer
            )));
        }
        let mut layers = Vec::with_capacity(hot.len());
        for (il, h) in hot.iter().enumerate() {
            if h.is_empty() {
                layers.push(None);
                continue;
            }
            if !h.windows(2).all(|w| w[0] < w[1]) || h.iter().any(|&i| i as usize >= n_ff) {
                return Err(crate::Error::InvalidArgument(format!(
                    "layer {il}: hot neurons must be sorted, distinct and below {n_ff}"
                )));
            }
            let l = &model.layers[il];
            let (Some(gate), None) = (&l.gate, &l.up_b) else {
                return Err(crate::Error::InvalidArgument(format!(
                    "layer {il}: an FFN without gate (Falcon, OPT) has no GPU kernels yet"
                )));
            };
            let (down_t, down) = match (&l.down_t, &l.down) {
                (Some(t), _) => (
                    Some(GpuMatrix::upload_rows(&ctx, &model.matrix(t), h)?),
                    None,
                ),
                (None, Some(d)) if h.len() == n_ff => {
                    (None, Some(GpuMatrix::upload(&ctx, &model.matrix(d))?))
                }
                _ => {
                    return Err(crate::Error::InvalidArgument(format!(
                    "layer {il} has a row-major ffn_down: its neurons must be all hot or all cold"
                )))
                }
            };
            let mut local = vec![COLD; n_ff];
            for (k, &i) in h.iter().enumerate() {
                local[i as usize] = k as u32;
            }
            layers.push(Some(GpuLayer {
                hot: h.clone(),
                local,
                gate: GpuMatrix::upload_rows(&ctx, &model.matrix(gate), h)?,
                up: GpuMatrix::upload_rows(&ctx, &model.matrix(&l.up), h)?,
                down_t,
                down,
            }));
        }
        let space = Mutex::new(Workspace::new(&ctx));
        let all_rows = (0..n_ff as u32).collect();
        Ok(GpuFfn {
            ctx,
            layers,
            space,
            all_rows,
        })
    }

    /// The hybrid FFN for a budget of `budget` bytes of FFN weights on the GPU, with the hot set
    /// of [`hot_neurons`].
    ///
    /// Errors: as [`GpuFfn::new`].
    pub fn with_budget(ctx: Arc<GpuContext>, model: &Model, budget: u64) -> Result<GpuFfn> {
        let hot = hot_neurons(model, budget, |il| layer_fits_kernels(model, il))?;
        GpuFfn::new(ctx, model, &hot)
    }

    /// Bytes of FFN weights on the GPU.
    pub fn bytes(&self) -> u64 {
        self.layers
            .iter()
            .flatten()
            .map(|l| {
                l.gate.bytes()
                    + l.up.bytes()
                    + l.down_t.as_ref().map_or(0, GpuMatrix::bytes)
                    + l.down.as_ref().map_or(0, GpuMatrix::bytes)
            })
            .sum()
    }

    /// Hot neurons per layer.
    pub fn hot_counts(&self) -> Vec<usize> {
        self.layers
            .iter()
            .map(|l| l.as_ref().map_or(0, |l| l.hot.len()))
            .collect()
    }

    /// The GPU in use.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    /// The gathered products of `whiches` (gate and/or up) over `rows`: the hot rows on the GPU
    /// (one submission, `x` uploaded once) while the CPU computes the cold rows, then merged.
    #[allow(clippy::too_many_arguments)]
    fn split_gather(
        &self,
        model: &Model,
        il: usize,
        layer: &GpuLayer,
        whiches: &[FfnTensor],
        rows: &[u32],
        x: &[f32],
        n: usize,
    ) -> Result<Vec<Vec<f32>>> {
        // Positions in `rows` of the hot and the cold neurons.
        let (hot_pos, cold_pos): (Vec<usize>, Vec<usize>) =
            (0..rows.len()).partition(|&k| layer.local[rows[k] as usize] != COLD);
        let hot_local: Vec<u32> = hot_pos
            .iter()
            .map(|&k| layer.local[rows[k] as usize])
            .collect();
        let held: Vec<&GpuMatrix> = whiches.iter().map(|&w| Self::held(layer, w)).collect();
        let mut space = self.space();
        let pending = match hot_local.is_empty() {
            true => None,
            false => Some(
                self.ctx
                    .submit_products(&mut space, &held, Some(&hot_local), x, n)?,
            ),
        };
        let cold_rows: Vec<u32> = cold_pos.iter().map(|&k| rows[k]).collect();
        let mut cold = Vec::with_capacity(whiches.len());
        for &which in whiches {
            let mut y = vec![0f32; n * cold_rows.len()];
            if !cold_rows.is_empty() {
                let w = ffn_weight(model, il, which)?;
                cpu::gather_matmul(&model.matrix(w), &cold_rows, x, n, &mut y)?;
            }
            cold.push(y);
        }
        let hot = match pending {
            Some(p) => p.wait(&self.ctx)?,
            None => Vec::new(),
        };
        drop(space);
        let (m, h) = (rows.len(), n * hot_pos.len());
        let merged = cold
            .iter()
            .enumerate()
            .map(|(i, cold)| {
                let hot = hot.get(i * h..(i + 1) * h).unwrap_or(&[]);
                let mut y = vec![0f32; n * m];
                for t in 0..n {
                    let row = &mut y[t * m..(t + 1) * m];
                    for (j, &k) in hot_pos.iter().enumerate() {
                        row[k] = hot[t * hot_pos.len() + j];
                    }
                    for (j, &k) in cold_pos.iter().enumerate() {
                        row[k] = cold[t * cold_pos.len() + j];
                    }
                }
                y
            })
            .collect();
        Ok(merged)
    }

    /// The reused buffers (a poisoned lock still holds usable buffers).
    fn space(&self) -> MutexGuard<'_, Workspace> {
        self.space.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// All held rows of `w` times `x`, with the reused buffers.
    fn matvec(&self, w: &GpuMatrix, x: &[f32], n: usize) -> Result<Vec<f32>> {
        let mut space = self.space();
        self.ctx
            .submit_products(&mut space, &[w], None, x, n)?
            .wait(&self.ctx)
    }

    /// Gate or up on the GPU.
    fn held(layer: &GpuLayer, which: FfnTensor) -> &GpuMatrix {
        match which {
            FfnTensor::Gate => &layer.gate,
            _ => &layer.up,
        }
    }
}

impl FfnOffload for GpuFfn {
    fn matmul(
        &self,
        model: &Model,
        il: usize,
        which: FfnTensor,
        x: &[f32],
        n: usize,
    ) -> Result<Vec<f32>> {
        let Some(layer) = &self.layers[il] else {
            return CpuFfn.matmul(model, il, which, x, n);
        };
        match which {
            FfnTensor::Down => match &layer.down {
                Some(down) => self.matvec(down, x, n),
                None => CpuFfn.matmul(model, il, which, x, n),
            },
            _ if layer.hot.len() == model.hp.n_ff => self.matvec(Self::held(layer, which), x, n),
            _ => self.gather(model, il, which, &self.all_rows, x, n),
        }
    }

    fn gather(
        &self,
        model: &Model,
        il: usize,
        which: FfnTensor,
        rows: &[u32],
        x: &[f32],
        n: usize,
    ) -> Result<Vec<f32>> {
        match &self.layers[il] {
            None => CpuFfn.gather(model, il, which, rows, x, n),
            Some(layer) => Ok(self
                .split_gather(model, il, layer, &[which], rows, x, n)?
                .remove(0)),
        }
    }

    fn gather_gate_up(
        &self,
        model: &Model,
        il: usize,
        rows: &[u32],
        x: &[f32],
        n: usize,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let Some(layer) = &self.layers[il] else {
            return CpuFfn.gather_gate_up(model, il, rows, x, n);
        };
        let both = [FfnTensor::Gate, FfnTensor::Up];
        let mut out = self.split_gather(model, il, layer, &both, rows, x, n)?;
        let up = out.pop().expect("two products");
        let gate = out.pop().expect("two products");
        Ok((gate, up))
    }

    fn down_axpy(&self, model: &Model, il: usize, a: &[f32], n: usize) -> Result<Vec<f32>> {
        let layer = match &self.layers[il] {
            Some(l) if l.down_t.is_some() => l,
            _ => return CpuFfn.down_axpy(model, il, a, n),
        };
        let n_ff = model.hp.n_ff;
        let h = layer.hot.len();
        let mut coeffs = vec![0f32; n * h];
        let mut cold = a.to_vec();
        for t in 0..n {
            for (k, &i) in layer.hot.iter().enumerate() {
                let idx = t * n_ff + i as usize;
                coeffs[t * h + k] = a[idx];
                cold[idx] = 0.0;
            }
        }
        let mut space = self.space();
        let pending = if coeffs.iter().any(|&c| c != 0.0) {
            let w = layer.down_t.as_ref().expect("checked above");
            let all = &self.all_rows[..h];
            Some(
                self.ctx
                    .submit_sparse_axpy_in(&mut space, w, all, &coeffs, n)?,
            )
        } else {
            None
        };
        let mut out = vec![0f32; n * model.hp.n_embd];
        if cold.iter().any(|&c| c != 0.0) {
            cpu::sparse_axpy(&down_t(model, il)?, &cold, n, &mut out)?;
        }
        if let Some(p) = pending {
            let gpu = p.wait(&self.ctx)?;
            out.iter_mut().zip(&gpu).for_each(|(o, g)| *o += g);
        }
        Ok(out)
    }
}
