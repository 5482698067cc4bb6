//! Portable kernels: ggml's `ggml_vec_dot_*_generic` in Rust, one row × one token at a time.
//!
//! These are the reference for the SIMD paths (identical integer block sums) and the path for
//! targets without SIMD kernels (wasm32, aarch64 for now).

// Index loops mirror ggml's reference code, which keeps the integer semantics reviewable.
#![allow(clippy::needless_range_loop)]

use half::{bf16, f16};

use crate::quant::{
    fp16_to_fp32, get_scale_min_k4, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1,
    BlockQ6K, BlockQ8_0, GgmlType, QK, QK_K,
};

use super::act::Acts;
use super::{Kernel, NT};

/// The scalar kernel for `ty`, if supported.
pub(crate) fn kernel(ty: GgmlType) -> Option<Kernel> {
    use GgmlType::*;
    Some(match ty {
        F32 => |w, rb, nr, a, t0, nt, out| tile(dot_f32, w, rb, nr, a, t0, nt, out),
        F16 => |w, rb, nr, a, t0, nt, out| tile(dot_f16, w, rb, nr, a, t0, nt, out),
        BF16 => |w, rb, nr, a, t0, nt, out| tile(dot_bf16, w, rb, nr, a, t0, nt, out),
        Q4_0 => |w, rb, nr, a, t0, nt, out| tile(dot_q4_0, w, rb, nr, a, t0, nt, out),
        Q4_1 => |w, rb, nr, a, t0, nt, out| tile(dot_q4_1, w, rb, nr, a, t0, nt, out),
        Q5_0 => |w, rb, nr, a, t0, nt, out| tile(dot_q5_0, w, rb, nr, a, t0, nt, out),
        Q5_1 => |w, rb, nr, a, t0, nt, out| tile(dot_q5_1, w, rb, nr, a, t0, nt, out),
        Q8_0 => |w, rb, nr, a, t0, nt, out| tile(dot_q8_0, w, rb, nr, a, t0, nt, out),
        Q4_K => |w, rb, nr, a, t0, nt, out| tile(dot_q4_k, w, rb, nr, a, t0, nt, out),
        Q5_K => |w, rb, nr, a, t0, nt, out| tile(dot_q5_k, w, rb, nr, a, t0, nt, out),
        Q6_K => |w, rb, nr, a, t0, nt, out| tile(dot_q6_k, w, rb, nr, a, t0, nt, out),
        _ => return None,
    })
}

/// Runs a one-row, one-token dot over a tile.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn tile(
    dot: fn(&[u8], &Acts, usize) -> f32,
    w: &[u8],
    rb: usize,
    nr: usize,
    a: &Acts,
    t0: usize,
    nt: usize,
    out: &mut [f32],
) {
    for i in 0..nr {
        let row = &w[i * rb..(i + 1) * rb];
        for t in 0..nt {
            out[i * NT + t] = dot(row, a, t0 + t);
        }
    }
}

/// Block `i` of a row, read unaligned.
#[inline(always)]
fn block<B: bytemuck::Pod>(row: &[u8], i: usize) -> B {
    let n = std::mem::size_of::<B>();
    bytemuck::pod_read_unaligned(&row[i * n..(i + 1) * n])
}

/// A float dot product with 8 partial sums.
#[inline(always)]
fn fdot(n: usize, w: impl Fn(usize) -> f32, x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let full = n / 8 * 8;
    for j in (0..full).step_by(8) {
        for l in 0..8 {
            acc[l] += w(j + l) * x[j + l];
        }
    }
    let mut s = 0f32;
    for j in full..n {
        s += w(j) * x[j];
    }
    acc.iter().sum::<f32>() + s
}

fn dot_f32(row: &[u8], a: &Acts, t: usize) -> f32 {
    let x = a.f(t);
    fdot(
        x.len(),
        |j| f32::from_le_bytes(row[4 * j..4 * j + 4].try_into().unwrap()),
        x,
    )
}

fn dot_f16(row: &[u8], a: &Acts, t: usize) -> f32 {
    let x = a.f(t);
    fdot(
        x.len(),
        |j| f16::from_bits(u16::from_le_bytes([row[2 * j], row[2 * j + 1]])).to_f32(),
        x,
    )
}

fn dot_bf16(row: &[u8], a: &Acts, t: usize) -> f32 {
    let x = a.f(t);
    fdot(
        x.len(),
        |j| bf16::from_bits(u16::from_le_bytes([row[2 * j], row[2 * j + 1]])).to_f32(),
        x,
    )
}

/// ggml `ggml_vec_dot_q4_0_q8_0`.
fn dot_q4_0(row: &[u8], a: &Acts, t: usize) -> f32 {
    let (q8, d8) = (a.q(t), a.d(t));
    let mut sumf = 0f32;
    for ib in 0..d8.len() {
        let b: BlockQ4_0 = block(row, ib);
        let y = &q8[ib * QK..(ib + 1) * QK];
        let mut sumi = 0i32;
        for j in 0..QK / 2 {
            let v0 = (b.qs[j] & 0x0F) as i32 - 8;
            let v1 = (b.qs[j] >> 4) as i32 - 8;
            sumi += v0 * y[j] as i32 + v1 * y[j + QK / 2] as i32;
        }
        sumf += sumi as f32 * (fp16_to_fp32(b.d) * d8[ib]);
    }
    sumf
}

/// ggml `ggml_vec_dot_q4_1_q8_1`.
fn dot_q4_1(row: &[u8], a: &Acts, t: usize) -> f32 {
    let (q8, d8, s8) = (a.q(t), a.d(t), a.s(t));
    let mut sumf = 0f32;
    for ib in 0..d8.len() {
        let b: BlockQ4_1 = block(row, ib);
        let y = &q8[ib * QK..(ib + 1) * QK];
        let mut sumi = 0i32;
        for j in 0..QK / 2 {
            sumi += (b.qs[j] & 0x0F) as i32 * y[j] as i32
                + (b.qs[j] >> 4) as i32 * y[j + QK / 2] as i32;
        }
        sumf += (fp16_to_fp32(b.d) * d8[ib]) * sumi as f32 + fp16_to_fp32(b.m) * s8[ib];
    }
    sumf
}

/// The 5-bit quant `j` (0..32) of a Q5_0/Q5_1 block, before any offset.
#[inline(always)]
fn q5(qs: &[u8; QK / 2], qh: u32, j: usize) -> i32 {
    let lo = if j < QK / 2 {
        qs[j] & 0x0F
    } else {
        qs[j - QK / 2] >> 4
    };
    (lo as i32) | ((((qh >> j) & 1) as i32) << 4)
}

/// ggml `ggml_vec_dot_q5_0_q8_0`.
fn dot_q5_0(row: &[u8], a: &Acts, t: usize) -> f32 {
    let (q8, d8) = (a.q(t), a.d(t));
    let mut sumf = 0f32;
    for ib in 0..d8.len() {
        let b: BlockQ5_0 = block(row, ib);
        let qh = u32::from_le_bytes(b.qh);
        let y = &q8[ib * QK..(ib + 1) * QK];
        let mut sumi = 0i32;
        for j in 0..QK {
            sumi += (q5(&b.qs, qh, j) - 16) * y[j] as i32;
        }
        sumf += (fp16_to_fp32(b.d) * d8[ib]) * sumi as f32;
    }
    sumf
}

/// ggml `ggml_vec_dot_q5_1_q8_1`.
fn dot_q5_1(row: &[u8], a: &Acts, t: usize) -> f32 {
    let (q8, d8, s8) = (a.q(t), a.d(t), a.s(t));
    let mut sumf = 0f32;
    for ib in 0..d8.len() {
        let b: BlockQ5_1 = block(row, ib);
        let qh = u32::from_le_bytes(b.qh);
        let y = &q8[ib * QK..(ib + 1) * QK];
        let mut sumi = 0i32;
        for j in 0..QK {
            sumi += q5(&b.qs, qh, j) * y[j] as i32;
        }
        sumf += (fp16_to_fp32(b.d) * d8[ib]) * sumi as f32 + fp16_to_fp32(b.m) * s8[ib];
    }
    sumf
}

/// ggml `ggml_vec_dot_q8_0_q8_0`.
fn dot_q8_0(row: &[u8], a: &Acts, t: usize) -> f32 {
    let (q8, d8) = (a.q(t), a.d(t));
    let mut sumf = 0f32;
    for ib in 0..d8.len() {
        let b: BlockQ8_0 = block(row, ib);
        let y = &q8[ib * QK..(ib + 1) * QK];
        let mut sumi = 0i32;
        for j in 0..QK {
            sumi += b.qs[j] as i32 * y[j] as i32;
        }
        sumf += sumi as f32 * (fp16_to_fp32(b.d) * d8[ib]);
    }
    sumf
}

/// ggml `ggml_vec_dot_q4_K_q8_K`: `d·dA·Σ sc_j (q·a)_j − dmin·dA·Σ m_j bsum_j`.
fn dot_q4_k(row: &[u8], a: &Acts, t: usize) -> f32 {
    let head = |b: &BlockQ4K| (b.d, b.dmin, b.scales);
    dot_k_scale_min(row, a, t, head, |b, j, l| k_nibble(&b.qs, j, l))
}

/// ggml `ggml_vec_dot_q5_K_q8_K`: Q4_K's sum with a fifth bit from `qh`.
fn dot_q5_k(row: &[u8], a: &Acts, t: usize) -> f32 {
    let head = |b: &BlockQ5K| (b.d, b.dmin, b.scales);
    dot_k_scale_min(row, a, t, head, |b, j, l| {
        k_nibble(&b.qs, j, l) | ((b.qh[l] >> j) & 1) << 4
    })
}

/// Nibble `l` of sub-block `j` in Q4_K / Q5_K quants `qs`: each 64 values are 32 bytes, the
/// first 32 values in their low nibbles.
#[inline(always)]
fn k_nibble(qs: &[u8], j: usize, l: usize) -> u8 {
    (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xF
}

/// The dot of the Q4_K / Q5_K blocks `B` of `row` with token `t`: per block, `d·dA·Σ sc_j (q·a)_j
/// − dmin·dA·Σ m_j bsum_j` over its eight sub-blocks of 32, where `head(b)` gives the block's f16
/// `d`, `dmin` and packed 6-bit scales and mins, and `quant(b, j, l)` quant `l` of sub-block `j`.
fn dot_k_scale_min<B: bytemuck::Pod>(
    row: &[u8],
    a: &Acts,
    t: usize,
    head: impl Fn(&B) -> (f16, f16, [u8; 12]),
    quant: impl Fn(&B, usize, usize) -> u8,
) -> f32 {
    let (q8, d8, bs) = (a.q(t), a.d(t), a.bsums(t));
    let mut sumf = 0f32;
    for ib in 0..d8.len() {
        let b: B = block(row, ib);
        let (d, dmin, scales) = head(&b);
        let y = &q8[ib * QK_K..(ib + 1) * QK_K];
        let bs = &bs[ib * 16..(ib + 1) * 16];
        let mut sumi = 0i32;
        let mut summ = 0i32;
        for j in 0..QK_K / 32 {
            let (sc, m) = get_scale_min_k4(j, &scales);
            let y = &y[32 * j..32 * j + 32];
            let mut s = 0i32;
            for (l, &y) in y.iter().enumerate() {
                s += quant(&b, j, l) as i32 * y as i32;
            }
            sumi += sc as i32 * s;
            summ += m as i32 * (bs[2 * j] as i32 + bs[2 * j + 1] as i32);
        }
        sumf += fp16_to_fp32(d) * d8[ib] * sumi as f32 - fp16_to_fp32(dmin) * d8[ib] * summ as f32;
    }
    sumf
}

/// The 6-bit quant (0..64, before the `-32`) at position `p` (0..256) of a Q6_K block.
#[inline(always)]
fn q6(b: &BlockQ6K, p: usize) -> i32 {
    let (n, r) = (p / 128, p % 128);
    let (quarter, l) = (r / 32, r % 32);
    let ql = &b.ql[64 * n..64 * n + 64];
    let qh = b.qh[32 * n + l];
    let lo = match quarter {
        0 => ql[l] & 0xF,
        1 => ql[l + 32] & 0xF,
        2 => ql[l] >> 4,
        _ => ql[l + 32] >> 4,
    };
    (lo | (((qh >> (2 * quarter)) & 3) << 4)) as i32
}

/// ggml `ggml_vec_dot_q6_K_q8_K`: `d·dA·Σ sc_j Σ (q − 32)·a` over 16 sub-blocks of 16.
fn dot_q6_k(row: &[u8], a: &Acts, t: usize) -> f32 {
    let (q8, d8) = (a.q(t), a.d(t));
    let mut sumf = 0f32;
    for ib in 0..d8.len() {
        let b: BlockQ6K = block(row, ib);
        let y = &q8[ib * QK_K..(ib + 1) * QK_K];
        let mut sumi = 0i32;
        for j in 0..QK_K / 16 {
            let mut s = 0i32;
            for p in 16 * j..16 * j + 16 {
                s += (q6(&b, p) - 32) * y[p] as i32;
            }
            sumi += b.scales[j] as i32 * s;
        }
        sumf += fp16_to_fp32(b.d) * d8[ib] * sumi as f32;
    }
    sumf
}

/// The 8 six-bit scales and 8 mins of a Q4_K/Q5_K block, unpacked as ggml's `utmp` trick does
/// (the same values as [`get_scale_min_k4`] for `j` in `0..8`).
#[inline(always)]
pub(crate) fn k4_scales_mins(scales: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    const K1: u32 = 0x3f3f_3f3f;
    const K2: u32 = 0x0f0f_0f0f;
    const K3: u32 = 0x0303_0303;
    let w = |i: usize| {
        u32::from_le_bytes([
            scales[4 * i],
            scales[4 * i + 1],
            scales[4 * i + 2],
            scales[4 * i + 3],
        ])
    };
    let (u0, u1, u2) = (w(0), w(1), w(2));
    let s0 = u0 & K1;
    let s1 = (u2 & K2) | (((u0 >> 6) & K3) << 4);
    let m0 = u1 & K1;
    let m1 = ((u2 >> 4) & K2) | (((u1 >> 6) & K3) << 4);
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    sc[..4].copy_from_slice(&s0.to_le_bytes());
    sc[4..].copy_from_slice(&s1.to_le_bytes());
    mn[..4].copy_from_slice(&m0.to_le_bytes());
    mn[4..].copy_from_slice(&m1.to_le_bytes());
    (sc, mn)
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn k4_scales_match_get_scale_min_k4() {
        let mut s = 0x1234_5678u32;
        for _ in 0..200 {
            let mut b = [0u8; 12];
            for v in &mut b {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                *v = (s >> 24) as u8;
            }
            let (sc, mn) = k4_scales_mins(&b);
            for j in 0..8 {
                assert_eq!((sc[j], mn[j]), get_scale_min_k4(j, &b));
            }
        }
    }
}
