//! The placement problem's inputs, and how they are read off a GGUF tensor table.

use crate::gguf::GgufFile;
use crate::{Error, Result};

/// One transformer block as the planner sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Layer {
    /// Bytes of one FFN neuron (gate row + up row + down column), equal for every neuron here.
    pub neuron_bytes: u64,
    /// Firing frequency of each neuron, in `[0, 1]`.
    pub frequencies: Vec<f32>,
    /// Bytes of the block's dense tensors (attention, norms, predictor), read every token.
    pub dense_bytes: u64,
}

/// A tensor outside the blocks (`token_embd`, `output`, `output_norm`, …).
#[derive(Clone, Debug, PartialEq)]
pub struct GlobalTensor {
    /// Tensor name.
    pub name: String,
    /// Bytes it takes on the device.
    pub bytes: u64,
    /// Bytes a decode step reads from it (all of a matrix it multiplies by, one row of a table
    /// it looks up).
    pub read_bytes: u64,
}

/// Everything [`crate::placement::solve`] decides from.
#[derive(Clone, Debug, PartialEq)]
pub struct Problem {
    /// The blocks, in order.
    pub layers: Vec<Layer>,
    /// The tensors outside the blocks.
    pub globals: Vec<GlobalTensor>,
    /// Bytes of weights the GPU may hold.
    pub budget: u64,
}

/// Most global tensors a problem may have (every subset of them is tried).
pub const MAX_GLOBALS: usize = 16;

/// FFN tensors of a block whose rows (or columns) are neurons.
const FFN_TENSORS: [&str; 5] = [
    "ffn_gate.weight",
    "ffn_up.weight",
    "ffn_down.weight",
    "ffn_down_t.weight",
    "ffn_up.bias",
];

impl Problem {
    /// Reads the tensor sizes off `file`'s tensor table; `frequencies[l]` are layer `l`'s
    /// per-neuron firing frequencies (as many as `ffn_up` has rows).
    pub fn from_gguf(file: &GgufFile, frequencies: Vec<Vec<f32>>, budget: u64) -> Result<Problem> {
        let n_layer = frequencies.len();
        let mut ffn_bytes = vec![0u64; n_layer];
        let mut dense_bytes = vec![0u64; n_layer];
        let mut globals = Vec::new();
        let has_output = file.tensor("output.weight").is_some();
        for t in file.tensors() {
            match block_of(&t.name) {
                Some((il, rest)) => {
                    let slot = if FFN_TENSORS.contains(&rest) {
                        ffn_bytes.get_mut(il)
                    } else {
                        dense_bytes.get_mut(il)
                    };
                    *slot.ok_or_else(|| Error::Tensor {
                        tensor: t.name.clone(),
                        message: format!("block {il} but the statistics have {n_layer} layers"),
                    })? += t.n_bytes;
                }
                None => {
                    // An embedding table is looked up (one row a token) unless it is also the
                    // LM head (tied embeddings), which reads all of it.
                    let looked_up = t.name == "token_embd.weight" && has_output;
                    let read_bytes = if looked_up && t.n_rows() > 0 {
                        t.n_bytes / t.n_rows()
                    } else {
                        t.n_bytes
                    };
                    globals.push(GlobalTensor {
                        name: t.name.clone(),
                        bytes: t.n_bytes,
                        read_bytes,
                    });
                }
            }
        }
        let layers = frequencies
            .into_iter()
            .enumerate()
            .map(|(il, f)| {
                let up = file.require_tensor(&format!("blk.{il}.ffn_up.weight"))?;
                let n_ff = up.n_rows();
                if f.len() as u64 != n_ff {
                    return Err(Error::InvalidArgument(format!(
                        "layer {il}: {} activation frequencies for {n_ff} FFN neurons",
                        f.len()
                    )));
                }
                Ok(Layer {
                    neuron_bytes: ffn_bytes[il].div_ceil(n_ff.max(1)),
                    frequencies: f,
                    dense_bytes: dense_bytes[il],
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let problem = Problem {
            layers,
            globals,
            budget,
        };
        problem.validate()?;
        Ok(problem)
    }

    /// Checks what the solver relies on: frequencies in `[0, 1]`, at most [`MAX_GLOBALS`] global
    /// tensors, fewer than 2³² neurons, and byte totals that fit in a `u64`.
    pub fn validate(&self) -> Result<()> {
        if self.globals.len() > MAX_GLOBALS {
            return Err(Error::InvalidArgument(format!(
                "{} tensors outside the blocks (the planner takes at most {MAX_GLOBALS})",
                self.globals.len()
            )));
        }
        let mut total: u64 = 0;
        let mut neurons: u64 = 0;
        let overflow = || Error::InvalidArgument("model size overflows 64 bits".into());
        for (il, l) in self.layers.iter().enumerate() {
            if let Some(f) = l.frequencies.iter().find(|f| !(0.0..=1.0).contains(*f)) {
                return Err(Error::InvalidArgument(format!(
                    "layer {il}: activation frequency {f} is outside [0, 1]"
                )));
            }
            let n = l.frequencies.len() as u64;
            neurons += n;
            total = l
                .neuron_bytes
                .checked_mul(n)
                .and_then(|b| b.checked_add(l.dense_bytes))
                .and_then(|b| b.checked_add(total))
                .ok_or_else(overflow)?;
        }
        for g in &self.globals {
            total = total.checked_add(g.bytes).ok_or_else(overflow)?;
        }
        if neurons > u64::from(u32::MAX) {
            return Err(Error::InvalidArgument(format!(
                "{neurons} FFN neurons (the planner takes fewer than 2^32)"
            )));
        }
        Ok(())
    }

    /// Bytes of every tensor the problem knows.
    pub fn total_bytes(&self) -> u64 {
        let layers: u64 = self
            .layers
            .iter()
            .map(|l| l.neuron_bytes * l.frequencies.len() as u64 + l.dense_bytes)
            .sum();
        layers + self.globals.iter().map(|g| g.bytes).sum::<u64>()
    }

    /// Expected bytes a decode step reads: every dense byte, and each neuron's bytes times its
    /// firing frequency.
    pub fn read_bytes_per_token(&self) -> f64 {
        let layers: f64 = self
            .layers
            .iter()
            .map(|l| l.dense_bytes as f64 + l.neuron_bytes as f64 * frequency_sum(l))
            .sum();
        layers
            + self
                .globals
                .iter()
                .map(|g| g.read_bytes as f64)
                .sum::<f64>()
    }
}

/// Sum of a layer's firing frequencies: its expected number of active neurons per token.
pub fn frequency_sum(layer: &Layer) -> f64 {
    sum(layer.frequencies.iter().map(|&f| f64::from(f)))
}

/// A sum that is +0 when empty (`Iterator::sum` of floats starts from −0).
pub(crate) fn sum(values: impl Iterator<Item = f64>) -> f64 {
    values.fold(0.0, |a, b| a + b)
}

/// `blk.N.rest` → `(N, rest)`.
fn block_of(name: &str) -> Option<(usize, &str)> {
    let rest = name.strip_prefix("blk.")?;
    let (n, rest) = rest.split_once('.')?;
    Some((n.parse().ok()?, rest))
}
