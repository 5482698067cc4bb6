//! The interleaved formats on AVX2, without VNNI: each 16-row group is two halves of eight rows,
//! one 32-bit lane of a 256-bit register per row.
//!
//! `vpmaddubsw` multiplies a step's four unsigned quants of each row by a broadcast of the token's
//! four activation quants into two 16-bit pair sums per lane, and `vpmaddwd` by ones adds the
//! pairs into the lane's 32-bit sum. The 16-bit results are first added over as many steps as
//! cannot overflow: a pair sum of a nibble is at most 2 · 15 · 128 = 3840, so eight steps of Q4_0
//! or Q4_K fit in 16 bits (30720), four of Q5_0's five-bit quants (4 · 7936) and two of Q6_K's
//! six-bit ones (2 · 16128). Q8_0's stored `q + 128` would overflow a pair sum, so it multiplies
//! `|q|` by the activation with `q`'s sign (at most 2 · 128 · 127) and widens each step. Q4_K's
//! mins go through `vpmaddwd` of each row's (min, min) pairs with the token's pairs of 32-sums.
//! Every integer sum is exact, and the float steps are [`Format::accumulate`](super::Format)'s,
//! so the bits are the scalar path's.

// Index loops over the const-generic tile dimensions read more plainly than zipped iterators.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::super::avx2::bits_32_as_0x10;
use super::{
    format, k_tokens, q4k_min_pairs, Acts, Format, Interleaved, GROUP, NIBBLE_BYTES, Q4, Q4K_M,
    Q4K_QS, Q4K_SC, Q5, Q6K_QH, Q6K_QL, Q6K_SC, Q8, QK, QK_K, QUAD, SCALE_BYTES, STEP_BYTES, TILE,
};

/// Rows per 256-bit register of i32 lanes: a group is two halves.
const HALF: usize = GROUP / 2;
/// Bytes ahead of the block being read that the first token pair prefetches.
const PF_AHEAD: usize = 4096;

/// [`Interleaved::scalar_tile`] with AVX2 (the same bits).
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
                    (Format::Q4_0, 2 | 3) => kernel::<Q4, 2>(p, acts, t0 + t, out),
                    (Format::Q4_0, _) => kernel::<Q4, 4>(p, acts, t0 + t, out),
                    (Format::Q5_0, 1) => kernel::<Q5, 1>(p, acts, t0 + t, out),
                    (Format::Q5_0, 2 | 3) => kernel::<Q5, 2>(p, acts, t0 + t, out),
                    (Format::Q5_0, _) => kernel::<Q5, 4>(p, acts, t0 + t, out),
                    (Format::Q8_0, 1) => kernel::<Q8, 1>(p, acts, t0 + t, out),
                    (Format::Q8_0, _) => kernel::<Q8, 2>(p, acts, t0 + t, out),
                    (Format::Q4_K, 1) => kernel_q4k::<1>(p, acts, t0 + t, out),
                    (Format::Q4_K, _) => kernel_q4k::<2>(p, acts, t0 + t, out),
                    (Format::Q6_K, 1) => kernel_q6k::<1>(p, acts, t0 + t, out),
                    (Format::Q6_K, _) => kernel_q6k::<2>(p, acts, t0 + t, out),
                }
            }
            t += match (il.format, nt - t) {
                (Format::Q4_0 | Format::Q5_0, 4) => 4,
                (_, left) => left.min(2),
            };
        }
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
    let (mut lo, mut hi) = nibbles(load(j));
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
    let q: [*const u8; N] = std::array::from_fn(|t| acts.q(t0 + t).as_ptr() as *const u8);
    let d: [&[f32]; N] = std::array::from_fn(|t| acts.d(t0 + t));
    let isum: [&[i32]; N] = std::array::from_fn(|t| acts.isum(t0 + t));
    let mut acc = [[_mm256_setzero_ps(); N]; 2];
    for b in 0..acts.nb() {
        let blk = w.add(b * bytes);
        if t0 == 0 {
            prefetch_ahead(blk, bytes);
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
                            widen_into(&mut s[t], &mut s16[t]);
                        }
                    }
                }
            }
            let dw = scales8(blk, h);
            for t in 0..N {
                let dd = _mm256_mul_ps(dw, _mm256_set1_ps(d[t][b]));
                acc[h][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), dd, acc[h][t]);
            }
        }
    }
    store(&acc, out);
}

/// Prefetches the `bytes` of the block at `blk`, [`PF_AHEAD`] ahead.
#[inline(always)]
fn prefetch_ahead(blk: *const u8, bytes: usize) {
    for l in 0..bytes.div_ceil(64) {
        crate::cpu::prefetch_ptr(blk.wrapping_add(PF_AHEAD + 64 * l));
    }
}

/// Four activation quants at `p` broadcast to every lane.
#[inline(always)]
unsafe fn quad(p: *const u8) -> __m256i {
    _mm256_set1_epi32((p as *const i32).read_unaligned())
}

/// Half `h` of the 16 rows' f16 scales at `p`, as f32.
#[inline(always)]
unsafe fn scales8(p: *const u8, h: usize) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * HALF * h) as *const __m128i))
}

/// Half `h` of step `s` of the quants at `at` of block `blk`.
#[inline(always)]
unsafe fn load_half(blk: *const u8, at: usize, s: usize, h: usize) -> __m256i {
    _mm256_loadu_si256(blk.add(at + s * STEP_BYTES + 32 * h) as *const __m256i)
}

/// The low and the high nibbles of each byte of `v`.
#[inline(always)]
unsafe fn nibbles(v: __m256i) -> (__m256i, __m256i) {
    let nibble = _mm256_set1_epi8(15);
    (
        _mm256_and_si256(v, nibble),
        _mm256_and_si256(_mm256_srli_epi16::<4>(v), nibble),
    )
}

/// Half `h` of the 16 rows' bytes at `p` (one per row) widened to i32, unsigned or signed.
#[inline(always)]
unsafe fn widen8<const SIGNED: bool>(p: *const u8, h: usize) -> __m256i {
    let v = _mm_loadl_epi64(p.add(HALF * h) as *const __m128i);
    if SIGNED {
        _mm256_cvtepi8_epi32(v)
    } else {
        _mm256_cvtepu8_epi32(v)
    }
}

/// The lane sums of the 16-bit pair sums `s16`, added to `s`; `s16` starts again from zero.
#[inline(always)]
unsafe fn widen_into(s: &mut __m256i, s16: &mut __m256i) {
    *s = _mm256_add_epi32(*s, _mm256_madd_epi16(*s16, _mm256_set1_epi16(1)));
    *s16 = _mm256_setzero_si256();
}

/// The accumulators of both halves × `N` tokens into `out[t]`.
#[inline(always)]
unsafe fn store<const N: usize>(acc: &[[__m256; N]; 2], out: &mut [[f32; GROUP]]) {
    for t in 0..N {
        for h in 0..2 {
            _mm256_storeu_ps(out[t][HALF * h..].as_mut_ptr(), acc[h][t]);
        }
    }
}

/// Q4_K, one group × `N` tokens from `t0`: per sub-block of 32, eight steps of nibbles added in
/// 16 bits, widened, times the row's scale; the mins times the token's pairs of 32-sums.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kernel_q4k<const N: usize>(
    w: *const u8,
    acts: &Acts,
    t0: usize,
    out: &mut [[f32; GROUP]],
) {
    let bytes = Format::Q4_K.block_bytes();
    let (q, d, bsums) = k_tokens::<N>(acts, t0);
    let mut acc = [[_mm256_setzero_ps(); N]; 2];
    for b in 0..acts.nb() {
        let blk = w.add(b * bytes);
        if t0 == 0 {
            prefetch_ahead(blk, bytes);
        }
        let pairs: [[__m256i; 4]; N] = std::array::from_fn(|t| {
            q4k_min_pairs(bsums[t], b).map(|v| _mm256_set1_epi32(v as i32))
        });
        for h in 0..2 {
            let mut isum = [_mm256_setzero_si256(); N];
            for j in 0..4 {
                let mut lo = [_mm256_setzero_si256(); N];
                let mut hi = [_mm256_setzero_si256(); N];
                for i in 0..8 {
                    let (wl, wh) = nibbles(load_half(blk, Q4K_QS, 8 * j + i, h));
                    for t in 0..N {
                        let at = q[t].add(b * QK_K + 64 * j + QUAD * i);
                        lo[t] = _mm256_add_epi16(lo[t], _mm256_maddubs_epi16(wl, quad(at)));
                        hi[t] = _mm256_add_epi16(hi[t], _mm256_maddubs_epi16(wh, quad(at.add(32))));
                    }
                }
                let sl = widen8::<false>(blk.add(Q4K_SC + 2 * j * GROUP), h);
                let sh = widen8::<false>(blk.add(Q4K_SC + (2 * j + 1) * GROUP), h);
                for t in 0..N {
                    let (mut l, mut hs) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                    widen_into(&mut l, &mut lo[t]);
                    widen_into(&mut hs, &mut hi[t]);
                    let both =
                        _mm256_add_epi32(_mm256_mullo_epi32(l, sl), _mm256_mullo_epi32(hs, sh));
                    isum[t] = _mm256_add_epi32(isum[t], both);
                }
            }
            // half h's (min, min) pairs of each pair of sub-blocks, as i16
            let mins: [__m256i; 4] = std::array::from_fn(|p| {
                let at = blk.add(Q4K_M + 2 * p * GROUP + 2 * HALF * h) as *const __m128i;
                _mm256_cvtepu8_epi16(_mm_loadu_si128(at))
            });
            let (dw, dmin) = (scales8(blk, h), scales8(blk.add(SCALE_BYTES), h));
            for t in 0..N {
                let mut msum = _mm256_setzero_si256();
                for p in 0..4 {
                    msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mins[p], pairs[t][p]));
                }
                let da = _mm256_set1_ps(d[t][b]);
                let dd = _mm256_mul_ps(dw, da);
                let dm = _mm256_mul_ps(dmin, da);
                let a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), dd, acc[h][t]);
                acc[h][t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), dm, a);
            }
        }
    }
    store(&acc, out);
}

/// Q6_K, one group × `N` tokens from `t0`: per sub-block of 16, the sum starts at `−32 ·` the
/// token's 16-sum, four steps of six-bit quants (nibble and bit pair joined) added in 16 bits
/// two at a time, then times the row's signed scale.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kernel_q6k<const N: usize>(
    w: *const u8,
    acts: &Acts,
    t0: usize,
    out: &mut [[f32; GROUP]],
) {
    let bytes = Format::Q6_K.block_bytes();
    let (q, d, bsums) = k_tokens::<N>(acts, t0);
    let pair_bits = _mm256_set1_epi8(0x30);
    let mut acc = [[_mm256_setzero_ps(); N]; 2];
    for b in 0..acts.nb() {
        let blk = w.add(b * bytes);
        if t0 == 0 {
            prefetch_ahead(blk, bytes);
        }
        let bs: [&[i16]; N] = std::array::from_fn(|t| &bsums[t][b * 16..(b + 1) * 16]);
        let qb: [*const u8; N] = std::array::from_fn(|t| q[t].add(b * QK_K));
        for h in 0..2 {
            let mut isum = [_mm256_setzero_si256(); N];
            // sub-block 8k + 2f + half: quarter f of ggml's half k, its steps 4 · half..
            for k in 0..2 {
                for half in 0..2 {
                    for f in 0..4 {
                        let sub = 8 * k + 2 * f + half;
                        let mut s: [__m256i; N] =
                            std::array::from_fn(|t| _mm256_set1_epi32(-32 * i32::from(bs[t][sub])));
                        let mut s16 = [_mm256_setzero_si256(); N];
                        for i in 4 * half..4 * half + 4 {
                            let ql = load_half(blk, Q6K_QL, 16 * k + 8 * (f % 2) + i, h);
                            let (lo, hi) = nibbles(ql);
                            let qh = load_half(blk, Q6K_QH, 8 * k + i, h);
                            let bits = match f {
                                0 => _mm256_slli_epi16::<4>(qh),
                                1 => _mm256_slli_epi16::<2>(qh),
                                2 => qh,
                                _ => _mm256_srli_epi16::<2>(qh),
                            };
                            let u = _mm256_or_si256(
                                if f < 2 { lo } else { hi },
                                _mm256_and_si256(bits, pair_bits),
                            );
                            for t in 0..N {
                                let a = quad(qb[t].add(128 * k + 32 * f + QUAD * i));
                                s16[t] = _mm256_add_epi16(s16[t], _mm256_maddubs_epi16(u, a));
                                if i % 2 == 1 {
                                    widen_into(&mut s[t], &mut s16[t]);
                                }
                            }
                        }
                        let sc = widen8::<true>(blk.add(Q6K_SC + sub * GROUP), h);
                        for t in 0..N {
                            isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(s[t], sc));
                        }
                    }
                }
            }
            let dw = scales8(blk, h);
            for t in 0..N {
                let dd = _mm256_mul_ps(dw, _mm256_set1_ps(d[t][b]));
                acc[h][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), dd, acc[h][t]);
            }
        }
    }
    store(&acc, out);
}
