//! The seam through which a block's attention projections run. The forward pass calls a
//! [`Linear`] for `Q`, `K`, `V` and `O` (the FFN's products go through
//! [`FfnOffload`](super::FfnOffload)); [`DenseLinear`] is the plain matrix product, and TEAL's
//! input-sparse operator ([`Teal`](super::Teal)) implements both traits.

use crate::model::{LayerWeights, Model, Weight};
use crate::Result;

/// One of a block's seven matrices, in the order of the per-layer threshold arrays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Proj {
    /// `attn_q`: input the normed attention input.
    Q,
    /// `attn_k`: the same input as `Q`.
    K,
    /// `attn_v`: the same input as `Q`.
    V,
    /// `attn_output`: input the attention output (all heads).
    O,
    /// `ffn_gate`: input the normed FFN input.
    Gate,
    /// `ffn_up`: the same input as `Gate`.
    Up,
    /// `ffn_down`: input the FFN activation.
    Down,
}

impl Proj {
    /// Every matrix, in threshold-array order.
    pub const ALL: [Proj; 7] = [
        Proj::Q,
        Proj::K,
        Proj::V,
        Proj::O,
        Proj::Gate,
        Proj::Up,
        Proj::Down,
    ];

    /// The position in [`Proj::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The GGUF tensor name's role part (`attn_q`, …, `ffn_down`).
    pub fn name(self) -> &'static str {
        match self {
            Proj::Q => "attn_q",
            Proj::K => "attn_k",
            Proj::V => "attn_v",
            Proj::O => "attn_output",
            Proj::Gate => "ffn_gate",
            Proj::Up => "ffn_up",
            Proj::Down => "ffn_down",
        }
    }

    /// The row-major weight of this matrix in `layer` (`None`: no gate, or a down projection the
    /// file only has neuron-major).
    pub fn weight(self, layer: &LayerWeights) -> Option<&Weight> {
        match self {
            Proj::Q => Some(&layer.wq),
            Proj::K => Some(&layer.wk),
            Proj::V => Some(&layer.wv),
            Proj::O => Some(&layer.wo),
            Proj::Gate => layer.gate.as_ref(),
            Proj::Up => Some(&layer.up),
            Proj::Down => layer.down.as_ref(),
        }
    }
}

impl From<super::FfnTensor> for Proj {
    fn from(t: super::FfnTensor) -> Proj {
        match t {
            super::FfnTensor::Gate => Proj::Gate,
            super::FfnTensor::Up => Proj::Up,
            super::FfnTensor::Down => Proj::Down,
        }
    }
}

/// Runs a block's projections for `n` token rows.
pub trait Linear: Send + Sync {
    /// `W · x` for layer `il`'s matrix `which` over `n` rows of `x` (`n × rows`, no bias).
    fn project(
        &self,
        model: &Model,
        il: usize,
        which: Proj,
        x: &[f32],
        n: usize,
    ) -> Result<Vec<f32>>;
}

/// Every projection as the dense `cpu::matmul`.
#[derive(Clone, Copy, Debug, Default)]
pub struct DenseLinear;

impl Linear for DenseLinear {
    fn project(
        &self,
        model: &Model,
        il: usize,
        which: Proj,
        x: &[f32],
        n: usize,
    ) -> Result<Vec<f32>> {
        dense_project(model, il, which, x, n)
    }
}

/// `W · x` with the row-major weight, as [`cpu::matmul`] computes it.
pub(crate) fn dense_project(
    model: &Model,
    il: usize,
    which: Proj,
    x: &[f32],
    n: usize,
) -> Result<Vec<f32>> {
    let w = which
        .weight(&model.layers[il])
        .ok_or_else(|| crate::Error::Tensor {
            tensor: format!("blk.{il}.{}.weight", which.name()),
            message: "the layer has no row-major copy of this matrix".into(),
        })?;
    model.matmul(w, x, n)
}
