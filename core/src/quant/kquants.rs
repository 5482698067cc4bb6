//! The K-quant helpers of ggml's reference quantisers (`nearest_int`, `make_qx_quants`,
//! `make_q3_quants`, `make_qkx2_quants`) and the 6-bit scale unpacking `get_scale_min_k4`.
//!
//! The float arithmetic is written in exactly ggml's order of operations (no fused multiply-add, no
//! reassociation), which is what makes the quantisers bit-exact with ggml's C built without FMA
//! contraction.

// Index loops mirror ggml's reference code line for line, which keeps the bit-exactness reviewable.
#![allow(clippy::needless_range_loop)]

use super::blocks::K_SCALE_SIZE;

/// ggml's `nearest_int`: round to nearest, ties to even, via the `1.5 * 2^23` trick; meaningful for
/// `|x| <= 4194303`, and like ggml it returns garbage (not a panic) outside that range.
#[inline]
pub fn nearest_int(x: f32) -> i32 {
    let val = x + 12_582_912.0;
    let i = val.to_bits() as i32;
    (i & 0x007f_ffff) - 0x0040_0000
}

/// Scale `j` (0..8) and min `j` of the packed 6-bit scales of a Q4_K or Q5_K block (ggml's
/// `get_scale_min_k4`).
#[inline]
pub fn get_scale_min_k4(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Below this largest magnitude a group counts as all zero (ggml's `GROUP_MAX_EPS`).
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// The weight ggml's `make_qx_quants` gives `x` for `rmse_type` 1..=4 (no importance weights).
#[inline]
fn qx_weight(rmse_type: i32, x: f32) -> f32 {
    match rmse_type {
        1 => x * x,
        2 => 1.0,
        3 => x.abs(),
        _ => x.abs().sqrt(),
    }
}

/// ggml's `make_qx_quants`: symmetric quants `L[i]` in `0..2*nmax` for `x` (as `l + nmax`), and
/// the scale; with `rmse_type != 0` it searches 18 scales around `nmax / max` for the least
/// weighted squared error (weights `qw`, or by `rmse_type`).
pub(crate) fn make_qx_quants(
    nmax: i32,
    x: &[f32],
    l_out: &mut [i8],
    mut rmse_type: i32,
    qw: Option<&[f32]>,
) -> f32 {
    let n = x.len();
    let l_out = &mut l_out[..n];
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let clamp = |l: i32| l.clamp(-nmax, nmax - 1);
    let mut iscale = -(nmax as f32) / max;
    if rmse_type == 0 {
        for (li, &v) in l_out.iter_mut().zip(x) {
            *li = (nmax + clamp(nearest_int(iscale * v))) as i8;
        }
        return 1.0 / iscale;
    }
    let mut return_early = false;
    if rmse_type < 0 {
        rmse_type = -rmse_type;
        return_early = true;
    }
    let weight = |i: usize| match qw {
        Some(qw) => qw[i],
        None => qx_weight(rmse_type, x[i]),
    };
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let l = clamp(nearest_int(iscale * x[i]));
        l_out[i] = (l + nmax) as i8;
        let w = weight(i);
        sumlx += w * x[i] * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    if return_early {
        return if suml2 > 0.0 {
            0.5 * (scale + 1.0 / iscale)
        } else {
            1.0 / iscale
        };
    }
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for i in 0..n {
            let l = clamp(nearest_int(iscale * x[i]));
            let w = weight(i);
            sumlx += w * x[i] * l as f32;
            suml2 += w * l as f32 * l as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (li, &v) in l_out.iter_mut().zip(x) {
                *li = (nmax + clamp(nearest_int(iscale * v))) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's `make_q3_quants`: symmetric quants `L[i]` in `0..2*nmax` and their scale; with
/// `do_rmse` it refines the quants one at a time (up to 5 passes) for the least `x²`-weighted
/// squared error.
pub(crate) fn make_q3_quants(nmax: i32, x: &[f32], l_out: &mut [i8], do_rmse: bool) -> f32 {
    let n = x.len();
    let l_out = &mut l_out[..n];
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let clamp = |l: i32| l.clamp(-nmax, nmax - 1);
    let iscale = -(nmax as f32) / max;
    if do_rmse {
        let mut sumlx = 0.0f32;
        let mut suml2 = 0.0f32;
        for i in 0..n {
            let l = clamp(nearest_int(iscale * x[i]));
            l_out[i] = l as i8;
            let w = x[i] * x[i];
            sumlx += w * x[i] * l as f32;
            suml2 += w * l as f32 * l as f32;
        }
        for _ in 0..5 {
            let mut n_changed = 0;
            for i in 0..n {
                let w = x[i] * x[i];
                let li = l_out[i] as f32;
                let mut slx = sumlx - w * x[i] * li;
                if slx > 0.0 {
                    let mut sl2 = suml2 - w * li * li;
                    let new_l = clamp(nearest_int(x[i] * sl2 / slx));
                    if new_l != l_out[i] as i32 {
                        slx += w * x[i] * new_l as f32;
                        sl2 += w * new_l as f32 * new_l as f32;
                        if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                            l_out[i] = new_l as i8;
                            sumlx = slx;
                            suml2 = sl2;
                            n_changed += 1;
                        }
                    }
                }
            }
            if n_changed == 0 {
                break;
            }
        }
        for li in l_out.iter_mut() {
            *li = (*li as i32 + nmax) as i8;
        }
        return if suml2 > 0.0 { sumlx / suml2 } else { 0.0 };
    }
    for (li, &v) in l_out.iter_mut().zip(x) {
        *li = (clamp(nearest_int(iscale * v)) + nmax) as i8;
    }
    1.0 / iscale
}

/// Parameters of ggml's `make_qkx2_quants` scale search: candidate inverse scales
/// `(rmin + rdelta * is + nmax) / (max - min)` for `is` in `0..=nstep`, error by absolute
/// (`use_mad`) or squared difference.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Qkx2Search {
    /// Offset of the first candidate from `nmax`.
    pub rmin: f32,
    /// Step between candidates.
    pub rdelta: f32,
    /// Number of steps (the search is skipped when below 1).
    pub nstep: i32,
    /// Absolute instead of squared error.
    pub use_mad: bool,
}

/// ggml's `make_qkx2_quants`: asymmetric quants `L[i]` in `0..=nmax` for `x` (at most 32 values)
/// under `weights`, returning `(scale, min)` with `x ≈ scale * L - min` (`min >= 0` up to sign of
/// zero).
pub(crate) fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    p: Qkx2Search,
) -> (f32, f32) {
    let n = x.len();
    debug_assert!(n <= 32 && n > 0);
    let l_out = &mut l_out[..n];
    let weights = &weights[..n];
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out.fill(0);
        return (0.0, -min);
    }
    let err = |diff: f32| if p.use_mad { diff.abs() } else { diff * diff };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        let diff = scale * l as f32 + min - x[i];
        best_error += weights[i] * err(diff);
    }
    if p.nstep < 1 {
        return (scale, -min);
    }
    let mut laux = [0u8; 32];
    let laux = &mut laux[..n];
    for is in 0..=p.nstep {
        iscale = (p.rmin + p.rdelta * is as f32 + nmax as f32) / (max - min);
        let mut sum_l = 0.0f32;
        let mut sum_l2 = 0.0f32;
        let mut sum_xl = 0.0f32;
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = l as u8;
            let w = weights[i];
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * err(diff);
            }
            if cur_error < best_error {
                l_out.copy_from_slice(laux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_ties_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-0.5), 0);
        assert_eq!(nearest_int(-1.5), -2);
        assert_eq!(nearest_int(-3.7), -4);
        assert_eq!(nearest_int(4_194_303.0), 4_194_303);
    }

    #[test]
    fn scale_min_k4_unpacks_six_bits() {
        // scales 0..8 = 10, 20, .., 63 pattern; mins = 63 - scale; packed as quantize_row_q4_K_ref does
        let ls: [u8; 8] = [1, 22, 33, 63, 40, 17, 5, 62];
        let lm: [u8; 8] = [63, 0, 12, 31, 48, 3, 60, 9];
        let mut q = [0u8; 12];
        for j in 0..8 {
            if j < 4 {
                q[j] = ls[j];
                q[j + 4] = lm[j];
            } else {
                q[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
                q[j - 4] |= (ls[j] >> 4) << 6;
                q[j] |= (lm[j] >> 4) << 6;
            }
        }
        for j in 0..8 {
            assert_eq!(get_scale_min_k4(j, &q), (ls[j], lm[j]), "j = {j}");
        }
    }

    #[test]
    fn qkx2_fits_an_affine_grid() {
        let x: Vec<f32> = (0..32).map(|i| -1.0 + 0.125 * (i % 16) as f32).collect();
        let w = vec![1.0f32; 32];
        let mut l = [0u8; 32];
        let p = Qkx2Search {
            rmin: -1.0,
            rdelta: 0.1,
            nstep: 20,
            use_mad: false,
        };
        let (scale, min) = make_qkx2_quants(15, &x, &w, &mut l, p);
        for i in 0..32 {
            assert!((scale * l[i] as f32 - min - x[i]).abs() < 1e-6);
        }
    }
}
