//! AVX2 + FMA + F16C kernels: one weight row × up to [`NT`] tokens per call, each weight block
//! unpacked once and reused for every token.
//!
//! The integer block sums are exactly ggml's. Weights with an offset (Q4_0's `q − 8`, Q5_0's
//! `q − 16`, Q6_K's `q − 32`) are multiplied unsigned (`maddubs`) and the offset is removed in the
//! integer domain with the activation block sums, before any conversion to float.

// Index loops over the const-generic tile dimensions read more plainly than zipped iterators.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::quant::{GgmlType, QK, QK_K};

use super::act::Acts;
use super::scalar::k4_scales_mins;
use super::{Kernel, RowsKernel, NT};

/// The AVX2 kernel for `ty`, if there is one.
pub(crate) fn kernel(ty: GgmlType) -> Option<Kernel> {
    use GgmlType::*;
    Some(match ty {
        F32 => tiled_kernel!(dot_f32, token_pairs),
        F16 => tiled_kernel!(dot_f16, token_pairs),
        BF16 => tiled_kernel!(dot_bf16, token_pairs),
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

/// The AVX2 [`RowsKernel`] for `ty`, if there is one (the 32-element block and float formats).
pub(crate) fn rows_kernel(ty: GgmlType) -> Option<RowsKernel> {
    macro_rules! by_count {
        ($f:ident) => {{
            unsafe fn k(rows: &[*const u8], a: &Acts, t: usize, n: usize, out: &mut [f32]) {
                // SAFETY: selected for CPUs with AVX2 (see `Level::available`); the caller passes
                // whole rows of `n` values and a token of `a` (see `RowsKernel`).
                unsafe {
                    match rows.len() {
                        1 => $f::<1>(rows, a, t, n, out),
                        2 => $f::<2>(rows, a, t, n, out),
                        3 => $f::<3>(rows, a, t, n, out),
                        _ => $f::<4>(rows, a, t, n, out),
                    }
                }
            }
            k as RowsKernel
        }};
    }
    use GgmlType::*;
    Some(match ty {
        Q4_0 => by_count!(rows_q4_0),
        Q4_1 => by_count!(rows_q4_1),
        Q5_0 => by_count!(rows_q5_0),
        Q5_1 => by_count!(rows_q5_1),
        Q8_0 => by_count!(rows_q8_0),
        F32 => by_count!(rows_f32),
        F16 => by_count!(rows_f16),
        BF16 => by_count!(rows_bf16),
        _ => return None,
    })
}

/// `out[i] = f32(f16(x[i]))` for every `i`, 8 values at a time with F16C (round to nearest even,
/// as [`crate::quant::fp32_to_fp16`]); a group holding a NaN, and the last `< 8` values, go through
/// `scalar`, which also gives NaNs their canonical quiet bits.
///
/// # Safety
/// The CPU must support AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn round_f16_row(x: &[f32], out: &mut [f32], scalar: fn(f32) -> f32) {
    assert_eq!(x.len(), out.len(), "round_f16_row lengths");
    let mut xs = x.chunks_exact(8);
    let mut os = out.chunks_exact_mut(8);
    for (x, o) in (&mut xs).zip(&mut os) {
        let v = _mm256_loadu_ps(x.as_ptr());
        if _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v)) != 0 {
            o.iter_mut().zip(x).for_each(|(o, &v)| *o = scalar(v));
            continue;
        }
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
        _mm256_storeu_ps(o.as_mut_ptr(), _mm256_cvtph_ps(h));
    }
    os.into_remainder()
        .iter_mut()
        .zip(xs.remainder())
        .for_each(|(o, &v)| *o = scalar(v));
}

/// `out[i] = f32(h[i])` for every `i`, 8 values at a time with F16C (exact, the same bits as
/// [`half::f16::to_f32`]).
///
/// # Safety
/// The CPU must support AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn widen_f16_row(h: &[half::f16], out: &mut [f32]) {
    widen_f16_bytes(bytemuck::cast_slice(h), out)
}

/// [`widen_f16_row`] over little-endian f16 bytes at any alignment (`h.len() == 2 * out.len()`).
///
/// # Safety
/// The CPU must support AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn widen_f16_bytes(h: &[u8], out: &mut [f32]) {
    widen_16bit(
        h,
        out,
        |v| _mm256_cvtph_ps(v),
        |b| half::f16::from_le_bytes(b).to_f32(),
    )
}

/// `out[i] = f32(h[i])` for little-endian bf16 bytes `h` at any alignment (`h.len() == 2 *
/// out.len()`), 8 values at a time: the bf16 bits become the top half of the f32's (exact).
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn widen_bf16_bytes(h: &[u8], out: &mut [f32]) {
    widen_16bit(
        h,
        out,
        |v| _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16)),
        |b| f32::from_bits((u16::from_le_bytes(b) as u32) << 16),
    )
}

/// Widens 16-bit floats `h` (little-endian bytes, any alignment) into `out`: `eight` converts 8 at
/// a time, `one` the last `< 8`.
#[inline(always)]
unsafe fn widen_16bit(
    h: &[u8],
    out: &mut [f32],
    eight: impl Fn(__m128i) -> __m256,
    one: impl Fn([u8; 2]) -> f32,
) {
    assert_eq!(h.len(), 2 * out.len(), "widened 16-bit row lengths");
    let mut hs = h.chunks_exact(16);
    let mut os = out.chunks_exact_mut(8);
    for (h, o) in (&mut hs).zip(&mut os) {
        let v = _mm_loadu_si128(h.as_ptr() as *const __m128i);
        _mm256_storeu_ps(o.as_mut_ptr(), eight(v));
    }
    os.into_remainder()
        .iter_mut()
        .zip(hs.remainder().chunks_exact(2))
        .for_each(|(o, h)| *o = one([h[0], h[1]]));
}

/// ggml's AVX2 `quantize_row_q8_0` for one token row: quants, f16-rounded scales, block sums.
///
/// # Safety
/// The CPU must support AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn quantize_q8_0_row(x: &[f32], q: &mut [i8], d: &mut [f32], isum: &mut [i32]) {
    let nb = x.len() / QK;
    assert!(q.len() >= nb * QK && d.len() >= nb && isum.len() >= nb);
    let sign = _mm256_set1_ps(-0.0);
    let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for i in 0..nb {
        let p = x.as_ptr().add(i * QK);
        let v0 = _mm256_loadu_ps(p);
        let v1 = _mm256_loadu_ps(p.add(8));
        let v2 = _mm256_loadu_ps(p.add(16));
        let v3 = _mm256_loadu_ps(p.add(24));
        let mut m = _mm256_andnot_ps(sign, v0);
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v1));
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v2));
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v3));
        let mut m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        let amax = _mm_cvtss_f32(m4);
        d[i] = round_f16(amax / 127.0);
        let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        const RN: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        let i0 = _mm256_cvtps_epi32(_mm256_round_ps::<RN>(_mm256_mul_ps(v0, id)));
        let i1 = _mm256_cvtps_epi32(_mm256_round_ps::<RN>(_mm256_mul_ps(v1, id)));
        let i2 = _mm256_cvtps_epi32(_mm256_round_ps::<RN>(_mm256_mul_ps(v2, id)));
        let i3 = _mm256_cvtps_epi32(_mm256_round_ps::<RN>(_mm256_mul_ps(v3, id)));
        let a = _mm256_packs_epi32(i0, i1);
        let b = _mm256_packs_epi32(i2, i3);
        let packed = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(a, b), perm);
        _mm256_storeu_si256(q.as_mut_ptr().add(i * QK) as *mut __m256i, packed);
        // the sum of the stored (saturated) quants, as the scalar path computes it
        let wide = _mm256_add_epi16(
            _mm256_cvtepi8_epi16(_mm256_castsi256_si128(packed)),
            _mm256_cvtepi8_epi16(_mm256_extracti128_si256(packed, 1)),
        );
        isum[i] = hsum_i32_8(_mm256_madd_epi16(wide, _mm256_set1_epi16(1)));
    }
}

/// ggml's `quantize_row_q8_K_ref` for one token row, bit-exact: the scale from the first value of
/// largest magnitude (`iscale = −127 / max`), quants `min(127, round_half_even(iscale · x))`
/// (ggml's `nearest_int`), `d = 1 / iscale`, and the sums of each 16 quants.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn quantize_q8k_row(x: &[f32], q: &mut [i8], d: &mut [f32], bsums: &mut [i16]) {
    let nb = x.len() / QK_K;
    assert!(q.len() >= nb * QK_K && d.len() >= nb && bsums.len() >= nb * 16);
    let sign = _mm256_set1_ps(-0.0);
    let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for i in 0..nb {
        let p = x.as_ptr().add(i * QK_K);
        let mut m = _mm256_setzero_ps();
        let mut nan = _mm256_setzero_ps();
        for j in 0..QK_K / 8 {
            let v = _mm256_loadu_ps(p.add(8 * j));
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v));
            nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
        }
        let mut m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        let amax = _mm_cvtss_f32(m4);
        let qo = q.as_mut_ptr().add(i * QK_K);
        if !(amax > 0.0 && amax.is_finite()) || _mm256_movemask_ps(nan) != 0 {
            // all zero (d = 0, quants 0), or a NaN or infinity: the reference's way
            super::act::quantize_q8k_block_scalar(
                std::slice::from_raw_parts(p, QK_K),
                std::slice::from_raw_parts_mut(qo, QK_K),
                &mut d[i],
                &mut bsums[16 * i..16 * i + 16],
            );
            continue;
        }
        // the first value whose magnitude is amax
        let target = _mm256_set1_ps(amax);
        let mut max = amax;
        for j in 0..QK_K / 8 {
            let v = _mm256_loadu_ps(p.add(8 * j));
            let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(
                _mm256_andnot_ps(sign, v),
                target,
            ));
            if hit != 0 {
                max = *p.add(8 * j + hit.trailing_zeros() as usize);
                break;
            }
        }
        let iscale = -127.0 / max;
        let sc = _mm256_set1_ps(iscale);
        let top = _mm256_set1_epi32(127);
        for j in 0..QK_K / 32 {
            let v = |k: usize| {
                // cvtps rounds half to even (the default MXCSR mode), as nearest_int does
                _mm256_min_epi32(
                    _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p.add(32 * j + 8 * k)), sc)),
                    top,
                )
            };
            let (i0, i1, i2, i3) = (v(0), v(1), v(2), v(3));
            bsums[16 * i + 2 * j] = hsum_i32_8(_mm256_add_epi32(i0, i1)) as i16;
            bsums[16 * i + 2 * j + 1] = hsum_i32_8(_mm256_add_epi32(i2, i3)) as i16;
            let a = _mm256_packs_epi32(i0, i1);
            let b = _mm256_packs_epi32(i2, i3);
            let packed = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(a, b), perm);
            _mm256_storeu_si256(qo.add(32 * j) as *mut __m256i, packed);
        }
        d[i] = 1.0 / iscale;
    }
}

/// `x` rounded to the nearest f16 (ties to even, as ggml's conversion), back as f32. A NaN stays
/// a NaN (its payload may differ from ggml's canonical one).
#[inline(always)]
unsafe fn round_f16(x: f32) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(
        _mm_set_ss(x),
    )))
}

/// Horizontal sum of 8 i32 lanes.
#[inline(always)]
pub(crate) unsafe fn hsum_i32_8(a: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// Horizontal sum of 8 f32 lanes.
#[inline(always)]
pub(crate) unsafe fn hsum_f32_8(x: __m256) -> f32 {
    let r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    let r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

/// The f16 at `p` (unaligned) as f32.
#[inline(always)]
pub(crate) unsafe fn f16_at(p: *const u8) -> f32 {
    let bits = (p as *const u16).read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

#[inline(always)]
unsafe fn load256(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// 16 packed bytes → 32 nibbles: low nibbles first, then high nibbles (ggml's element order).
#[inline(always)]
unsafe fn nibbles_32(p: *const u8) -> __m256i {
    let t = _mm_loadu_si128(p as *const __m128i);
    let b = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    _mm256_and_si256(b, _mm256_set1_epi8(0x0F))
}

/// The 32 bits of the little-endian u32 at `p` → 32 bytes, `0x10` where the bit is set.
#[inline(always)]
pub(crate) unsafe fn bits_32_as_0x10(p: *const u8) -> __m256i {
    let x = (p as *const u32).read_unaligned();
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0x0000_0000_0000_0000,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), shuf);
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// Σ u·a over 32 bytes as 8 i32 lanes (`u` unsigned, at most 127 · 2 · 127 per pair).
#[inline(always)]
unsafe fn dot_u8_i8(u: __m256i, a: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), _mm256_set1_epi16(1))
}

/// The shared loop of the 32-element block formats over an R × N tile (the R rows of `n` values
/// at `rows`, anywhere): `unpack(block) -> (u, dw, mw)` gives the unsigned (or, for Q8_0, signed)
/// quants, the f16 scale and the f16 min; `OFF` is the weight offset, removed with the activation
/// block sums; `AFFINE` formats add `mw · s`.
#[inline(always)]
unsafe fn dot_blocks32<
    const R: usize,
    const N: usize,
    const OFF: i32,
    const SIGNED: bool,
    const AFFINE: bool,
>(
    rows: [*const u8; R],
    n: usize,
    a: &Acts,
    t0: usize,
    out: &mut [f32],
    bb: usize,
    unpack: impl Fn(*const u8) -> (__m256i, f32, f32),
) {
    let nb = n / QK;
    let q: [*const u8; N] = std::array::from_fn(|t| a.q(t0 + t).as_ptr() as *const u8);
    let d8: [*const f32; N] = std::array::from_fn(|t| a.d(t0 + t).as_ptr());
    let isum: [*const i32; N] = std::array::from_fn(|t| a.isum(t0 + t).as_ptr());
    let s8: [*const f32; N] =
        std::array::from_fn(|t| if AFFINE { a.s(t0 + t).as_ptr() } else { d8[t] });
    let mut acc = [[_mm256_setzero_ps(); N]; R];
    let mut accm = [[0f32; N]; R];
    for ib in 0..nb {
        let mut u = [_mm256_setzero_si256(); R];
        let mut ax = [_mm256_setzero_si256(); R];
        let mut dw = [0f32; R];
        let mut mw = [0f32; R];
        for r in 0..R {
            (u[r], dw[r], mw[r]) = unpack(rows[r].add(ib * bb));
            if SIGNED {
                ax[r] = _mm256_sign_epi8(u[r], u[r]);
            }
        }
        for t in 0..N {
            let av = load256(q[t].add(ib * QK));
            let dy = *d8[t].add(ib);
            let corr = if OFF != 0 {
                _mm256_setr_epi32(-OFF * *isum[t].add(ib), 0, 0, 0, 0, 0, 0, 0)
            } else {
                _mm256_setzero_si256()
            };
            for r in 0..R {
                let mut s = if SIGNED {
                    dot_u8_i8(ax[r], _mm256_sign_epi8(av, u[r]))
                } else {
                    dot_u8_i8(u[r], av)
                };
                if OFF != 0 {
                    s = _mm256_add_epi32(s, corr);
                }
                acc[r][t] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dw[r] * dy), acc[r][t]);
                if AFFINE {
                    accm[r][t] += mw[r] * *s8[t].add(ib);
                }
            }
        }
    }
    for r in 0..R {
        for t in 0..N {
            out[r * NT + t] = hsum_f32_8(acc[r][t]) + accm[r][t];
        }
    }
}

/// The two forms of a kernel over rows of `bytes` bytes per `values` values: `$name::<R, N>`, the
/// [`Kernel`] form (`R` consecutive rows of `rb` bytes, `N` tokens from `t0`), and
/// `$rows_name::<R>`, the [`RowsKernel`] form (`R` rows anywhere, one token), both running
/// `$dot::<R, N, $p…>(rows, n, a, t0, out, $extra…)` (given as `$dot[$p…]($extra…)`).
macro_rules! kernel_forms {
    ($name:ident, $rows_name:ident, $bytes:expr, $values:expr,
     $dot:ident[$($p:tt),*]($($extra:expr),*)) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $name<const R: usize, const N: usize>(
            w: *const u8,
            rb: usize,
            a: &Acts,
            t0: usize,
            out: &mut [f32],
        ) {
            let rows = std::array::from_fn(|r| w.add(r * rb));
            $dot::<R, N $(, $p)*>(rows, rb / $bytes * $values, a, t0, out $(, $extra)*)
        }

        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $rows_name<const R: usize>(
            rows: &[*const u8],
            a: &Acts,
            t: usize,
            n: usize,
            out: &mut [f32],
        ) {
            let rows = std::array::from_fn(|r| rows[r]);
            $dot::<R, 1 $(, $p)*>(rows, n, a, t, out $(, $extra)*)
        }
    };
}

/// A 32-element block format's kernels (see [`dot_blocks32`]).
macro_rules! fmt32_kernel {
    ($name:ident, $rows_name:ident, $off:expr, $signed:expr, $affine:expr, $bb:expr, $unpack:expr) => {
        kernel_forms!(
            $name,
            $rows_name,
            $bb,
            QK,
            dot_blocks32[$off, $signed, $affine]($bb, $unpack)
        );
    };
}

fmt32_kernel!(dot_q4_0, rows_q4_0, 8, false, false, 18, |p| (
    nibbles_32(p.add(2)),
    f16_at(p),
    0.0
));
fmt32_kernel!(dot_q4_1, rows_q4_1, 0, false, true, 20, |p| (
    nibbles_32(p.add(4)),
    f16_at(p),
    f16_at(p.add(2))
));
fmt32_kernel!(dot_q5_0, rows_q5_0, 16, false, false, 22, |p| {
    (
        _mm256_or_si256(nibbles_32(p.add(6)), bits_32_as_0x10(p.add(2))),
        f16_at(p),
        0.0,
    )
});
fmt32_kernel!(dot_q5_1, rows_q5_1, 0, false, true, 24, |p| {
    (
        _mm256_or_si256(nibbles_32(p.add(8)), bits_32_as_0x10(p.add(4))),
        f16_at(p),
        f16_at(p.add(2)),
    )
});
fmt32_kernel!(dot_q8_0, rows_q8_0, 0, true, false, 34, |p| (
    load256(p.add(2)),
    f16_at(p),
    0.0
));

/// `[m0, m0, m1, m1, …, m7, m7]` as 16 i16 (each min twice, to pair with the 16 `bsums`).
#[inline(always)]
unsafe fn mins_x2(mins: &[u8; 8]) -> __m256i {
    let m = _mm_cvtepu8_epi16(_mm_loadl_epi64(mins.as_ptr() as *const __m128i));
    _mm256_set_m128i(_mm_unpackhi_epi16(m, m), _mm_unpacklo_epi16(m, m))
}

/// The two i16 scales `lo` (lanes 0..8) and `hi` (lanes 8..16).
#[inline(always)]
unsafe fn scales2(lo: i16, hi: i16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo))
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
    let bs: [*const i16; N] = std::array::from_fn(|t| a.bsums(t0 + t).as_ptr());
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = [[_mm256_setzero_ps(); N]; R];
    let mut accm = [[0f32; N]; R];
    for ib in 0..nb {
        let mut acci = [[_mm256_setzero_si256(); N]; R];
        let mut scales = [[0u8; 8]; R];
        for r in 0..R {
            let p = rows[r].add(ib * bb);
            let (sc, mins) = k4_scales_mins(&*(p.add(4) as *const [u8; 12]));
            scales[r] = sc;
            let mv = mins_x2(&mins);
            let dmin = f16_at(p.add(2));
            for t in 0..N {
                let b = _mm256_loadu_si256(bs[t].add(16 * ib) as *const __m256i);
                let summ = hsum_i32_8(_mm256_madd_epi16(mv, b));
                accm[r][t] += dmin * *d8[t].add(ib) * summ as f32;
            }
        }
        for k in 0..4 {
            for r in 0..R {
                let p = rows[r].add(ib * bb);
                let qv = load256(p.add(qs_at + 32 * k));
                let mut lo = _mm256_and_si256(qv, m4);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16(qv, 4), m4);
                if HIGH {
                    let qh = load256(p.add(16));
                    let b_lo = _mm256_set1_epi8((1u8 << (2 * k)) as i8);
                    let b_hi = _mm256_set1_epi8((2u8 << (2 * k)) as i8);
                    let h_lo = _mm256_cmpeq_epi8(_mm256_and_si256(qh, b_lo), b_lo);
                    let h_hi = _mm256_cmpeq_epi8(_mm256_and_si256(qh, b_hi), b_hi);
                    lo = _mm256_or_si256(lo, _mm256_and_si256(h_lo, _mm256_set1_epi8(0x10)));
                    hi = _mm256_or_si256(hi, _mm256_and_si256(h_hi, _mm256_set1_epi8(0x10)));
                }
                let s_lo = _mm256_set1_epi16(scales[r][2 * k] as i16);
                let s_hi = _mm256_set1_epi16(scales[r][2 * k + 1] as i16);
                for t in 0..N {
                    let qa = q[t].add(ib * QK_K + 64 * k);
                    let p_lo = _mm256_maddubs_epi16(lo, load256(qa));
                    let p_hi = _mm256_maddubs_epi16(hi, load256(qa.add(32)));
                    let s = _mm256_add_epi32(
                        _mm256_madd_epi16(p_lo, s_lo),
                        _mm256_madd_epi16(p_hi, s_hi),
                    );
                    acci[r][t] = _mm256_add_epi32(acci[r][t], s);
                }
            }
        }
        for r in 0..R {
            let d = f16_at(rows[r].add(ib * bb));
            for t in 0..N {
                let dy = *d8[t].add(ib);
                acc[r][t] = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(acci[r][t]),
                    _mm256_set1_ps(d * dy),
                    acc[r][t],
                );
            }
        }
    }
    for r in 0..R {
        for t in 0..N {
            out[r * NT + t] = hsum_f32_8(acc[r][t]) - accm[r][t];
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_k<const R: usize, const N: usize>(
    w: *const u8,
    rb: usize,
    a: &Acts,
    t0: usize,
    out: &mut [f32],
) {
    dot_k4::<R, N, false>(w, rb, a, t0, out)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_k<const R: usize, const N: usize>(
    w: *const u8,
    rb: usize,
    a: &Acts,
    t0: usize,
    out: &mut [f32],
) {
    dot_k4::<R, N, true>(w, rb, a, t0, out)
}

/// Q6_K over an R × N tile; the −32 offset enters the i32 accumulator first.
#[target_feature(enable = "avx2,fma,f16c")]
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
    let bs: [*const i16; N] = std::array::from_fn(|t| a.bsums(t0 + t).as_ptr());
    let m4 = _mm256_set1_epi8(0x0F);
    let m30 = _mm256_set1_epi8(0x30);
    let mut acc = [[_mm256_setzero_ps(); N]; R];
    for ib in 0..nb {
        let mut acci = [[_mm256_setzero_si256(); N]; R];
        for r in 0..R {
            let sc16 =
                _mm256_cvtepi8_epi16(_mm_loadu_si128(rows[r].add(ib * BB + 192) as *const __m128i));
            // the −32 offset: −32 · Σ_j sc_j · bsums_j
            for t in 0..N {
                let b = _mm256_loadu_si256(bs[t].add(16 * ib) as *const __m256i);
                acci[r][t] =
                    _mm256_sub_epi32(acci[r][t], _mm256_slli_epi32(_mm256_madd_epi16(sc16, b), 5));
            }
        }
        for n in 0..2 {
            for g in 0..4 {
                for r in 0..R {
                    let p = rows[r].add(ib * BB);
                    let sc = p.add(192) as *const i8;
                    let ql = load256(p.add(64 * n + 32 * (g & 1)));
                    let qh = load256(p.add(128 + 32 * n));
                    let lo = if g < 2 {
                        _mm256_and_si256(ql, m4)
                    } else {
                        _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4)
                    };
                    let hb = match g {
                        0 => _mm256_slli_epi16(qh, 4),
                        1 => _mm256_slli_epi16(qh, 2),
                        2 => qh,
                        _ => _mm256_srli_epi16(qh, 2),
                    };
                    let u = _mm256_or_si256(lo, _mm256_and_si256(hb, m30));
                    let j = 8 * n + 2 * g; // first of the two sub-blocks of 16
                    let s = scales2(*sc.add(j) as i16, *sc.add(j + 1) as i16);
                    for t in 0..N {
                        let qa = q[t].add(ib * QK_K + 128 * n + 32 * g);
                        let pr = _mm256_maddubs_epi16(u, load256(qa));
                        acci[r][t] = _mm256_add_epi32(acci[r][t], _mm256_madd_epi16(pr, s));
                    }
                }
            }
        }
        for r in 0..R {
            let d = f16_at(rows[r].add(ib * BB + 208));
            for t in 0..N {
                let dy = *d8[t].add(ib);
                acc[r][t] = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(acci[r][t]),
                    _mm256_set1_ps(d * dy),
                    acc[r][t],
                );
            }
        }
    }
    for r in 0..R {
        for t in 0..N {
            out[r * NT + t] = hsum_f32_8(acc[r][t]);
        }
    }
}

/// Float rows over an R × N tile (the R rows of `n` values at `rows`, anywhere): `load8(p)` gives
/// 8 weights from `p` as f32, `one(p)` one. Each (row, token) is its own pair of chains, so its
/// bits do not depend on the tile's shape.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn dot_float<const R: usize, const N: usize>(
    rows: [*const u8; R],
    n: usize,
    a: &Acts,
    t0: usize,
    out: &mut [f32],
    esize: usize,
    load8: impl Fn(*const u8) -> __m256,
    one: impl Fn(*const u8) -> f32,
) {
    let x: [*const f32; N] = std::array::from_fn(|t| a.f(t0 + t).as_ptr());
    let mut acc0 = [[_mm256_setzero_ps(); N]; R];
    let mut acc1 = [[_mm256_setzero_ps(); N]; R];
    let mut j = 0;
    while j + 16 <= n {
        for r in 0..R {
            let w0 = load8(rows[r].add(j * esize));
            let w1 = load8(rows[r].add((j + 8) * esize));
            for t in 0..N {
                acc0[r][t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[t].add(j)), acc0[r][t]);
                acc1[r][t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[t].add(j + 8)), acc1[r][t]);
            }
        }
        j += 16;
    }
    while j + 8 <= n {
        for r in 0..R {
            let w0 = load8(rows[r].add(j * esize));
            for t in 0..N {
                acc0[r][t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[t].add(j)), acc0[r][t]);
            }
        }
        j += 8;
    }
    for r in 0..R {
        for t in 0..N {
            let mut s = hsum_f32_8(_mm256_add_ps(acc0[r][t], acc1[r][t]));
            for k in j..n {
                s += one(rows[r].add(k * esize)) * *x[t].add(k);
            }
            out[r * NT + t] = s;
        }
    }
}

/// A float format's kernels (see [`dot_float`]).
macro_rules! float_kernel {
    ($name:ident, $rows_name:ident, $esize:expr, $load8:expr, $one:expr) => {
        kernel_forms!($name, $rows_name, $esize, 1, dot_float[]($esize, $load8, $one));
    };
}

float_kernel!(
    dot_f32,
    rows_f32,
    4,
    |p| _mm256_loadu_ps(p as *const f32),
    |p| (p as *const f32).read_unaligned()
);
float_kernel!(
    dot_f16,
    rows_f16,
    2,
    |p| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
    |p| f16_at(p)
);
float_kernel!(
    dot_bf16,
    rows_bf16,
    2,
    |p| {
        let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
        _mm256_castsi256_ps(_mm256_slli_epi32(h, 16))
    },
    |p| f32::from_bits(((p as *const u16).read_unaligned() as u32) << 16)
);
