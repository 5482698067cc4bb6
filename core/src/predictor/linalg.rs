//! Plain f32 matrix products for training, row-major, parallel over output rows with rayon.
//!
//! Every output element is reduced serially in a fixed order inside one task, so results are
//! bit-identical at any thread count.

use rayon::prelude::*;

/// Rows per rayon task: enough work per task to amortise scheduling.
fn rows_per_task(cols: usize, inner: usize) -> usize {
    (16_384 / (cols * inner).max(1)).clamp(1, 64)
}

/// Dot product with eight independent accumulators (vectorisable, fixed order).
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; 8];
    let (ac, ar) = a.split_at(a.len() / 8 * 8);
    let (bc, br) = b.split_at(ac.len());
    for (x, y) in ac.chunks_exact(8).zip(bc.chunks_exact(8)) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ar.iter().zip(br) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// `y += alpha · x`.
#[inline]
pub(crate) fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    debug_assert_eq!(x.len(), y.len());
    for (y, x) in y.iter_mut().zip(x) {
        *y += alpha * x;
    }
}

/// `C = A · Bᵀ` with `A`: m × k, `B`: n × k; returns m × n.
pub(crate) fn matmul_nt(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    debug_assert_eq!(a.len(), m * k);
    debug_assert_eq!(b.len(), n * k);
    let mut c = vec![0f32; m * n];
    if n == 0 || k == 0 {
        return c;
    }
    let rows = rows_per_task(n, k);
    c.par_chunks_mut(n * rows)
        .zip(a.par_chunks(k * rows))
        .for_each(|(c, a)| {
            // Block over B so a tile of B rows stays in cache across the A rows of this task.
            const TILE: usize = 64;
            for j0 in (0..n).step_by(TILE) {
                let j1 = (j0 + TILE).min(n);
                for (c, a) in c.chunks_exact_mut(n).zip(a.chunks_exact(k)) {
                    for j in j0..j1 {
                        c[j] = dot(a, &b[j * k..(j + 1) * k]);
                    }
                }
            }
        });
    c
}

/// `C = A · B` with `A`: m × k, `B`: k × n; returns m × n.
pub(crate) fn matmul_nn(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    debug_assert_eq!(a.len(), m * k);
    debug_assert_eq!(b.len(), k * n);
    let mut c = vec![0f32; m * n];
    if n == 0 || k == 0 {
        return c;
    }
    let rows = rows_per_task(n, k);
    c.par_chunks_mut(n * rows)
        .zip(a.par_chunks(k * rows))
        .for_each(|(c, a)| {
            for (c, a) in c.chunks_exact_mut(n).zip(a.chunks_exact(k)) {
                for (p, &ap) in a.iter().enumerate() {
                    if ap != 0.0 {
                        axpy(c, ap, &b[p * n..(p + 1) * n]);
                    }
                }
            }
        });
    c
}

/// `Aᵀ` for `A`: m × n; returns n × m.
pub(crate) fn transpose(a: &[f32], m: usize, n: usize) -> Vec<f32> {
    debug_assert_eq!(a.len(), m * n);
    let mut t = vec![0f32; m * n];
    const TILE: usize = 32;
    for i0 in (0..m).step_by(TILE) {
        for j0 in (0..n).step_by(TILE) {
            for i in i0..(i0 + TILE).min(m) {
                for j in j0..(j0 + TILE).min(n) {
                    t[j * m + i] = a[i * n + j];
                }
            }
        }
    }
    t
}

/// `C = Aᵀ · B` with `A`: k × m, `B`: k × n; returns m × n.
pub(crate) fn matmul_tn(a: &[f32], b: &[f32], k: usize, m: usize, n: usize) -> Vec<f32> {
    matmul_nn(&transpose(a, k, m), b, m, k, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut c = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    }

    #[test]
    fn products_match_naive() {
        let mut rng = super::super::rng::Rng::new(1);
        let (m, k, n) = (37, 19, 70);
        let a: Vec<f32> = (0..m * k).map(|_| rng.normal()).collect();
        let b: Vec<f32> = (0..k * n).map(|_| rng.normal()).collect();
        let want = naive(&a, &b, m, k, n);
        let close = |got: &[f32]| {
            got.iter()
                .zip(&want)
                .all(|(g, w)| (g - w).abs() <= 1e-4 * (1.0 + w.abs()))
        };
        assert!(close(&matmul_nn(&a, &b, m, k, n)));
        assert!(close(&matmul_nt(&a, &transpose(&b, k, n), m, k, n)));
        assert!(close(&matmul_tn(&transpose(&a, m, k), &b, k, m, n)));
    }
}
