//! Helpers shared by the benchmarks: seeded inputs, synthetic quantised weights, timing.

use std::time::{Duration, Instant};

use hotcold::quant::{quantize, GgmlType};

/// Deterministic pseudo-random f32s in [-1, 1).
pub fn random_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// `rows × cols` weights of `ty`: 256 distinct quantised rows repeated (quantising 167M values for
/// the LM head would take longer than the bench).
pub fn weights(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let base_rows = rows.min(256);
    let f = random_f32(base_rows * cols, 0x5eed ^ (rows * cols) as u64);
    let rb = ty.row_bytes(cols as u64).unwrap() as usize;
    let mut base = vec![0u8; base_rows * rb];
    quantize(ty, &f, &mut base).unwrap();
    let mut data = Vec::with_capacity(rows * rb);
    while data.len() < rows * rb {
        let take = (rows * rb - data.len()).min(base.len());
        data.extend_from_slice(&base[..take]);
    }
    data
}

/// Seconds per call of `f`: the best of several batches lasting `budget` in total.
pub fn time(budget: Duration, mut f: impl FnMut()) -> f64 {
    f(); // warm up (page in, fill the scratch buffers)
    let start = Instant::now();
    let mut best = f64::INFINITY;
    let mut total = 0usize;
    while start.elapsed() < budget || total < 3 {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
        total += 1;
    }
    best
}
