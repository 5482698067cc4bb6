//! Causal multi-head attention over the KV cache (grouped-query, optional sliding window).
//!
//! Precision follows ggml's attention over an f16 cache: the query is rounded to f16 before its
//! dot products with the keys, and the softmax weights are rounded to f16 before they weigh the
//! values (ggml converts both operands of an f16 matrix product to f16); sums are in f32.

use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::kv_cache::KvCache;
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
    out.par_chunks_mut(shape.head_dim_v)
        .enumerate()
        .for_each_init(
            || {
                (
                    Vec::new(),
                    vec![0f32; shape.head_dim.max(shape.head_dim_v)],
                    vec![0f32; shape.head_dim],
                )
            },
            |(scores, row, q16), (i, out)| {
                let (t, h) = (i / shape.n_head, i % shape.n_head);
                let p = pos0 + t;
                let first = shape.window.map_or(0, |w| (p + 1).saturating_sub(w));
                let kv_head = h / group;
                for (r, &x) in q16
                    .iter_mut()
                    .zip(&q[i * shape.head_dim..(i + 1) * shape.head_dim])
                {
                    *r = f16::from_f32(x).to_f32();
                }
                scores.clear();
                for j in first..=p {
                    let k = cache.key(il, j, kv_head, shape.head_dim);
                    scores.push(dot_f16(q16, k, row) * shape.scale);
                }
                softmax(scores);
                scores
                    .iter_mut()
                    .for_each(|w| *w = f16::from_f32(*w).to_f32());
                out.fill(0.0);
                for (j, &w) in (first..=p).zip(scores.iter()) {
                    let v = cache.value(il, j, kv_head, shape.head_dim_v);
                    let v32 = &mut row[..shape.head_dim_v];
                    v.convert_to_f32_slice(v32);
                    for (o, &x) in out.iter_mut().zip(v32.iter()) {
                        *o += w * x;
                    }
                }
            },
        );
}

fn dot_f16(q: &[f32], k: &[f16], tmp: &mut [f32]) -> f32 {
    let k32 = &mut tmp[..k.len()];
    k.convert_to_f32_slice(k32);
    q.iter().zip(k32.iter()).map(|(a, b)| a * b).sum()
}
