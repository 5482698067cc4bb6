//! The column-sparse product over the input-major copies against the dense product, on every type
//! TEAL repacks to.

use super::*;
use crate::quant;

/// A deterministic value in [-1, 1).
fn noise(i: usize) -> f32 {
    let h = (i as u64)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .rotate_left(29);
    (h >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

const N_OUT: usize = 64;
const N_IN: usize = 96;

fn row_major() -> Vec<f32> {
    (0..N_OUT * N_IN).map(noise).collect()
}

fn as_f32_matrix(w: &[f32]) -> Vec<u8> {
    w.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// `x` thresholded at `t`, for `n` rows.
fn thresholded(n: usize, t: f32) -> (Vec<f32>, Vec<f32>) {
    let x: Vec<f32> = (0..n * N_IN).map(|i| noise(i + 77_777) * 2.0).collect();
    let xs = x
        .iter()
        .map(|&v| if v.abs() < t { 0.0 } else { v })
        .collect();
    (x, xs)
}

#[test]
fn column_sparse_product_equals_the_dense_product_on_every_repacked_type() {
    let w = row_major();
    let bytes = as_f32_matrix(&w);
    let m = Matrix::new(GgmlType::F32, N_OUT, N_IN, &bytes).unwrap();
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
    ] {
        let packed = crate::model::transposed_as(&m, ty).unwrap();
        let wt = Matrix::new(ty, N_IN, N_OUT, &packed).unwrap();
        // the dense reference on the very values stored: W'ᵀ from dequantising the copy
        let mut deq = vec![0f32; N_IN * N_OUT];
        quant::dequantize(ty, &packed, &mut deq).unwrap();
        for (n, t) in [(1, 0.0), (1, 0.8), (3, 1.2)] {
            let (_, xs) = thresholded(n, t);
            let mut y = vec![0f32; n * N_OUT];
            cpu::sparse_axpy(&wt, &xs, n, &mut y).unwrap();
            for r in 0..n {
                for o in 0..N_OUT {
                    let want: f32 = (0..N_IN)
                        .map(|i| xs[r * N_IN + i] * deq[i * N_OUT + o])
                        .sum();
                    let got = y[r * N_OUT + o];
                    assert!(
                        (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                        "{ty:?} n={n} t={t} row {r} out {o}: {got} vs {want}"
                    );
                }
            }
            // and against the original matrix: only the copy's rounding differs, at most half a
            // quantisation step per weight (|w| < 1), times Σ|x| of the row
            let mut dense = vec![0f32; n * N_OUT];
            cpu::matmul(&m, &xs, n, &mut dense).unwrap();
            let half_step = match ty {
                GgmlType::F32 => 1e-6,
                GgmlType::F16 => 1.0 / 2048.0,
                GgmlType::Q8_0 => 1.0 / 254.0,
                GgmlType::Q5_0 => 1.0 / 32.0,
                _ => 1.0 / 16.0,
            };
            for r in 0..n {
                let l1: f32 = xs[r * N_IN..(r + 1) * N_IN].iter().map(|v| v.abs()).sum();
                let worst = (0..N_OUT)
                    .map(|o| (dense[r * N_OUT + o] - y[r * N_OUT + o]).abs())
                    .fold(0f32, f32::max);
                assert!(
                    worst <= half_step * l1 * 1.01 + 1e-4,
                    "{ty:?} n={n} row {r}: max diff to dense {worst}"
                );
            }
        }
    }
}

#[test]
fn skipped_inputs_do_not_read_their_columns() {
    let w = row_major();
    let m_bytes = as_f32_matrix(&w);
    let m = Matrix::new(GgmlType::F32, N_OUT, N_IN, &m_bytes).unwrap();
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0] {
        let mut packed = crate::model::transposed_as(&m, ty).unwrap();
        let (_, xs) = thresholded(1, 1.0);
        let col = packed.len() / N_IN;
        let skipped: Vec<usize> = (0..N_IN).filter(|&i| xs[i] == 0.0).collect();
        assert!(!skipped.is_empty());
        for &i in &skipped {
            // poison every byte pattern of a skipped column: NaN in every float and f16 scale
            let nan: &[u8] = match ty {
                GgmlType::F32 => &[0x00, 0x00, 0xc0, 0x7f],
                _ => &[0x00, 0x7e],
            };
            for c in packed[i * col..(i + 1) * col].chunks_exact_mut(nan.len()) {
                c.copy_from_slice(nan);
            }
        }
        let wt = Matrix::new(ty, N_IN, N_OUT, &packed).unwrap();
        let mut y = vec![0f32; N_OUT];
        cpu::sparse_axpy(&wt, &xs, 1, &mut y).unwrap();
        assert!(y.iter().all(|v| v.is_finite()), "{ty:?}: {y:?}");
    }
}

#[test]
fn repack_types_keep_floats_4_bit_legacy_as_q4_0_and_the_rest_as_q8_0() {
    assert_eq!(repack_type(GgmlType::F32, 64), GgmlType::F32);
    assert_eq!(repack_type(GgmlType::BF16, 64), GgmlType::F16);
    assert_eq!(repack_type(GgmlType::Q5_0, 64), GgmlType::Q8_0);
    assert_eq!(repack_type(GgmlType::Q4_K, 64), GgmlType::Q8_0);
    assert_eq!(repack_type(GgmlType::Q6_K, 64), GgmlType::Q8_0);
    assert_eq!(repack_type(GgmlType::Q8_0, 64), GgmlType::Q8_0);
    assert_eq!(repack_type(GgmlType::Q8_0, 48), GgmlType::F16);
    assert_eq!(repack_type(GgmlType::Q4_0, 64), GgmlType::Q4_0);
    assert_eq!(repack_type(GgmlType::Q4_1, 64), GgmlType::Q4_0);
    assert_eq!(repack_type(GgmlType::Q4_0, 48), GgmlType::F16);
}
