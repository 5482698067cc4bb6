//! ggml's reference quantisers (`quantize_row_*_ref`), one block at a time and bit-exact (same order
//! of float operations, same integer truncations), and the row driver behind [`super::quantize`].

// Index loops mirror ggml's reference code line for line, which keeps the bit-exactness reviewable.
#![allow(clippy::needless_range_loop)]

use bytemuck::Zeroable;
use half::{bf16, f16};

use super::blocks::*;
use super::float::{fp16_to_fp32, fp32_to_bf16, fp32_to_fp16};
use super::kquants::{
    get_scale_min_k4, make_q3_quants, make_qkx2_quants, make_qx_quants, nearest_int, Qkx2Search,
    GROUP_MAX_EPS,
};

/// A block that ggml's reference quantiser can build from [`Block::ELEMS`] f32 values.
pub trait QuantizeBlock: Block {
    /// Quantises `x[..Self::ELEMS]` (panics if `x` is shorter).
    fn quantize(x: &[f32]) -> Self;
}

/// Quantises `src` into the whole blocks of `dst` (lengths checked by the caller).
pub(crate) fn quantize_blocks<B: QuantizeBlock>(src: &[f32], dst: &mut [u8]) {
    let size = std::mem::size_of::<B>();
    debug_assert_eq!(dst.len() / size * B::ELEMS, src.len());
    match bytemuck::try_cast_slice_mut::<u8, B>(dst) {
        Ok(blocks) => {
            for (b, x) in blocks.iter_mut().zip(src.chunks_exact(B::ELEMS)) {
                *b = B::quantize(x);
            }
        }
        Err(_) => {
            for (out, x) in dst.chunks_exact_mut(size).zip(src.chunks_exact(B::ELEMS)) {
                out.copy_from_slice(bytemuck::bytes_of(&B::quantize(x)));
            }
        }
    }
}

impl QuantizeBlock for f32 {
    #[inline]
    fn quantize(x: &[f32]) -> Self {
        x[0]
    }
}

impl QuantizeBlock for f16 {
    #[inline]
    fn quantize(x: &[f32]) -> Self {
        fp32_to_fp16(x[0])
    }
}

impl QuantizeBlock for bf16 {
    #[inline]
    fn quantize(x: &[f32]) -> Self {
        fp32_to_bf16(x[0])
    }
}

/// The first value of largest magnitude in `x` (ggml's `max` beside `amax`), or 0.
#[inline]
fn signed_absmax(x: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// `(min, max)` of `x`, starting from `(f32::MAX, -f32::MAX)` as ggml does.
#[inline]
fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// ggml's `d ? 1.0f/d : 0.0f`.
#[inline]
fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

impl QuantizeBlock for BlockQ4_0 {
    fn quantize(x: &[f32]) -> Self {
        let x = &x[..QK];
        let d = signed_absmax(x) / -8.0;
        let id = inverse(d);
        let mut b = BlockQ4_0 {
            d: fp32_to_fp16(d),
            qs: [0; QK / 2],
        };
        for j in 0..QK / 2 {
            let q0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
            let q1 = ((x[j + QK / 2] * id + 8.5) as i8).min(15) as u8;
            b.qs[j] = q0 | (q1 << 4);
        }
        b
    }
}

impl QuantizeBlock for BlockQ4_1 {
    fn quantize(x: &[f32]) -> Self {
        let x = &x[..QK];
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = inverse(d);
        let mut b = BlockQ4_1 {
            d: fp32_to_fp16(d),
            m: fp32_to_fp16(min),
            qs: [0; QK / 2],
        };
        for j in 0..QK / 2 {
            let q0 = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
            let q1 = (((x[j + QK / 2] - min) * id + 0.5) as i8).min(15) as u8;
            b.qs[j] = q0 | (q1 << 4);
        }
        b
    }
}

/// Packs 32 five-bit quants as Q5_0/Q5_1 store them: `(qh, qs)`.
#[inline]
fn pack_q5(q: impl Fn(usize) -> u8) -> ([u8; 4], [u8; QK / 2]) {
    let mut qh = 0u32;
    let mut qs = [0u8; QK / 2];
    for j in 0..QK / 2 {
        let (q0, q1) = (q(j), q(j + QK / 2));
        qs[j] = (q0 & 0x0F) | ((q1 & 0x0F) << 4);
        qh |= (((q0 & 0x10) >> 4) as u32) << j;
        qh |= (((q1 & 0x10) >> 4) as u32) << (j + QK / 2);
    }
    (qh.to_le_bytes(), qs)
}

impl QuantizeBlock for BlockQ5_0 {
    fn quantize(x: &[f32]) -> Self {
        let x = &x[..QK];
        let d = signed_absmax(x) / -16.0;
        let id = inverse(d);
        let (qh, qs) = pack_q5(|j| ((x[j] * id + 16.5) as i8).min(31) as u8);
        BlockQ5_0 {
            d: fp32_to_fp16(d),
            qh,
            qs,
        }
    }
}

impl QuantizeBlock for BlockQ5_1 {
    fn quantize(x: &[f32]) -> Self {
        let x = &x[..QK];
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = inverse(d);
        let (qh, qs) = pack_q5(|j| ((x[j] - min) * id + 0.5) as u8);
        BlockQ5_1 {
            d: fp32_to_fp16(d),
            m: fp32_to_fp16(min),
            qh,
            qs,
        }
    }
}

/// ggml's Q8_0/Q8_1 scale: `(d, 1/d)` with `d = amax / 127`.
#[inline]
fn q8_scale(x: &[f32]) -> (f32, f32) {
    let amax = x.iter().fold(0.0f32, |a, &v| a.max(v.abs()));
    let d = amax / 127.0;
    (d, inverse(d))
}

impl QuantizeBlock for BlockQ8_0 {
    fn quantize(x: &[f32]) -> Self {
        let x = &x[..QK];
        let (d, id) = q8_scale(x);
        let mut b = BlockQ8_0 {
            d: fp32_to_fp16(d),
            qs: [0; QK],
        };
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = (v * id).round() as i8;
        }
        b
    }
}

impl QuantizeBlock for BlockQ8_1 {
    fn quantize(x: &[f32]) -> Self {
        let x = &x[..QK];
        let (d, id) = q8_scale(x);
        let mut qs = [0i8; QK];
        let mut sum = 0i32;
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = (v * id).round() as i8;
            sum += *q as i32;
        }
        BlockQ8_1 {
            d: fp32_to_fp16(d),
            s: fp32_to_fp16(sum as f32 * d),
            qs,
        }
    }
}

/// Packs 256 two-bit quants as Q2_K and Q3_K store them: for each 128, byte `l` holds values
/// `l`, `l + 32`, `l + 64`, `l + 96` from the low bits up.
#[inline]
fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8; QK_K / 4]) {
    for j in (0..QK_K).step_by(128) {
        for i in 0..32 {
            qs[j / 4 + i] =
                l[j + i] | (l[j + i + 32] << 2) | (l[j + i + 64] << 4) | (l[j + i + 96] << 6);
        }
    }
}

impl QuantizeBlock for BlockQ2K {
    fn quantize(x: &[f32]) -> Self {
        let x = &x[..QK_K];
        const Q4SCALE: f32 = 15.0;
        let mut b = BlockQ2K::zeroed();
        let mut l = [0u8; QK_K];
        let mut weights = [0.0f32; 16];
        let mut mins = [0.0f32; QK_K / 16];
        let mut scales = [0.0f32; QK_K / 16];
        let search = Qkx2Search {
            rmin: -0.5,
            rdelta: 0.1,
            nstep: 15,
            use_mad: true,
        };
        let mut max_scale = 0.0f32;
        let mut max_min = 0.0f32;
        for j in 0..QK_K / 16 {
            let xs = &x[16 * j..16 * j + 16];
            for (w, &v) in weights.iter_mut().zip(xs) {
                *w = v.abs();
            }
            (scales[j], mins[j]) = make_qkx2_quants(3, xs, &weights, &mut l[16 * j..], search);
            if scales[j] > max_scale {
                max_scale = scales[j];
            }
            if mins[j] > max_min {
                max_min = mins[j];
            }
        }
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for j in 0..QK_K / 16 {
                b.scales[j] = nearest_int(iscale * scales[j]) as u8;
            }
            b.d = fp32_to_fp16(max_scale / Q4SCALE);
        } else {
            b.d = fp32_to_fp16(0.0);
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for j in 0..QK_K / 16 {
                b.scales[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
            }
            b.dmin = fp32_to_fp16(max_min / Q4SCALE);
        } else {
            b.dmin = fp32_to_fp16(0.0);
        }
        for j in 0..QK_K / 16 {
            let d = fp16_to_fp32(b.d) * (b.scales[j] & 0xF) as f32;
            if d == 0.0 {
                continue;
            }
            let dm = fp16_to_fp32(b.dmin) * (b.scales[j] >> 4) as f32;
            for ii in 0..16 {
                l[16 * j + ii] = nearest_int((x[16 * j + ii] + dm) / d).clamp(0, 3) as u8;
            }
        }
        pack_2bit(&l, &mut b.qs);
        b
    }
}

impl QuantizeBlock for BlockQ3K {
    fn quantize(x: &[f32]) -> Self {
        let x = &x[..QK_K];
        let mut b = BlockQ3K::zeroed();
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; QK_K / 16];
        let mut max_scale = 0.0f32;
        let mut amax = 0.0f32;
        for j in 0..QK_K / 16 {
            scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..], true);
            let scale = scales[j].abs();
            if scale > amax {
                amax = scale;
                max_scale = scales[j];
            }
        }
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for j in 0..QK_K / 16 {
                let q = nearest_int(iscale * scales[j]) as i8;
                let q = (q.clamp(-32, 31) + 32) as u8;
                if j < 8 {
                    b.scales[j] = q & 0xF;
                } else {
                    b.scales[j - 8] |= (q & 0xF) << 4;
                }
                b.scales[j % 4 + 8] |= (q >> 4) << (2 * (j / 4));
            }
            b.d = fp32_to_fp16(1.0 / iscale);
        } else {
            b.d = fp32_to_fp16(0.0);
        }
        for j in 0..QK_K / 16 {
            let sc = super::dequant::q3k_scale(&b.scales, j) as i32 - 32;
            let d = fp16_to_fp32(b.d) * sc as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                l[16 * j + ii] = (nearest_int(x[16 * j + ii] / d).clamp(-4, 3) + 4) as i8;
            }
        }
        // the third bit of value j goes to bit j / 32 of hmask[j % 32]
        let mut lu = [0u8; QK_K];
        for (j, (&v, u)) in l.iter().zip(lu.iter_mut()).enumerate() {
            if v > 3 {
                b.hmask[j % 32] |= 1 << (j / 32);
                *u = (v - 4) as u8;
            } else {
                *u = v as u8;
            }
        }
        pack_2bit(&lu, &mut b.qs);
        b
    }
}

/// The sub-block scales and mins search shared by Q4_K and Q5_K: fills `l` (quants in `0..=nmax`)
/// and returns the packed 6-bit `scales`, `d` and `dmin`.
fn quantize_k4_scales(
    x: &[f32],
    nmax: i32,
    search: Qkx2Search,
    l: &mut [u8; QK_K],
) -> ([u8; K_SCALE_SIZE], f16, f16) {
    let mut weights = [0.0f32; 32];
    let mut mins = [0.0f32; QK_K / 32];
    let mut scales = [0.0f32; QK_K / 32];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..QK_K / 32 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        (scales[j], mins[j]) = make_qkx2_quants(nmax, xs, &weights, &mut l[32 * j..], search);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; K_SCALE_SIZE];
    for j in 0..QK_K / 32 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let d = fp32_to_fp16(max_scale / 63.0);
    let dmin = fp32_to_fp16(max_min / 63.0);
    for j in 0..QK_K / 32 {
        let (sc, m) = get_scale_min_k4(j, &packed);
        let d = fp16_to_fp32(d) * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = fp16_to_fp32(dmin) * m as f32;
        for ii in 0..32 {
            l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, nmax) as u8;
        }
    }
    (packed, d, dmin)
}

impl QuantizeBlock for BlockQ4K {
    fn quantize(x: &[f32]) -> Self {
        let x = &x[..QK_K];
        let mut l = [0u8; QK_K];
        let search = Qkx2Search {
            rmin: -1.0,
            rdelta: 0.1,
            nstep: 20,
            use_mad: false,
        };
        let (scales, d, dmin) = quantize_k4_scales(x, 15, search, &mut l);
        let mut b = BlockQ4K {
            d,
            dmin,
            scales,
            qs: [0; QK_K / 2],
        };
        for (k, q) in b.qs.chunks_exact_mut(32).enumerate() {
            for (i, q) in q.iter_mut().enumerate() {
                *q = l[64 * k + i] | (l[64 * k + i + 32] << 4);
            }
        }
        b
    }
}

impl QuantizeBlock for BlockQ5K {
    fn quantize(x: &[f32]) -> Self {
        let x = &x[..QK_K];
        let mut l = [0u8; QK_K];
        let search = Qkx2Search {
            rmin: -0.5,
            rdelta: 0.1,
            nstep: 15,
            use_mad: false,
        };
        let (scales, d, dmin) = quantize_k4_scales(x, 31, search, &mut l);
        let mut b = BlockQ5K {
            d,
            dmin,
            scales,
            qh: [0; QK_K / 8],
            qs: [0; QK_K / 2],
        };
        for (k, ql) in b.qs.chunks_exact_mut(32).enumerate() {
            let (m1, m2) = (1u8 << (2 * k), 2u8 << (2 * k));
            for j in 0..32 {
                let mut l1 = l[64 * k + j];
                if l1 > 15 {
                    l1 -= 16;
                    b.qh[j] |= m1;
                }
                let mut l2 = l[64 * k + j + 32];
                if l2 > 15 {
                    l2 -= 16;
                    b.qh[j] |= m2;
                }
                ql[j] = l1 | (l2 << 4);
            }
        }
        b
    }
}

impl QuantizeBlock for BlockQ6K {
    fn quantize(x: &[f32]) -> Self {
        let x = &x[..QK_K];
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; QK_K / 16];
        let mut max_scale = 0.0f32;
        let mut max_abs_scale = 0.0f32;
        for ib in 0..QK_K / 16 {
            let scale = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..], 1, None);
            scales[ib] = scale;
            if scale.abs() > max_abs_scale {
                max_abs_scale = scale.abs();
                max_scale = scale;
            }
        }
        let mut b = BlockQ6K::zeroed();
        if max_abs_scale < GROUP_MAX_EPS {
            b.d = fp32_to_fp16(0.0);
            return b;
        }
        let iscale = -128.0 / max_scale;
        b.d = fp32_to_fp16(1.0 / iscale);
        for (s, &scale) in b.scales.iter_mut().zip(&scales) {
            *s = nearest_int(iscale * scale).min(127) as i8;
        }
        for j in 0..QK_K / 16 {
            let d = fp16_to_fp32(b.d) * b.scales[j] as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                l[16 * j + ii] = (nearest_int(x[16 * j + ii] / d).clamp(-32, 31) + 32) as i8;
            }
        }
        for n in 0..2 {
            let (j, ql, qh) = (
                128 * n,
                &mut b.ql[64 * n..64 * n + 64],
                &mut b.qh[32 * n..32 * n + 32],
            );
            let lv = |i: usize| l[j + i] as u8;
            for i in 0..32 {
                ql[i] = (lv(i) & 0xF) | ((lv(i + 64) & 0xF) << 4);
                ql[i + 32] = (lv(i + 32) & 0xF) | ((lv(i + 96) & 0xF) << 4);
                qh[i] = (lv(i) >> 4)
                    | ((lv(i + 32) >> 4) << 2)
                    | ((lv(i + 64) >> 4) << 4)
                    | ((lv(i + 96) >> 4) << 6);
            }
        }
        b
    }
}

impl QuantizeBlock for BlockQ8K {
    fn quantize(x: &[f32]) -> Self {
        let x = &x[..QK_K];
        let mut b = BlockQ8K::zeroed();
        let mut max = 0.0f32;
        let mut amax = 0.0f32;
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            return b;
        }
        let iscale = -127.0 / max;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (s, q) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = q.iter().map(|&q| q as i32).sum::<i32>() as i16;
        }
        b.d = 1.0 / iscale;
        b
    }
}
