//! The key/value cache: per layer, f16 keys in blocks of [`KEY_BLOCK`] positions (dimension-major,
//! so that one vector holds one dimension of consecutive keys) and one f16 row of values per
//! position.

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::model::HyperParams;

/// Positions per key block: a block of KV head `h` holds `head_dim × KEY_BLOCK` values, dimension
/// `i` of position `KEY_BLOCK · b + l` at `KEY_BLOCK · i + l`.
pub(super) const KEY_BLOCK: usize = 8;

/// Positions the key storage is rounded up to, so that attention may read whole pairs of key
/// blocks past the last cached position (their scores are not used).
const KEY_ROUND: usize = 2 * KEY_BLOCK;

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
                .map(|_| vec![f16::ZERO; n_ctx.next_multiple_of(KEY_ROUND) * k_width])
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
        let width = self.k_width;
        for (p, row) in (pos..).zip(k.chunks(width)) {
            let block =
                &mut self.keys[il][p / KEY_BLOCK * KEY_BLOCK * width..][..KEY_BLOCK * width];
            for (i, &x) in row.iter().enumerate() {
                block[i * KEY_BLOCK + p % KEY_BLOCK] = f16::from_f32(x);
            }
        }
        let vd = &mut self.values[il][pos * self.v_width..pos * self.v_width + v.len()];
        vd.convert_from_f32_slice(v);
    }

    /// Key block `block` (positions `KEY_BLOCK · block ..`, see [`KEY_BLOCK`]) of KV head `head`
    /// (size `head_dim`) in layer `il`; blocks up to the capacity rounded up to two blocks exist.
    pub fn key_block(&self, il: usize, block: usize, head: usize, head_dim: usize) -> &[f16] {
        let start = (block * self.k_width + head * head_dim) * KEY_BLOCK;
        &self.keys[il][start..start + head_dim * KEY_BLOCK]
    }

    /// Value of KV head `head` (size `head_dim`) at `pos` in layer `il`.
    pub fn value(&self, il: usize, pos: usize, head: usize, head_dim: usize) -> &[f16] {
        let start = pos * self.v_width + head * head_dim;
        &self.values[il][start..start + head_dim]
    }

    /// The values of layer `il` (one row of every KV head's values per position) and the length
    /// of a row.
    pub fn values(&self, il: usize) -> (&[f16], usize) {
        (&self.values[il], self.v_width)
    }

    /// Bytes the cache holds.
    pub fn n_bytes(&self) -> usize {
        (self.keys.iter().map(Vec::len).sum::<usize>()
            + self.values.iter().map(Vec::len).sum::<usize>())
            * 2
    }
}
