//! [`Pair::run`] for AVX2: the cached keys and values are converted from f16 in registers as they
//! are used, and up to [`ROWS`] query heads of the group share each conversion. Every value goes
//! through the same operations in the same order as in the portable form, so the bits are the
//! same:
//! - the scores of two key blocks (16 keys, one per lane) are sums over chunks of
//!   [`SCORE_CHUNK`] dimensions, each chunk's `Σ_i q_i · k_i` in order (product rounded, then
//!   added) and the chunks' sums added in order, then `· scale`;
//! - an output value is `0 + w_0 · v_0 + w_1 · v_1 + …` over the keys in order, 16 dimensions of
//!   each head at a time.

use std::arch::x86_64::*;

use half::f16;

use super::{Pair, Scratch, KEY_BLOCK, SCORE_CHUNK};

/// Query heads that share one pass over the keys (and the values): two accumulators each, with
/// two operands and a broadcast, fill the 16 vector registers.
const ROWS: usize = 6;

/// Bytes of f16 values (of one KV head) that the value pass weighs at a time, every query head and
/// dimension of the group passing over them before the next run of keys: a part of L1.
const VALUE_RUN_BYTES: usize = 16 << 10;

/// Whether [`run`] takes heads of these sizes: values a multiple of 16 (two vectors).
pub(super) fn fits(head_dim_v: usize) -> bool {
    head_dim_v.is_multiple_of(16)
}

/// [`Pair::run`] for heads that [`fits`] takes.
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn run(pair: &Pair, s: &mut Scratch, out: &mut [f32]) {
    let shape = pair.shape;
    let heads = pair.heads;
    let (hd, hd_v) = (shape.head_dim, shape.head_dim_v);
    debug_assert!(fits(hd_v));
    let layout = pair.prepare(s);
    let (n_keys, skip, span) = (layout.n_keys, layout.skip, layout.span);
    let (first_block, n_blocks) = (layout.blocks.start, layout.blocks.len());
    let scores = s.scores.as_mut_ptr();
    let chunks = heads.div_ceil(ROWS);
    let per = heads.div_ceil(chunks);
    for bb in (0..n_blocks).step_by(2) {
        let b = first_block + bb;
        let k0 = pair.cache.key_block(pair.il, b, pair.kv_head, hd).as_ptr();
        let k1 = pair
            .cache
            .key_block(pair.il, b + 1, pair.kv_head, hd)
            .as_ptr();
        for g0 in (0..heads).step_by(per) {
            let rows = (heads - g0).min(per);
            let q = |r: usize| s.q16.as_ptr().add((g0 + r) * hd);
            let o = |r: usize| scores.add((g0 + r) * span + bb * KEY_BLOCK);
            let score = Score {
                k: [k0, k1],
                hd,
                scale: shape.scale,
            };
            for_rows(&score, rows, q, o);
        }
    }
    Pair::softmax_rows(s, span, skip, n_keys);
    let (values, width) = pair.cache.values(pair.il);
    let first = layout.keys.start() * width + pair.kv_head * hd_v;
    assert!(first + (n_keys - 1) * width + hd_v <= values.len());
    assert_eq!(out.len(), heads * hd_v);
    out.fill(0.0);
    let (weights, out) = (s.scores.as_ptr(), out.as_mut_ptr());
    // the keys in runs whose values stay in L1 while every head and dimension passes over them
    let run_keys = (VALUE_RUN_BYTES / (2 * hd_v)).max(1);
    for j0 in (0..n_keys).step_by(run_keys) {
        for g0 in (0..heads).step_by(per) {
            let rows = (heads - g0).min(per);
            for d in (0..hd_v).step_by(16) {
                let weigh = Weigh {
                    v: values.as_ptr().add(first + j0 * width + d),
                    width,
                    n_keys: (n_keys - j0).min(run_keys),
                };
                let w = |r: usize| weights.add((g0 + r) * span + skip + j0);
                let o = |r: usize| out.add((g0 + r) * hd_v + d);
                for_rows(&weigh, rows, w, o);
            }
        }
    }
}

/// A kernel over `R` query heads at a time (`R` ≤ [`ROWS`]), run by [`for_rows`]: `a(r)` is head
/// `r`'s f32 operand, `out(r)` where its 16 results go.
trait RowKernel {
    unsafe fn rows<const R: usize>(
        &self,
        a: impl Fn(usize) -> *const f32,
        out: impl Fn(usize) -> *mut f32,
    );
}

/// Runs `kernel` on `rows` heads (1 ..= [`ROWS`]).
#[inline(always)]
unsafe fn for_rows(
    kernel: &impl RowKernel,
    rows: usize,
    a: impl Fn(usize) -> *const f32,
    out: impl Fn(usize) -> *mut f32,
) {
    match rows {
        1 => kernel.rows::<1>(a, out),
        2 => kernel.rows::<2>(a, out),
        3 => kernel.rows::<3>(a, out),
        4 => kernel.rows::<4>(a, out),
        5 => kernel.rows::<5>(a, out),
        _ => kernel.rows::<6>(a, out),
    }
}

/// `acc_r += a_r[s] · x_s` for each head `r` over the steps `s` in order (the product rounded,
/// then added), `x(s)` pointing at the step's two vectors of 8 f16 values.
#[inline(always)]
unsafe fn accumulate<const R: usize>(
    acc: &mut [[__m256; 2]; R],
    a: &[*const f32; R],
    steps: usize,
    x: impl Fn(usize) -> [*const f16; 2],
) {
    for s in 0..steps {
        let x = x(s).map(|p| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)));
        for (acc, a) in acc.iter_mut().zip(a) {
            let a = _mm256_broadcast_ss(&*a.add(s));
            acc[0] = _mm256_add_ps(acc[0], _mm256_mul_ps(a, x[0]));
            acc[1] = _mm256_add_ps(acc[1], _mm256_mul_ps(a, x[1]));
        }
    }
}

/// The scores of two key blocks.
struct Score {
    /// The blocks' f16 keys (dimension-major, [`KEY_BLOCK`] keys a dimension).
    k: [*const f16; 2],
    hd: usize,
    scale: f32,
}

impl RowKernel for Score {
    /// For `R` heads, the 16 scores `(Σ_i q_i · k_i) · scale` to `out(r)`; `q(r)` is head `r`'s
    /// f16-rounded query.
    #[inline(always)]
    unsafe fn rows<const R: usize>(
        &self,
        q: impl Fn(usize) -> *const f32,
        out: impl Fn(usize) -> *mut f32,
    ) {
        let q: [*const f32; R] = std::array::from_fn(q);
        // each chunk's sums on their own, added to the running totals in `out`
        for c in (0..self.hd).step_by(SCORE_CHUNK) {
            let mut acc = [[_mm256_setzero_ps(); 2]; R];
            let steps = (self.hd - c).min(SCORE_CHUNK);
            accumulate(&mut acc, &q.map(|q| q.add(c)), steps, |i| {
                self.k.map(|k| k.add(KEY_BLOCK * (c + i)))
            });
            for (r, acc) in acc.iter().enumerate() {
                for (half, &a) in acc.iter().enumerate() {
                    let o = out(r).add(KEY_BLOCK * half);
                    let total = if c == 0 {
                        a
                    } else {
                        _mm256_add_ps(_mm256_loadu_ps(o), a)
                    };
                    _mm256_storeu_ps(o, total);
                }
            }
        }
        let scale = _mm256_set1_ps(self.scale);
        for r in 0..R {
            for half in 0..2 {
                let o = out(r).add(KEY_BLOCK * half);
                _mm256_storeu_ps(o, _mm256_mul_ps(_mm256_loadu_ps(o), scale));
            }
        }
    }
}

/// 16 dimensions of the values of consecutive keys, weighed.
struct Weigh {
    /// The first key's values (f16), a key every `width` values.
    v: *const f16,
    width: usize,
    n_keys: usize,
}

impl RowKernel for Weigh {
    /// For `R` heads, adds `w_j · v_j` over the keys in order to `out(r)` (16 values); `w(r)` is
    /// head `r`'s weights of the keys.
    #[inline(always)]
    unsafe fn rows<const R: usize>(
        &self,
        w: impl Fn(usize) -> *const f32,
        out: impl Fn(usize) -> *mut f32,
    ) {
        let mut acc: [[__m256; 2]; R] =
            std::array::from_fn(|r| [0, 8].map(|at| _mm256_loadu_ps(out(r).add(at))));
        accumulate(&mut acc, &std::array::from_fn(w), self.n_keys, |j| {
            let v = self.v.add(j * self.width);
            [v, v.add(8)]
        });
        for (r, acc) in acc.iter().enumerate() {
            _mm256_storeu_ps(out(r), acc[0]);
            _mm256_storeu_ps(out(r).add(8), acc[1]);
        }
    }
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
        // models, Qwen2.5 0.5B (7 heads a group), one head a group, a sliding window (with keys
        // of two and a half score chunks)
        let shapes = [
            (4, 1, 256, 256, None),
            (16, 4, 64, 64, None),
            (14, 2, 64, 64, None),
            (8, 8, 128, 128, None),
            (6, 2, 40, 32, Some(5)),
        ];
        for (case, &(n_head, n_head_kv, hd, hd_v, window)) in shapes.iter().enumerate() {
            assert!(super::fits(hd_v));
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
                    let pair = |head0, heads| Pair {
                        cache: &cache,
                        il: 0,
                        shape: &shape,
                        q: &q,
                        pos0,
                        t,
                        kv_head,
                        head0,
                        heads,
                    };
                    let mut want = vec![0f32; group * hd_v];
                    pair(0, group).run(&mut Scratch::default(), &mut want, |h, f| {
                        h.convert_to_f32_slice(f)
                    });
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    // the whole group, then its heads one task each (as decoding with fewer
                    // pairs than threads splits them)
                    for heads in [group, 1] {
                        let mut got = vec![f32::NAN; group * hd_v];
                        for (i, got) in got.chunks_exact_mut(heads * hd_v).enumerate() {
                            // SAFETY: the CPU has AVX2 (checked above; F16C comes with it here).
                            unsafe {
                                super::run(&pair(i * heads, heads), &mut Scratch::default(), got)
                            };
                        }
                        assert_eq!(
                            bits(&got),
                            bits(&want),
                            "case {case} t {t} kv head {kv_head}, {heads} heads a task"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn heads_split_only_when_threads_would_idle() {
        use super::super::heads_per_task;
        // (group, pairs, threads) → heads a task
        assert_eq!(heads_per_task(7, 128, 2), 7);
        assert_eq!(heads_per_task(7, 2, 2), 7);
        assert_eq!(heads_per_task(4, 1, 2), 2);
        assert_eq!(heads_per_task(4, 1, 16), 1);
        assert_eq!(heads_per_task(7, 1, 2), 1);
        assert_eq!(heads_per_task(1, 1, 8), 1);
    }
}
