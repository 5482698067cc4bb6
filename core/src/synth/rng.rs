//! A small, fast, seeded random number generator (xoshiro256++ seeded through SplitMix64), Gaussian
//! samples, and the standard normal CDF and its inverse (Acklam's rational approximation refined by
//! one Halley step).
//!
//! Every random tensor row is drawn from its own generator, derived from the model seed and a
//! stream id ([`stream`]), so the output does not depend on how rayon schedules the rows.

/// SplitMix64's mixing step: a bijective 64-bit hash.
pub fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A stream id for `seed` and a path of integers (layer, tensor kind, row, …).
pub fn stream(seed: u64, path: &[u64]) -> u64 {
    path.iter()
        .fold(splitmix64(seed), |acc, &p| splitmix64(acc ^ splitmix64(p)))
}

/// xoshiro256++ (Blackman and Vigna), seeded by SplitMix64.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator whose state is SplitMix64's first four outputs from `seed`.
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            splitmix64(x.wrapping_sub(0x9E37_79B9_7F4A_7C15))
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (((self.next_u64() >> 32) * n as u64) >> 32) as usize
    }

    /// A standard normal sample (Box–Muller, one of the pair).
    pub fn normal(&mut self) -> f32 {
        let u1 = 1.0 - self.uniform(); // (0, 1]
        let u2 = self.uniform();
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
    }

    /// Fills `out` with normal samples times `scale`.
    pub fn fill_normal(&mut self, out: &mut [f32], scale: f32) {
        for v in out {
            *v = self.normal() * scale;
        }
    }

    /// A uniformly random permutation of `0..n` (Fisher–Yates).
    pub fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut p: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            p.swap(i, self.below(i + 1));
        }
        p
    }
}

/// The standard normal CDF Φ(x), from `erfc` (absolute error below 1e-14 away from the tails'
/// underflow).
pub fn normal_cdf(x: f64) -> f64 {
    0.5 * erfc(-x / std::f64::consts::SQRT_2)
}

/// The complementary error function, as the regularised incomplete gamma function Q(1/2, x²):
/// a series for small x², Lentz's continued fraction for large x² (accurate to about 1e-15).
fn erfc(x: f64) -> f64 {
    if x < 0.0 {
        return 2.0 - erfc(-x);
    }
    let a = 0.5f64;
    let z = x * x;
    let ln_gamma_half = 0.572_364_942_924_700_1; // ln Γ(1/2) = ln √π
    if z < a + 1.0 {
        // P(a, z) by series; erfc = 1 - P
        let (mut sum, mut del, mut ap) = (1.0 / a, 1.0 / a, a);
        for _ in 0..200 {
            ap += 1.0;
            del *= z / ap;
            sum += del;
            if del.abs() < sum.abs() * 1e-16 {
                break;
            }
        }
        1.0 - sum * (-z + a * z.ln() - ln_gamma_half).exp()
    } else {
        let tiny = 1e-300;
        let mut b = z + 1.0 - a;
        let mut c = 1.0 / tiny;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..300 {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = an * d + b;
            if d.abs() < tiny {
                d = tiny;
            }
            c = b + an / c;
            if c.abs() < tiny {
                c = tiny;
            }
            d = 1.0 / d;
            let del = d * c;
            h *= del;
            if (del - 1.0).abs() < 1e-16 {
                break;
            }
        }
        (-z + a * z.ln() - ln_gamma_half).exp() * h
    }
}

/// The inverse standard normal CDF Φ⁻¹(p) for `p` in (0, 1): Peter Acklam's rational
/// approximation (relative error 1.15e-9) refined by one Halley step against [`normal_cdf`].
/// Returns ±∞ at 0 and 1.
pub fn inv_normal_cdf(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    if p <= 0.0 {
        return f64::NEG_INFINITY;
    }
    if p >= 1.0 {
        return f64::INFINITY;
    }
    let p_low = 0.02425;
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    let x = if p < p_low {
        tail((-2.0 * p.ln()).sqrt())
    } else if p <= 1.0 - p_low {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    } else {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    };
    // one Halley step
    let e = normal_cdf(x) - p;
    let u = e * (std::f64::consts::TAU).sqrt() * (x * x / 2.0).exp();
    x - u / (1.0 + x * u / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inverse_normal_known_values() {
        let cases = [
            (0.5, 0.0),
            (0.975, 1.959_963_984_540_054),
            (0.841_344_746_068_542_9, 1.0),
            (1e-4, -3.719_016_485_455_709),
            (0.999, 3.090_232_306_167_813),
            (0.05, -1.644_853_626_951_472_2),
            (1e-9, -5.997_807_015_007_686),
        ];
        for (p, x) in cases {
            let got = inv_normal_cdf(p);
            assert!((got - x).abs() < 1e-9, "Φ⁻¹({p}) = {got}, expected {x}");
        }
    }

    #[test]
    fn inverse_normal_round_trips() {
        for i in 1..1000 {
            let p = i as f64 / 1000.0;
            let x = inv_normal_cdf(p);
            assert!((normal_cdf(x) - p).abs() < 1e-12, "p {p}");
        }
        assert!((normal_cdf(-1.0) - 0.158_655_253_931_457_05).abs() < 1e-14);
    }

    #[test]
    fn rng_is_deterministic_and_normal() {
        let mut a = Rng::new(42);
        let mut b = Rng::new(42);
        assert_eq!(a.next_u64(), b.next_u64());
        let n = 200_000;
        let (mut s, mut s2) = (0.0f64, 0.0f64);
        for _ in 0..n {
            let x = f64::from(a.normal());
            s += x;
            s2 += x * x;
        }
        let mean = s / n as f64;
        let var = s2 / n as f64 - mean * mean;
        assert!(
            mean.abs() < 0.01 && (var - 1.0).abs() < 0.02,
            "{mean} {var}"
        );
        assert_ne!(stream(1, &[2, 3]), stream(1, &[3, 2]));
    }
}
