//! Tests of the sparse operators: gather vs dense `matmul` bit-exact on every SIMD path, sparse
//! axpy against an f64 reference on dequantised weights (all neurons active and 10%), bit-exact
//! across thread counts and SIMD paths, skipped zeros, and argument errors.

use super::super::tests::{bits, in_pool, Rng};
use super::super::{matmul, matmul_at, Level, Matrix};
use super::*;
use crate::quant::{dequantize, quantize, GgmlType};

const TYPES: &[GgmlType] = super::super::MATMUL_TYPES;

/// The dense matmul levels this CPU can run.
fn matmul_levels() -> Vec<Level> {
    [Level::Scalar, Level::Simd128, Level::Avx2, Level::Avx512]
        .into_iter()
        .filter(|l| l.available())
        .collect()
}

/// The axpy levels this CPU can run (its AVX-512 kernels need only F/BW/VL, not VNNI).
fn axpy_levels() -> Vec<Level> {
    let mut v = vec![Level::Scalar];
    if Level::Simd128.available() {
        v.push(Level::Simd128);
    }
    #[cfg(target_arch = "x86_64")]
    {
        if Level::detect() >= Level::Avx2 {
            v.push(Level::Avx2);
        }
        if Level::detect() >= Level::Avx2
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
        {
            v.push(Level::Avx512);
        }
    }
    v
}

/// Quantised random weights, `rows × cols` of `ty`.
fn weights(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let f: Vec<f32> = (0..rows * cols).map(|_| rng.f()).collect();
    let mut data = vec![0u8; ty.row_bytes(cols as u64).unwrap() as usize * rows];
    quantize(ty, &f, &mut data).unwrap();
    data
}

/// Index lists: sorted with runs, unsorted, repeated, all rows, one row.
fn index_lists(rows: usize, rng: &mut Rng) -> Vec<Vec<u32>> {
    let mut sorted: Vec<u32> = (0..rows as u32).filter(|_| rng.below(3) == 0).collect();
    if sorted.is_empty() {
        sorted.push(0);
    }
    let mut runs = Vec::new();
    let mut r = 0;
    while r < rows {
        let len = 1 + rng.below(7);
        runs.extend((r..(r + len).min(rows)).map(|r| r as u32));
        r += len + rng.below(4);
    }
    let shuffled: Vec<u32> = (0..rows * 2).map(|_| rng.below(rows) as u32).collect();
    vec![
        sorted,
        runs,
        shuffled,
        (0..rows as u32).collect(),
        vec![rows as u32 - 1],
    ]
}

/// Columns of a test matrix of `ty`: whole blocks, and for float types a part of a 16-value step
/// at the end of each row.
fn test_cols(ty: GgmlType) -> usize {
    match ty.block_size() {
        256 => 512,
        1 => 104,
        _ => 96,
    }
}

#[test]
fn gather_is_bit_identical_to_dense() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for &ty in TYPES {
        let cols = test_cols(ty);
        let rows = 37;
        let data = weights(ty, rows, cols, &mut rng);
        let w = Matrix::new(ty, rows, cols, &data).unwrap();
        let lists = index_lists(rows, &mut rng);
        for level in matmul_levels() {
            for n_tokens in [1, 2, 3, 5, 9] {
                let x: Vec<f32> = (0..n_tokens * cols).map(|_| rng.f()).collect();
                let mut dense = vec![0f32; n_tokens * rows];
                matmul_at(level, &w, &x, n_tokens, &mut dense).unwrap();
                for idx in &lists {
                    let n = idx.len();
                    for threads in [1, 2, 3] {
                        let mut y = vec![f32::NAN; n_tokens * n];
                        in_pool(threads, || {
                            gather_matmul_at(level, &w, idx, &x, n_tokens, &mut y)
                        })
                        .unwrap();
                        for t in 0..n_tokens {
                            for (k, &r) in idx.iter().enumerate() {
                                assert_eq!(
                                    y[t * n + k].to_bits(),
                                    dense[t * rows + r as usize].to_bits(),
                                    "{ty} {level:?} n_tokens={n_tokens} threads={threads} t={t} k={k} row={r}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn gather_large_rows_match_dense() {
    // enough rows for several tasks and the prefetch window
    let mut rng = Rng(42);
    for ty in [GgmlType::Q4_0, GgmlType::F16, GgmlType::Q8_0] {
        let (rows, cols) = (600, 256);
        let data = weights(ty, rows, cols, &mut rng);
        let w = Matrix::new(ty, rows, cols, &data).unwrap();
        let idx: Vec<u32> = (0..rows as u32).filter(|_| rng.below(4) != 0).collect();
        for n_tokens in [1, 4, 8, 12] {
            let x: Vec<f32> = (0..n_tokens * cols).map(|_| rng.f()).collect();
            let mut dense = vec![0f32; n_tokens * rows];
            matmul(&w, &x, n_tokens, &mut dense).unwrap();
            let mut y = vec![0f32; n_tokens * idx.len()];
            in_pool(2, || gather_matmul(&w, &idx, &x, n_tokens, &mut y).unwrap());
            for t in 0..n_tokens {
                for (k, &r) in idx.iter().enumerate() {
                    assert_eq!(
                        y[t * idx.len() + k].to_bits(),
                        dense[t * rows + r as usize].to_bits(),
                        "{ty} n_tokens={n_tokens} t={t} row={r}"
                    );
                }
            }
        }
    }
}

#[test]
fn gather_errors() {
    let mut rng = Rng(7);
    let data = weights(GgmlType::Q4_0, 8, 64, &mut rng);
    let w = Matrix::new(GgmlType::Q4_0, 8, 64, &data).unwrap();
    let x = vec![0.5f32; 64];
    let mut y = vec![0f32; 2];
    let bad = |r: Result<()>| assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    bad(gather_matmul(&w, &[1, 8], &x, 1, &mut y));
    bad(gather_matmul(&w, &[1, u32::MAX], &x, 1, &mut y));
    bad(gather_matmul(&w, &[1, 2], &x[..32], 1, &mut y));
    bad(gather_matmul(&w, &[1, 2, 3], &x, 1, &mut y));
    bad(gather_matmul(&w, &[1, 2], &x, 2, &mut y));
    let short = Matrix {
        data: &data[..10],
        ..w
    };
    bad(gather_matmul(&short, &[1, 2], &x, 1, &mut y));
    gather_matmul(&w, &[], &x, 1, &mut []).unwrap();
    gather_matmul(&w, &[1, 7], &x, 1, &mut y).unwrap();
}

/// `out0 + Σ a·w` in f64 from the dequantised rows, and the sum of magnitudes (for tolerances).
fn axpy_reference(w: &Matrix, a: &[f32], n_tokens: usize, out0: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let (rows, cols) = (w.rows, w.cols);
    let mut deq = vec![0f32; rows * cols];
    dequantize(w.ty, w.data, &mut deq).unwrap();
    let mut r: Vec<f64> = out0.iter().map(|&v| v as f64).collect();
    let mut mag: Vec<f64> = out0.iter().map(|&v| (v as f64).abs()).collect();
    for t in 0..n_tokens {
        for i in 0..rows {
            let c = a[t * rows + i];
            if c == 0.0 {
                continue;
            }
            for e in 0..cols {
                let v = c as f64 * deq[i * cols + e] as f64;
                r[t * cols + e] += v;
                mag[t * cols + e] += v.abs();
            }
        }
    }
    (r, mag)
}

/// Coefficients with about `density` of them non-zero (ReLU-like: the rest exactly 0 or -0).
fn coefs(n: usize, density: f64, rng: &mut Rng) -> Vec<f32> {
    (0..n)
        .map(|_| {
            if (rng.next() % 1000) as f64 >= density * 1000.0 {
                if rng.below(2) == 0 {
                    0.0
                } else {
                    -0.0
                }
            } else {
                rng.f() * 2.0
            }
        })
        .collect()
}

fn axpy_cols(ty: GgmlType) -> Vec<usize> {
    match ty.block_size() {
        256 => vec![256, 768],
        32 => vec![32, 96, 544],
        _ => vec![1, 37, 96, 300],
    }
}

#[test]
fn axpy_matches_reference_on_every_path() {
    let mut rng = Rng(0xdead_beef);
    for &ty in TYPES {
        for cols in axpy_cols(ty) {
            let rows = 53;
            let data = weights(ty, rows, cols, &mut rng);
            let w = Matrix::new(ty, rows, cols, &data).unwrap();
            for n_tokens in [1, 3, 6] {
                for density in [1.0, 0.1] {
                    let a = coefs(n_tokens * rows, density, &mut rng);
                    let out0: Vec<f32> = (0..n_tokens * cols).map(|_| rng.f()).collect();
                    let (want, mag) = axpy_reference(&w, &a, n_tokens, &out0);
                    let mut first: Option<Vec<f32>> = None;
                    for level in axpy_levels() {
                        let mut out = out0.clone();
                        sparse_axpy_at(level, &w, &a, n_tokens, &mut out).unwrap();
                        for (e, &g) in out.iter().enumerate() {
                            let tol = 1e-4 * mag[e].max(1e-6);
                            assert!(
                                (g as f64 - want[e]).abs() <= tol,
                                "{ty} cols={cols} n={n_tokens} density={density} {level:?} e={e}: got {g}, want {}",
                                want[e]
                            );
                        }
                        // every path does the same fused multiply-adds in the same order
                        match &first {
                            None => first = Some(out),
                            Some(f) => assert_eq!(
                                bits(f),
                                bits(&out),
                                "{ty} cols={cols} n={n_tokens} {level:?} differs from scalar"
                            ),
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn axpy_is_deterministic_across_thread_counts() {
    let mut rng = Rng(99);
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
    ] {
        let (rows, cols) = (300, if ty.block_size() == 256 { 2048 } else { 1056 });
        let data = weights(ty, rows, cols, &mut rng);
        let w = Matrix::new(ty, rows, cols, &data).unwrap();
        for n_tokens in [1, 4, 33] {
            for density in [1.0, 0.1] {
                let a = coefs(n_tokens * rows, density, &mut rng);
                let out0: Vec<f32> = (0..n_tokens * cols).map(|_| rng.f()).collect();
                let mut first: Option<Vec<u32>> = None;
                for threads in [1, 2, 3, 5] {
                    let mut out = out0.clone();
                    in_pool(threads, || sparse_axpy(&w, &a, n_tokens, &mut out).unwrap());
                    let b = bits(&out);
                    match &first {
                        None => first = Some(b),
                        Some(f) => assert!(
                            *f == b,
                            "{ty} n={n_tokens} density={density}: {threads} threads differ"
                        ),
                    }
                }
            }
        }
    }
}

#[test]
fn axpy_skips_zero_coefficients() {
    let mut rng = Rng(5);
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::Q5_1,
    ] {
        let (rows, cols) = (20, 64);
        let mut data = weights(ty, rows, cols, &mut rng);
        let rb = ty.row_bytes(cols as u64).unwrap() as usize;
        // row 7: NaN everywhere (all-ones bytes are a NaN in every float format and a NaN scale
        // in every block format)
        data[7 * rb..8 * rb].fill(0xFF);
        let w = Matrix::new(ty, rows, cols, &data).unwrap();
        for n_tokens in [1, 3] {
            let mut a = coefs(n_tokens * rows, 0.5, &mut rng);
            for t in 0..n_tokens {
                a[t * rows + 7] = if t % 2 == 0 { 0.0 } else { -0.0 };
            }
            for level in axpy_levels() {
                let mut out = vec![0f32; n_tokens * cols];
                sparse_axpy_at(level, &w, &a, n_tokens, &mut out).unwrap();
                assert!(out.iter().all(|v| v.is_finite()), "{ty} {level:?}");
                // the same as with the row zeroed
                let mut clean = data.clone();
                clean[7 * rb..8 * rb].fill(0);
                let wc = Matrix::new(ty, rows, cols, &clean).unwrap();
                let mut want = vec![0f32; n_tokens * cols];
                sparse_axpy_at(level, &wc, &a, n_tokens, &mut want).unwrap();
                assert_eq!(bits(&out), bits(&want), "{ty} {level:?}");
            }
            // and an active NaN row does reach the output
            a[7] = 1.0;
            let mut out = vec![0f32; n_tokens * cols];
            sparse_axpy(&w, &a, n_tokens, &mut out).unwrap();
            assert!(out[..cols].iter().any(|v| v.is_nan()), "{ty}");
        }
    }
}

#[test]
fn axpy_all_zero_leaves_out_untouched() {
    let mut rng = Rng(11);
    let data = weights(GgmlType::Q4_0, 16, 64, &mut rng);
    let w = Matrix::new(GgmlType::Q4_0, 16, 64, &data).unwrap();
    let mut out: Vec<f32> = (0..2 * 64).map(|_| rng.f()).collect();
    let before = out.clone();
    sparse_axpy(&w, &[0.0; 32], 2, &mut out).unwrap();
    assert_eq!(bits(&before), bits(&out));
    sparse_axpy(&w, &[], 0, &mut []).unwrap();
}

#[test]
fn axpy_errors() {
    let mut rng = Rng(3);
    let data = weights(GgmlType::Q8_0, 8, 64, &mut rng);
    let w = Matrix::new(GgmlType::Q8_0, 8, 64, &data).unwrap();
    let bad = |r: Result<()>| assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    bad(sparse_axpy(&w, &[1.0; 7], 1, &mut [0.0; 64]));
    bad(sparse_axpy(&w, &[1.0; 8], 1, &mut [0.0; 63]));
    bad(sparse_axpy(&w, &[1.0; 8], 2, &mut [0.0; 128]));
    bad(sparse_axpy(&w, &[1.0; 16], 2, &mut [0.0; 64]));
    let short = Matrix { rows: 9, ..w };
    bad(sparse_axpy(&short, &[1.0; 9], 1, &mut [0.0; 64]));
    let mut out = [0.0; 64];
    sparse_axpy(&w, &[1.0; 8], 1, &mut out).unwrap();
}

/// Per-token sets for `n_tokens` tokens over `rows` rows: random subsets (some empty), all rows,
/// and unsorted ones with repeats.
fn token_sets(rows: usize, n_tokens: usize, rng: &mut Rng) -> Vec<Vec<Vec<u32>>> {
    let subset = |rng: &mut Rng, keep: usize| -> Vec<u32> {
        (0..rows as u32).filter(|_| rng.below(keep) == 0).collect()
    };
    let random: Vec<Vec<u32>> = (0..n_tokens)
        .map(|t| {
            if t % 3 == 1 {
                Vec::new()
            } else {
                subset(rng, 4)
            }
        })
        .collect();
    let sparse: Vec<Vec<u32>> = (0..n_tokens).map(|_| subset(rng, 10)).collect();
    let all: Vec<Vec<u32>> = (0..n_tokens).map(|_| (0..rows as u32).collect()).collect();
    let shuffled: Vec<Vec<u32>> = (0..n_tokens)
        .map(|_| (0..rows).map(|_| rng.below(rows) as u32).collect())
        .collect();
    let empty: Vec<Vec<u32>> = vec![Vec::new(); n_tokens];
    vec![random, sparse, all, shuffled, empty]
}

/// Checks `gather_matmul_sets_at` on `level` against the dense product's entries, bit for bit.
fn check_sets(
    level: Level,
    w: &Matrix,
    sets: &[Vec<u32>],
    x: &[f32],
    dense: &[f32],
    threads: usize,
) {
    let total: usize = sets.iter().map(Vec::len).sum();
    let mut y = vec![f32::NAN; total];
    in_pool(threads, || gather_matmul_sets_at(level, w, sets, x, &mut y)).unwrap();
    let mut off = 0;
    for (t, set) in sets.iter().enumerate() {
        for (k, &r) in set.iter().enumerate() {
            assert_eq!(
                y[off + k].to_bits(),
                dense[t * w.rows + r as usize].to_bits(),
                "{} {level:?} n_tokens={} threads={threads} t={t} k={k} row={r}",
                w.ty,
                sets.len()
            );
        }
        off += set.len();
    }
}

#[test]
fn gather_sets_is_bit_identical_to_dense() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for &ty in TYPES {
        let cols = test_cols(ty);
        let rows = 37;
        let data = weights(ty, rows, cols, &mut rng);
        let w = Matrix::new(ty, rows, cols, &data).unwrap();
        for level in matmul_levels() {
            for n_tokens in [1, 2, 3, 5, 9] {
                let x: Vec<f32> = (0..n_tokens * cols).map(|_| rng.f()).collect();
                let mut dense = vec![0f32; n_tokens * rows];
                matmul_at(level, &w, &x, n_tokens, &mut dense).unwrap();
                for sets in token_sets(rows, n_tokens, &mut rng) {
                    for threads in [1, 3] {
                        check_sets(level, &w, &sets, &x, &dense, threads);
                    }
                }
            }
        }
    }
}

#[test]
fn gather_sets_of_several_matrices_equal_one_call_each() {
    // gate and up of a batched sparse FFN: two matrices (of different types) over the same sets
    let mut rng = Rng(77);
    let (rows, cols) = (600, 256);
    let (ta, tb) = (GgmlType::Q4_0, GgmlType::F16);
    let (da, db) = (
        weights(ta, rows, cols, &mut rng),
        weights(tb, rows, cols, &mut rng),
    );
    let ws = [
        Matrix::new(ta, rows, cols, &da).unwrap(),
        Matrix::new(tb, rows, cols, &db).unwrap(),
    ];
    for n_tokens in [1, 3, 9] {
        let x: Vec<f32> = (0..n_tokens * cols).map(|_| rng.f()).collect();
        for sets in token_sets(rows, n_tokens, &mut rng) {
            let total: usize = sets.iter().map(Vec::len).sum();
            let mut want = [vec![0f32; total], vec![0f32; total]];
            for (w, y) in ws.iter().zip(&mut want) {
                gather_matmul_sets(w, &sets, &x, y).unwrap();
            }
            for threads in [1, 2, 3] {
                let (mut a, mut b) = (vec![f32::NAN; total], vec![f32::NAN; total]);
                in_pool(threads, || {
                    gather_matmul_sets_multi(&ws, &sets, &x, &mut [&mut a, &mut b])
                })
                .unwrap();
                assert_eq!(
                    bits(&a),
                    bits(&want[0]),
                    "{n_tokens} tokens, {threads} threads"
                );
                assert_eq!(
                    bits(&b),
                    bits(&want[1]),
                    "{n_tokens} tokens, {threads} threads"
                );
            }
        }
    }
    let x = vec![0.5f32; 2 * cols];
    let sets = [vec![1u32, 2], vec![3]];
    let (mut a, mut b) = (vec![0f32; 3], vec![0f32; 3]);
    let bad = |r: Result<()>| assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    bad(gather_matmul_sets_multi(&ws, &sets, &x, &mut [&mut a]));
    bad(gather_matmul_sets_multi(
        &ws,
        &sets,
        &x,
        &mut [&mut a, &mut b[..2]],
    ));
    let short = Matrix::new(tb, rows - 1, cols, &db[..db.len() - 512]).unwrap();
    bad(gather_matmul_sets_multi(
        &[ws[0], short],
        &sets,
        &x,
        &mut [&mut a, &mut b],
    ));
}

#[test]
fn gather_sets_large_rows_match_dense() {
    // enough rows for several tasks and the prefetch window, at the default level
    let mut rng = Rng(4242);
    for ty in [GgmlType::Q4_0, GgmlType::F16, GgmlType::Q8_0] {
        let (rows, cols) = (600, 256);
        let data = weights(ty, rows, cols, &mut rng);
        let w = Matrix::new(ty, rows, cols, &data).unwrap();
        for n_tokens in [2, 8, 12] {
            let x: Vec<f32> = (0..n_tokens * cols).map(|_| rng.f()).collect();
            let mut dense = vec![0f32; n_tokens * rows];
            matmul(&w, &x, n_tokens, &mut dense).unwrap();
            let sets: Vec<Vec<u32>> = (0..n_tokens)
                .map(|_| (0..rows as u32).filter(|_| rng.below(10) == 0).collect())
                .collect();
            check_sets(Level::current(), &w, &sets, &x, &dense, 2);
        }
    }
}

#[test]
fn gather_sets_errors() {
    let mut rng = Rng(11);
    let data = weights(GgmlType::Q4_0, 8, 64, &mut rng);
    let w = Matrix::new(GgmlType::Q4_0, 8, 64, &data).unwrap();
    let x = vec![0.5f32; 128];
    let mut y = vec![0f32; 3];
    let bad = |r: Result<()>| assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    bad(gather_matmul_sets(&w, &[vec![1, 8], vec![0]], &x, &mut y));
    bad(gather_matmul_sets(
        &w,
        &[vec![1], vec![u32::MAX, 0]],
        &x,
        &mut y,
    ));
    bad(gather_matmul_sets(
        &w,
        &[vec![1, 2], vec![3]],
        &x[..100],
        &mut y,
    ));
    bad(gather_matmul_sets(
        &w,
        &[vec![1, 2], vec![3]],
        &x[..64],
        &mut y,
    ));
    bad(gather_matmul_sets(
        &w,
        &[vec![1, 2], vec![3, 4]],
        &x,
        &mut y,
    ));
    bad(gather_matmul_sets(&w, &[vec![1], vec![3]], &x, &mut y));
    let short = Matrix {
        data: &data[..10],
        ..w
    };
    bad(gather_matmul_sets(
        &short,
        &[vec![1, 2], vec![3]],
        &x,
        &mut y,
    ));
    let none: [Vec<u32>; 2] = [Vec::new(), Vec::new()];
    gather_matmul_sets(&w, &none, &x, &mut []).unwrap();
    gather_matmul_sets::<Vec<u32>>(&w, &[], &[], &mut []).unwrap();
    gather_matmul_sets(&w, &[vec![1, 7], vec![0]], &x, &mut y).unwrap();
    // a type without kernels
    let q2k = Matrix {
        ty: GgmlType::Q2_K,
        rows: 1,
        cols: 256,
        data: &[0u8; 84],
    };
    assert!(matches!(
        gather_matmul_sets(&q2k, &[vec![0u32]], &[0.5; 256], &mut [0.0]),
        Err(Error::UnsupportedType { .. })
    ));
}
