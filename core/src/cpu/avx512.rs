//! AVX-512 (F, BW, VL, VNNI) kernels: tiles of up to 4 weight rows × 4 tokens, so each weight
//! block is unpacked once per token group and each activation block is loaded once per row group.
//!
//! - 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): two blocks per 512-bit register. Weights
//!   become unsigned bytes (Q8_0 via `w + 128`), `vpdpbusd` sums `u · a` starting from the
//!   precomputed `−offset · Σa` of each block, so the 8 lanes of a block add up to exactly ggml's
//!   integer block sum; then one multiply by `[dw0·da0 ×8, dw1·da1 ×8]` and a float accumulate.
//! - K-quants (Q4_K, Q5_K, Q6_K): `vpmaddubsw` then `vpdpwssd` with the sub-block scales, integer
//!   accumulation over the whole super-block, the mins (or Q6_K's −32) from the Q8_K `bsums`.
//! - F32 / F16 / BF16: 16-wide FMAs.
//! - Batches of 8+ tokens: [`packed`] gives a packer that unpacks a task's rows once into
//!   [`Packed`] and kernels that read them back with plain loads (same arithmetic as above).

// Index loops over the const-generic tile dimensions read more plainly than zipped iterators.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::quant::{GgmlType, QK, QK_K};

use super::act::Acts;
use super::avx2::f16_at;
use super::scalar::k4_scales_mins;
use super::{prefetch_ptr, Kernel, RowsKernel, NT};

/// Wraps `$f::<R, N>(w, rb, a, t0, out)` into a [`Kernel`], splitting the rows into groups of at
/// most `$r1` / `$r2` / `$r4` rows for 1 / 2 / 3–4 tokens.
macro_rules! tiles {
    ($f:ident, $r1:expr, $r2:expr, $r4:expr) => {
        |w: &[u8], rb: usize, nr: usize, a: &Acts, t0: usize, nt: usize, out: &mut [f32]| {
            assert!(
                w.len() >= nr * rb
                    && (1..=NT).contains(&nt)
                    && t0 + nt <= a.n
                    && out.len() >= nr * NT
            );
            let rmax: usize = match nt {
                1 => $r1,
                2 => $r2,
                _ => $r4,
            };
            let mut i = 0;
            while i < nr {
                let r = match (nr - i).min(rmax) {
                    4.. => 4,
                    2 | 3 => 2,
                    _ => 1,
                };
                let (wp, o) = (w[i * rb..].as_ptr(), &mut out[i * NT..]);
                // SAFETY: only selected when the CPU has AVX-512 F/BW/VL/VNNI (and AVX2/FMA/F16C);
                // rows i..i+r and tokens t0..t0+nt exist (asserted above).
                unsafe {
                    match (r, nt) {
                        (1, 1) => $f::<1, 1>(wp, rb, a, t0, o),
                        (1, 2) => $f::<1, 2>(wp, rb, a, t0, o),
                        (1, 3) => $f::<1, 3>(wp, rb, a, t0, o),
                        (1, _) => $f::<1, 4>(wp, rb, a, t0, o),
                        (2, 1) => $f::<2, 1>(wp, rb, a, t0, o),
                        (2, 2) => $f::<2, 2>(wp, rb, a, t0, o),
                        (2, 3) => $f::<2, 3>(wp, rb, a, t0, o),
                        (2, _) => $f::<2, 4>(wp, rb, a, t0, o),
                        (_, 1) => $f::<4, 1>(wp, rb, a, t0, o),
                        (_, 2) => $f::<4, 2>(wp, rb, a, t0, o),
                        (_, 3) => $f::<4, 3>(wp, rb, a, t0, o),
                        (_, _) => $f::<4, 4>(wp, rb, a, t0, o),
                    }
                }
                i += r;
            }
        }
    };
}

/// The AVX-512 kernel for `ty`, if there is one.
pub(crate) fn kernel(ty: GgmlType) -> Option<Kernel> {
    use GgmlType::*;
    Some(match ty {
        Q4_0 => tiles!(dot_q4_0, 4, 4, 4),
        Q4_1 => tiles!(dot_q4_1, 4, 4, 4),
        Q5_0 => tiles!(dot_q5_0, 4, 4, 4),
        Q5_1 => tiles!(dot_q5_1, 4, 4, 4),
        Q8_0 => tiles!(dot_q8_0, 4, 4, 4),
        Q4_K => tiles!(dot_q4_k, 4, 4, 2),
        Q5_K => tiles!(dot_q5_k, 4, 4, 2),
        Q6_K => tiles!(dot_q6_k, 4, 4, 2),
        F32 => tiles!(tile_f32, 4, 4, 4),
        F16 => tiles!(tile_f16, 4, 4, 4),
        BF16 => tiles!(tile_bf16, 4, 4, 4),
        _ => return None,
    })
}

/// The kernel for `ty` over consecutive rows read once (a dense matmul), prefetching its own
/// rows ahead, if it has one (the 32-element and float formats); [`kernel`]'s reads only what it
/// uses.
pub(crate) fn streaming_kernel(ty: GgmlType) -> Option<Kernel> {
    use GgmlType::*;
    Some(match ty {
        Q4_0 => tiles!(stream_q4_0, 4, 4, 4),
        Q4_1 => tiles!(stream_q4_1, 4, 4, 4),
        Q5_0 => tiles!(stream_q5_0, 4, 4, 4),
        Q5_1 => tiles!(stream_q5_1, 4, 4, 4),
        Q8_0 => tiles!(stream_q8_0, 4, 4, 4),
        F32 => tiles!(stream_f32, 4, 4, 4),
        F16 => tiles!(stream_f16, 4, 4, 4),
        BF16 => tiles!(stream_bf16, 4, 4, 4),
        _ => return None,
    })
}

#[inline(always)]
unsafe fn load128(p: *const u8) -> __m128i {
    _mm_loadu_si128(p as *const __m128i)
}

#[inline(always)]
unsafe fn load256(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[inline(always)]
unsafe fn load512(p: *const u8) -> __m512i {
    _mm512_loadu_si512(p as *const __m512i)
}

/// `[x0 ×8, x1 ×8]` from the f16 values at `p0` and `p1`.
#[inline(always)]
unsafe fn f16_pair(p0: *const u8, p1: *const u8) -> __m512 {
    let h0 = (p0 as *const u16).read_unaligned() as i32;
    let h1 = (p1 as *const u16).read_unaligned() as i32;
    let f = _mm_cvtph_ps(_mm_cvtsi32_si128(h0 | (h1 << 16)));
    let idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(f))
}

/// Two blocks' 16 packed bytes each → `[lo0, hi0, lo1, hi1]` nibbles (ggml's element order).
#[inline(always)]
unsafe fn nibbles_2x32(q0: *const u8, q1: *const u8) -> __m512i {
    let q = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(load128(q0)), load128(q1));
    let z = _mm512_permutexvar_epi64(
        _mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3),
        _mm512_castsi256_si512(q),
    );
    let z = _mm512_mask_srli_epi16::<4>(z, 0xFF00_FF00, z);
    _mm512_and_si512(z, _mm512_set1_epi8(0x0F))
}

/// One block's 16 packed bytes → 32 nibbles.
#[inline(always)]
unsafe fn nibbles_32(q: *const u8) -> __m256i {
    let t = load128(q);
    _mm256_and_si256(
        _mm256_set_m128i(_mm_srli_epi16(t, 4), t),
        _mm256_set1_epi8(0x0F),
    )
}

/// A 32-element block format as the AVX-512 kernels see it.
trait Fmt32 {
    /// Bytes per block.
    const BB: usize;
    /// log2 of the weight offset subtracted after the unsigned product (`None`: no offset).
    const SHIFT: Option<u32>;
    /// `x = d·q + m` (Q4_1, Q5_1): add `m · s`.
    const AFFINE: bool;
    /// Two consecutive blocks as 64 unsigned quants.
    unsafe fn unpack2(p: *const u8) -> __m512i;
    /// One block as 32 unsigned quants.
    unsafe fn unpack1(p: *const u8) -> __m256i;
    /// Offset of the f16 min `m` in a block (affine formats).
    const M_AT: usize = 2;
}

struct Q4_0;
impl Fmt32 for Q4_0 {
    const BB: usize = 18;
    const SHIFT: Option<u32> = Some(3);
    const AFFINE: bool = false;
    #[inline(always)]
    unsafe fn unpack2(p: *const u8) -> __m512i {
        nibbles_2x32(p.add(2), p.add(Self::BB + 2))
    }
    #[inline(always)]
    unsafe fn unpack1(p: *const u8) -> __m256i {
        nibbles_32(p.add(2))
    }
}

struct Q4_1;
impl Fmt32 for Q4_1 {
    const BB: usize = 20;
    const SHIFT: Option<u32> = None;
    const AFFINE: bool = true;
    #[inline(always)]
    unsafe fn unpack2(p: *const u8) -> __m512i {
        nibbles_2x32(p.add(4), p.add(Self::BB + 4))
    }
    #[inline(always)]
    unsafe fn unpack1(p: *const u8) -> __m256i {
        nibbles_32(p.add(4))
    }
}

/// Adds 16 to each byte of `u` whose bit in the little-endian u32s at `h0` (bytes 0..32) and `h1`
/// (bytes 32..64) is set.
#[inline(always)]
unsafe fn add_high_bits_2x32(u: __m512i, h0: *const u8, h1: *const u8) -> __m512i {
    let lo = (h0 as *const u32).read_unaligned() as u64;
    let hi = (h1 as *const u32).read_unaligned() as u64;
    _mm512_mask_add_epi8(u, _cvtu64_mask64(lo | (hi << 32)), u, _mm512_set1_epi8(16))
}

#[inline(always)]
unsafe fn add_high_bits_32(u: __m256i, h: *const u8) -> __m256i {
    let m = (h as *const u32).read_unaligned();
    _mm256_mask_add_epi8(u, _cvtu32_mask32(m), u, _mm256_set1_epi8(16))
}

struct Q5_0;
impl Fmt32 for Q5_0 {
    const BB: usize = 22;
    const SHIFT: Option<u32> = Some(4);
    const AFFINE: bool = false;
    #[inline(always)]
    unsafe fn unpack2(p: *const u8) -> __m512i {
        let q = Self::BB;
        add_high_bits_2x32(nibbles_2x32(p.add(6), p.add(q + 6)), p.add(2), p.add(q + 2))
    }
    #[inline(always)]
    unsafe fn unpack1(p: *const u8) -> __m256i {
        add_high_bits_32(nibbles_32(p.add(6)), p.add(2))
    }
}

struct Q5_1;
impl Fmt32 for Q5_1 {
    const BB: usize = 24;
    const SHIFT: Option<u32> = None;
    const AFFINE: bool = true;
    #[inline(always)]
    unsafe fn unpack2(p: *const u8) -> __m512i {
        let q = Self::BB;
        add_high_bits_2x32(nibbles_2x32(p.add(8), p.add(q + 8)), p.add(4), p.add(q + 4))
    }
    #[inline(always)]
    unsafe fn unpack1(p: *const u8) -> __m256i {
        add_high_bits_32(nibbles_32(p.add(8)), p.add(4))
    }
}

struct Q8_0;
impl Fmt32 for Q8_0 {
    const BB: usize = 34;
    const SHIFT: Option<u32> = Some(7);
    const AFFINE: bool = false;
    #[inline(always)]
    unsafe fn unpack2(p: *const u8) -> __m512i {
        let z = _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(load256(p.add(2))),
            load256(p.add(Self::BB + 2)),
        );
        _mm512_xor_si512(z, _mm512_set1_epi8(-128))
    }
    #[inline(always)]
    unsafe fn unpack1(p: *const u8) -> __m256i {
        _mm256_xor_si256(load256(p.add(2)), _mm256_set1_epi8(-128))
    }
}

/// Horizontal sum of 8 i32.
#[inline(always)]
unsafe fn hsum_i32_8(a: __m256i) -> i32 {
    super::avx2::hsum_i32_8(a)
}

/// Bytes ahead of each row's current block that a streaming kernel prefetches.
const STREAM_AHEAD: usize = 4096;

/// The R × N tile of a 32-element format over whole rows. `PF` (rows that follow each other in
/// memory, read once: a dense matmul's first token group) prefetches [`STREAM_AHEAD`] bytes
/// ahead of each row, two lines per row and block pair, spread over the arithmetic: issued in one
/// burst per tile instead, the prefetches filled the line-fill buffers and stalled the core (18%
/// of a Gemma decode step on the prefetch loop; its Q8_0 LM head 10.8 → 8.8 ms alone).
#[inline(always)]
unsafe fn dot32<F: Fmt32, const R: usize, const N: usize, const PF: bool>(
    w: *const u8,
    rb: usize,
    a: &Acts,
    t0: usize,
    out: &mut [f32],
) {
    let nb = rb / F::BB;
    let np = nb / 2;
    debug_assert_eq!(a.npairs(), np);
    let rows: [*const u8; R] = std::array::from_fn(|r| w.add(r * rb));
    let q: [*const u8; N] = std::array::from_fn(|t| a.q(t0 + t).as_ptr() as *const u8);
    let base = |t: usize| (t0 + t) * np * 16;
    let dv: [*const f32; N] = std::array::from_fn(|t| a.dv[base(t)..].as_ptr());
    let nis: [*const i32; N] = std::array::from_fn(|t| a.nis[base(t)..].as_ptr());
    let sv: [*const f32; N] = std::array::from_fn(|t| {
        if F::AFFINE {
            a.sv[base(t)..].as_ptr()
        } else {
            dv[t]
        }
    });
    let mut acc = [[_mm512_setzero_ps(); N]; R];
    let prefetch = PF && t0 == 0;
    for p in 0..np {
        let mut u = [_mm512_setzero_si512(); R];
        let mut dw = [_mm512_setzero_ps(); R];
        let mut mw = [_mm512_setzero_ps(); R];
        for r in 0..R {
            let b = rows[r].add(2 * p * F::BB);
            if prefetch {
                // the addresses may lie past the weights: a prefetch never faults
                let ahead = b.wrapping_add(STREAM_AHEAD);
                prefetch_ptr(ahead);
                prefetch_ptr(ahead.wrapping_add(64));
            }
            u[r] = F::unpack2(b);
            dw[r] = f16_pair(b, b.add(F::BB));
            if F::AFFINE {
                mw[r] = f16_pair(b.add(F::M_AT), b.add(F::BB + F::M_AT));
            }
        }
        for t in 0..N {
            let av = load512(q[t].add(2 * p * QK));
            let dvt = _mm512_loadu_ps(dv[t].add(16 * p));
            let init = match F::SHIFT {
                Some(_) => _mm512_loadu_si512(nis[t].add(16 * p) as *const __m512i),
                None => _mm512_setzero_si512(),
            };
            let svt = if F::AFFINE {
                _mm512_loadu_ps(sv[t].add(16 * p))
            } else {
                dvt
            };
            for r in 0..R {
                let s = _mm512_dpbusd_epi32(init, u[r], av);
                let scale = _mm512_mul_ps(dw[r], dvt);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, acc[r][t]);
                if F::AFFINE {
                    acc[r][t] = _mm512_fmadd_ps(mw[r], svt, acc[r][t]);
                }
            }
        }
    }
    // an odd last block
    let mut tail = [[0f32; N]; R];
    if nb % 2 == 1 {
        let ib = nb - 1;
        for r in 0..R {
            let b = rows[r].add(ib * F::BB);
            let u = F::unpack1(b);
            let dw = f16_at(b);
            for t in 0..N {
                let av = load256(q[t].add(ib * QK));
                let mut s = hsum_i32_8(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u, av));
                if let Some(sh) = F::SHIFT {
                    s -= a.isum(t0 + t)[ib] << sh;
                }
                tail[r][t] = s as f32 * (dw * a.d(t0 + t)[ib]);
                if F::AFFINE {
                    tail[r][t] += f16_at(b.add(F::M_AT)) * a.s(t0 + t)[ib];
                }
            }
        }
    }
    for r in 0..R {
        for t in 0..N {
            out[r * NT + t] = _mm512_reduce_add_ps(acc[r][t]) + tail[r][t];
        }
    }
}

/// For each `name, stream => f` (or `f<Fmt>`): the [`kernel`] flavour `name` (`f` with `PF` false)
/// and the [`streaming_kernel`] flavour `stream` (`PF` true), as [`tiles!`] takes them.
macro_rules! paired_kernels {
    ($($name:ident, $stream:ident => $f:ident $(<$fmt:ty>)?;)*) => {$(
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        unsafe fn $name<const R: usize, const N: usize>(
            w: *const u8,
            rb: usize,
            a: &Acts,
            t0: usize,
            out: &mut [f32],
        ) {
            $f::<$($fmt,)? R, N, false>(w, rb, a, t0, out)
        }

        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        unsafe fn $stream<const R: usize, const N: usize>(
            w: *const u8,
            rb: usize,
            a: &Acts,
            t0: usize,
            out: &mut [f32],
        ) {
            $f::<$($fmt,)? R, N, true>(w, rb, a, t0, out)
        }
    )*};
}
paired_kernels! {
    dot_q4_0, stream_q4_0 => dot32<Q4_0>;
    dot_q4_1, stream_q4_1 => dot32<Q4_1>;
    dot_q5_0, stream_q5_0 => dot32<Q5_0>;
    dot_q5_1, stream_q5_1 => dot32<Q5_1>;
    dot_q8_0, stream_q8_0 => dot32<Q8_0>;
}

/// `[m0, m0, m1, m1, …, m7, m7]` as 16 i16.
#[inline(always)]
unsafe fn mins_x2(mins: &[u8; 8]) -> __m256i {
    let m = _mm_cvtepu8_epi16(_mm_loadl_epi64(mins.as_ptr() as *const __m128i));
    _mm256_set_m128i(_mm_unpackhi_epi16(m, m), _mm_unpacklo_epi16(m, m))
}

/// Index vector for `vpermw`: i16 element `e` takes source element `base + e / per`.
#[inline(always)]
unsafe fn spread_idx(base: i16, per: usize) -> __m512i {
    let mut idx = [0i16; 32];
    for (e, v) in idx.iter_mut().enumerate() {
        *v = base + (e / per) as i16;
    }
    _mm512_loadu_si512(idx.as_ptr() as *const __m512i)
}

/// Q4_K / Q5_K: R rows × N tokens. Per super-block and (row, token): the scaled quant sums in an
/// i32 accumulator (`vpmaddubsw` + `vpdpwssd` with the 6-bit scales), the mins as
/// `Σ m_j · bsum_j` (`vpmaddwd`), then `d·dA·Σ − dmin·dA·Σm` in float, as ggml.
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
    let m4 = _mm512_set1_epi8(0x0F);
    let shifts = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
    let idx: [__m512i; 4] = std::array::from_fn(|k| spread_idx(2 * k as i16, 16));
    let mut acc = [[_mm512_setzero_ps(); N]; R];
    for ib in 0..nb {
        let mut acci = [[_mm512_setzero_si512(); N]; R];
        let mut sc16 = [_mm512_setzero_si512(); R];
        let mut mv = [_mm256_setzero_si256(); R];
        for r in 0..R {
            let b = rows[r].add(ib * bb);
            let (s, m) = k4_scales_mins(&*(b.add(4) as *const [u8; 12]));
            sc16[r] = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64(
                s.as_ptr() as *const __m128i
            )));
            mv[r] = mins_x2(&m);
        }
        for k in 0..4 {
            for r in 0..R {
                let b = rows[r].add(ib * bb);
                let qv = _mm512_broadcast_i64x4(load256(b.add(qs_at + 32 * k)));
                let mut u = _mm512_and_si512(_mm512_srlv_epi64(qv, shifts), m4);
                if HIGH {
                    let qh = _mm512_broadcast_i64x4(load256(b.add(16)));
                    let bits = _mm512_inserti64x4::<1>(
                        _mm512_set1_epi8((1u8 << (2 * k)) as i8),
                        _mm256_set1_epi8((2u8 << (2 * k)) as i8),
                    );
                    u = _mm512_mask_add_epi8(
                        u,
                        _mm512_test_epi8_mask(qh, bits),
                        u,
                        _mm512_set1_epi8(16),
                    );
                }
                // [sc_2k ×16, sc_2k+1 ×16]
                let s = _mm512_permutexvar_epi16(idx[k], sc16[r]);
                for t in 0..N {
                    let av = load512(q[t].add(ib * QK_K + 64 * k));
                    acci[r][t] = _mm512_dpwssd_epi32(acci[r][t], _mm512_maddubs_epi16(u, av), s);
                }
            }
        }
        for r in 0..R {
            let b = rows[r].add(ib * bb);
            let d = _mm512_set1_ps(f16_at(b));
            let dmin = _mm512_set1_ps(-f16_at(b.add(2)));
            for t in 0..N {
                let dy = _mm512_set1_ps(*d8[t].add(ib));
                acc[r][t] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(acci[r][t]),
                    _mm512_mul_ps(d, dy),
                    acc[r][t],
                );
                // the mins, in lanes 0..8
                let bsv = load256(bs[t].add(16 * ib) as *const u8);
                let mi = _mm512_zextps256_ps512(_mm256_cvtepi32_ps(_mm256_madd_epi16(mv[r], bsv)));
                acc[r][t] = _mm512_fmadd_ps(mi, _mm512_mul_ps(dmin, dy), acc[r][t]);
            }
        }
    }
    for r in 0..R {
        for t in 0..N {
            out[r * NT + t] = _mm512_reduce_add_ps(acc[r][t]);
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_q4_k<const R: usize, const N: usize>(
    w: *const u8,
    rb: usize,
    a: &Acts,
    t0: usize,
    out: &mut [f32],
) {
    dot_k4::<R, N, false>(w, rb, a, t0, out)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_q5_k<const R: usize, const N: usize>(
    w: *const u8,
    rb: usize,
    a: &Acts,
    t0: usize,
    out: &mut [f32],
) {
    dot_k4::<R, N, true>(w, rb, a, t0, out)
}

/// Q6_K: R rows × N tokens. The −32 offset enters the i32 accumulator first, as
/// `−32 · Σ_j sc_j · bsum_j`, so the block's integer sum is ggml's exactly.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
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
    let m4 = _mm512_set1_epi8(0x0F);
    let m30 = _mm512_set1_epi8(0x30);
    // qh bits 0-1 | 2-3 (first half of a 64) and 4-5 | 6-7 (second half) moved to bits 4-5
    let sh_lo_l = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2);
    let sh_hi_r = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
    let idx: [__m512i; 4] = std::array::from_fn(|m| spread_idx(4 * m as i16, 8));
    let mut acc = [[_mm512_setzero_ps(); N]; R];
    for ib in 0..nb {
        let mut acci = [[_mm512_setzero_si512(); N]; R];
        let mut sc16 = [_mm512_setzero_si512(); R];
        for r in 0..R {
            let b = rows[r].add(ib * BB);
            let s = _mm256_cvtepi8_epi16(load128(b.add(192)));
            sc16[r] = _mm512_castsi256_si512(s);
            // −32 · sc_j as i16 (|·| ≤ 4096), paired with the bsums
            let nsc = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16::<5>(s));
            for t in 0..N {
                let bsv = load256(bs[t].add(16 * ib) as *const u8);
                acci[r][t] = _mm512_zextsi256_si512(_mm256_madd_epi16(nsc, bsv));
            }
        }
        for n in 0..2 {
            for half in 0..2 {
                let m = 2 * n + half; // which 64 of the 256
                for r in 0..R {
                    let b = rows[r].add(ib * BB);
                    let ql = load512(b.add(64 * n));
                    let qh = _mm512_broadcast_i64x4(load256(b.add(128 + 32 * n)));
                    let u = if half == 0 {
                        _mm512_or_si512(
                            _mm512_and_si512(ql, m4),
                            _mm512_and_si512(_mm512_sllv_epi64(qh, sh_lo_l), m30),
                        )
                    } else {
                        _mm512_or_si512(
                            _mm512_and_si512(_mm512_srli_epi64::<4>(ql), m4),
                            _mm512_and_si512(_mm512_srlv_epi64(qh, sh_hi_r), m30),
                        )
                    };
                    // sub-blocks 4m..4m+4, each scale on 8 i16 lanes
                    let s = _mm512_permutexvar_epi16(idx[m], sc16[r]);
                    for t in 0..N {
                        let av = load512(q[t].add(ib * QK_K + 64 * m));
                        acci[r][t] =
                            _mm512_dpwssd_epi32(acci[r][t], _mm512_maddubs_epi16(u, av), s);
                    }
                }
            }
        }
        for r in 0..R {
            let d = _mm512_set1_ps(f16_at(rows[r].add(ib * BB + 208)));
            for t in 0..N {
                let dy = _mm512_set1_ps(*d8[t].add(ib));
                acc[r][t] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(acci[r][t]),
                    _mm512_mul_ps(d, dy),
                    acc[r][t],
                );
            }
        }
    }
    for r in 0..R {
        for t in 0..N {
            out[r * NT + t] = _mm512_reduce_add_ps(acc[r][t]);
        }
    }
}

/// Float rows: `load16(p)` gives 16 weights from `p` as f32, `one(p)` a single weight.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn dot_float<const R: usize, const N: usize, const PF: bool>(
    w: *const u8,
    rb: usize,
    a: &Acts,
    t0: usize,
    out: &mut [f32],
    esize: usize,
    load16: impl Fn(*const u8) -> __m512,
    one: impl Fn(*const u8) -> f32,
) {
    let rows: [*const u8; R] = std::array::from_fn(|r| w.add(r * rb));
    let x: [*const f32; N] = std::array::from_fn(|t| a.f(t0 + t).as_ptr());
    float_chains::<R, N>(rows, x, rb / esize, PF && t0 == 0, out, esize, load16, one)
}

/// The dot products of [`dot_float`] for rows and tokens at any addresses: `out[r * NT + t]` =
/// dot(`rows[r]`, `x[t]`) over `n` values, one chain of fused multiply-adds per pair over 16-value
/// steps, then the lanes' sum and the last `n % 16` products one by one.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn float_chains<const R: usize, const N: usize>(
    rows: [*const u8; R],
    x: [*const f32; N],
    n: usize,
    prefetch: bool,
    out: &mut [f32],
    esize: usize,
    load16: impl Fn(*const u8) -> __m512,
    one: impl Fn(*const u8) -> f32,
) {
    let mut acc = [[_mm512_setzero_ps(); N]; R];
    let mut j = 0;
    while j + 16 <= n {
        if prefetch && (j * esize).is_multiple_of(64) {
            // one line per row and 64 bytes read (see `dot32`); a prefetch never faults
            for r in 0..R {
                let ahead = rows[r].wrapping_add(j * esize + STREAM_AHEAD);
                prefetch_ptr(ahead);
            }
        }
        let wv: [__m512; R] = std::array::from_fn(|r| load16(rows[r].add(j * esize)));
        for t in 0..N {
            let xv = _mm512_loadu_ps(x[t].add(j));
            for r in 0..R {
                acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
            }
        }
        j += 16;
    }
    for r in 0..R {
        for t in 0..N {
            let mut s = _mm512_reduce_add_ps(acc[r][t]);
            for k in j..n {
                s += one(rows[r].add(k * esize)) * *x[t].add(k);
            }
            out[r * NT + t] = s;
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_f32<const R: usize, const N: usize, const PF: bool>(
    w: *const u8,
    rb: usize,
    a: &Acts,
    t0: usize,
    out: &mut [f32],
) {
    dot_float::<R, N, PF>(
        w,
        rb,
        a,
        t0,
        out,
        4,
        |p| _mm512_loadu_ps(p as *const f32),
        |p| (p as *const f32).read_unaligned(),
    )
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_f16<const R: usize, const N: usize, const PF: bool>(
    w: *const u8,
    rb: usize,
    a: &Acts,
    t0: usize,
    out: &mut [f32],
) {
    dot_float::<R, N, PF>(
        w,
        rb,
        a,
        t0,
        out,
        2,
        |p| _mm512_cvtph_ps(load256(p)),
        |p| f16_at(p),
    )
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_bf16<const R: usize, const N: usize, const PF: bool>(
    w: *const u8,
    rb: usize,
    a: &Acts,
    t0: usize,
    out: &mut [f32],
) {
    dot_float::<R, N, PF>(
        w,
        rb,
        a,
        t0,
        out,
        2,
        |p| _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(load256(p)))),
        |p| f32::from_bits(((p as *const u16).read_unaligned() as u32) << 16),
    )
}

/// `out[r * NT]` = dot(row `rows[r]`, token `t` of `a`) for the `R` rows of `n` F16 values at
/// `rows` (anywhere): the bits of [`tile_f16`]'s product of the same row and token.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn rows_f16<const R: usize>(
    rows: &[*const u8],
    a: &Acts,
    t: usize,
    n: usize,
    out: &mut [f32],
) {
    float_chains::<R, 1>(
        std::array::from_fn(|r| rows[r]),
        [a.f(t).as_ptr()],
        n,
        false,
        out,
        2,
        |p| _mm512_cvtph_ps(load256(p)),
        |p| f16_at(p),
    )
}

/// The AVX-512 [`RowsKernel`] for `ty`, if there is one (F16).
pub(crate) fn rows_kernel(ty: GgmlType) -> Option<RowsKernel> {
    unsafe fn f16_rows(rows: &[*const u8], a: &Acts, t: usize, n: usize, out: &mut [f32]) {
        // SAFETY: selected for CPUs with AVX-512; the caller passes rows of `n` F16 values and
        // a token of `a` (see `RowsKernel`).
        unsafe {
            match rows.len() {
                1 => rows_f16::<1>(rows, a, t, n, out),
                2 => rows_f16::<2>(rows, a, t, n, out),
                3 => rows_f16::<3>(rows, a, t, n, out),
                _ => rows_f16::<4>(rows, a, t, n, out),
            }
        }
    }
    (ty == GgmlType::F16).then_some(f16_rows as RowsKernel)
}

paired_kernels! {
    tile_f32, stream_f32 => dot_f32;
    tile_f16, stream_f16 => dot_f16;
    tile_bf16, stream_bf16 => dot_bf16;
}

// ---------------------------------------------------------------------------------------------
// Batched path: a task's rows are unpacked once ("packed") into registers-ready form, then every
// token group reads them back with plain loads. For a prompt of n tokens this moves the weight
// unpacking (nibbles, high bits, f16 scales, 6-bit K scales) out of the n/4 token sweeps.

/// A task's weight rows unpacked for the batched kernels (a reusable buffer).
#[derive(Default)]
pub(crate) struct Packed {
    /// Unsigned quants: per row, 64 bytes per pair of 32-blocks, or 256 per K super-block.
    u: Vec<u8>,
    /// 32-blocks: per row and pair, `[dw0 ×8, dw1 ×8]` then (affine) `[m0 ×8, m1 ×8]`.
    /// K-quants: per row and super-block, `d` and `−dmin`.
    f: Vec<f32>,
    /// K-quants: per row and super-block, 4 × 32 i16 sub-block scales for `vpdpwssd`, then 16
    /// i16 coefficients of the `bsums` (`m_j` pairs for Q4_K/Q5_K, `−32·sc_j` for Q6_K).
    s: Vec<i16>,
    /// Row stride of `u`, `f`, `s` (in elements of each).
    su: usize,
    sf: usize,
    ss: usize,
}

/// Packs `nrows` rows (each `rb` bytes) of `w` into a [`Packed`].
pub(crate) type Packer = fn(w: &[u8], rb: usize, nrows: usize, out: &mut Packed);
/// Computes the tile of packed rows `r0..r0+nr` × tokens `t0..t0+nt` into `out[i * NT + t]`.
pub(crate) type PackedKernel =
    fn(p: &Packed, r0: usize, nr: usize, a: &Acts, t0: usize, nt: usize, out: &mut [f32]);

/// Wraps `$f::<R, N>(p, r0, a, t0, out)` into a [`PackedKernel`], with at most `$r4` rows for
/// 3–4 tokens (4 rows otherwise).
macro_rules! packed_tiles {
    ($f:ident, $r4:expr) => {
        |p: &Packed, r0: usize, nr: usize, a: &Acts, t0: usize, nt: usize, out: &mut [f32]| {
            assert!((1..=NT).contains(&nt) && t0 + nt <= a.n && out.len() >= nr * NT);
            assert!(
                (r0 + nr) * p.su <= p.u.len()
                    && (r0 + nr) * p.sf <= p.f.len()
                    && (r0 + nr) * p.ss <= p.s.len()
            );
            let rmax: usize = if nt <= 2 { 4 } else { $r4 };
            let mut i = 0;
            while i < nr {
                let r = match (nr - i).min(rmax) {
                    4.. => 4,
                    2 | 3 => 2,
                    _ => 1,
                };
                let o = &mut out[i * NT..];
                // SAFETY: only selected on AVX-512 F/BW/VL/VNNI CPUs; packed rows r0+i..r0+i+r
                // and tokens t0..t0+nt exist (asserted above).
                unsafe {
                    match (r, nt) {
                        (1, 1) => $f::<1, 1>(p, r0 + i, a, t0, o),
                        (1, 2) => $f::<1, 2>(p, r0 + i, a, t0, o),
                        (1, 3) => $f::<1, 3>(p, r0 + i, a, t0, o),
                        (1, _) => $f::<1, 4>(p, r0 + i, a, t0, o),
                        (2, 1) => $f::<2, 1>(p, r0 + i, a, t0, o),
                        (2, 2) => $f::<2, 2>(p, r0 + i, a, t0, o),
                        (2, 3) => $f::<2, 3>(p, r0 + i, a, t0, o),
                        (2, _) => $f::<2, 4>(p, r0 + i, a, t0, o),
                        (_, 1) => $f::<4, 1>(p, r0 + i, a, t0, o),
                        (_, 2) => $f::<4, 2>(p, r0 + i, a, t0, o),
                        (_, 3) => $f::<4, 3>(p, r0 + i, a, t0, o),
                        (_, _) => $f::<4, 4>(p, r0 + i, a, t0, o),
                    }
                }
                i += r;
            }
        }
    };
}
/// The batched path for `ty` and rows of `cols` values, if there is one.
pub(crate) fn packed(ty: GgmlType, cols: usize) -> Option<(Packer, PackedKernel)> {
    if ty.block_size() == QK && (cols / QK) % 2 == 1 {
        return None; // an odd last block: the direct kernels handle it
    }
    Some(match ty {
        GgmlType::Q4_0 => (pack32::<Q4_0>, packed_tiles!(pk32_q4_0, 4)),
        GgmlType::Q4_1 => (pack32::<Q4_1>, packed_tiles!(pk32_q4_1, 4)),
        GgmlType::Q5_0 => (pack32::<Q5_0>, packed_tiles!(pk32_q5_0, 4)),
        GgmlType::Q5_1 => (pack32::<Q5_1>, packed_tiles!(pk32_q5_1, 4)),
        GgmlType::Q8_0 => (pack32::<Q8_0>, packed_tiles!(pk32_q8_0, 4)),
        GgmlType::Q4_K => (pack_q4k::<false>, packed_tiles!(pk_k_min, 2)),
        GgmlType::Q5_K => (pack_q4k::<true>, packed_tiles!(pk_k_min, 2)),
        GgmlType::Q6_K => (pack_q6k, packed_tiles!(pk_k_fold, 2)),
        _ => return None,
    })
}

/// Sets the length of `v` to at least `n` (contents are overwritten by the packer).
fn reserve<T: Default + Clone>(v: &mut Vec<T>, n: usize) {
    if v.len() < n {
        v.resize(n, T::default());
    }
}

fn pack32<F: Fmt32>(w: &[u8], rb: usize, nrows: usize, out: &mut Packed) {
    assert!(w.len() >= nrows * rb);
    let np = rb / F::BB / 2;
    out.su = np * 64;
    out.sf = np * if F::AFFINE { 32 } else { 16 };
    out.ss = 0;
    reserve(&mut out.u, nrows * out.su);
    reserve(&mut out.f, nrows * out.sf);
    // SAFETY: AVX-512 was detected (this packer is only selected then); every read is inside
    // the asserted rows and every write inside the reserved buffers.
    unsafe { pack32_impl::<F>(w, rb, nrows, out, np) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn pack32_impl<F: Fmt32>(w: &[u8], rb: usize, nrows: usize, out: &mut Packed, np: usize) {
    for r in 0..nrows {
        let row = w.as_ptr().add(r * rb);
        let u = out.u.as_mut_ptr().add(r * out.su);
        let f = out.f.as_mut_ptr().add(r * out.sf);
        for p in 0..np {
            let b = row.add(2 * p * F::BB);
            _mm512_storeu_si512(u.add(64 * p) as *mut __m512i, F::unpack2(b));
            let fp = f.add(p * if F::AFFINE { 32 } else { 16 });
            _mm512_storeu_ps(fp, f16_pair(b, b.add(F::BB)));
            if F::AFFINE {
                _mm512_storeu_ps(fp.add(16), f16_pair(b.add(F::M_AT), b.add(F::BB + F::M_AT)));
            }
        }
    }
}

/// The packed R × N tile of a 32-element format.
#[inline(always)]
unsafe fn pk32<F: Fmt32, const R: usize, const N: usize>(
    pk: &Packed,
    r0: usize,
    a: &Acts,
    t0: usize,
    out: &mut [f32],
) {
    let np = a.npairs();
    debug_assert_eq!(pk.su, np * 64);
    let fs = if F::AFFINE { 32 } else { 16 };
    let u: [*const u8; R] = std::array::from_fn(|r| pk.u.as_ptr().add((r0 + r) * pk.su));
    let f: [*const f32; R] = std::array::from_fn(|r| pk.f.as_ptr().add((r0 + r) * pk.sf));
    let q: [*const u8; N] = std::array::from_fn(|t| a.q(t0 + t).as_ptr() as *const u8);
    let base = |t: usize| (t0 + t) * np * 16;
    let dv: [*const f32; N] = std::array::from_fn(|t| a.dv[base(t)..].as_ptr());
    let nis: [*const i32; N] = std::array::from_fn(|t| a.nis[base(t)..].as_ptr());
    let sv: [*const f32; N] = std::array::from_fn(|t| {
        if F::AFFINE {
            a.sv[base(t)..].as_ptr()
        } else {
            dv[t]
        }
    });
    let mut acc = [[_mm512_setzero_ps(); N]; R];
    for p in 0..np {
        let uw: [__m512i; R] = std::array::from_fn(|r| load512(u[r].add(64 * p)));
        let dw: [__m512; R] = std::array::from_fn(|r| _mm512_loadu_ps(f[r].add(fs * p)));
        for t in 0..N {
            let av = load512(q[t].add(2 * p * QK));
            let dvt = _mm512_loadu_ps(dv[t].add(16 * p));
            let init = if F::SHIFT.is_some() {
                _mm512_loadu_si512(nis[t].add(16 * p) as *const __m512i)
            } else {
                _mm512_setzero_si512()
            };
            for r in 0..R {
                let s = _mm512_dpbusd_epi32(init, uw[r], av);
                acc[r][t] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw[r], dvt), acc[r][t]);
                if F::AFFINE {
                    let mw = _mm512_loadu_ps(f[r].add(fs * p + 16));
                    acc[r][t] = _mm512_fmadd_ps(mw, _mm512_loadu_ps(sv[t].add(16 * p)), acc[r][t]);
                }
            }
        }
    }
    for r in 0..R {
        for t in 0..N {
            out[r * NT + t] = _mm512_reduce_add_ps(acc[r][t]);
        }
    }
}

macro_rules! pk32_kernel {
    ($name:ident, $fmt:ty) => {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        unsafe fn $name<const R: usize, const N: usize>(
            p: &Packed,
            r0: usize,
            a: &Acts,
            t0: usize,
            out: &mut [f32],
        ) {
            pk32::<$fmt, R, N>(p, r0, a, t0, out)
        }
    };
}
pk32_kernel!(pk32_q4_0, Q4_0);
pk32_kernel!(pk32_q4_1, Q4_1);
pk32_kernel!(pk32_q5_0, Q5_0);
pk32_kernel!(pk32_q5_1, Q5_1);
pk32_kernel!(pk32_q8_0, Q8_0);

/// Per K super-block in [`Packed`]: 256 quant bytes; 4 × 32 + 16 i16; 2 floats.
const K_U: usize = 256;
const K_S: usize = 4 * 32 + 16;
const K_F: usize = 2;

fn pack_q4k<const HIGH: bool>(w: &[u8], rb: usize, nrows: usize, out: &mut Packed) {
    pack_k(
        w,
        rb,
        nrows,
        out,
        if HIGH { 176 } else { 144 },
        if HIGH {
            pack_q4k_impl::<true>
        } else {
            pack_q4k_impl::<false>
        },
    )
}

fn pack_q6k(w: &[u8], rb: usize, nrows: usize, out: &mut Packed) {
    pack_k(w, rb, nrows, out, 210, pack_q6k_impl)
}

/// Shared driver of the K packers: sizes the buffers and runs `block` on each super-block.
fn pack_k(
    w: &[u8],
    rb: usize,
    nrows: usize,
    out: &mut Packed,
    bb: usize,
    block: unsafe fn(*const u8, *mut u8, *mut i16, *mut f32),
) {
    assert!(w.len() >= nrows * rb);
    let nb = rb / bb;
    out.su = nb * K_U;
    out.ss = nb * K_S;
    out.sf = nb * K_F;
    reserve(&mut out.u, nrows * out.su);
    reserve(&mut out.s, nrows * out.ss);
    reserve(&mut out.f, nrows * out.sf);
    for r in 0..nrows {
        for ib in 0..nb {
            // SAFETY: AVX-512 was detected (the packers are only selected then); the block is
            // inside the asserted rows and the outputs inside the reserved buffers.
            unsafe {
                block(
                    w.as_ptr().add(r * rb + ib * bb),
                    out.u.as_mut_ptr().add(r * out.su + ib * K_U),
                    out.s.as_mut_ptr().add(r * out.ss + ib * K_S),
                    out.f.as_mut_ptr().add(r * out.sf + ib * K_F),
                )
            };
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn pack_q4k_impl<const HIGH: bool>(b: *const u8, u: *mut u8, s: *mut i16, f: *mut f32) {
    let qs_at = if HIGH { 48 } else { 16 };
    let m4 = _mm512_set1_epi8(0x0F);
    let shifts = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
    let (sc, mn) = k4_scales_mins(&*(b.add(4) as *const [u8; 12]));
    let sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64(
        sc.as_ptr() as *const __m128i
    )));
    for k in 0..4 {
        let qv = _mm512_broadcast_i64x4(load256(b.add(qs_at + 32 * k)));
        let mut uv = _mm512_and_si512(_mm512_srlv_epi64(qv, shifts), m4);
        if HIGH {
            let qh = _mm512_broadcast_i64x4(load256(b.add(16)));
            let bits = _mm512_inserti64x4::<1>(
                _mm512_set1_epi8((1u8 << (2 * k)) as i8),
                _mm256_set1_epi8((2u8 << (2 * k)) as i8),
            );
            uv = _mm512_mask_add_epi8(
                uv,
                _mm512_test_epi8_mask(qh, bits),
                uv,
                _mm512_set1_epi8(16),
            );
        }
        _mm512_storeu_si512(u.add(64 * k) as *mut __m512i, uv);
        let sv = _mm512_permutexvar_epi16(spread_idx(2 * k as i16, 16), sc16);
        _mm512_storeu_si512(s.add(32 * k) as *mut __m512i, sv);
    }
    _mm256_storeu_si256(s.add(128) as *mut __m256i, mins_x2(&mn));
    *f = f16_at(b);
    *f.add(1) = -f16_at(b.add(2));
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn pack_q6k_impl(b: *const u8, u: *mut u8, s: *mut i16, f: *mut f32) {
    let m4 = _mm512_set1_epi8(0x0F);
    let m30 = _mm512_set1_epi8(0x30);
    let sh_lo_l = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2);
    let sh_hi_r = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
    let sc = _mm256_cvtepi8_epi16(load128(b.add(192)));
    let sc16 = _mm512_castsi256_si512(sc);
    for n in 0..2 {
        let ql = load512(b.add(64 * n));
        let qh = _mm512_broadcast_i64x4(load256(b.add(128 + 32 * n)));
        let lo = _mm512_or_si512(
            _mm512_and_si512(ql, m4),
            _mm512_and_si512(_mm512_sllv_epi64(qh, sh_lo_l), m30),
        );
        let hi = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi64::<4>(ql), m4),
            _mm512_and_si512(_mm512_srlv_epi64(qh, sh_hi_r), m30),
        );
        _mm512_storeu_si512(u.add(128 * n) as *mut __m512i, lo);
        _mm512_storeu_si512(u.add(128 * n + 64) as *mut __m512i, hi);
    }
    for m in 0..4 {
        let sv = _mm512_permutexvar_epi16(spread_idx(4 * m as i16, 8), sc16);
        _mm512_storeu_si512(s.add(32 * m) as *mut __m512i, sv);
    }
    let nsc = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16::<5>(sc));
    _mm256_storeu_si256(s.add(128) as *mut __m256i, nsc);
    *f = f16_at(b.add(208));
    *f.add(1) = 0.0;
}

/// The packed R × N tile of a K-quant. `FOLD` (Q6_K): the bsums term is an integer offset added
/// before the conversion; otherwise (Q4_K, Q5_K) it is the mins term, scaled by `−dmin`.
#[inline(always)]
unsafe fn pk_k<const R: usize, const N: usize, const FOLD: bool>(
    pk: &Packed,
    r0: usize,
    a: &Acts,
    t0: usize,
    out: &mut [f32],
) {
    let nb = a.nb();
    debug_assert_eq!(pk.su, nb * K_U);
    let u: [*const u8; R] = std::array::from_fn(|r| pk.u.as_ptr().add((r0 + r) * pk.su));
    let s: [*const i16; R] = std::array::from_fn(|r| pk.s.as_ptr().add((r0 + r) * pk.ss));
    let f: [*const f32; R] = std::array::from_fn(|r| pk.f.as_ptr().add((r0 + r) * pk.sf));
    let q: [*const u8; N] = std::array::from_fn(|t| a.q(t0 + t).as_ptr() as *const u8);
    let d8: [*const f32; N] = std::array::from_fn(|t| a.d(t0 + t).as_ptr());
    let bs: [*const i16; N] = std::array::from_fn(|t| a.bsums(t0 + t).as_ptr());
    let mut acc = [[_mm512_setzero_ps(); N]; R];
    for ib in 0..nb {
        let mut acci = [[_mm512_setzero_si512(); N]; R];
        if FOLD {
            for r in 0..R {
                let c = load256(s[r].add(ib * K_S + 128) as *const u8);
                for t in 0..N {
                    let bsv = load256(bs[t].add(16 * ib) as *const u8);
                    acci[r][t] = _mm512_zextsi256_si512(_mm256_madd_epi16(c, bsv));
                }
            }
        }
        for k in 0..4 {
            for r in 0..R {
                let uv = load512(u[r].add(ib * K_U + 64 * k));
                let sv = load512(s[r].add(ib * K_S + 32 * k) as *const u8);
                for t in 0..N {
                    let av = load512(q[t].add(ib * QK_K + 64 * k));
                    acci[r][t] = _mm512_dpwssd_epi32(acci[r][t], _mm512_maddubs_epi16(uv, av), sv);
                }
            }
        }
        for r in 0..R {
            let d = _mm512_set1_ps(*f[r].add(ib * K_F));
            let c = load256(s[r].add(ib * K_S + 128) as *const u8);
            let ndmin = _mm512_set1_ps(*f[r].add(ib * K_F + 1));
            for t in 0..N {
                let dy = _mm512_set1_ps(*d8[t].add(ib));
                acc[r][t] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(acci[r][t]),
                    _mm512_mul_ps(d, dy),
                    acc[r][t],
                );
                if !FOLD {
                    let bsv = load256(bs[t].add(16 * ib) as *const u8);
                    let mi = _mm512_zextps256_ps512(_mm256_cvtepi32_ps(_mm256_madd_epi16(c, bsv)));
                    acc[r][t] = _mm512_fmadd_ps(mi, _mm512_mul_ps(ndmin, dy), acc[r][t]);
                }
            }
        }
    }
    for r in 0..R {
        for t in 0..N {
            out[r * NT + t] = _mm512_reduce_add_ps(acc[r][t]);
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn pk_k_min<const R: usize, const N: usize>(
    p: &Packed,
    r0: usize,
    a: &Acts,
    t0: usize,
    out: &mut [f32],
) {
    pk_k::<R, N, false>(p, r0, a, t0, out)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn pk_k_fold<const R: usize, const N: usize>(
    p: &Packed,
    r0: usize,
    a: &Acts,
    t0: usize,
    out: &mut [f32],
) {
    pk_k::<R, N, true>(p, r0, a, t0, out)
}
