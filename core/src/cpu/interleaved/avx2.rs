//! The 32-column interleaved formats (Q4_0, Q5_0, Q8_0) on AVX2, without VNNI: each 16-row group
//! is two halves of eight rows, one 32-bit lane of a 256-bit register per row.
//!
//! `vpmaddubsw` multiplies a step's four unsigned quants of each row by a broadcast of the token's
//! four activation quants into two 16-bit pair sums per lane, and `vpmaddwd` by ones adds the
//! pairs into the lane's 32-bit sum. Q4_0 and Q5_0 first add their 16-bit results over several
//! steps: a pair sum of a nibble is at most 2 · 15 · 128 = 3840, so all eight of a Q4_0 block fit
//! in 16 bits (30720), and four of Q5_0's five-bit ones (4 · 7936). Q8_0's stored `q + 128`
//! would overflow a pair sum, so it multiplies `|q|` by the activation with `q`'s sign (at most
//! 2 · 128 · 127) and adds each step at once. Every integer sum is exact, and the float steps
//! are [`Format::accumulate`](super::Format)'s, so the bits are the scalar path's.

// Index loops over the const-generic tile dimensions read more plainly than zipped iterators.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::super::avx2::bits_32_as_0x10;
use super::{
    Acts, Format, Interleaved, GROUP, NIBBLE_BYTES, QK, QUAD, SCALE_BYTES, STEP_BYTES, TILE,
};

/// Rows per 256-bit register of i32 lanes: a group is two halves.
const HALF: usize = GROUP / 2;
/// Bytes ahead of the block being read that the first token pair prefetches.
const PF_AHEAD: usize = 4096;

/// The kernels' const-generic names of the formats.
const Q4: u8 = 0;
const Q5: u8 = 1;
const Q8: u8 = 2;

/// Whether `format` has an AVX2 kernel here.
pub(super) fn supports(format: Format) -> bool {
    matches!(format, Format::Q4_0 | Format::Q5_0 | Format::Q8_0)
}

/// [`Interleaved::scalar_tile`] with AVX2 (the same bits), for a format [`supports`] accepts.
pub(super) fn tile(
    il: &Interleaved,
    g: usize,
    ng: usize,
    acts: &Acts,
    t0: usize,
    nt: usize,
    tile: &mut [[f32; GROUP]; TILE],
) {
    assert!((1..=4).contains(&ng) && (1..=4).contains(&nt) && t0 + nt <= acts.n);
    let gb = il.group_bytes();
    let w = il.groups(g, ng).as_ptr();
    for gi in 0..ng {
        let mut t = 0;
        while t < nt {
            let (p, out) = (w.wrapping_add(gi * gb), &mut tile[gi * nt + t..]);
            // SAFETY: only called on the AVX2 level (AVX2, FMA, F16C); group gi (sliced above)
            // and tokens t0 + t.. (asserted) exist.
            unsafe {
                match (il.format, nt - t) {
                    (Format::Q4_0, 1) => kernel::<Q4, 1>(p, acts, t0 + t, out),
                    (Format::Q4_0, _) => kernel::<Q4, 2>(p, acts, t0 + t, out),
                    (Format::Q5_0, 1) => kernel::<Q5, 1>(p, acts, t0 + t, out),
                    (Format::Q5_0, _) => kernel::<Q5, 2>(p, acts, t0 + t, out),
                    (Format::Q8_0, 1) => kernel::<Q8, 1>(p, acts, t0 + t, out),
                    (Format::Q8_0, _) => kernel::<Q8, 2>(p, acts, t0 + t, out),
                    (format, _) => unreachable!("no AVX2 kernel for {format:?}"),
                }
            }
            t += (nt - t).min(2);
        }
    }
}

/// The format `F` of a const-generic name.
const fn format(f: u8) -> Format {
    match f {
        Q4 => Format::Q4_0,
        Q5 => Format::Q5_0,
        _ => Format::Q8_0,
    }
}

/// Steps whose 16-bit products format `F` adds before widening them (see the module doc).
const fn steps_per_widening(f: u8) -> usize {
    match f {
        Q4 => 8,
        Q5 => 4,
        _ => 1,
    }
}

/// Half `h` of step pair `j` of block `blk`'s quants, as unsigned bytes (Q8_0: as signed), and
/// the offsets of the activation quads each multiplies: Q8_0 steps `2j` and `2j + 1`; Q4_0 /
/// Q5_0 step `j`'s low and high nibbles (plus their fifth bits).
#[inline(always)]
unsafe fn step<const F: u8>(blk: *const u8, j: usize, h: usize) -> ([__m256i; 2], [usize; 2]) {
    let load = |s: usize| {
        _mm256_loadu_si256(blk.add(SCALE_BYTES + s * STEP_BYTES + h * 32) as *const __m256i)
    };
    if F == Q8 {
        let sign = _mm256_set1_epi8(-128);
        return (
            [
                _mm256_xor_si256(load(2 * j), sign),
                _mm256_xor_si256(load(2 * j + 1), sign),
            ],
            [8 * j, 8 * j + QUAD],
        );
    }
    let v = load(j);
    let nibble = _mm256_set1_epi8(15);
    let mut lo = _mm256_and_si256(v, nibble);
    let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nibble);
    if F == Q5 {
        // bit k of mask m marks byte k of its step; this half's bytes are bits 32h..
        let masks = blk.add(SCALE_BYTES + NIBBLE_BYTES + 4 * h);
        lo = _mm256_or_si256(lo, bits_32_as_0x10(masks.add(8 * (2 * j))));
        hi = _mm256_or_si256(hi, bits_32_as_0x10(masks.add(8 * (2 * j + 1))));
    }
    ([lo, hi], [QUAD * j, QK / 2 + QUAD * j])
}

/// The 16-bit pair sums of quants `w` (of format `F`) times the activation quad `a`.
#[inline(always)]
unsafe fn pair_sums<const F: u8>(w: __m256i, a: __m256i) -> __m256i {
    if F == Q8 {
        _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w))
    } else {
        _mm256_maddubs_epi16(w, a)
    }
}

/// Format `F`, one group × `N` tokens from `t0`: `out[t]` (16 rows each).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kernel<const F: u8, const N: usize>(
    w: *const u8,
    acts: &Acts,
    t0: usize,
    out: &mut [[f32; GROUP]],
) {
    let bytes = format(F).block_bytes();
    // Q8_0's sums are signed already; the others remove the offset with the activation sums
    let offset = if F == Q8 { 0 } else { format(F).offset() };
    let widen_every = steps_per_widening(F);
    let ones = _mm256_set1_epi16(1);
    let q: [*const u8; N] = std::array::from_fn(|t| acts.q(t0 + t).as_ptr() as *const u8);
    let d: [&[f32]; N] = std::array::from_fn(|t| acts.d(t0 + t));
    let isum: [&[i32]; N] = std::array::from_fn(|t| acts.isum(t0 + t));
    let mut acc = [[_mm256_setzero_ps(); N]; 2];
    for b in 0..acts.nb() {
        let blk = w.add(b * bytes);
        if t0 == 0 {
            for l in 0..bytes.div_ceil(64) {
                crate::cpu::prefetch_ptr(blk.wrapping_add(PF_AHEAD + 64 * l));
            }
        }
        for h in 0..2 {
            let mut s: [__m256i; N] =
                std::array::from_fn(|t| _mm256_set1_epi32(-offset * isum[t][b]));
            let mut s16 = [_mm256_setzero_si256(); N];
            for j in 0..4 {
                let (wv, at) = step::<F>(blk, j, h);
                for t in 0..N {
                    for k in 0..2 {
                        let a = _mm256_set1_epi32(
                            (q[t].add(b * QK + at[k]) as *const i32).read_unaligned(),
                        );
                        s16[t] = _mm256_add_epi16(s16[t], pair_sums::<F>(wv[k], a));
                        if (2 * j + k + 1) % widen_every == 0 {
                            s[t] = _mm256_add_epi32(s[t], _mm256_madd_epi16(s16[t], ones));
                            s16[t] = _mm256_setzero_si256();
                        }
                    }
                }
            }
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(2 * HALF * h) as *const __m128i));
            for t in 0..N {
                let dd = _mm256_mul_ps(dw, _mm256_set1_ps(d[t][b]));
                acc[h][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), dd, acc[h][t]);
            }
        }
    }
    for t in 0..N {
        for h in 0..2 {
            _mm256_storeu_ps(out[t][HALF * h..].as_mut_ptr(), acc[h][t]);
        }
    }
}
