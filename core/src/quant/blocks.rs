//! The ggml block layouts as `#[repr(C)]` plain-old-data structs, field for field as `ggml-common.h`
//! declares `block_q4_0`, `block_q4_K`, …, so a slice of GGUF tensor bytes can be read as blocks.
//!
//! Multi-byte fields are read in native byte order; GGUF data is little-endian, which is the byte
//! order of every target hotcold builds for (a big-endian build fails to compile, below).
//!
//! The structs with f16 fields are 2-byte aligned ([`BlockQ8K`] 4-byte): a byte slice that starts at
//! an odd address cannot be cast to them, only read block by block (see [`super::dequantize`]).

use bytemuck::{Pod, Zeroable};
use half::{bf16, f16};

use super::GgmlType;

#[cfg(target_endian = "big")]
compile_error!("the ggml block structs assume a little-endian target");

/// Elements in one block of the legacy formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1).
pub const QK: usize = 32;
/// Elements in one super-block of the K-quants (ggml's `QK_K`).
pub const QK_K: usize = 256;
/// Bytes of packed 6-bit scales and mins in Q4_K and Q5_K (ggml's `K_SCALE_SIZE`).
pub const K_SCALE_SIZE: usize = 12;

/// A ggml block layout: [`Block::ELEMS`] values stored in `size_of::<Self>()` bytes.
pub trait Block: Pod {
    /// The ggml type whose tensors are made of these blocks.
    const TYPE: GgmlType;
    /// Number of values in one block.
    const ELEMS: usize;
}

/// ggml `block_q4_0`: `x = d * (q - 8)`, 4-bit `q`; element `j` in the low nibble of `qs[j]`, element
/// `j + 16` in its high nibble.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4_0 {
    /// Scale.
    pub d: f16,
    /// Quants, two per byte.
    pub qs: [u8; QK / 2],
}

/// ggml `block_q4_1`: `x = d * q + m`, 4-bit `q`, nibbles as in [`BlockQ4_0`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4_1 {
    /// Scale.
    pub d: f16,
    /// Minimum (offset).
    pub m: f16,
    /// Quants, two per byte.
    pub qs: [u8; QK / 2],
}

/// ggml `block_q5_0`: `x = d * (q - 16)`, 5-bit `q`: low nibbles as in [`BlockQ4_0`], the fifth bit
/// of element `j` in bit `j` of the little-endian `u32` `qh`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5_0 {
    /// Scale.
    pub d: f16,
    /// Fifth bits, as a little-endian `u32`.
    pub qh: [u8; 4],
    /// Low four bits, two per byte.
    pub qs: [u8; QK / 2],
}

/// ggml `block_q5_1`: `x = d * q + m`, 5-bit `q` packed as in [`BlockQ5_0`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5_1 {
    /// Scale.
    pub d: f16,
    /// Minimum (offset).
    pub m: f16,
    /// Fifth bits, as a little-endian `u32`.
    pub qh: [u8; 4],
    /// Low four bits, two per byte.
    pub qs: [u8; QK / 2],
}

/// ggml `block_q8_0`: `x = d * q`, 8-bit `q`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8_0 {
    /// Scale.
    pub d: f16,
    /// Quants.
    pub qs: [i8; QK],
}

/// ggml `block_q8_1` (activations for the legacy formats' dot products): `x = d * q`, and
/// `s = d * sum(q)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8_1 {
    /// Scale.
    pub d: f16,
    /// `d` times the sum of the quants.
    pub s: f16,
    /// Quants.
    pub qs: [i8; QK],
}

/// ggml `block_q2_K`: 16 sub-blocks of 16; `x = d * sc * q - dmin * m` with 2-bit `q` and 4-bit
/// `sc` (low nibble of `scales[i]`) and `m` (high nibble).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ2K {
    /// Sub-block scales (low nibble) and mins (high nibble).
    pub scales: [u8; QK_K / 16],
    /// Quants, four per byte.
    pub qs: [u8; QK_K / 4],
    /// Super-block scale of the scales.
    pub d: f16,
    /// Super-block scale of the mins.
    pub dmin: f16,
}

/// ggml `block_q3_K`: 16 sub-blocks of 16; `x = d * (sc - 32) * (q - 4)`, with 3-bit `q` (low two
/// bits in `qs`, the third, inverted, in `hmask`) and 6-bit `sc` packed in `scales`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ3K {
    /// High bits of the quants (set: no `-4` offset).
    pub hmask: [u8; QK_K / 8],
    /// Low two bits of the quants.
    pub qs: [u8; QK_K / 4],
    /// 6-bit sub-block scales: low nibbles in bytes 0..8, high two bits in bytes 8..12.
    pub scales: [u8; 12],
    /// Super-block scale.
    pub d: f16,
}

/// ggml `block_q4_K`: 8 sub-blocks of 32; `x = d * sc * q - dmin * m`, 4-bit `q`, 6-bit `sc` and `m`
/// packed in `scales` (see [`super::get_scale_min_k4`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4K {
    /// Super-block scale of the scales.
    pub d: f16,
    /// Super-block scale of the mins.
    pub dmin: f16,
    /// Packed 6-bit scales and mins.
    pub scales: [u8; K_SCALE_SIZE],
    /// Quants: for each 64 values, 32 bytes with the first 32 in the low nibbles.
    pub qs: [u8; QK_K / 2],
}

/// ggml `block_q5_K`: as [`BlockQ4K`] with a fifth bit per quant in `qh`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5K {
    /// Super-block scale of the scales.
    pub d: f16,
    /// Super-block scale of the mins.
    pub dmin: f16,
    /// Packed 6-bit scales and mins.
    pub scales: [u8; K_SCALE_SIZE],
    /// Fifth bits: bit `2k` (`2k+1`) of `qh[l]` for value `l` (`l + 32`) of the `k`-th 64.
    pub qh: [u8; QK_K / 8],
    /// Low four bits, laid out as [`BlockQ4K::qs`].
    pub qs: [u8; QK_K / 2],
}

/// ggml `block_q6_K`: 16 sub-blocks of 16; `x = d * sc * (q - 32)`, 6-bit `q`, 8-bit signed `sc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ6K {
    /// Low four bits of the quants.
    pub ql: [u8; QK_K / 2],
    /// High two bits of the quants.
    pub qh: [u8; QK_K / 4],
    /// Sub-block scales.
    pub scales: [i8; QK_K / 16],
    /// Super-block scale.
    pub d: f16,
}

/// ggml `block_q8_K` (activations for the K-quants' dot products): `x = d * q`, with the sums of
/// each 16 quants in `bsums`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8K {
    /// Scale (an f32, unlike the other formats).
    pub d: f32,
    /// Quants.
    pub qs: [i8; QK_K],
    /// Sums of the quants in groups of 16.
    pub bsums: [i16; QK_K / 16],
}

macro_rules! blocks {
    ($($ty:ty => $variant:ident, $elems:expr;)*) => {
        $(impl Block for $ty {
            const TYPE: GgmlType = GgmlType::$variant;
            const ELEMS: usize = $elems;
        })*

        #[cfg(test)]
        mod layout_tests {
            use super::*;

            #[test]
            fn sizes_match_the_type_table() {
                $(
                    assert_eq!(std::mem::size_of::<$ty>(), GgmlType::$variant.block_bytes(), stringify!($ty));
                    assert_eq!(<$ty as Block>::ELEMS, GgmlType::$variant.block_size(), stringify!($ty));
                )*
            }
        }
    };
}

blocks! {
    f32 => F32, 1;
    f16 => F16, 1;
    bf16 => BF16, 1;
    BlockQ4_0 => Q4_0, QK;
    BlockQ4_1 => Q4_1, QK;
    BlockQ5_0 => Q5_0, QK;
    BlockQ5_1 => Q5_1, QK;
    BlockQ8_0 => Q8_0, QK;
    BlockQ8_1 => Q8_1, QK;
    BlockQ2K => Q2_K, QK_K;
    BlockQ3K => Q3_K, QK_K;
    BlockQ4K => Q4_K, QK_K;
    BlockQ5K => Q5_K, QK_K;
    BlockQ6K => Q6_K, QK_K;
    BlockQ8K => Q8_K, QK_K;
}

/// Calls `f(i, &block)` for each block `i` in `src`, which must hold a whole number of blocks.
///
/// Casts in place when `src` is aligned for `B`, and otherwise copies each block out with an
/// unaligned read (tensor data in a GGUF mmap may start at any byte).
pub(crate) fn for_each_block<B: Block>(src: &[u8], mut f: impl FnMut(usize, &B)) {
    let size = std::mem::size_of::<B>();
    debug_assert_eq!(src.len() % size, 0);
    match bytemuck::try_cast_slice::<u8, B>(src) {
        Ok(blocks) => blocks.iter().enumerate().for_each(|(i, b)| f(i, b)),
        Err(_) => {
            for (i, chunk) in src.chunks_exact(size).enumerate() {
                let b: B = bytemuck::pod_read_unaligned(chunk);
                f(i, &b);
            }
        }
    }
}
