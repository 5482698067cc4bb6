//! Falcon's parallel block: attention and FFN both read the block's input, and both outputs
//! join the residual stream at once.

use crate::cpu::ops;

/// `x = (ffn + attn) + x`, in the order of PowerInfer's / llama.cpp's `build_falcon`.
pub(super) fn parallel_residual(x: &mut [f32], attn: &[f32], mut ffn: Vec<f32>) {
    ops::add_assign(&mut ffn, attn);
    ops::add_assign(x, &ffn);
}
