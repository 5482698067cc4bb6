//! Dequantisation of one block to f32, bit-exact with ggml's `dequantize_row_*` (same order of
//! float operations), and the row driver behind [`super::dequantize`].

// Index loops mirror ggml's reference code line for line, which keeps the bit-exactness reviewable.
#![allow(clippy::needless_range_loop)]

use half::{bf16, f16};

use super::blocks::*;
use super::float::{bf16_to_fp32, fp16_to_fp32};
use super::kquants::get_scale_min_k4;

/// A block that can be expanded to its [`Block::ELEMS`] f32 values.
pub trait DequantizeBlock: Block {
    /// Writes the block's values to `y[..Self::ELEMS]` (panics if `y` is shorter).
    fn dequantize(&self, y: &mut [f32]);
}

/// Dequantises the whole blocks in `src` into `dst` (lengths checked by the caller).
pub(crate) fn dequantize_blocks<B: DequantizeBlock>(src: &[u8], dst: &mut [f32]) {
    debug_assert_eq!(src.len() / std::mem::size_of::<B>() * B::ELEMS, dst.len());
    for_each_block::<B>(src, |i, b| {
        b.dequantize(&mut dst[i * B::ELEMS..(i + 1) * B::ELEMS])
    });
}

impl DequantizeBlock for f32 {
    #[inline]
    fn dequantize(&self, y: &mut [f32]) {
        y[0] = *self;
    }
}

impl DequantizeBlock for f16 {
    #[inline]
    fn dequantize(&self, y: &mut [f32]) {
        y[0] = fp16_to_fp32(*self);
    }
}

impl DequantizeBlock for bf16 {
    #[inline]
    fn dequantize(&self, y: &mut [f32]) {
        y[0] = bf16_to_fp32(*self);
    }
}

impl DequantizeBlock for BlockQ4_0 {
    fn dequantize(&self, y: &mut [f32]) {
        let y = &mut y[..QK];
        let d = fp16_to_fp32(self.d);
        for (j, &q) in self.qs.iter().enumerate() {
            y[j] = ((q & 0x0F) as i32 - 8) as f32 * d;
            y[j + QK / 2] = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

impl DequantizeBlock for BlockQ4_1 {
    fn dequantize(&self, y: &mut [f32]) {
        let y = &mut y[..QK];
        let d = fp16_to_fp32(self.d);
        let m = fp16_to_fp32(self.m);
        for (j, &q) in self.qs.iter().enumerate() {
            y[j] = (q & 0x0F) as f32 * d + m;
            y[j + QK / 2] = (q >> 4) as f32 * d + m;
        }
    }
}

impl DequantizeBlock for BlockQ5_0 {
    fn dequantize(&self, y: &mut [f32]) {
        let y = &mut y[..QK];
        let d = fp16_to_fp32(self.d);
        let qh = u32::from_le_bytes(self.qh);
        for (j, &q) in self.qs.iter().enumerate() {
            let h0 = ((qh >> j) << 4) & 0x10;
            let h1 = (qh >> (j + 12)) & 0x10;
            y[j] = (((q & 0x0F) as u32 | h0) as i32 - 16) as f32 * d;
            y[j + QK / 2] = (((q >> 4) as u32 | h1) as i32 - 16) as f32 * d;
        }
    }
}

impl DequantizeBlock for BlockQ5_1 {
    fn dequantize(&self, y: &mut [f32]) {
        let y = &mut y[..QK];
        let d = fp16_to_fp32(self.d);
        let m = fp16_to_fp32(self.m);
        let qh = u32::from_le_bytes(self.qh);
        for (j, &q) in self.qs.iter().enumerate() {
            let h0 = ((qh >> j) << 4) & 0x10;
            let h1 = (qh >> (j + 12)) & 0x10;
            y[j] = ((q & 0x0F) as u32 | h0) as f32 * d + m;
            y[j + QK / 2] = ((q >> 4) as u32 | h1) as f32 * d + m;
        }
    }
}

impl DequantizeBlock for BlockQ8_0 {
    fn dequantize(&self, y: &mut [f32]) {
        let d = fp16_to_fp32(self.d);
        for (y, &q) in y[..QK].iter_mut().zip(&self.qs) {
            *y = q as f32 * d;
        }
    }
}

/// Q8_1 has no dequantiser in ggml; this is `d * q`, the value its dot products use.
impl DequantizeBlock for BlockQ8_1 {
    fn dequantize(&self, y: &mut [f32]) {
        let d = fp16_to_fp32(self.d);
        for (y, &q) in y[..QK].iter_mut().zip(&self.qs) {
            *y = q as f32 * d;
        }
    }
}

impl DequantizeBlock for BlockQ2K {
    fn dequantize(&self, y: &mut [f32]) {
        let y = &mut y[..QK_K];
        let d = fp16_to_fp32(self.d);
        let min = fp16_to_fp32(self.dmin);
        let mut out = 0;
        let mut is = 0;
        for q in self.qs.chunks_exact(32) {
            for shift in [0, 2, 4, 6] {
                for half in [&q[..16], &q[16..]] {
                    let sc = self.scales[is];
                    is += 1;
                    let dl = d * (sc & 0xF) as f32;
                    let ml = min * (sc >> 4) as f32;
                    for &b in half {
                        y[out] = dl * ((b >> shift) & 3) as f32 - ml;
                        out += 1;
                    }
                }
            }
        }
    }
}

/// Sub-block scale `j` (0..16) of a Q3_K block, in `0..64` (subtract 32 for the signed scale).
#[inline]
pub(crate) fn q3k_scale(scales: &[u8; 12], j: usize) -> u8 {
    let lo = if j < 8 {
        scales[j] & 0xF
    } else {
        scales[j - 8] >> 4
    };
    let hi = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
    lo | (hi << 4)
}

impl DequantizeBlock for BlockQ3K {
    fn dequantize(&self, y: &mut [f32]) {
        let y = &mut y[..QK_K];
        let d_all = fp16_to_fp32(self.d);
        let mut out = 0;
        let mut is = 0;
        let mut m = 1u8;
        for q in self.qs.chunks_exact(32) {
            for shift in [0, 2, 4, 6] {
                for half in 0..2 {
                    let dl = d_all * (q3k_scale(&self.scales, is) as i32 - 32) as f32;
                    is += 1;
                    for l in 16 * half..16 * half + 16 {
                        let low = ((q[l] >> shift) & 3) as i32;
                        let off = if self.hmask[l] & m != 0 { 0 } else { 4 };
                        y[out] = dl * (low - off) as f32;
                        out += 1;
                    }
                }
                m <<= 1;
            }
        }
    }
}

impl DequantizeBlock for BlockQ4K {
    fn dequantize(&self, y: &mut [f32]) {
        let y = &mut y[..QK_K];
        let d = fp16_to_fp32(self.d);
        let min = fp16_to_fp32(self.dmin);
        for (k, (q, y)) in self
            .qs
            .chunks_exact(32)
            .zip(y.chunks_exact_mut(64))
            .enumerate()
        {
            let (sc1, m1) = get_scale_min_k4(2 * k, &self.scales);
            let (sc2, m2) = get_scale_min_k4(2 * k + 1, &self.scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            for l in 0..32 {
                y[l] = d1 * (q[l] & 0xF) as f32 - m1;
                y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

impl DequantizeBlock for BlockQ5K {
    fn dequantize(&self, y: &mut [f32]) {
        let y = &mut y[..QK_K];
        let d = fp16_to_fp32(self.d);
        let min = fp16_to_fp32(self.dmin);
        for (k, (ql, y)) in self
            .qs
            .chunks_exact(32)
            .zip(y.chunks_exact_mut(64))
            .enumerate()
        {
            let (sc1, m1) = get_scale_min_k4(2 * k, &self.scales);
            let (sc2, m2) = get_scale_min_k4(2 * k + 1, &self.scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            let (u1, u2) = (1u8 << (2 * k), 2u8 << (2 * k));
            for l in 0..32 {
                let h1 = if self.qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if self.qh[l] & u2 != 0 { 16 } else { 0 };
                y[l] = d1 * ((ql[l] & 0xF) as i32 + h1) as f32 - m1;
                y[l + 32] = d2 * ((ql[l] >> 4) as i32 + h2) as f32 - m2;
            }
        }
    }
}

impl DequantizeBlock for BlockQ6K {
    fn dequantize(&self, y: &mut [f32]) {
        let y = &mut y[..QK_K];
        let d = fp16_to_fp32(self.d);
        for n in 0..2 {
            let ql = &self.ql[64 * n..64 * n + 64];
            let qh = &self.qh[32 * n..32 * n + 32];
            let sc = &self.scales[8 * n..8 * n + 8];
            let y = &mut y[128 * n..128 * n + 128];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                y[l] = d * sc[is] as f32 * q1 as f32;
                y[l + 32] = d * sc[is + 2] as f32 * q2 as f32;
                y[l + 64] = d * sc[is + 4] as f32 * q3 as f32;
                y[l + 96] = d * sc[is + 6] as f32 * q4 as f32;
            }
        }
    }
}

impl DequantizeBlock for BlockQ8K {
    fn dequantize(&self, y: &mut [f32]) {
        for (y, &q) in y[..QK_K].iter_mut().zip(&self.qs) {
            *y = self.d * q as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_0_known_block() {
        let mut b = BlockQ4_0 {
            d: f16::from_f32(0.5),
            qs: [0; 16],
        };
        b.qs[0] = 0x9F; // element 0: 15 - 8 = 7, element 16: 9 - 8 = 1
        b.qs[1] = 0x08;
        let mut y = [0.0f32; 32];
        b.dequantize(&mut y);
        assert_eq!(y[0], 3.5);
        assert_eq!(y[16], 0.5);
        assert_eq!(y[1], 0.0);
        assert_eq!(y[17], -4.0);
    }

    #[test]
    fn q8_k_is_d_times_q() {
        let mut b: BlockQ8K = bytemuck::Zeroable::zeroed();
        b.d = 0.25;
        b.qs[3] = -128;
        b.qs[255] = 127;
        let mut y = [1.0f32; 256];
        b.dequantize(&mut y);
        assert_eq!(y[3], -32.0);
        assert_eq!(y[255], 31.75);
        assert_eq!(y[0], 0.0);
    }

    #[test]
    fn q3k_scales_unpack() {
        // scale j stored as 6 bits: low nibble in byte j (or j-8, high nibble), high 2 bits in 8+j%4
        let mut s = [0u8; 12];
        let want: Vec<u8> = (0..16).map(|j| (j * 4 + 3) as u8 % 64).collect();
        for (j, &l) in want.iter().enumerate() {
            if j < 8 {
                s[j] = l & 0xF;
            } else {
                s[j - 8] |= (l & 0xF) << 4;
            }
            s[j % 4 + 8] |= (l >> 4) << (2 * (j / 4));
        }
        for (j, &l) in want.iter().enumerate() {
            assert_eq!(q3k_scale(&s, j), l);
        }
    }
}
