//! [`Pair::run`] for AVX2: the cached keys and values are converted from f16 in registers as they
//! are used, and up to [`HEADS`] query heads of the group share each conversion. Every value goes
//! through the same operations in the same order as in the portable form, so the bits are the
//! same:
//! - a score is `dot_f32(q, k) · scale`: 16 lanes, lane `i` summing `q[16c + i] · k[16c + i]`
//!   (product rounded, then added) over the chunks `c`, then the lanes added in order 0..16 (here
//!   for four heads at once, one head per lane of a 4-lane vector, after a transpose);
//! - an output value is `0 + w_0 · v_0 + w_1 · v_1 + …` over the keys in order.

use std::arch::x86_64::*;

use super::{Pair, Scratch};
use crate::cpu::ops::softmax;

/// Query heads that share one pass over the keys (and the values).
const HEADS: usize = 4;

/// Whether [`run`] takes heads of these sizes: keys a multiple of 16 values (whole 16-lane
/// chunks, without the portable dot product's tail), values a multiple of 8.
pub(super) fn fits(head_dim: usize, head_dim_v: usize) -> bool {
    head_dim.is_multiple_of(16) && head_dim_v.is_multiple_of(8)
}

/// [`Pair::run`] for heads that [`fits`] takes.
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn run(pair: &Pair, s: &mut Scratch, out: &mut [f32]) {
    let shape = pair.shape;
    let group = shape.n_head / shape.n_head_kv;
    let (hd, hd_v) = (shape.head_dim, shape.head_dim_v);
    debug_assert!(fits(hd, hd_v));
    let keys = pair.keys();
    let n_keys = keys.end() + 1 - keys.start();
    pair.round_query(s);
    s.scores.resize(group * n_keys, 0.0);
    // the portable dot product adds its (here empty) scalar tail's sum to the lanes' sum
    let tail = _mm_set1_ps(std::iter::empty::<f32>().sum());
    let scale = _mm_set1_ps(shape.scale);
    for g0 in (0..group).step_by(HEADS) {
        let ng = (group - g0).min(HEADS);
        // heads past the group's end repeat its last one; their results are dropped
        let q: [*const f32; HEADS] =
            std::array::from_fn(|h| s.q16.as_ptr().add((g0 + h.min(ng - 1)) * hd));
        for (jj, j) in keys.clone().enumerate() {
            let k = pair.cache.key(pair.il, j, pair.kv_head, hd).as_ptr() as *const __m128i;
            let mut acc = [[_mm256_setzero_ps(); 2]; HEADS];
            for c in 0..hd / 16 {
                let k0 = _mm256_cvtph_ps(_mm_loadu_si128(k.add(2 * c)));
                let k1 = _mm256_cvtph_ps(_mm_loadu_si128(k.add(2 * c + 1)));
                for (acc, &q) in acc.iter_mut().zip(&q) {
                    let q = q.add(16 * c);
                    acc[0] = _mm256_add_ps(acc[0], _mm256_mul_ps(_mm256_loadu_ps(q), k0));
                    acc[1] = _mm256_add_ps(acc[1], _mm256_mul_ps(_mm256_loadu_ps(q.add(8)), k1));
                }
            }
            let dots = _mm_add_ps(lane_sums(&acc), tail);
            let mut v = [0f32; HEADS];
            _mm_storeu_ps(v.as_mut_ptr(), _mm_mul_ps(dots, scale));
            for (h, &v) in v.iter().enumerate().take(ng) {
                s.scores[(g0 + h) * n_keys + jj] = v;
            }
        }
    }
    for w in s.scores.chunks_exact_mut(n_keys) {
        softmax(w);
        w.iter_mut()
            .for_each(|x| *x = half::f16::from_f32(*x).to_f32());
    }
    for g0 in (0..group).step_by(HEADS) {
        let ng = (group - g0).min(HEADS);
        let w: [&[f32]; HEADS] =
            std::array::from_fn(|h| &s.scores[(g0 + h.min(ng - 1)) * n_keys..][..n_keys]);
        for d in (0..hd_v).step_by(8) {
            let mut acc = [_mm256_setzero_ps(); HEADS];
            for (jj, j) in keys.clone().enumerate() {
                let v = pair
                    .cache
                    .value(pair.il, j, pair.kv_head, hd_v)
                    .as_ptr()
                    .add(d);
                let v = _mm256_cvtph_ps(_mm_loadu_si128(v as *const __m128i));
                for (acc, w) in acc.iter_mut().zip(&w) {
                    *acc = _mm256_add_ps(*acc, _mm256_mul_ps(_mm256_set1_ps(w[jj]), v));
                }
            }
            for (h, acc) in acc.iter().enumerate().take(ng) {
                _mm256_storeu_ps(out.as_mut_ptr().add((g0 + h) * hd_v + d), *acc);
            }
        }
    }
}

/// For each head `h` (the rows of `acc`: lanes 0..8, then 8..16), its 16 lanes added in order,
/// as lane `h` of the result.
#[inline(always)]
unsafe fn lane_sums(acc: &[[__m256; 2]; HEADS]) -> __m128 {
    let mut sum = None;
    for half in [0, 1] {
        // a 4 × 4 transpose in each 128-bit lane: t[i] holds lane i of every head (low half) and
        // lane i + 4 (high half)
        let r = acc.map(|a| a[half]);
        let (a, b) = (
            _mm256_unpacklo_ps(r[0], r[1]),
            _mm256_unpackhi_ps(r[0], r[1]),
        );
        let (c, d) = (
            _mm256_unpacklo_ps(r[2], r[3]),
            _mm256_unpackhi_ps(r[2], r[3]),
        );
        let t = [
            _mm256_shuffle_ps::<0b01_00_01_00>(a, c),
            _mm256_shuffle_ps::<0b11_10_11_10>(a, c),
            _mm256_shuffle_ps::<0b01_00_01_00>(b, d),
            _mm256_shuffle_ps::<0b11_10_11_10>(b, d),
        ];
        let low = t.map(|v| _mm256_castps256_ps128(v));
        let high = t.map(|v| _mm256_extractf128_ps::<1>(v));
        for lane in low.into_iter().chain(high) {
            sum = Some(sum.map_or(lane, |s| _mm_add_ps(s, lane)));
        }
    }
    sum.expect("16 lanes")
}

#[cfg(test)]
mod tests {
    use half::slice::HalfFloatSliceExt;

    use super::super::{AttentionShape, KvCache, Pair, Scratch};

    /// Pseudo-random values in [-2, 2) (a fixed LCG).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((x >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
            })
            .collect()
    }

    #[test]
    fn avx2_attention_has_the_portable_bits() {
        if !crate::cpu::has_avx2() {
            return;
        }
        // (query heads, KV heads, key size, value size, window): Gemma 3 270M, the synthetic
        // models, Qwen2.5 0.5B (7 heads a group), one head a group, a sliding window
        let shapes = [
            (4, 1, 256, 256, None),
            (16, 4, 64, 64, None),
            (14, 2, 64, 64, None),
            (8, 8, 128, 128, None),
            (6, 2, 48, 32, Some(5)),
        ];
        for (case, &(n_head, n_head_kv, hd, hd_v, window)) in shapes.iter().enumerate() {
            assert!(super::fits(hd, hd_v));
            let (pos0, n) = (37, 3);
            let mut cache = KvCache::with_widths(1, pos0 + n, n_head_kv * hd, n_head_kv * hd_v);
            let keys = values((pos0 + n) * n_head_kv * hd, 1 + case as u64);
            let vals = values((pos0 + n) * n_head_kv * hd_v, 100 + case as u64);
            cache.store(0, 0, &keys, &vals);
            let q = values(n * n_head * hd, 200 + case as u64);
            let shape = AttentionShape {
                n_head,
                n_head_kv,
                head_dim: hd,
                head_dim_v: hd_v,
                scale: 1.0 / (hd as f32).sqrt(),
                window,
            };
            let group = n_head / n_head_kv;
            for t in 0..n {
                for kv_head in 0..n_head_kv {
                    let pair = Pair {
                        cache: &cache,
                        il: 0,
                        shape: &shape,
                        q: &q,
                        pos0,
                        t,
                        kv_head,
                    };
                    let mut want = vec![0f32; group * hd_v];
                    pair.run(&mut Scratch::default(), &mut want, |h, f| {
                        h.convert_to_f32_slice(f)
                    });
                    let mut got = vec![f32::NAN; group * hd_v];
                    // SAFETY: the CPU has AVX2 (checked above; F16C comes with it here).
                    unsafe { super::run(&pair, &mut Scratch::default(), &mut got) };
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "case {case} t {t} kv head {kv_head}"
                    );
                }
            }
        }
    }
}
