//! wasm simd128 kernels (the browser's CPU path): tiles of weight rows × tokens as on x86, each
//! weight block unpacked once into 128-bit vectors and reused for every token of the tile.
//!
//! The integer block sums are exactly ggml's (and the scalar path's): quants are multiplied as i8
//! into i16 lanes (`i16x8_extmul_*_i8x16`), summed pairwise to i32 and scaled by the K-quants'
//! sub-block scales in the integer domain (`i32x4_dot_i16x8`). Weight offsets (Q4_0's `q − 8`,
//! Q5_0's `q − 16`, Q6_K's `q − 32`) are subtracted from the unpacked quants, which keeps every
//! i16 partial sum far from overflow. Only the float accumulation over blocks runs in another order
//! (four lanes), as on the other SIMD paths. Float weights (F32, F16, BF16) accumulate in the
//! scalar path's eight partial sums and in its order, so they give its bits. No relaxed-simd (not
//! enabled by default in browsers), hence no fused multiply-add.
//!
//! Also the activation quantisers for Q8_0 and Q8_K rows, bit-exact with the scalar ones, and the
//! sparse axpy over F32, F16, Q8_0 and Q4_0 rows, whose fused multiply-adds are emulated in f64
//! with the scalar path's rounding (so its bits).

// Index loops over the const-generic tile dimensions read more plainly than zipped iterators.
#![allow(clippy::needless_range_loop)]

use core::arch::wasm32::*;

use half::f16;

use crate::quant::{fp16_to_fp32, fp32_to_fp16, GgmlType, QK, QK_K};

use super::act::{quantize_q8k_block_scalar, Acts};
use super::scalar::k4_scales_mins;
use super::sparse::{axpy_scalar, AxpyKernel};
use super::{Kernel, NT};

/// The simd128 kernel for `ty`, if there is one.
pub(crate) fn kernel(ty: GgmlType) -> Option<Kernel> {
    use GgmlType::*;
    Some(match ty {
        F32 => tiled_kernel!(dot_f32),
        F16 => tiled_kernel!(dot_f16),
        BF16 => tiled_kernel!(dot_bf16),
        Q4_0 => tiled_kernel!(dot_q4_0),
        Q4_1 => tiled_kernel!(dot_q4_1),
        Q5_0 => tiled_kernel!(dot_q5_0),
        Q5_1 => tiled_kernel!(dot_q5_1),
        Q8_0 => tiled_kernel!(dot_q8_0),
        Q4_K => tiled_kernel!(dot_q4_k),
        Q5_K => tiled_kernel!(dot_q5_k),
        Q6_K => tiled_kernel!(dot_q6_k),
        _ => return None,
    })
}

/// 16 bytes at `p` (any alignment: wasm loads need none).
#[inline(always)]
unsafe fn load(p: *const u8) -> v128 {
    v128_load(p as *const v128)
}

/// The f16 at `p` (unaligned) as f32.
#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    fp16_to_fp32(f16::from_bits((p as *const u16).read_unaligned()))
}

/// Lane `k` of the result: `a[k]·b[k] + a[k+8]·b[k+8]` (i8 × i8 into i16; exact while the pair
/// sums stay within i16, which the callers' quant ranges guarantee).
#[inline(always)]
fn mul_i8_i16(a: v128, b: v128) -> v128 {
    i16x8_add(i16x8_extmul_low_i8x16(a, b), i16x8_extmul_high_i8x16(a, b))
}

/// Σ a·b over 16 i8 lanes as 4 i32 lanes (exact for any i8 values).
#[inline(always)]
fn dot_i8_i32(a: v128, b: v128) -> v128 {
    i32x4_add(
        i32x4_extadd_pairwise_i16x8(i16x8_extmul_low_i8x16(a, b)),
        i32x4_extadd_pairwise_i16x8(i16x8_extmul_high_i8x16(a, b)),
    )
}

/// Sum of 4 i32 lanes.
#[inline(always)]
fn hsum_i32(v: v128) -> i32 {
    i32x4_extract_lane::<0>(v)
        .wrapping_add(i32x4_extract_lane::<1>(v))
        .wrapping_add(i32x4_extract_lane::<2>(v))
        .wrapping_add(i32x4_extract_lane::<3>(v))
}

/// Sum of 4 f32 lanes.
#[inline(always)]
fn hsum_f32(v: v128) -> f32 {
    (f32x4_extract_lane::<0>(v) + f32x4_extract_lane::<1>(v))
        + (f32x4_extract_lane::<2>(v) + f32x4_extract_lane::<3>(v))
}

/// Largest of 4 f32 lanes (none of them a NaN).
#[inline(always)]
fn hmax_f32(v: v128) -> f32 {
    f32x4_extract_lane::<0>(v)
        .max(f32x4_extract_lane::<1>(v))
        .max(f32x4_extract_lane::<2>(v))
        .max(f32x4_extract_lane::<3>(v))
}

/// The low and high nibbles of 16 bytes (ggml's elements `0..16` and `16..32` of a block).
#[inline(always)]
fn nibbles(v: v128) -> (v128, v128) {
    (v128_and(v, u8x16_splat(0x0F)), u8x16_shr(v, 4))
}

/// The 32 bits of a Q5 block's `qh` → two times 16 bytes, `0x10` where the element's bit is set.
#[inline(always)]
fn bits_as_0x10(qh: u32) -> (v128, v128) {
    let v = u32x4_splat(qh);
    let bit = u8x16(1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128);
    let set = |bytes: v128| v128_and(i8x16_eq(v128_and(bytes, bit), bit), u8x16_splat(0x10));
    (
        set(i8x16_shuffle::<
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            1,
            1,
            1,
            1,
            1,
            1,
            1,
            1,
        >(v, v)),
        set(i8x16_shuffle::<
            2,
            2,
            2,
            2,
            2,
            2,
            2,
            2,
            3,
            3,
            3,
            3,
            3,
            3,
            3,
            3,
        >(v, v)),
    )
}

/// A 32-element block format's unpacker: the block's signed weights (elements `0..16`,
/// `16..32`, offset removed), its scale and its min (0 for formats without one).
type Unpack32 = unsafe fn(*const u8) -> (v128, v128, f32, f32);

/// The shared loop of the 32-element block formats over an R × N tile. `WIDE`: the weights span
/// the whole i8 range (Q8_0), so products are widened to i32 at once (narrower weights sum four
/// products in i16 first); `AFFINE` formats add `m · s` per block.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn dot_blocks32<const R: usize, const N: usize, const WIDE: bool, const AFFINE: bool>(
    w: *const u8,
    rb: usize,
    a: &Acts,
    t0: usize,
    out: &mut [f32],
    bb: usize,
    unpack: Unpack32,
) {
    let nb = rb / bb;
    let rows: [*const u8; R] = std::array::from_fn(|r| w.add(r * rb));
    let q: [*const u8; N] = std::array::from_fn(|t| a.q(t0 + t).as_ptr() as *const u8);
    let d8: [*const f32; N] = std::array::from_fn(|t| a.d(t0 + t).as_ptr());
    let s8: [*const f32; N] =
        std::array::from_fn(|t| if AFFINE { a.s(t0 + t).as_ptr() } else { d8[t] });
    let mut acc = [[f32x4_splat(0.0); N]; R];
    let mut accm = [[0f32; N]; R];
    for ib in 0..nb {
        let mut w0 = [i8x16_splat(0); R];
        let mut w1 = [i8x16_splat(0); R];
        let mut dw = [0f32; R];
        let mut mw = [0f32; R];
        for r in 0..R {
            (w0[r], w1[r], dw[r], mw[r]) = unpack(rows[r].add(ib * bb));
        }
        for t in 0..N {
            let qa = q[t].add(ib * QK);
            let (a0, a1) = (load(qa), load(qa.add(16)));
            let dy = *d8[t].add(ib);
            for r in 0..R {
                let s = if WIDE {
                    i32x4_add(dot_i8_i32(w0[r], a0), dot_i8_i32(w1[r], a1))
                } else {
                    i32x4_extadd_pairwise_i16x8(i16x8_add(
                        mul_i8_i16(w0[r], a0),
                        mul_i8_i16(w1[r], a1),
                    ))
                };
                acc[r][t] = f32x4_add(
                    acc[r][t],
                    f32x4_mul(f32x4_convert_i32x4(s), f32x4_splat(dw[r] * dy)),
                );
                if AFFINE {
                    accm[r][t] += mw[r] * *s8[t].add(ib);
                }
            }
        }
    }
    for r in 0..R {
        for t in 0..N {
            out[r * NT + t] = hsum_f32(acc[r][t]) + accm[r][t];
        }
    }
}

/// Defines `$name::<R, N>`, the tile kernel of a 32-element block format of `$bb` bytes.
macro_rules! fmt32_kernel {
    ($name:ident, $wide:expr, $affine:expr, $bb:expr, $unpack:expr) => {
        unsafe fn $name<const R: usize, const N: usize>(
            w: *const u8,
            rb: usize,
            a: &Acts,
            t0: usize,
            out: &mut [f32],
        ) {
            dot_blocks32::<R, N, $wide, $affine>(w, rb, a, t0, out, $bb, $unpack)
        }
    };
}

fmt32_kernel!(dot_q4_0, false, false, 18, |p| {
    let (lo, hi) = nibbles(load(p.add(2)));
    let eight = i8x16_splat(8);
    (i8x16_sub(lo, eight), i8x16_sub(hi, eight), f16_at(p), 0.0)
});
fmt32_kernel!(dot_q4_1, false, true, 20, |p| {
    let (lo, hi) = nibbles(load(p.add(4)));
    (lo, hi, f16_at(p), f16_at(p.add(2)))
});
fmt32_kernel!(dot_q5_0, false, false, 22, |p| {
    let (lo, hi) = nibbles(load(p.add(6)));
    let (h0, h1) = bits_as_0x10((p.add(2) as *const u32).read_unaligned());
    let sixteen = i8x16_splat(16);
    (
        i8x16_sub(v128_or(lo, h0), sixteen),
        i8x16_sub(v128_or(hi, h1), sixteen),
        f16_at(p),
        0.0,
    )
});
fmt32_kernel!(dot_q5_1, false, true, 24, |p| {
    let (lo, hi) = nibbles(load(p.add(8)));
    let (h0, h1) = bits_as_0x10((p.add(4) as *const u32).read_unaligned());
    (
        v128_or(lo, h0),
        v128_or(hi, h1),
        f16_at(p),
        f16_at(p.add(2)),
    )
});
fmt32_kernel!(dot_q8_0, true, false, 34, |p| (
    load(p.add(2)),
    load(p.add(18)),
    f16_at(p),
    0.0
));

/// `[m0, m0, m1, m1, m2, m2, m3, m3]` and the same for `m4..m8`, as i16 (each min twice, to pair
/// with the 16 `bsums`).
#[inline(always)]
fn mins_x2(mins: &[u8; 8]) -> (v128, v128) {
    let m = |i: usize| mins[i] as i16;
    (
        i16x8(m(0), m(0), m(1), m(1), m(2), m(2), m(3), m(3)),
        i16x8(m(4), m(4), m(5), m(5), m(6), m(6), m(7), m(7)),
    )
}

/// Shared Q4_K / Q5_K loop over an R × N tile; `HIGH` adds Q5_K's fifth bits.
#[inline(always)]
unsafe fn dot_k4<const R: usize, const N: usize, const HIGH: bool>(
    w: *const u8,
    rb: usize,
    a: &Acts,
    t0: usize,
    out: &mut [f32],
) {
    let bb = if HIGH { 176 } else { 144 };
    let qs_at = if HIGH { 48 } else { 16 };
    let nb = rb / bb;
    let rows: [*const u8; R] = std::array::from_fn(|r| w.add(r * rb));
    let q: [*const u8; N] = std::array::from_fn(|t| a.q(t0 + t).as_ptr() as *const u8);
    let d8: [*const f32; N] = std::array::from_fn(|t| a.d(t0 + t).as_ptr());
    let bs: [*const u8; N] = std::array::from_fn(|t| a.bsums(t0 + t).as_ptr() as *const u8);
    let mut acc = [[f32x4_splat(0.0); N]; R];
    let mut accm = [[0f32; N]; R];
    for ib in 0..nb {
        let mut acci = [[i32x4_splat(0); N]; R];
        let mut scales = [[0u8; 8]; R];
        for r in 0..R {
            let p = rows[r].add(ib * bb);
            let (sc, mins) = k4_scales_mins(&*(p.add(4) as *const [u8; 12]));
            scales[r] = sc;
            let (m0, m1) = mins_x2(&mins);
            let dmin = f16_at(p.add(2));
            for t in 0..N {
                // 16 i16 bsums = 32 bytes per block
                let b = bs[t].add(32 * ib);
                let summ = hsum_i32(i32x4_add(
                    i32x4_dot_i16x8(m0, load(b)),
                    i32x4_dot_i16x8(m1, load(b.add(16))),
                ));
                accm[r][t] += dmin * *d8[t].add(ib) * summ as f32;
            }
        }
        for k in 0..4 {
            for r in 0..R {
                let p = rows[r].add(ib * bb);
                let (mut l0, mut h0) = nibbles(load(p.add(qs_at + 32 * k)));
                let (mut l1, mut h1) = nibbles(load(p.add(qs_at + 32 * k + 16)));
                if HIGH {
                    // bit 2k of qh[l] is the fifth bit of sub-block 2k's element l, bit 2k+1
                    // that of sub-block 2k+1's
                    let bit = |v: v128, b: u32| {
                        v128_and(i8x16_shl(u8x16_shr(v, b), 4), u8x16_splat(0x10))
                    };
                    let (qh0, qh1) = (load(p.add(16)), load(p.add(32)));
                    let b = 2 * k as u32;
                    l0 = v128_or(l0, bit(qh0, b));
                    l1 = v128_or(l1, bit(qh1, b));
                    h0 = v128_or(h0, bit(qh0, b + 1));
                    h1 = v128_or(h1, bit(qh1, b + 1));
                }
                let s_lo = i16x8_splat(scales[r][2 * k] as i16);
                let s_hi = i16x8_splat(scales[r][2 * k + 1] as i16);
                for t in 0..N {
                    let qa = q[t].add(ib * QK_K + 64 * k);
                    // ≤ 4 · 31 · 127 per i16 lane
                    let p_lo =
                        i16x8_add(mul_i8_i16(l0, load(qa)), mul_i8_i16(l1, load(qa.add(16))));
                    let p_hi = i16x8_add(
                        mul_i8_i16(h0, load(qa.add(32))),
                        mul_i8_i16(h1, load(qa.add(48))),
                    );
                    let s = i32x4_add(i32x4_dot_i16x8(p_lo, s_lo), i32x4_dot_i16x8(p_hi, s_hi));
                    acci[r][t] = i32x4_add(acci[r][t], s);
                }
            }
        }
        for r in 0..R {
            let d = f16_at(rows[r].add(ib * bb));
            for t in 0..N {
                let scale = f32x4_splat(d * *d8[t].add(ib));
                acc[r][t] = f32x4_add(acc[r][t], f32x4_mul(f32x4_convert_i32x4(acci[r][t]), scale));
            }
        }
    }
    for r in 0..R {
        for t in 0..N {
            out[r * NT + t] = hsum_f32(acc[r][t]) - accm[r][t];
        }
    }
}

unsafe fn dot_q4_k<const R: usize, const N: usize>(
    w: *const u8,
    rb: usize,
    a: &Acts,
    t0: usize,
    out: &mut [f32],
) {
    dot_k4::<R, N, false>(w, rb, a, t0, out)
}

unsafe fn dot_q5_k<const R: usize, const N: usize>(
    w: *const u8,
    rb: usize,
    a: &Acts,
    t0: usize,
    out: &mut [f32],
) {
    dot_k4::<R, N, true>(w, rb, a, t0, out)
}

/// Q6_K over an R × N tile: the quants minus 32 as i8, products in i16, then the signed 8-bit
/// scale of each sub-block of 16 applied in i32.
unsafe fn dot_q6_k<const R: usize, const N: usize>(
    w: *const u8,
    rb: usize,
    a: &Acts,
    t0: usize,
    out: &mut [f32],
) {
    const BB: usize = 210;
    let nb = rb / BB;
    let rows: [*const u8; R] = std::array::from_fn(|r| w.add(r * rb));
    let q: [*const u8; N] = std::array::from_fn(|t| a.q(t0 + t).as_ptr() as *const u8);
    let d8: [*const f32; N] = std::array::from_fn(|t| a.d(t0 + t).as_ptr());
    let m4 = u8x16_splat(0x0F);
    let m30 = u8x16_splat(0x30);
    let off = i8x16_splat(32);
    let mut acc = [[f32x4_splat(0.0); N]; R];
    for ib in 0..nb {
        let mut acci = [[i32x4_splat(0); N]; R];
        for n in 0..2 {
            for g in 0..4 {
                for r in 0..R {
                    let p = rows[r].add(ib * BB);
                    let sc = p.add(192) as *const i8;
                    // elements 128n + 32g + l, l in 0..16 and 16..32 (sub-blocks j and j + 1)
                    let quants = |h: usize| {
                        let ql = load(p.add(64 * n + 32 * (g & 1) + 16 * h));
                        let qh = load(p.add(128 + 32 * n + 16 * h));
                        let lo = if g < 2 {
                            v128_and(ql, m4)
                        } else {
                            u8x16_shr(ql, 4)
                        };
                        let hb = match g {
                            0 => i8x16_shl(qh, 4),
                            1 => i8x16_shl(qh, 2),
                            2 => qh,
                            _ => u8x16_shr(qh, 2),
                        };
                        i8x16_sub(v128_or(lo, v128_and(hb, m30)), off)
                    };
                    let (u0, u1) = (quants(0), quants(1));
                    let j = 8 * n + 2 * g;
                    let s0 = i16x8_splat(*sc.add(j) as i16);
                    let s1 = i16x8_splat(*sc.add(j + 1) as i16);
                    for t in 0..N {
                        let qa = q[t].add(ib * QK_K + 128 * n + 32 * g);
                        let s = i32x4_add(
                            i32x4_dot_i16x8(mul_i8_i16(u0, load(qa)), s0),
                            i32x4_dot_i16x8(mul_i8_i16(u1, load(qa.add(16))), s1),
                        );
                        acci[r][t] = i32x4_add(acci[r][t], s);
                    }
                }
            }
        }
        for r in 0..R {
            let d = f16_at(rows[r].add(ib * BB + 208));
            for t in 0..N {
                let scale = f32x4_splat(d * *d8[t].add(ib));
                acc[r][t] = f32x4_add(acc[r][t], f32x4_mul(f32x4_convert_i32x4(acci[r][t]), scale));
            }
        }
    }
    for r in 0..R {
        for t in 0..N {
            out[r * NT + t] = hsum_f32(acc[r][t]);
        }
    }
}

/// Float rows over an R × N tile in the scalar path's order: eight partial sums (lanes 0..4 and
/// 4..8 of each step of 8), added in turn, then the tail. `load8(p)` gives the 8 weights at `p`
/// as two f32x4, `one(p)` the one at `p`; `esize` is the bytes per weight.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn dot_float<const R: usize, const N: usize>(
    w: *const u8,
    rb: usize,
    a: &Acts,
    t0: usize,
    out: &mut [f32],
    esize: usize,
    load8: unsafe fn(*const u8) -> (v128, v128),
    one: unsafe fn(*const u8) -> f32,
) {
    let n = rb / esize;
    let full = n / 8 * 8;
    let rows: [*const u8; R] = std::array::from_fn(|r| w.add(r * rb));
    let x: [*const f32; N] = std::array::from_fn(|t| a.f(t0 + t).as_ptr());
    let mut acc0 = [[f32x4_splat(0.0); N]; R];
    let mut acc1 = [[f32x4_splat(0.0); N]; R];
    let mut j = 0;
    while j < full {
        for r in 0..R {
            let (w0, w1) = load8(rows[r].add(j * esize));
            for t in 0..N {
                let xp = x[t].add(j) as *const u8;
                acc0[r][t] = f32x4_add(acc0[r][t], f32x4_mul(w0, load(xp)));
                acc1[r][t] = f32x4_add(acc1[r][t], f32x4_mul(w1, load(xp.add(16))));
            }
        }
        j += 8;
    }
    for r in 0..R {
        for t in 0..N {
            let (a0, a1) = (acc0[r][t], acc1[r][t]);
            let lanes = [
                f32x4_extract_lane::<0>(a0),
                f32x4_extract_lane::<1>(a0),
                f32x4_extract_lane::<2>(a0),
                f32x4_extract_lane::<3>(a0),
                f32x4_extract_lane::<0>(a1),
                f32x4_extract_lane::<1>(a1),
                f32x4_extract_lane::<2>(a1),
                f32x4_extract_lane::<3>(a1),
            ];
            let mut tail = 0f32;
            for k in full..n {
                tail += one(rows[r].add(k * esize)) * *x[t].add(k);
            }
            out[r * NT + t] = lanes.iter().sum::<f32>() + tail;
        }
    }
}

/// 4 f16 (in the low halves of u32 lanes) → f32, exactly (subnormals, infinities and NaNs too):
/// the magnitude bits moved to f32's place and scaled by 2^112, the exponent set to all ones
/// for infinities and NaNs, the sign put back.
#[inline(always)]
fn f16x4_to_f32(h: v128) -> v128 {
    let mag = v128_and(h, u32x4_splat(0x7fff));
    let shifted = i32x4_shl(mag, 13);
    let finite = f32x4_mul(shifted, f32x4_splat(f32::from_bits(0x7780_0000))); // 2^112
    let special = v128_or(shifted, u32x4_splat(0x7f80_0000));
    let is_special = i32x4_ge(mag, i32x4_splat(0x7c00));
    let sign = i32x4_shl(v128_and(h, u32x4_splat(0x8000)), 16);
    v128_or(v128_bitselect(special, finite, is_special), sign)
}

unsafe fn dot_f32<const R: usize, const N: usize>(
    w: *const u8,
    rb: usize,
    a: &Acts,
    t0: usize,
    out: &mut [f32],
) {
    dot_float::<R, N>(
        w,
        rb,
        a,
        t0,
        out,
        4,
        |p| (load(p), load(p.add(16))),
        |p| (p as *const f32).read_unaligned(),
    )
}

unsafe fn dot_f16<const R: usize, const N: usize>(
    w: *const u8,
    rb: usize,
    a: &Acts,
    t0: usize,
    out: &mut [f32],
) {
    dot_float::<R, N>(
        w,
        rb,
        a,
        t0,
        out,
        2,
        |p| {
            let h = load(p);
            (
                f16x4_to_f32(u32x4_extend_low_u16x8(h)),
                f16x4_to_f32(u32x4_extend_high_u16x8(h)),
            )
        },
        |p| f16_at(p),
    )
}

unsafe fn dot_bf16<const R: usize, const N: usize>(
    w: *const u8,
    rb: usize,
    a: &Acts,
    t0: usize,
    out: &mut [f32],
) {
    dot_float::<R, N>(
        w,
        rb,
        a,
        t0,
        out,
        2,
        |p| {
            let h = load(p);
            (
                i32x4_shl(u32x4_extend_low_u16x8(h), 16),
                i32x4_shl(u32x4_extend_high_u16x8(h), 16),
            )
        },
        |p| f32::from_bits(((p as *const u16).read_unaligned() as u32) << 16),
    )
}

/// 4 f32 lanes of `x` from `i` (in bounds: `i + 4 <= x.len()`).
#[inline(always)]
fn load_f32x4(x: &[f32], i: usize) -> v128 {
    let v = &x[i..i + 4];
    // SAFETY: v holds 4 f32 (16 bytes); wasm loads need no alignment.
    unsafe { v128_load(v.as_ptr() as *const v128) }
}

/// The largest magnitude of `x` (a whole number of 4-lane groups) ignoring NaNs, as the scalar
/// `fold(0.0, max(|v|))` does (`pmax` keeps its first operand when the second is a NaN); and
/// whether there was a NaN.
#[inline(always)]
fn absmax_nan(x: &[f32]) -> (f32, bool) {
    let mut m = f32x4_splat(0.0);
    let mut nan = i32x4_splat(0);
    for i in (0..x.len()).step_by(4) {
        let v = load_f32x4(x, i);
        m = f32x4_pmax(m, f32x4_abs(v));
        nan = v128_or(nan, f32x4_ne(v, v));
    }
    (hmax_f32(m), v128_any_true(nan))
}

/// 16 i32 lanes → 16 i8 with saturation (the scalar path's clamp to −128..=127).
#[inline(always)]
fn narrow_i32_i8(v: [v128; 4]) -> v128 {
    i8x16_narrow_i16x8(
        i16x8_narrow_i32x4(v[0], v[1]),
        i16x8_narrow_i32x4(v[2], v[3]),
    )
}

/// Stores 16 bytes at the start of `q` (at least 16 long).
#[inline(always)]
fn store16(q: &mut [i8], v: v128) {
    let q = &mut q[..16];
    // SAFETY: q holds 16 bytes; wasm stores need no alignment.
    unsafe { v128_store(q.as_mut_ptr() as *mut v128, v) }
}

/// ggml's x86 `quantize_row_q8_0` for one token row, bit-exact with the scalar path: quants
/// `round_half_even(x · 127 / amax)`, f16-rounded scales, and the sums of the stored quants.
pub(crate) fn quantize_q8_0_row(x: &[f32], q: &mut [i8], d: &mut [f32], isum: &mut [i32]) {
    for (((x, q), d), isum) in x
        .chunks_exact(QK)
        .zip(q.chunks_exact_mut(QK))
        .zip(d.iter_mut())
        .zip(isum.iter_mut())
    {
        let (amax, _) = absmax_nan(x);
        *d = fp16_to_fp32(fp32_to_fp16(amax / 127.0));
        let id = f32x4_splat(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        // nearest rounds half to even; trunc_sat gives 0 for a NaN and saturates, as `as i32`
        let quant =
            |i: usize| i32x4_trunc_sat_f32x4(f32x4_nearest(f32x4_mul(load_f32x4(x, i), id)));
        let mut sum = i32x4_splat(0);
        for h in 0..2 {
            let b = narrow_i32_i8(std::array::from_fn(|k| quant(16 * h + 4 * k)));
            store16(&mut q[16 * h..], b);
            sum = i32x4_add(
                sum,
                i32x4_extadd_pairwise_i16x8(i16x8_extadd_pairwise_i8x16(b)),
            );
        }
        *isum = hsum_i32(sum);
    }
}

/// ggml's `quantize_row_q8_K_ref` for one token row, bit-exact: the scale from the first value of
/// largest magnitude (`iscale = −127 / max`), quants `min(127, round_half_even(iscale · x))`,
/// `d = 1 / iscale`, and the sums of each 16 quants. Blocks that are all zero or hold a NaN or an
/// infinity take the reference quantiser.
pub(crate) fn quantize_q8k_row(x: &[f32], q: &mut [i8], d: &mut [f32], bsums: &mut [i16]) {
    for (((x, q), d), bsums) in x
        .chunks_exact(QK_K)
        .zip(q.chunks_exact_mut(QK_K))
        .zip(d.iter_mut())
        .zip(bsums.chunks_exact_mut(16))
    {
        let (amax, nan) = absmax_nan(x);
        if !(amax > 0.0 && amax.is_finite()) || nan {
            quantize_q8k_block_scalar(x, q, d, bsums);
            continue;
        }
        let max = *x
            .iter()
            .find(|v| v.abs() == amax)
            .expect("amax is the magnitude of a value of the block");
        let iscale = -127.0 / max;
        let sc = f32x4_splat(iscale);
        let top = i32x4_splat(127);
        for (j, bsum) in bsums.iter_mut().enumerate() {
            let v: [v128; 4] = std::array::from_fn(|k| {
                let scaled = f32x4_mul(load_f32x4(x, 16 * j + 4 * k), sc);
                i32x4_min(i32x4_trunc_sat_f32x4(f32x4_nearest(scaled)), top)
            });
            *bsum = hsum_i32(i32x4_add(i32x4_add(v[0], v[1]), i32x4_add(v[2], v[3]))) as i16;
            store16(&mut q[16 * j..], narrow_i32_i8(v));
        }
        *d = 1.0 / iscale;
    }
}

/// The sparse axpy kernel (see `sparse::AxpyKernel`) for rows of `ty`, if there is one: F32,
/// F16, Q8_0 and Q4_0 rows.
pub(crate) fn axpy_kernel(ty: GgmlType) -> Option<AxpyKernel> {
    Some(match ty {
        GgmlType::F32 => axpy::<F32Rows>,
        GgmlType::F16 => axpy::<F16Rows>,
        GgmlType::Q8_0 => axpy::<Q8_0Rows>,
        GgmlType::Q4_0 => axpy::<Q4_0Rows>,
        _ => return None,
    })
}

/// A row format whose 32-element groups the axpy decodes to exact f32 values.
trait Rows32 {
    /// Bytes per 32 elements.
    const BB: usize;
    /// The 32 values at `p`, as 8 × f32x4 (exactly the scalar dequantisation's values).
    unsafe fn decode(p: *const u8) -> [v128; 8];
}

/// F32 rows.
struct F32Rows;
/// F16 rows.
struct F16Rows;
/// Q8_0 rows.
struct Q8_0Rows;
/// Q4_0 rows.
struct Q4_0Rows;

impl Rows32 for F32Rows {
    const BB: usize = 128;
    unsafe fn decode(p: *const u8) -> [v128; 8] {
        std::array::from_fn(|k| load(p.add(16 * k)))
    }
}

impl Rows32 for F16Rows {
    const BB: usize = 64;
    unsafe fn decode(p: *const u8) -> [v128; 8] {
        let h: [v128; 4] = std::array::from_fn(|k| load(p.add(16 * k)));
        std::array::from_fn(|k| {
            let v = h[k / 2];
            f16x4_to_f32(if k % 2 == 0 {
                u32x4_extend_low_u16x8(v)
            } else {
                u32x4_extend_high_u16x8(v)
            })
        })
    }
}

/// 32 signed 8-bit quants (two vectors) times the f16 scale at `p`, as 8 × f32x4 (exact: an
/// 11-bit by 8-bit product).
#[inline(always)]
unsafe fn scaled_i8(q: [v128; 2], p: *const u8) -> [v128; 8] {
    let d = f32x4_splat(f16_at(p));
    std::array::from_fn(|k| {
        let v = q[k / 4];
        let h = if k % 4 < 2 {
            i16x8_extend_low_i8x16(v)
        } else {
            i16x8_extend_high_i8x16(v)
        };
        let i = if k % 2 == 0 {
            i32x4_extend_low_i16x8(h)
        } else {
            i32x4_extend_high_i16x8(h)
        };
        f32x4_mul(d, f32x4_convert_i32x4(i))
    })
}

impl Rows32 for Q8_0Rows {
    const BB: usize = 34;
    unsafe fn decode(p: *const u8) -> [v128; 8] {
        scaled_i8([load(p.add(2)), load(p.add(18))], p)
    }
}

impl Rows32 for Q4_0Rows {
    const BB: usize = 18;
    unsafe fn decode(p: *const u8) -> [v128; 8] {
        let (lo, hi) = nibbles(load(p.add(2)));
        let eight = i8x16_splat(8);
        scaled_i8([i8x16_sub(lo, eight), i8x16_sub(hi, eight)], p)
    }
}

/// `fma(c, w, o)` lane by lane, rounded exactly as `f32::mul_add` (wasm has a fused multiply-add
/// only in relaxed-simd, whose rounding is not fixed). `c · w` is exact in f64, and `c · w + o`
/// rounded to f64 and then to f32 is the correctly rounded result unless the f64 sum sits exactly
/// halfway between two f32 values or below f32's normal range (musl's `fmaf` argument); the rare
/// vectors with such a lane take `f32::mul_add`.
#[inline(always)]
fn fma4(c: f32, w: v128, o: v128) -> v128 {
    let cd = f64x2_splat(c as f64);
    let sum = |w: v128, o: v128| {
        f64x2_add(
            f64x2_mul(cd, f64x2_promote_low_f32x4(w)),
            f64x2_promote_low_f32x4(o),
        )
    };
    let lo = sum(w, o);
    let hi = sum(
        i32x4_shuffle::<2, 3, 0, 1>(w, w),
        i32x4_shuffle::<2, 3, 0, 1>(o, o),
    );
    let doubtful = |s: v128| {
        let halfway = i64x2_eq(
            v128_and(s, i64x2_splat(0x1fff_ffff)),
            i64x2_splat(0x1000_0000),
        );
        let small = v128_and(
            f64x2_lt(f64x2_abs(s), f64x2_splat(f32::MIN_POSITIVE as f64)),
            f64x2_ne(s, f64x2_splat(0.0)),
        );
        v128_or(halfway, small)
    };
    if v128_any_true(v128_or(doubtful(lo), doubtful(hi))) {
        let w = [
            f32x4_extract_lane::<0>(w),
            f32x4_extract_lane::<1>(w),
            f32x4_extract_lane::<2>(w),
            f32x4_extract_lane::<3>(w),
        ];
        let o = [
            f32x4_extract_lane::<0>(o),
            f32x4_extract_lane::<1>(o),
            f32x4_extract_lane::<2>(o),
            f32x4_extract_lane::<3>(o),
        ];
        return f32x4(
            c.mul_add(w[0], o[0]),
            c.mul_add(w[1], o[1]),
            c.mul_add(w[2], o[2]),
            c.mul_add(w[3], o[3]),
        );
    }
    i32x4_shuffle::<0, 1, 4, 5>(f32x4_demote_f64x2_zero(lo), f32x4_demote_f64x2_zero(hi))
}

/// The simd128 sparse axpy over a row segment of `F` (see `sparse::AxpyKernel` for the contract):
/// each 32-element group decoded once, then `out = fma(coef, w, out)` for every token in turn;
/// the float formats' last < 32 values by the scalar kernel.
unsafe fn axpy<F: Rows32>(
    ty: GgmlType,
    seg: *const u8,
    n: usize,
    coefs: &[f32],
    toks: &[u32],
    out: *mut f32,
    stride: usize,
) {
    let nblk = n / QK;
    for b in 0..nblk {
        let w = F::decode(seg.add(b * F::BB));
        for (&c, &t) in coefs.iter().zip(toks) {
            let o = out.add(t as usize * stride + b * QK) as *mut u8;
            for (k, &w) in w.iter().enumerate() {
                let p = o.add(16 * k);
                v128_store(p as *mut v128, fma4(c, w, load(p)));
            }
        }
    }
    if nblk * QK < n {
        let done = nblk * QK;
        axpy_scalar(
            ty,
            seg.add(nblk * F::BB),
            n - done,
            coefs,
            toks,
            out.add(done),
            stride,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::tests::Rng;

    /// `fma4` against `f32::mul_add` lane by lane, bit for bit.
    fn check(c: f32, w: [f32; 4], o: [f32; 4]) {
        let got = fma4(
            c,
            f32x4(w[0], w[1], w[2], w[3]),
            f32x4(o[0], o[1], o[2], o[3]),
        );
        let got = [
            f32x4_extract_lane::<0>(got),
            f32x4_extract_lane::<1>(got),
            f32x4_extract_lane::<2>(got),
            f32x4_extract_lane::<3>(got),
        ];
        for k in 0..4 {
            assert_eq!(
                got[k].to_bits(),
                c.mul_add(w[k], o[k]).to_bits(),
                "fma({c:e}, {:e}, {:e})",
                w[k],
                o[k]
            );
        }
    }

    #[test]
    fn emulated_fma_rounds_as_mul_add() {
        // c·w + o = 1 + 3·2^-24 − 2^-54: rounded to f64 it is the midpoint between 1 + 2^-23 and
        // 1 + 2^-22, which a second rounding would send to the even 1 + 2^-22; fused, 1 + 2^-23
        let (c, w, o) = (
            1.0 + 2f32.powi(-15),
            2f32.powi(-24) * (1.0 - 2f32.powi(-15)),
            1.0 + 2f32.powi(-23),
        );
        let naive = (c as f64 * w as f64 + o as f64) as f32;
        assert_ne!(naive, c.mul_add(w, o), "the case must need the fallback");
        check(c, [w, -w, w, 0.5], [o, -o, 1.0, 0.25]);
        // results below f32's normal range, zeros, infinities
        check(
            2f32.powi(-70),
            [2f32.powi(-70), -2f32.powi(-75), 0.0, 1.0],
            [f32::from_bits(3), 0.0, -0.0, f32::INFINITY],
        );
        let mut rng = Rng(0x5eed_f3a);
        for i in 0..200_000 {
            let scale = 2f32.powi(rng.int(-30, 30));
            let c = rng.f() * scale;
            let w: [f32; 4] =
                std::array::from_fn(|_| rng.f() * if i % 3 == 0 { 1.0 } else { 1e-4 });
            let o: [f32; 4] = std::array::from_fn(|_| rng.f() * scale);
            check(c, w, o);
        }
    }
}
