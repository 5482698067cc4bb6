//! Where the FFN's matrix products run. The forward pass calls an [`FfnOffload`] for every FFN
//! product (no device branches in the pass itself); [`CpuFfn`] runs them all on the CPU, and
//! `GpuFfn` (feature `gpu`) runs each layer's hot neurons on the GPU while the CPU computes the
//! cold ones.
//!
//! [`hot_neurons`] chooses the hot set for a VRAM budget with a simple rule; the placement
//! planner replaces it (it returns the same shape: per layer, the sorted hot neuron ids).

use crate::cpu::{self, Matrix};
use crate::model::{LayerWeights, Model, Weight};
use crate::placement;
use crate::Result;

/// One of a layer's FFN matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnTensor {
    /// `ffn_gate` (`n_ff × n_embd`).
    Gate,
    /// `ffn_up` (`n_ff × n_embd`).
    Up,
    /// `ffn_down` (`n_embd × n_ff`, row-major).
    Down,
}

impl FfnTensor {
    /// The tensor's weight in `layer` (`None`: a `Down` the file only has neuron-major, or the
    /// `Gate` of a gateless FFN).
    pub fn weight(self, layer: &LayerWeights) -> Option<&Weight> {
        match self {
            FfnTensor::Gate => layer.gate.as_ref(),
            FfnTensor::Up => Some(&layer.up),
            FfnTensor::Down => layer.down.as_ref(),
        }
    }
}

/// Runs the FFN's matrix products of one layer for `n` token rows.
pub trait FfnOffload: Send + Sync {
    /// `W · x` over every row of the layer's `which` (`n × rows`), as `cpu::matmul` computes it.
    fn matmul(
        &self,
        model: &Model,
        il: usize,
        which: FfnTensor,
        x: &[f32],
        n: usize,
    ) -> Result<Vec<f32>>;

    /// The sorted rows `rows` of gate or up times `x` (`n × rows.len()`), as
    /// `cpu::gather_matmul` computes them. By default on the CPU ([`CpuFfn`]).
    fn gather(
        &self,
        model: &Model,
        il: usize,
        which: FfnTensor,
        rows: &[u32],
        x: &[f32],
        n: usize,
    ) -> Result<Vec<f32>> {
        CpuFfn.gather(model, il, which, rows, x, n)
    }

    /// [`FfnOffload::gather`] of gate and of up over the same rows: `(gate, up)`.
    fn gather_gate_up(
        &self,
        model: &Model,
        il: usize,
        rows: &[u32],
        x: &[f32],
        n: usize,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let gate = self.gather(model, il, FfnTensor::Gate, rows, x, n)?;
        let up = self.gather(model, il, FfnTensor::Up, rows, x, n)?;
        Ok((gate, up))
    }

    /// Gate or up rows of each token's sorted set `sets[t]` times that token's row of `x`, packed
    /// token after token (`Σ |sets[t]|` values), as [`crate::cpu::sparse::gather_matmul_sets`]
    /// computes them. By default: [`FfnOffload::gather`] over the union of the sets, repacked.
    fn gather_sets(
        &self,
        model: &Model,
        il: usize,
        which: FfnTensor,
        sets: &[Vec<u32>],
        x: &[f32],
    ) -> Result<Vec<f32>> {
        let union = union_of(sets, model.hp.n_ff);
        let gathered = self.gather(model, il, which, &union, x, sets.len())?;
        Ok(pack_sets(&gathered, &union, sets))
    }

    /// [`FfnOffload::gather_sets`] of gate and of up: `(gate, up)`. By default:
    /// [`FfnOffload::gather_gate_up`] over the union of the sets, repacked.
    fn gather_gate_up_sets(
        &self,
        model: &Model,
        il: usize,
        sets: &[Vec<u32>],
        x: &[f32],
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let union = union_of(sets, model.hp.n_ff);
        let (gate, up) = self.gather_gate_up(model, il, &union, x, sets.len())?;
        Ok((pack_sets(&gate, &union, sets), pack_sets(&up, &union, sets)))
    }

    /// The down projection over the neuron-major `ffn_down_t` with coefficients `a`
    /// (`n × n_ff`, already rounded as `cpu::matmul` rounds its input), `n × n_embd`.
    fn down_axpy(&self, model: &Model, il: usize, a: &[f32], n: usize) -> Result<Vec<f32>>;

    /// Whether every product runs on the CPU as `cpu` computes it, so that the forward pass may
    /// call the fused CPU operators ([`crate::cpu::sparse_ffn`]) instead. By default: no.
    fn all_on_cpu(&self) -> bool {
        false
    }
}

/// The sorted union of the per-token sorted index sets.
fn union_of(sets: &[Vec<u32>], n_ff: usize) -> Vec<u32> {
    if let [only] = sets {
        return only.clone();
    }
    let mut mark = vec![false; n_ff];
    for &i in sets.iter().flatten() {
        mark[i as usize] = true;
    }
    (0..n_ff as u32).filter(|&i| mark[i as usize]).collect()
}

/// From `gathered` (`sets.len() × union.len()`, token-major), each token's values of its own
/// set, packed token after token.
fn pack_sets(gathered: &[f32], union: &[u32], sets: &[Vec<u32>]) -> Vec<f32> {
    let m = union.len();
    let mut out = Vec::with_capacity(sets.iter().map(Vec::len).sum());
    for (t, set) in sets.iter().enumerate() {
        // both are sorted: walk them together
        let mut k = 0;
        for &i in set {
            while union[k] != i {
                k += 1;
            }
            out.push(gathered[t * m + k]);
        }
    }
    out
}

/// Every FFN product on the CPU.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuFfn;

/// The layer's `which` weight, or an error naming it.
pub(crate) fn ffn_weight(model: &Model, il: usize, which: FfnTensor) -> Result<&Weight> {
    which.weight(&model.layers[il]).ok_or_else(|| match which {
        FfnTensor::Gate => crate::Error::Tensor {
            tensor: format!("blk.{il}.ffn_gate.weight"),
            message: "this FFN has no gate".into(),
        },
        _ => crate::Error::Tensor {
            tensor: format!("blk.{il}.ffn_down.weight"),
            message: "the file has only the neuron-major ffn_down_t".into(),
        },
    })
}

/// The layer's neuron-major down projection, or an error naming it.
pub(crate) fn down_t(model: &Model, il: usize) -> Result<Matrix<'_>> {
    let w = model.layers[il]
        .down_t
        .as_ref()
        .ok_or_else(|| crate::Error::Tensor {
            tensor: format!("blk.{il}.ffn_down_t.weight"),
            message: "the sparse down projection needs the neuron-major copy".into(),
        })?;
    Ok(model.matrix(w))
}

impl FfnOffload for CpuFfn {
    fn matmul(
        &self,
        model: &Model,
        il: usize,
        which: FfnTensor,
        x: &[f32],
        n: usize,
    ) -> Result<Vec<f32>> {
        model.matmul(ffn_weight(model, il, which)?, x, n)
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
        let w = ffn_weight(model, il, which)?;
        let mut y = vec![0f32; n * rows.len()];
        cpu::gather_matmul(&model.matrix(w), rows, x, n, &mut y)?;
        Ok(y)
    }

    fn gather_sets(
        &self,
        model: &Model,
        il: usize,
        which: FfnTensor,
        sets: &[Vec<u32>],
        x: &[f32],
    ) -> Result<Vec<f32>> {
        let w = ffn_weight(model, il, which)?;
        let mut y = vec![0f32; sets.iter().map(Vec::len).sum()];
        cpu::sparse::gather_matmul_sets(&model.matrix(w), sets, x, &mut y)?;
        Ok(y)
    }

    fn gather_gate_up_sets(
        &self,
        model: &Model,
        il: usize,
        sets: &[Vec<u32>],
        x: &[f32],
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let gate = model.matrix(ffn_weight(model, il, FfnTensor::Gate)?);
        let up = model.matrix(ffn_weight(model, il, FfnTensor::Up)?);
        let pairs = sets.iter().map(Vec::len).sum();
        let (mut g, mut u) = (vec![0f32; pairs], vec![0f32; pairs]);
        cpu::sparse::gather_matmul_sets_multi(&[gate, up], sets, x, &mut [&mut g, &mut u])?;
        Ok((g, u))
    }

    fn down_axpy(&self, model: &Model, il: usize, a: &[f32], n: usize) -> Result<Vec<f32>> {
        let mut out = vec![0f32; n * model.hp.n_embd];
        cpu::sparse_axpy(&down_t(model, il)?, a, n, &mut out)?;
        Ok(out)
    }

    fn all_on_cpu(&self) -> bool {
        true
    }
}

/// The hot set a PowerInfer GPU index (`<model>.generated.gpuidx`, [`placement::gpuidx`]) gives
/// `model`, when it can be used under `budget` bytes of FFN weights: one list per layer of
/// `n_ff` neurons, hot neurons only in layers `usable(il)` accepts, a layer without `ffn_down_t`
/// all hot or all cold, and at most `budget` bytes of FFN weights in all ([`neuron_bytes`]).
///
/// Errors: a sentence saying why the index cannot be used (the caller falls back to
/// [`hot_neurons`]).
pub fn hot_from_index(
    model: &Model,
    index: &placement::gpuidx::GpuIndex,
    budget: u64,
    usable: impl Fn(usize) -> bool,
) -> std::result::Result<Vec<Vec<u32>>, String> {
    let (n_layer, n_ff) = (model.hp.n_layer, model.hp.n_ff);
    index.validate().map_err(|e| e.to_string())?;
    if index.hot.len() != n_layer {
        return Err(format!(
            "it has {} layers, the model {n_layer}",
            index.hot.len()
        ));
    }
    let mut bytes = 0u64;
    for (il, (hot, &n)) in index.hot.iter().zip(&index.n_neurons).enumerate() {
        if n != n_ff {
            return Err(format!("layer {il} has {n} neurons, the model's {n_ff}"));
        }
        if hot.is_empty() {
            continue;
        }
        if !usable(il) {
            return Err(format!("layer {il}'s FFN cannot run on the GPU"));
        }
        if model.layers[il].down_t.is_none() && hot.len() != n_ff {
            return Err(format!(
                "layer {il} has a row-major ffn_down: its neurons must be all hot or all cold"
            ));
        }
        bytes += neuron_bytes(model, il) * hot.len() as u64;
    }
    if bytes > budget {
        return Err(format!(
            "its hot neurons take {bytes} bytes, over the budget of {budget}"
        ));
    }
    Ok(index.hot.clone())
}

/// Bytes one neuron of layer `il` takes on the GPU: its gate and up rows, and its down column
/// (its `ffn_down_t` row, or its share of `ffn_down`).
pub fn neuron_bytes(model: &Model, il: usize) -> u64 {
    let l = &model.layers[il];
    let row = |w: &Weight| (w.cols / w.ty.block_size() * w.ty.block_bytes()) as u64;
    let down = match (&l.down_t, &l.down) {
        (Some(t), _) => row(t),
        (None, Some(d)) => d.rows as u64 * row(d) / d.cols.max(1) as u64,
        (None, None) => 0,
    };
    l.gate.as_ref().map_or(0, row) + row(&l.up) + down
}

/// Bytes of every layer's FFN weights (what "all on the GPU" means for a budget).
pub fn ffn_bytes(model: &Model) -> u64 {
    (0..model.hp.n_layer)
        .map(|il| neuron_bytes(model, il) * model.hp.n_ff as u64)
        .sum()
}

/// The hot neurons of each layer (sorted ids) for a GPU budget in bytes:
/// - a model whose every layer has `ffn_down_t` (neuron-sparse): the placement planner's optimal
///   plan over the FFN neurons ([`crate::placement::solve`] with only the neurons to place, as the
///   hybrid pass offloads only the FFN), with the firing frequencies of
///   [`crate::placement::stats::frequencies`] (calibrated, or a synthetic file's targets); without
///   statistics every neuron counts the same;
/// - otherwise (dense down, which a layer cannot split): whole layers, first to last, while they fit.
///
/// `usable(il)` says whether layer `il` can run on the GPU at all (its weight types).
///
/// Errors: those of the planner.
pub fn hot_neurons(
    model: &Model,
    budget: u64,
    usable: impl Fn(usize) -> bool,
) -> Result<Vec<Vec<u32>>> {
    let (n_layer, n_ff) = (model.hp.n_layer, model.hp.n_ff);
    if model.layers.iter().all(|l| l.down_t.is_some()) {
        let frequencies = placement::stats::frequencies(model.file())
            .map(|(f, _)| f)
            .unwrap_or_else(|_| vec![vec![1.0; n_ff]; n_layer]);
        let layers = frequencies
            .into_iter()
            .enumerate()
            .map(|(il, f)| placement::Layer {
                neuron_bytes: neuron_bytes(model, il),
                // a layer the GPU cannot run is worth nothing there
                frequencies: if usable(il) { f } else { vec![0.0; f.len()] },
                dense_bytes: 0,
            })
            .collect();
        let problem = placement::Problem {
            layers,
            globals: Vec::new(),
            budget,
        };
        let mut hot = placement::solve(&problem)?.hot;
        for (il, h) in hot.iter_mut().enumerate() {
            if !usable(il) {
                h.clear();
            }
        }
        return Ok(hot);
    }
    let mut hot = vec![Vec::new(); n_layer];
    let mut left = budget;
    for (il, h) in hot.iter_mut().enumerate() {
        let cost = neuron_bytes(model, il) * n_ff as u64;
        if !usable(il) || cost > left {
            break;
        }
        left -= cost;
        *h = (0..n_ff as u32).collect();
    }
    Ok(hot)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::gguf::{GgufFile, MetaArray, MetaValue};
    use crate::placement::FREQUENCY_KEY_PREFIX;
    use crate::synth::{self, SynthConfig};

    fn tiny(frequencies: Option<&[Vec<f32>]>) -> Model {
        let cfg = SynthConfig::preset("tiny").unwrap();
        let (mut writer, _) = synth::build(&cfg).unwrap();
        for (il, f) in frequencies.into_iter().flatten().enumerate() {
            writer.set(
                format!("{FREQUENCY_KEY_PREFIX}.{il}"),
                MetaValue::Array(MetaArray::F32(f.clone())),
            );
        }
        let file = GgufFile::from_bytes(writer.to_bytes().unwrap()).unwrap();
        Model::from_file(Arc::new(file)).unwrap()
    }

    #[test]
    fn union_is_sorted_and_deduplicated() {
        assert_eq!(union_of(&[vec![1, 5], vec![0, 5, 7]], 8), vec![0, 1, 5, 7]);
        assert_eq!(union_of(&[vec![2, 3]], 8), vec![2, 3]);
        assert_eq!(union_of(&[vec![], vec![]], 4), Vec::<u32>::new());
    }

    #[test]
    fn sets_are_packed_from_the_union() {
        let sets = [vec![1, 5], vec![0, 5, 7]];
        let union = union_of(&sets, 8);
        // token t's value of neuron i is 10·t + i
        let gathered: Vec<f32> = (0..2)
            .flat_map(|t| union.iter().map(move |&i| (10 * t) as f32 + i as f32))
            .collect();
        assert_eq!(
            pack_sets(&gathered, &union, &sets),
            vec![1.0, 5.0, 10.0, 15.0, 17.0]
        );
    }

    #[test]
    fn the_budget_is_respected_and_shared_between_layers() {
        let model = tiny(None);
        let per = neuron_bytes(&model, 0);
        let n_ff = model.hp.n_ff;
        assert_eq!(ffn_bytes(&model), per * (n_ff * model.hp.n_layer) as u64);
        let hot = hot_neurons(&model, per * 10 + per / 2, |_| true).unwrap();
        assert_eq!(hot.iter().map(Vec::len).sum::<usize>(), 10);
        // The synthetic file's own target frequencies pick the neurons: the most frequent ones.
        let (freq, _) = placement::stats::frequencies(model.file()).unwrap();
        let mut all_freq: Vec<f32> = freq.iter().flatten().copied().collect();
        all_freq.sort_by(|a, b| b.total_cmp(a));
        let chosen: f32 = (0..2)
            .flat_map(|il| hot[il].iter().map(move |&i| (il, i)))
            .map(|(il, i)| freq[il][i as usize])
            .sum();
        let best: f32 = all_freq[..10].iter().sum();
        assert!((chosen - best).abs() <= 1e-5 * best, "{chosen} vs {best}");
        assert!(hot.iter().all(|h| h.windows(2).all(|w| w[0] < w[1])));
        let all = hot_neurons(&model, u64::MAX, |_| true).unwrap();
        assert!(all.iter().all(|h| h.len() == n_ff));
        let none = hot_neurons(&model, u64::MAX, |il| il == 1).unwrap();
        assert!(none[0].is_empty() && none[1].len() == n_ff);
    }

    #[test]
    fn activation_frequencies_choose_the_hot_neurons() {
        let n_ff = tiny(None).hp.n_ff;
        // Layer 1's last neurons fire most, then layer 0's neuron 7.
        let mut f0 = vec![0.01f32; n_ff];
        f0[7] = 0.5;
        let mut f1 = vec![0.0f32; n_ff];
        f1[n_ff - 3..].fill(0.9);
        let model = tiny(Some(&[f0, f1]));
        let per = neuron_bytes(&model, 0);
        let hot = hot_neurons(&model, per * 4, |_| true).unwrap();
        assert_eq!(hot[0], vec![7]);
        let n = n_ff as u32;
        assert_eq!(hot[1], vec![n - 3, n - 2, n - 1]);
    }
}
