//! `cargo bench --bench axpy`: the sparse axpy's yardstick. For each case, the axpy over `k` active
//! rows of a neuron-major (input-major) `rows × cols` matrix next to the dense `matmul` of the same
//! product in the row-major layout (`cols × rows`, same type), both in GB/s of weight bytes read:
//! an axpy that streams its rows as fast as the dense matmul streams its matrix reaches the
//! dense GB/s.
//!
//! Cases: `up7b` (Llama-2-7B's gate/up as TEAL's input-major copy, 4096 × 11008, 50% active),
//! `down7b` (its down, 11008 × 4096, 50%), `small` (the synthetic `small` ReLU model's down,
//! 4096 × 1024, 13%), `gemma_k`, `gemma_up`, `gemma_dn` (Gemma 3 270M's K, gate/up and down as
//! TEAL's copies at 40%: 640 × 256 at 80%, 640 × 2048 at 63%, 2048 × 640 at 35%), each for F16,
//! Q8_0 and Q4_0, one token (and for Q4_0 `q4_0/i8`, the same
//! product with 8-bit coefficients, [`sparse_axpy_int8`]); with `HOTCOLD_BENCH_TOKENS=n`, a batch
//! of `n` tokens whose active sets overlap (each token half the rows of a common 60%).
//!
//! Runs on rayon's global pool (`RAYON_NUM_THREADS` sets its size). `HOTCOLD_BENCH_QUICK=1`
//! shortens each measurement; `HOTCOLD_BENCH_CASES=up7b,small` picks cases.

mod common;

use std::time::Duration;

use common::{random_f32, time, weights};

use hotcold::cpu::{matmul, simd_level, sparse_axpy, sparse_axpy_int8, Matrix, SplitQ4_0};
use hotcold::quant::GgmlType;

/// One benchmark shape: `rows` inputs (neurons), `cols` outputs, a fraction `density` active.
struct Case {
    name: &'static str,
    rows: usize,
    cols: usize,
    density: f64,
}

const CASES: [Case; 6] = [
    Case {
        name: "up7b",
        rows: 4096,
        cols: 11008,
        density: 0.5,
    },
    Case {
        name: "down7b",
        rows: 11008,
        cols: 4096,
        density: 0.5,
    },
    Case {
        name: "small",
        rows: 4096,
        cols: 1024,
        density: 0.13,
    },
    Case {
        name: "gemma_k",
        rows: 640,
        cols: 256,
        density: 0.8,
    },
    Case {
        name: "gemma_up",
        rows: 640,
        cols: 2048,
        density: 0.63,
    },
    Case {
        name: "gemma_dn",
        rows: 2048,
        cols: 640,
        density: 0.35,
    },
];

/// `n` tokens' coefficients over `rows` neurons: token `t` keeps neuron `i` when a seeded draw
/// falls under `density` (for a batch: the neurons of a common set of `1.2 × density`, each kept
/// by a token with probability 5/6, so the union is about 1.2× one token's set).
fn coefs(rows: usize, n: usize, density: f64) -> (Vec<f32>, usize) {
    let v = random_f32(n * rows, 13);
    let pick = random_f32(n * rows, 31);
    let common = random_f32(rows, 37);
    let mut a = vec![0f32; n * rows];
    let mut union = vec![false; rows];
    for t in 0..n {
        for i in 0..rows {
            let u = |r: f32| (r as f64 + 1.0) / 2.0;
            let keep = if n == 1 {
                u(pick[i]) < density
            } else {
                u(common[i]) < (1.2 * density).min(1.0) && u(pick[t * rows + i]) < 5.0 / 6.0
            };
            if keep {
                a[t * rows + i] = v[t * rows + i];
                union[i] = true;
            }
        }
    }
    (a, union.iter().filter(|&&u| u).count())
}

fn main() {
    let quick = std::env::var_os("HOTCOLD_BENCH_QUICK").is_some();
    let budget = Duration::from_millis(if quick { 150 } else { 600 });
    let n: usize = std::env::var("HOTCOLD_BENCH_TOKENS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let pick = std::env::var("HOTCOLD_BENCH_CASES").ok();
    let threads = rayon_threads();
    println!(
        "hotcold axpy bench: simd = {}, threads = {threads}, tokens = {n}",
        simd_level()
    );
    println!(
        "{:<7} {:<7} {:>6} {:>10} {:>9} {:>10} {:>9} {:>7}",
        "case", "type", "active", "dense µs", "dense GB/s", "axpy µs", "axpy GB/s", "GB/s÷"
    );
    for case in CASES.iter().filter(|c| {
        pick.as_deref()
            .is_none_or(|p| p.split(',').any(|x| x == c.name))
    }) {
        for ty in [GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0] {
            let (rows, cols) = (case.rows, case.cols);
            // the same product in the row-major layout: cols outputs over rows inputs
            let dense_w = weights(ty, cols, rows);
            let wd = Matrix::new(ty, cols, rows, &dense_w).unwrap();
            let x = random_f32(n * rows, 7);
            let mut y = vec![0f32; n * cols];
            let dense = time(budget, || matmul(&wd, &x, n, &mut y).unwrap());
            let dense_gbs = dense_w.len() as f64 / dense / 1e9;
            drop(dense_w);
            let wt_data = weights(ty, rows, cols);
            let wt = Matrix::new(ty, rows, cols, &wt_data).unwrap();
            let (a, union) = coefs(rows, n, case.density);
            let bytes = union * wt_data.len() / rows;
            let row = |label: &str, secs: f64| {
                let gbs = bytes as f64 / secs / 1e9;
                println!(
                    "{:<7} {:<7} {:>5.1}% {:>10.1} {:>9.2} {:>10.1} {:>9.2} {:>7.2}",
                    case.name,
                    label,
                    100.0 * union as f64 / rows as f64,
                    dense * 1e6,
                    dense_gbs,
                    secs * 1e6,
                    gbs,
                    gbs / dense_gbs
                );
            };
            row(
                ty.name(),
                time(budget, || sparse_axpy(&wt, &a, n, &mut y).unwrap()),
            );
            if ty == GgmlType::Q4_0 && n == 1 {
                // the same product with 8-bit coefficients (TEAL's Q4_0 copies)
                let (split, out) = (SplitQ4_0::new(&wt).unwrap(), &mut y[..cols]);
                let secs = time(budget, || sparse_axpy_int8(&split, &a, out).unwrap());
                row("q4_0/i8", secs);
            }
        }
    }
}

/// The size of rayon's global pool as `RAYON_NUM_THREADS` sets it (else the CPU count).
fn rayon_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}
