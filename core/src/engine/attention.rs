//! Causal multi-head attention over the KV cache (grouped-query, optional sliding window).
//!
//! Precision follows ggml's attention over an f16 cache: the query is rounded to f16 before its
//! dot products with the keys, and the softmax weights are rounded to f16 before they weigh the
//! values (ggml converts both operands of an f16 matrix product to f16); sums are in f32, in an
//! order fixed by [`Pair::run`] that every kernel keeps, so that the bits do not depend on the CPU.
//!
//! Work is split over (token, KV head) pairs: the query heads that share a KV head are handled
//! together, so each cached key and value is converted from f16 once per group, not per head.
//! Keys are cached dimension-major in blocks of positions ([`KEY_BLOCK`]), so that the scores of
//! a block's keys are vectors of independent sums.

use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::kv_cache::{KvCache, KEY_BLOCK};
#[cfg(target_arch = "x86_64")]
#[path = "attention_avx2.rs"]
mod avx2;
use crate::cpu::ops::softmax;

/// The attention problem of one layer for a batch of query tokens.
pub struct AttentionShape {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Size of a query/key head.
    pub head_dim: usize,
    /// Size of a value head.
    pub head_dim_v: usize,
    /// Multiplier of the scores.
    pub scale: f32,
    /// Sliding window (a query at `p` sees keys `p - window + 1 ..= p`), if any.
    pub window: Option<usize>,
}

/// Multiply-adds below which a piece of attention is not worth a task of its own: handing a task
/// to a worker that is awake ([`super::awake`]) costs about a microsecond, about what this much
/// work takes on one core.
const MIN_TASK_MACS: usize = 1 << 14;

/// Dimensions of a key summed on their own before the chunks' sums are added: the score's
/// rounding error then grows with `SCORE_CHUNK + head_dim / SCORE_CHUNK` terms, not `head_dim`.
const SCORE_CHUNK: usize = 16;

/// Per-task buffers.
#[derive(Default)]
struct Scratch {
    q16: Vec<f32>,
    scores: Vec<f32>,
    w16: Vec<f16>,
    row: Vec<f32>,
}

/// For each query token `t` (at position `pos0 + t`) and head, `out = softmax(scale · q·K) · V`
/// over the positions it may see. `q` is `n × n_head × head_dim`; `out` is `n × n_head × head_dim_v`.
pub fn attend(
    cache: &KvCache,
    il: usize,
    shape: &AttentionShape,
    q: &[f32],
    pos0: usize,
    out: &mut [f32],
) {
    let group = shape.n_head / shape.n_head_kv;
    let (hd, hd_v) = (shape.head_dim, shape.head_dim_v);
    let n = out.len() / (shape.n_head * hd_v).max(1);
    let heads = heads_per_task(group, n * shape.n_head_kv, rayon::current_num_threads());
    let tasks_per_pair = group / heads;
    // tasks per rayon job: each job at least MIN_TASK_MACS multiply-adds, so that a decode step
    // over a short context runs on the calling thread instead of waking the others
    let keys = shape.window.map_or(pos0 + n, |w| w.min(pos0 + n)).max(1);
    let task_macs = keys * heads * (hd + hd_v);
    let min_len = MIN_TASK_MACS.div_ceil(task_macs.max(1));
    let avx2 = crate::cpu::has_avx2();
    out.par_chunks_mut(heads * hd_v)
        .with_min_len(min_len)
        .enumerate()
        .for_each_init(Scratch::default, |s, (i, out)| {
            let pair = i / tasks_per_pair;
            let pair = Pair {
                cache,
                il,
                shape,
                q,
                pos0,
                t: pair / shape.n_head_kv,
                kv_head: pair % shape.n_head_kv,
                head0: i % tasks_per_pair * heads,
                heads,
            };
            #[cfg(target_arch = "x86_64")]
            if avx2 {
                // SAFETY: the CPU has AVX2, FMA and F16C (the kernels' AVX2 level runs).
                unsafe { pair.run_avx2(s, out) };
                return;
            }
            let _ = avx2;
            pair.run(s, out, |h, f| h.convert_to_f32_slice(f));
        });
}

/// Query heads of a KV group that one task takes: the whole group, unless there are fewer
/// (token, KV head) pairs than threads (decoding a model with one or two KV heads); then the
/// largest divisor of the group that gives every thread a task (each task converts the keys
/// and values it reads on its own).
fn heads_per_task(group: usize, pairs: usize, threads: usize) -> usize {
    let want = threads.div_ceil(pairs.max(1));
    (1..=group)
        .rev()
        .find(|&h| group.is_multiple_of(h) && group / h >= want)
        .unwrap_or(1)
}

/// One query token's heads of one KV-head group (all of them or a run of them): the unit of work
/// of [`attend`].
struct Pair<'a> {
    cache: &'a KvCache,
    il: usize,
    shape: &'a AttentionShape,
    q: &'a [f32],
    pos0: usize,
    /// The query token (row of `q`).
    t: usize,
    kv_head: usize,
    /// The first of the pair's query heads, counted in the group.
    head0: usize,
    /// Query heads of the pair.
    heads: usize,
}

/// Where a pair's keys lie: the positions it sees, their number, the key blocks holding them
/// ([`Pair::key_blocks`]: the first key at `skip` in the first block), and the scores per head
/// (`span`, whole blocks).
struct KeyLayout {
    keys: std::ops::RangeInclusive<usize>,
    n_keys: usize,
    blocks: std::ops::Range<usize>,
    skip: usize,
    span: usize,
}

impl Pair<'_> {
    /// [`Pair::run`] compiled for AVX2 (the same operations in the same order, so the same bits:
    /// only the vectors are wider).
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn run_avx2(&self, s: &mut Scratch, out: &mut [f32]) {
        if avx2::fits(self.shape.head_dim_v) {
            // SAFETY: the caller guarantees AVX2 and F16C (this function's contract).
            return unsafe { avx2::run(self, s, out) };
        }
        // SAFETY: as above.
        self.run(s, out, |h, f| unsafe { crate::cpu::widen_f16_row(h, f) })
    }

    /// The cached positions the query sees.
    fn keys(&self) -> std::ops::RangeInclusive<usize> {
        let p = self.pos0 + self.t;
        let first = self.shape.window.map_or(0, |w| (p + 1).saturating_sub(w));
        first..=p
    }

    /// The pair's query heads rounded to f16 (as ggml rounds the query of an f16 product) into
    /// `s.q16`.
    fn round_query(&self, s: &mut Scratch) {
        let shape = self.shape;
        let group = shape.n_head / shape.n_head_kv;
        let head = self.kv_head * group + self.head0;
        let q_start = (self.t * shape.n_head + head) * shape.head_dim;
        s.q16.clear();
        s.q16.extend(
            self.q[q_start..q_start + self.heads * shape.head_dim]
                .iter()
                .map(|&x| f16::from_f32(x).to_f32()),
        );
    }

    /// The layout of the pair's keys ([`KeyLayout`]), with the query rounded into `s.q16` and
    /// room for every head's scores in `s.scores`: what both the portable and the AVX2 run start
    /// from.
    fn prepare(&self, s: &mut Scratch) -> KeyLayout {
        let keys = self.keys();
        let n_keys = keys.end() + 1 - keys.start();
        let (blocks, skip) = self.key_blocks();
        let span = blocks.len() * KEY_BLOCK;
        self.round_query(s);
        s.scores.resize(self.heads * span, 0.0);
        KeyLayout {
            keys,
            n_keys,
            blocks,
            skip,
            span,
        }
    }

    /// The key blocks that hold [`Pair::keys`] (see [`KEY_BLOCK`]), in whole pairs from an even
    /// block (a kernel may take two blocks at a time; the cache holds every such pair), and where
    /// the first key sits in the first block's scores.
    fn key_blocks(&self) -> (std::ops::Range<usize>, usize) {
        let keys = self.keys();
        let first = keys.start() / (2 * KEY_BLOCK) * 2;
        let end = (keys.end() / KEY_BLOCK + 1).next_multiple_of(2);
        (first..end, keys.start() - first * KEY_BLOCK)
    }

    /// Softmax of each head's scores over the keys it sees (`n_keys` from `skip` in each row of
    /// `span` scores), the weights rounded to f16 (through `s.w16`, a whole row at a time).
    fn softmax_rows(s: &mut Scratch, span: usize, skip: usize, n_keys: usize) {
        s.w16.resize(n_keys, f16::ZERO);
        for row in s.scores.chunks_exact_mut(span) {
            let w = &mut row[skip..skip + n_keys];
            softmax(w);
            s.w16.convert_from_f32_slice(w);
            s.w16.convert_to_f32_slice(w);
        }
    }

    /// Writes the pair's heads' `out = softmax(scale · q·K) · V`; `widen` converts cached f16 values to
    /// f32. A score is `(Σ_i q_i · k_i) · scale`, summed per chunk of [`SCORE_CHUNK`] dimensions
    /// (the products added in order of `i`, each rounded, then added) and the chunks' sums added
    /// in order; an output value `0 + w_0 · v_0 + w_1 · v_1 + …` over the keys in order.
    #[inline(always)]
    fn run(&self, s: &mut Scratch, out: &mut [f32], widen: impl Fn(&[f16], &mut [f32])) {
        let shape = self.shape;
        let (hd, hd_v) = (shape.head_dim, shape.head_dim_v);
        let KeyLayout {
            keys,
            n_keys,
            blocks,
            skip,
            span,
        } = self.prepare(s);
        s.row.resize((hd * KEY_BLOCK).max(hd_v), 0.0);
        for (bb, b) in blocks.enumerate() {
            let k = &mut s.row[..hd * KEY_BLOCK];
            widen(self.cache.key_block(self.il, b, self.kv_head, hd), k);
            for (g, qh) in s.q16.chunks_exact(hd).enumerate() {
                let mut total = [0f32; KEY_BLOCK];
                let chunks = qh
                    .chunks(SCORE_CHUNK)
                    .zip(k.chunks(SCORE_CHUNK * KEY_BLOCK));
                for (c, (qc, kc)) in chunks.enumerate() {
                    let mut acc = [0f32; KEY_BLOCK];
                    for (&qi, ki) in qc.iter().zip(kc.chunks_exact(KEY_BLOCK)) {
                        acc.iter_mut().zip(ki).for_each(|(a, &x)| *a += qi * x);
                    }
                    if c == 0 {
                        total = acc;
                    } else {
                        total.iter_mut().zip(acc).for_each(|(t, a)| *t += a);
                    }
                }
                let scores = &mut s.scores[g * span + bb * KEY_BLOCK..][..KEY_BLOCK];
                scores
                    .iter_mut()
                    .zip(total)
                    .for_each(|(s, a)| *s = a * shape.scale);
            }
        }
        Self::softmax_rows(s, span, skip, n_keys);
        out.fill(0.0);
        for (jj, j) in keys.enumerate() {
            let v = &mut s.row[..hd_v];
            widen(self.cache.value(self.il, j, self.kv_head, hd_v), v);
            for (g, o) in out.chunks_exact_mut(hd_v).enumerate() {
                let w = s.scores[g * span + skip + jj];
                o.iter_mut().zip(v.iter()).for_each(|(o, &x)| *o += w * x);
            }
        }
    }
}
