//! ggml block formats: the type table, block layouts, dequantisation and quantisation, bit-exact
//! with ggml (its `dequantize_row_*` and reference `quantize_row_*_ref` functions).
//!
//! - `types`: [`GgmlType`], ids, names and sizes of every ggml type.
//! - [`blocks`]: the `#[repr(C)]` block structs ([`BlockQ4_0`], [`BlockQ4K`], …).
//! - `float`: ggml's f16/bf16 rounding.
//! - `kquants`: the K-quant helpers (scale searches, [`nearest_int`], [`get_scale_min_k4`]).
//! - `dequant` / `quantize`: one block at a time ([`DequantizeBlock`], [`QuantizeBlock`]); the
//!   row functions [`dequantize`] and [`quantize`] dispatch on the type.

pub mod blocks;
mod dequant;
mod float;
mod kquants;
mod quantize;
mod types;

use half::{bf16, f16};

pub use blocks::{
    Block, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1,
    BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1, QK, QK_K,
};
pub use dequant::DequantizeBlock;
pub use float::{bf16_to_fp32, fp16_to_fp32, fp32_to_bf16, fp32_to_fp16};
pub use kquants::{get_scale_min_k4, nearest_int};
pub use quantize::QuantizeBlock;
pub use types::GgmlType;

use crate::{Error, Result};

/// Whether [`dequantize`] supports `ty`.
pub fn can_dequantize(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16
            | BF16
            | Q4_0
            | Q4_1
            | Q5_0
            | Q5_1
            | Q8_0
            | Q8_1
            | Q2_K
            | Q3_K
            | Q4_K
            | Q5_K
            | Q6_K
            | Q8_K
    )
}

/// Whether [`quantize`] supports `ty`.
pub fn can_quantize(ty: GgmlType) -> bool {
    // the same set: every dequantisable type has a reference quantiser
    can_dequantize(ty)
}

/// Checks that `bytes` are exactly `elems` elements of `ty`.
fn check_len(ty: GgmlType, elems: usize, bytes: usize) -> Result<()> {
    let want = ty.row_bytes(elems as u64)?;
    if want != bytes as u64 {
        return Err(Error::InvalidArgument(format!(
            "{elems} {ty} elements take {want} bytes, got {bytes}"
        )));
    }
    Ok(())
}

/// Calls `$run::<Block>($a, $b)` with the block type of `$ty`, or returns
/// [`Error::UnsupportedType`] for operation `$op`.
macro_rules! with_block_type {
    ($ty:expr, $op:literal, $run:ident($a:expr, $b:expr)) => {
        match $ty {
            GgmlType::F32 => $run::<f32>($a, $b),
            GgmlType::F16 => $run::<f16>($a, $b),
            GgmlType::BF16 => $run::<bf16>($a, $b),
            GgmlType::Q4_0 => $run::<BlockQ4_0>($a, $b),
            GgmlType::Q4_1 => $run::<BlockQ4_1>($a, $b),
            GgmlType::Q5_0 => $run::<BlockQ5_0>($a, $b),
            GgmlType::Q5_1 => $run::<BlockQ5_1>($a, $b),
            GgmlType::Q8_0 => $run::<BlockQ8_0>($a, $b),
            GgmlType::Q8_1 => $run::<BlockQ8_1>($a, $b),
            GgmlType::Q2_K => $run::<BlockQ2K>($a, $b),
            GgmlType::Q3_K => $run::<BlockQ3K>($a, $b),
            GgmlType::Q4_K => $run::<BlockQ4K>($a, $b),
            GgmlType::Q5_K => $run::<BlockQ5K>($a, $b),
            GgmlType::Q6_K => $run::<BlockQ6K>($a, $b),
            GgmlType::Q8_K => $run::<BlockQ8K>($a, $b),
            other => {
                return Err(Error::UnsupportedType {
                    ty: other.name(),
                    op: $op,
                })
            }
        }
    };
}

/// Dequantises `src`, exactly `dst.len()` elements of type `ty`, into `dst`, bit-exact with ggml.
///
/// `src` may start at any address. Errors: [`Error::InvalidArgument`] when the lengths do not match
/// (or `dst.len()` is not a whole number of blocks), [`Error::UnsupportedType`] for a type without a
/// dequantiser (see [`can_dequantize`]). Q8_1, which ggml never dequantises, gives `d * q`.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    use dequant::dequantize_blocks as run;
    if !can_dequantize(ty) {
        return Err(Error::UnsupportedType {
            ty: ty.name(),
            op: "dequantize",
        });
    }
    check_len(ty, dst.len(), src.len())?;
    with_block_type!(ty, "dequantize", run(src, dst));
    Ok(())
}

/// Quantises `src` into `dst`, which must be exactly `src.len()` elements of type `ty`, with ggml's
/// reference quantiser (`quantize_row_*_ref`, `ggml_fp32_to_fp16_row`, `ggml_fp32_to_bf16_row_ref`),
/// bit-exact.
///
/// `dst` may start at any address. Errors as for [`dequantize`]. One difference from ggml: an
/// all-zero Q8_K block gets zero `bsums` (ggml leaves them as they were).
pub fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    use quantize::quantize_blocks as run;
    if !can_quantize(ty) {
        return Err(Error::UnsupportedType {
            ty: ty.name(),
            op: "quantize",
        });
    }
    check_len(ty, src.len(), dst.len())?;
    with_block_type!(ty, "quantize", run(src, dst));
    Ok(())
}

#[cfg(test)]
mod tests;
