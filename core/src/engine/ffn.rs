//! The feed-forward step, dense or neuron-sparse.
//!
//! A neuron `i` is row `i` of gate and up and row `i` of `ffn_down_t`. The sparse modes choose a set
//! of neurons per token, compute gate/up only for the union of those sets (gather-matmul, each row
//! read once for the batch), zero the neurons a token did not choose, and add only the non-zero
//! neurons' down rows (sparse axpy). With a ReLU activation the oracle set is exactly the set of
//! non-zero neurons, so `Oracle` equals `Dense` up to float summation order.

use super::offload::{FfnOffload, FfnTensor};
use crate::cpu;
use crate::model::{FfnActivation, LayerWeights, Model, Predictor, Weight};
use crate::{Error, Result};

/// How the FFN chooses its neurons.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnMode {
    /// Every neuron.
    Dense,
    /// The neurons PowerInfer's predictor selects (from the residual stream before the FFN norm).
    Sparse,
    /// The neurons that really fire: gate computed densely, the rest sparsely.
    Oracle,
    /// Training-free sparsity (CATS): gate computed densely, neurons whose gate activation is
    /// smaller in magnitude than the layer's calibrated threshold skipped in up and down.
    Cats,
}

/// Neurons computed per layer, summed over the tokens seen, and the neurons whose weights a forward
/// step read (the union of its tokens' sets, each read once for the batch), summed over the steps.
#[derive(Clone, Debug, Default)]
pub struct FfnDensity {
    computed: Vec<u64>,
    tokens: Vec<u64>,
    read: Vec<u64>,
    steps: Vec<u64>,
    n_ff: usize,
}

impl FfnDensity {
    pub(super) fn new(n_layer: usize, n_ff: usize) -> FfnDensity {
        FfnDensity {
            computed: vec![0; n_layer],
            tokens: vec![0; n_layer],
            read: vec![0; n_layer],
            steps: vec![0; n_layer],
            n_ff,
        }
    }

    /// One step of layer `il`: `computed` (token, neuron) pairs over `tokens` tokens, whose union
    /// holds `union` neurons.
    fn record(&mut self, il: usize, computed: usize, union: usize, tokens: usize) {
        self.computed[il] += computed as u64;
        self.tokens[il] += tokens as u64;
        self.read[il] += union as u64;
        self.steps[il] += 1;
    }

    /// Fraction of the FFN neurons whose weights a forward step reads (the union of its tokens'
    /// sets), per layer, averaged over the steps. With one token per step it equals
    /// [`FfnDensity::per_layer`]; for a batch it bounds how much batching saves: a step of `n`
    /// tokens reads `union / density` neurons' weights where `n` lone steps read `n`.
    pub fn union_per_layer(&self) -> Vec<f64> {
        ratio(&self.read, &self.steps, self.n_ff)
    }

    /// Mean over the layers of [`FfnDensity::union_per_layer`].
    pub fn union_mean(&self) -> f64 {
        mean(&self.union_per_layer())
    }

    /// Fraction of the FFN neurons computed per token, per layer (1 for dense).
    pub fn per_layer(&self) -> Vec<f64> {
        ratio(&self.computed, &self.tokens, self.n_ff)
    }

    /// Mean over the layers of [`FfnDensity::per_layer`].
    pub fn mean(&self) -> f64 {
        mean(&self.per_layer())
    }

    /// Bytes of weights one decoded token reads on average with the FFN in `mode` at these
    /// densities: every layer's attention matrices and the LM head; for the FFN, every matrix in
    /// `Dense`, the predictor and each computed neuron's gate and up rows and down column in
    /// `Sparse`, the whole decider (gate, or up without gate) and the computed neurons' other rows
    /// in `Oracle` and `Cats`. The token embedding row is negligible and not counted.
    pub fn weight_bytes_per_token(&self, model: &Model, mode: FfnMode) -> u64 {
        let density = self.per_layer();
        let ffn: f64 = model
            .layers
            .iter()
            .enumerate()
            .map(|(il, l)| {
                let all = [l.gate.as_ref(), Some(&l.up), Some(l.down_weight())];
                let chosen = density.get(il).copied().unwrap_or(1.0) * model.hp.n_ff as f64;
                let neuron = super::offload::neuron_bytes(model, il) as f64;
                match mode {
                    FfnMode::Dense => {
                        all.into_iter().flatten().map(Weight::n_bytes).sum::<u64>() as f64
                    }
                    FfnMode::Sparse => {
                        let predictor = l
                            .predictor
                            .as_ref()
                            .map_or(0, |p| p.fc1.n_bytes() + p.fc2.n_bytes());
                        predictor as f64 + chosen * neuron
                    }
                    FfnMode::Oracle | FfnMode::Cats => {
                        let decider = l.decider();
                        let row = decider.n_bytes() as f64 / decider.rows.max(1) as f64;
                        decider.n_bytes() as f64 + chosen * (neuron - row)
                    }
                }
            })
            .sum();
        let attention: u64 = model
            .layers
            .iter()
            .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo])
            .map(Weight::n_bytes)
            .sum();
        attention + model.output.n_bytes() + ffn.round() as u64
    }
}

/// `num[l] / (den[l] · n_ff)` per layer (0 where `den[l]` is 0).
fn ratio(num: &[u64], den: &[u64], n_ff: usize) -> Vec<f64> {
    num.iter()
        .zip(den)
        .map(|(&c, &t)| {
            if t == 0 {
                0.0
            } else {
                c as f64 / (t as f64 * n_ff as f64)
            }
        })
        .collect()
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// Neurons in the union of `sets` (each below `n_ff`).
fn union_len(sets: &[Vec<u32>], n_ff: usize) -> usize {
    if let [only] = sets {
        return only.len();
    }
    let mut bits = vec![0u64; n_ff.div_ceil(64)];
    for &i in sets.iter().flatten() {
        bits[i as usize / 64] |= 1 << (i % 64);
    }
    bits.iter().map(|b| b.count_ones() as usize).sum()
}

/// What an [`FfnObserver`] sees of one layer and batch.
pub struct FfnTrace<'a> {
    /// The layer.
    pub layer: usize,
    /// The residual stream entering the FFN, before its norm (`n × n_embd`).
    pub input: &'a [f32],
    /// The gate pre-activations (`n × n_ff`; up's, with its bias, in an FFN without gate), in the
    /// modes that compute them densely.
    pub gate: Option<&'a [f32]>,
    /// The FFN activations (`n × n_ff`, zero for skipped neurons).
    pub activations: &'a [f32],
}

/// Sees every layer's FFN trace: how `calibrate` records statistics.
pub type FfnObserver = Box<dyn FnMut(&FfnTrace) + Send + Sync>;

/// The FFN of layer `il` for `n` tokens: `x` is the residual stream entering the FFN (the
/// predictor's input), `h` the same after the FFN norm. Returns `n × n_embd`. The matrix products
/// run where `offload` puts them.
#[allow(clippy::too_many_arguments)]
pub(super) fn feed_forward(
    model: &Model,
    offload: &dyn FfnOffload,
    mode: FfnMode,
    il: usize,
    x: &[f32],
    h: &[f32],
    n: usize,
    density: &mut FfnDensity,
    observer: Option<&mut FfnObserver>,
) -> Result<Vec<f32>> {
    let layer = &model.layers[il];
    let act = model.hp.ffn_act;
    let n_ff = model.hp.n_ff;
    // the FFN's output, where the fused path already summed it
    let mut fused_out = None;
    let (mut a, gate) = match mode {
        FfnMode::Dense => {
            let (decider, up) = match &layer.gate {
                Some(_) => {
                    let (gate, up) = rayon::join(
                        || offload.matmul(model, il, FfnTensor::Gate, h, n),
                        || offload.matmul(model, il, FfnTensor::Up, h, n),
                    );
                    (gate?, Some(up?))
                }
                None => (decider_dense(model, offload, il, h, n)?, None),
            };
            let a = match up {
                Some(up) => decider
                    .iter()
                    .zip(&up)
                    .map(|(&g, &u)| act.combine(g, u))
                    .collect(),
                None => decider.iter().map(|&u| act.gate(u)).collect(),
            };
            density.record(il, n * n_ff, n_ff, n);
            (a, Some(decider))
        }
        FfnMode::Oracle | FfnMode::Cats => {
            let gate = decider_dense(model, offload, il, h, n)?;
            let threshold = match mode {
                FfnMode::Cats => cats_threshold(model, il)?,
                _ => 0.0,
            };
            let keep = |v: f32| match mode {
                FfnMode::Cats => act.gate(v).abs() >= threshold,
                _ => !act.is_relu() || v > 0.0,
            };
            let chosen: Vec<Vec<u32>> = gate.chunks_exact(n_ff).map(|g| select(g, keep)).collect();
            let a = sparse_activations(model, offload, h, n, &chosen, Some(&gate), il, density)?;
            (a, Some(gate))
        }
        FfnMode::Sparse => {
            let predictor = layer.predictor.as_ref().ok_or_else(|| Error::Tensor {
                tensor: format!("blk.{il}.fc1.weight"),
                message: "the file has no predictor for this layer (use --ffn oracle or dense)"
                    .into(),
            })?;
            match fused_sparse(model, offload, predictor, il, x, h, n, &observer)? {
                Some(FusedFfn { a, chosen, out }) => {
                    density.record(il, chosen, chosen, n);
                    fused_out = Some(out);
                    (a, None)
                }
                None => {
                    let logits = predict(model, predictor, x, n)?;
                    let threshold = model.hp.sparse_thresholds[il];
                    let chosen: Vec<Vec<u32>> = logits
                        .chunks_exact(n_ff)
                        .map(|p| select(p, |v| v >= threshold))
                        .collect();
                    let a = sparse_activations(model, offload, h, n, &chosen, None, il, density)?;
                    (a, None)
                }
            }
        }
    };
    if let Some(observe) = observer {
        observe(&FfnTrace {
            layer: il,
            input: x,
            gate: gate.as_deref(),
            activations: &a,
        });
    }
    let mut out = match fused_out {
        Some(out) => out,
        None => down_projection(model, offload, il, &mut a, n)?,
    };
    if let Some(b) = &layer.down_b {
        out.chunks_exact_mut(b.len())
            .for_each(|row| cpu::ops::add_assign(row, b));
    }
    Ok(out)
}

/// What [`fused_sparse`] computed.
struct FusedFfn {
    /// The activations, rounded for the down projection.
    a: Vec<f32>,
    /// The number of chosen neurons.
    chosen: usize,
    /// The FFN's output (before a down bias).
    out: Vec<f32>,
}

/// One token's predicted FFN in one parallel region ([`cpu::sparse_ffn`]); `None` where that path does not apply (a batch, products off the CPU, an FFN
/// without gate or with an up bias, no neuron-major down, an observer that wants the unrounded
/// activations).
#[allow(clippy::too_many_arguments)]
fn fused_sparse(
    model: &Model,
    offload: &dyn FfnOffload,
    predictor: &Predictor,
    il: usize,
    x: &[f32],
    h: &[f32],
    n: usize,
    observer: &Option<&mut FfnObserver>,
) -> Result<Option<FusedFfn>> {
    let layer = &model.layers[il];
    let (Some(gate), Some(down_t)) = (&layer.gate, &layer.down_t) else {
        return Ok(None);
    };
    if n != 1 || !offload.all_on_cpu() || layer.up_b.is_some() || observer.is_some() {
        return Ok(None);
    }
    let weights = cpu::sparse_ffn::PredictedFfn {
        fc1: model.matrix(&predictor.fc1),
        fc2: model.matrix(&predictor.fc2),
        fc1_interleaved: model.interleaved(&predictor.fc1),
        fc2_interleaved: model.interleaved(&predictor.fc2),
        hot: layer.hot.as_ref().map(|h| (&h.gate, &h.up)),
        gate: model.matrix(gate),
        up: model.matrix(&layer.up),
        threshold: model.hp.sparse_thresholds[il],
        gate_decides: model.hp.ffn_act.gate_decides(),
        down_ty: down_t.ty,
    };
    let act = model.hp.ffn_act;
    let mut a = vec![0f32; model.hp.n_ff];
    let mut out = vec![0f32; down_t.cols];
    let down = (&model.matrix(down_t), &mut out[..]);
    let combine = |g, u| act.combine(g, u);
    let chosen =
        cpu::sparse_ffn::predicted_activations(&weights, combine, x, h, &mut a, Some(down))?;
    Ok(Some(FusedFfn { a, chosen, out }))
}

/// The pre-activations that decide which neurons fire, for every neuron: the gate's, or in an FFN
/// without gate up's with its bias.
fn decider_dense(
    model: &Model,
    offload: &dyn FfnOffload,
    il: usize,
    h: &[f32],
    n: usize,
) -> Result<Vec<f32>> {
    let layer = &model.layers[il];
    let which = match layer.gate {
        Some(_) => FfnTensor::Gate,
        None => FfnTensor::Up,
    };
    let mut y = offload.matmul(model, il, which, h, n)?;
    if let (None, Some(b)) = (&layer.gate, &layer.up_b) {
        y.chunks_exact_mut(b.len())
            .for_each(|row| cpu::ops::add_assign(row, b));
    }
    Ok(y)
}

/// Layer `il`'s CATS threshold (a file without them is rejected when the mode is chosen).
fn cats_threshold(model: &Model, il: usize) -> Result<f32> {
    model
        .hp
        .cats_thresholds
        .as_ref()
        .map(|t| t[il])
        .ok_or_else(|| Error::InvalidArgument(CATS_NEEDS_THRESHOLDS.into()))
}

/// The error for `--ffn cats` on a file without calibrated thresholds.
pub(super) const CATS_NEEDS_THRESHOLDS: &str =
    "--ffn cats needs thresholds from `hotcold calibrate --target-sparsity` (hotcold.cats.thresholds)";

/// PowerInfer's predictor logits `fc2 · relu(fc1 · x)`, `n × n_ff`.
fn predict(model: &Model, p: &Predictor, x: &[f32], n: usize) -> Result<Vec<f32>> {
    let mut hidden = matmul(model, &p.fc1, x, n)?;
    hidden.iter_mut().for_each(|v| *v = v.max(0.0));
    matmul(model, &p.fc2, &hidden, n)
}

/// Indices of the entries of `row` that pass `keep`.
fn select(row: &[f32], keep: impl Fn(f32) -> bool) -> Vec<u32> {
    row.iter()
        .enumerate()
        .filter(|&(_, &v)| keep(v))
        .map(|(i, _)| i as u32)
        .collect()
}

/// The FFN activations (`n × n_ff`, zero outside each token's chosen set), computing gate (unless
/// given densely) and up only for each token's chosen neurons.
#[allow(clippy::too_many_arguments)]
fn sparse_activations(
    model: &Model,
    offload: &dyn FfnOffload,
    h: &[f32],
    n: usize,
    chosen: &[Vec<u32>],
    dense_gate: Option<&[f32]>,
    il: usize,
    density: &mut FfnDensity,
) -> Result<Vec<f32>> {
    let n_ff = model.hp.n_ff;
    let layer = &model.layers[il];
    let act: FfnActivation = model.hp.ffn_act;
    let gated = layer.gate.is_some();
    // The pre-activations of each token's chosen neurons, packed token after token. An FFN
    // without gate decides with up (with its bias), which `dense_gate` then already holds.
    let (gate, mut up) = match (gated, dense_gate) {
        (true, None) => {
            let (gate, up) = offload.gather_gate_up_sets(model, il, chosen, h)?;
            (Some(gate), Some(up))
        }
        (true, Some(_)) | (false, None) => (
            None,
            Some(offload.gather_sets(model, il, FfnTensor::Up, chosen, h)?),
        ),
        (false, Some(_)) => (None, None),
    };
    if let Some(up) = &mut up {
        add_up_bias(layer, chosen, up);
    }
    let mut a = vec![0f32; n * n_ff];
    let mut off = 0;
    for (t, set) in chosen.iter().enumerate() {
        for (k, &i) in set.iter().enumerate() {
            let (i, p) = (t * n_ff + i as usize, off + k);
            let pick = |gathered: &Option<Vec<f32>>| match (gathered, dense_gate) {
                (Some(g), _) => g[p],
                (None, Some(dense)) => dense[i],
                (None, None) => unreachable!("computed densely when not gathered"),
            };
            a[i] = if gated {
                let up = up.as_ref().expect("a gated FFN gathers up");
                act.combine(pick(&gate), up[p])
            } else {
                act.gate(pick(&up))
            };
        }
        off += set.len();
    }
    density.record(
        il,
        chosen.iter().map(Vec::len).sum(),
        union_len(chosen, n_ff),
        n,
    );
    Ok(a)
}

/// Adds up's bias to its gathered pre-activations `y` of each token's neurons `sets[t]`, packed
/// token after token.
fn add_up_bias(layer: &LayerWeights, sets: &[Vec<u32>], y: &mut [f32]) {
    if let Some(b) = &layer.up_b {
        y.iter_mut()
            .zip(sets.iter().flatten())
            .for_each(|(v, &i)| *v += b[i as usize]);
    }
}

/// `down · a` for `n` tokens: the sparse axpy over the neuron-major copy when the file has one
/// (skipping zero activations), else the dense matmul. The axpy's coefficients are first rounded as
/// ggml rounds a product's input for the down weights' type (Q8_0 for Q4_0, f16 for F16), as
/// ggml's dense product and PowerInfer's sparse kernels both do.
fn down_projection(
    model: &Model,
    offload: &dyn FfnOffload,
    il: usize,
    a: &mut [f32],
    n: usize,
) -> Result<Vec<f32>> {
    match &model.layers[il].down_t {
        Some(down_t) => {
            cpu::round_like_matmul_input(down_t.ty, a, n, model.hp.n_ff)?;
            offload.down_axpy(model, il, a, n)
        }
        None => offload.matmul(model, il, FfnTensor::Down, a, n),
    }
}

fn matmul(model: &Model, w: &Weight, x: &[f32], n: usize) -> Result<Vec<f32>> {
    model.matmul(w, x, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_keeps_passing_entries() {
        assert_eq!(select(&[0.5, -1.0, 0.0, 2.0], |v| v > 0.0), vec![0, 3]);
    }

    #[test]
    fn bytes_read_count_only_the_computed_neurons() {
        use std::sync::Arc;
        let cfg = crate::synth::SynthConfig::preset("tiny").unwrap();
        let (writer, _) = crate::synth::build(&cfg).unwrap();
        let file = crate::gguf::GgufFile::from_bytes(writer.to_bytes().unwrap()).unwrap();
        let model = Model::from_file(Arc::new(file)).unwrap();
        let (n_layer, n_ff) = (model.hp.n_layer, model.hp.n_ff);
        let mut d = FfnDensity::new(n_layer, n_ff);
        for il in 0..n_layer {
            d.record(il, n_ff / 4, n_ff / 4, 1);
        }
        let fixed: u64 = model
            .layers
            .iter()
            .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo])
            .map(Weight::n_bytes)
            .sum::<u64>()
            + model.output.n_bytes();
        let mut sparse = fixed;
        let mut oracle = fixed;
        for (il, l) in model.layers.iter().enumerate() {
            let p = l.predictor.as_ref().unwrap();
            let neuron = crate::engine::neuron_bytes(&model, il);
            let gate = l.gate.as_ref().unwrap();
            let gate_row = gate.n_bytes() / n_ff as u64;
            sparse += p.fc1.n_bytes() + p.fc2.n_bytes() + neuron * (n_ff / 4) as u64;
            oracle += gate.n_bytes() + (neuron - gate_row) * (n_ff / 4) as u64;
        }
        assert_eq!(d.weight_bytes_per_token(&model, FfnMode::Sparse), sparse);
        assert_eq!(d.weight_bytes_per_token(&model, FfnMode::Oracle), oracle);
        // dense reads every weight matrix, whatever the density says
        assert_eq!(
            d.weight_bytes_per_token(&model, FfnMode::Dense),
            model.bytes_per_token()
        );
        assert!(sparse < model.bytes_per_token());
    }

    #[test]
    fn density_averages_over_tokens_and_layers() {
        let mut d = FfnDensity::new(2, 10);
        d.record(0, 3, 3, 1);
        d.record(0, 1, 1, 1);
        d.record(1, 10, 10, 1);
        assert_eq!(d.per_layer(), vec![0.2, 1.0]);
        assert!((d.mean() - 0.6).abs() < 1e-12);
        assert_eq!(d.union_per_layer(), d.per_layer());
        // a step of two tokens choosing 3 and 4 neurons of which 2 are shared reads 5
        d.record(1, 7, 5, 2);
        assert_eq!(d.per_layer(), vec![0.2, 17.0 / 30.0]);
        assert_eq!(d.union_per_layer(), vec![0.2, 15.0 / 20.0]);
    }

    #[test]
    fn union_counts_each_neuron_once() {
        assert_eq!(union_len(&[vec![1, 5], vec![0, 5, 7]], 8), 4);
        assert_eq!(union_len(&[vec![2, 3, 4]], 8), 3);
        assert_eq!(union_len(&[vec![], vec![]], 8), 0);
        assert_eq!(union_len(&[vec![0, 64, 129], vec![129, 1]], 130), 4);
    }
}
