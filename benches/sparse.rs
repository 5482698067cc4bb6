//! `cargo bench --bench sparse`: the sparse FFN operators at ReluLLaMA-7B's layer shape
//! (n_embd 4096, n_ff 11008), decode (one token), F16 and Q4_0 weights.
//!
//! For gate/up (`n_ff × n_embd`): dense `matmul` vs `gather_matmul` of 10% and 100% of the rows.
//! For down: dense `matmul` with the `n_embd × n_ff` matrix vs `sparse_axpy` over the transposed
//! (`n_ff × n_embd`) matrix with 10% and 100% of the neurons active. Prints µs per call, GB/s of
//! weight bytes read, and the ratio to the dense call.
//!
//! Runs on rayon's global pool (`RAYON_NUM_THREADS` sets its size). `HOTCOLD_BENCH_QUICK=1`
//! shortens each measurement; `HOTCOLD_BENCH_SMALL=1` uses 2048 × 5504; `HOTCOLD_BENCH_TOKENS=n`
//! times a batch of `n` tokens instead of one, and then also the batched sparse FFN of a decode
//! step: each token with its own set of about 10% of the neurons (correlated across tokens as real
//! active sets are: a third of the neurons fire with probability 0.3, so 8 tokens' union is about a
//! third), `gather_matmul_sets_multi` of gate and up and `sparse_axpy` of down over those sets.
//! `HOTCOLD_BENCH_SHAPE=EMBDxFF` (e.g. `1024x4096`, the synthetic `small` model) sets the shape.

mod common;

use std::time::Duration;

use common::{random_f32, time, weights};

use hotcold::cpu::sparse::gather_matmul_sets_multi;
use hotcold::cpu::{gather_matmul, matmul, simd_level, sparse_axpy, Matrix};
use hotcold::quant::GgmlType;

/// Every `1/frac`-th neuron or so, pseudo-randomly (sorted).
fn active(n: usize, density: f64, seed: u64) -> Vec<u32> {
    if density >= 1.0 {
        return (0..n as u32).collect();
    }
    let r = random_f32(n, seed);
    (0..n as u32)
        .filter(|&i| (r[i as usize] as f64 + 1.0) / 2.0 < density)
        .collect()
}

/// `n` tokens' sorted active sets: a third of the neurons fire with probability 0.3 for each
/// token (about 10% per token, correlated as real active sets are), the others never.
fn token_sets(n: usize, n_ff: usize) -> Vec<Vec<u32>> {
    let r = random_f32(n * n_ff, 23);
    let hot = random_f32(n_ff, 29);
    (0..n)
        .map(|t| {
            (0..n_ff as u32)
                .filter(|&i| {
                    let i = i as usize;
                    (hot[i] + 1.0) / 2.0 < 1.0 / 3.0 && (r[t * n_ff + i] + 1.0) / 2.0 < 0.3
                })
                .collect()
        })
        .collect()
}

/// Neurons in the union of `sets`.
fn union_len(sets: &[Vec<u32>], n_ff: usize) -> usize {
    let mut seen = vec![false; n_ff];
    sets.iter().flatten().for_each(|&i| seen[i as usize] = true);
    seen.iter().filter(|&&s| s).count()
}

fn row(what: &str, ty: GgmlType, density: &str, secs: f64, bytes: usize, dense: f64) {
    println!(
        "{:<7} {:<5} {:>7} {:>10.1} {:>8.2} {:>8.3}",
        what,
        ty.name(),
        density,
        secs * 1e6,
        bytes as f64 / secs / 1e9,
        secs / dense
    );
}

fn main() {
    let quick = std::env::var_os("HOTCOLD_BENCH_QUICK").is_some();
    let small = std::env::var_os("HOTCOLD_BENCH_SMALL").is_some();
    let n: usize = std::env::var("HOTCOLD_BENCH_TOKENS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let budget = Duration::from_millis(if quick { 100 } else { 500 });
    let shape = std::env::var("HOTCOLD_BENCH_SHAPE").ok().and_then(|v| {
        let (e, f) = v.split_once('x')?;
        Some((e.parse().ok()?, f.parse().ok()?))
    });
    let (n_embd, n_ff) = match shape {
        Some(s) => s,
        None if small => (2048, 5504),
        None => (4096, 11008),
    };
    let threads = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    println!(
        "hotcold sparse bench: simd = {}, threads = {threads}, n_embd = {n_embd}, n_ff = {n_ff}, tokens = {n}",
        simd_level()
    );
    println!(
        "{:<7} {:<5} {:>7} {:>10} {:>8} {:>8}",
        "op", "type", "density", "µs/call", "GB/s", "/dense"
    );
    for ty in [GgmlType::F16, GgmlType::Q4_0] {
        // gate/up: n_ff × n_embd
        let up = weights(ty, n_ff, n_embd);
        let w = Matrix::new(ty, n_ff, n_embd, &up).unwrap();
        let rb = up.len() / n_ff;
        let x = random_f32(n * n_embd, 7);
        let mut y = vec![0f32; n * n_ff];
        let dense = time(budget, || matmul(&w, &x, n, &mut y).unwrap());
        row("up", ty, "dense", dense, up.len(), dense);
        for (name, d) in [("10%", 0.1), ("100%", 1.0)] {
            let idx = active(n_ff, d, 11);
            let mut yg = vec![0f32; n * idx.len()];
            let secs = time(budget, || gather_matmul(&w, &idx, &x, n, &mut yg).unwrap());
            row("gather", ty, name, secs, idx.len() * rb, dense);
        }
        let sets = token_sets(n, n_ff);
        if n > 1 {
            let union = union_len(&sets, n_ff);
            let pairs: usize = sets.iter().map(Vec::len).sum();
            let (mut g, mut u) = (vec![0f32; pairs], vec![0f32; pairs]);
            let secs = time(budget, || {
                gather_matmul_sets_multi(&[w, w], &sets, &x, &mut [&mut g, &mut u]).unwrap()
            });
            let name = format!("u{:.0}%", 100.0 * union as f64 / n_ff as f64);
            row("sets×2", ty, &name, secs, 2 * union * rb, 2.0 * dense);
        }
        drop(up);

        // down: dense n_embd × n_ff vs transposed n_ff × n_embd
        let down = weights(ty, n_embd, n_ff);
        let wd = Matrix::new(ty, n_embd, n_ff, &down).unwrap();
        let h = random_f32(n * n_ff, 13);
        let mut o = vec![0f32; n * n_embd];
        let dense = time(budget, || matmul(&wd, &h, n, &mut o).unwrap());
        row("down", ty, "dense", dense, down.len(), dense);
        drop(down);
        let down_t = weights(ty, n_ff, n_embd);
        let wt = Matrix::new(ty, n_ff, n_embd, &down_t).unwrap();
        for (name, d) in [("10%", 0.1), ("100%", 1.0)] {
            let idx = active(n_ff, d, 17);
            let mut a = vec![0f32; n * n_ff];
            for t in 0..n {
                for &i in &idx {
                    a[t * n_ff + i as usize] = h[t * n_ff + i as usize];
                }
            }
            let secs = time(budget, || sparse_axpy(&wt, &a, n, &mut o).unwrap());
            row("axpy", ty, name, secs, idx.len() * rb, dense);
        }
        if n > 1 {
            let sets = token_sets(n, n_ff);
            let mut a = vec![0f32; n * n_ff];
            for (t, set) in sets.iter().enumerate() {
                for &i in set {
                    a[t * n_ff + i as usize] = h[t * n_ff + i as usize];
                }
            }
            let union = union_len(&sets, n_ff);
            let secs = time(budget, || sparse_axpy(&wt, &a, n, &mut o).unwrap());
            let name = format!("u{:.0}%", 100.0 * union as f64 / n_ff as f64);
            row("axpy", ty, &name, secs, union * rb, dense);
        }
    }
}
