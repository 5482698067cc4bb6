//! The key/value cache: per layer, one f16 row of keys and one of values per position.

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::model::HyperParams;

/// Keys and values of every layer for positions `0..n_ctx`, stored as f16 (as llama.cpp does by
/// default).
pub struct KvCache {
    n_ctx: usize,
    k_width: usize,
    v_width: usize,
    keys: Vec<Vec<f16>>,
    values: Vec<Vec<f16>>,
}

impl KvCache {
    /// An empty cache for `n_ctx` positions of a model shaped like `hp`.
    pub fn new(hp: &HyperParams, n_ctx: usize) -> KvCache {
        KvCache::with_widths(hp.n_layer, n_ctx, hp.k_width(), hp.v_width())
    }

    /// An empty cache for `n_ctx` positions of `n_layer` layers, with rows of `k_width` keys and
    /// `v_width` values (every KV head's) per position.
    pub(super) fn with_widths(
        n_layer: usize,
        n_ctx: usize,
        k_width: usize,
        v_width: usize,
    ) -> KvCache {
        KvCache {
            n_ctx,
            k_width,
            v_width,
            keys: (0..n_layer)
                .map(|_| vec![f16::ZERO; n_ctx * k_width])
                .collect(),
            values: (0..n_layer)
                .map(|_| vec![f16::ZERO; n_ctx * v_width])
                .collect(),
        }
    }

    /// Capacity in positions.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Stores rows of keys and values (`n` positions from `pos`) of layer `il`.
    pub fn store(&mut self, il: usize, pos: usize, k: &[f32], v: &[f32]) {
        let kd = &mut self.keys[il][pos * self.k_width..pos * self.k_width + k.len()];
        kd.convert_from_f32_slice(k);
        let vd = &mut self.values[il][pos * self.v_width..pos * self.v_width + v.len()];
        vd.convert_from_f32_slice(v);
    }

    /// Key of KV head `head` (size `head_dim`) at `pos` in layer `il`.
    pub fn key(&self, il: usize, pos: usize, head: usize, head_dim: usize) -> &[f16] {
        let start = pos * self.k_width + head * head_dim;
        &self.keys[il][start..start + head_dim]
    }

    /// Value of KV head `head` (size `head_dim`) at `pos` in layer `il`.
    pub fn value(&self, il: usize, pos: usize, head: usize, head_dim: usize) -> &[f16] {
        let start = pos * self.v_width + head * head_dim;
        &self.values[il][start..start + head_dim]
    }

    /// Bytes the cache holds.
    pub fn n_bytes(&self) -> usize {
        (self.keys.iter().map(Vec::len).sum::<usize>()
            + self.values.iter().map(Vec::len).sum::<usize>())
            * 2
    }
}
