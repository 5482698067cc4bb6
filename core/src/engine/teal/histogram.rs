//! A bounded-memory histogram of activation magnitudes for calibration: for each magnitude bin,
//! how many values fell in it and how much output error zeroing them would add.
//!
//! Bins follow the bits of an f32: 32 bins per octave (the exponent and the top five mantissa
//! bits), from 2^-24 to 2^24, so a quantile is found to within 2.2% of its value with 1,536 bins
//! whatever the number of samples; values below 2^-24 (and zeros) share the first bin, values
//! above 2^24 the last.

/// Mantissa bits dropped from an f32 to form its bin.
const SHIFT: u32 = 23 - 5;
/// The bin of 2^-24 (biased exponent 103, 32 bins per octave).
const FIRST: u32 = 103 << 5;
/// Bins: 48 octaves of 32.
pub(crate) const N_BINS: usize = 48 * 32;

/// Counts and error mass of magnitudes by bin.
#[derive(Clone, Debug)]
pub struct MagnitudeHistogram {
    count: Vec<u64>,
    energy: Vec<f64>,
}

impl Default for MagnitudeHistogram {
    fn default() -> Self {
        MagnitudeHistogram {
            count: vec![0; N_BINS],
            energy: vec![0.0; N_BINS],
        }
    }
}

/// The bin of `|v|`.
fn bin(v: f32) -> usize {
    let b = (v.to_bits() & 0x7fff_ffff) >> SHIFT;
    (b.saturating_sub(FIRST) as usize).min(N_BINS - 1)
}

/// The lower edge of bin `b` (0 for the first).
fn lower_edge(b: usize) -> f32 {
    if b == 0 {
        0.0
    } else {
        f32::from_bits((b as u32 + FIRST) << SHIFT)
    }
}

impl MagnitudeHistogram {
    /// Records a value `v` whose zeroing would add `weight · v²` to the output's squared error.
    pub fn add(&mut self, v: f32, weight: f32) {
        let b = bin(v);
        self.count[b] += 1;
        self.energy[b] += f64::from(weight) * f64::from(v) * f64::from(v);
    }

    /// Adds the counts of `other`.
    pub fn merge(&mut self, other: &MagnitudeHistogram) {
        self.count
            .iter_mut()
            .zip(&other.count)
            .for_each(|(a, b)| *a += b);
        self.energy
            .iter_mut()
            .zip(&other.energy)
            .for_each(|(a, b)| *a += b);
    }

    /// Values recorded.
    pub fn len(&self) -> u64 {
        self.count.iter().sum()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Total error mass (zeroing every value).
    pub fn total_energy(&self) -> f64 {
        self.energy.iter().sum()
    }

    /// The threshold `t` below which a `sparsity` fraction of the values lie, and the error mass
    /// of those values (linear interpolation inside the bin that holds the cut). 0 and 0 for an
    /// empty histogram or `sparsity ≤ 0`.
    pub fn cut(&self, sparsity: f64) -> (f32, f64) {
        let n = self.len();
        if n == 0 || sparsity <= 0.0 {
            return (0.0, 0.0);
        }
        let want = sparsity.min(1.0) * n as f64;
        let mut below = 0u64;
        let mut energy = 0.0;
        for b in 0..N_BINS {
            let c = self.count[b];
            if (below + c) as f64 >= want && c > 0 {
                let frac = (want - below as f64) / c as f64;
                let hi = if b + 1 < N_BINS {
                    lower_edge(b + 1)
                } else {
                    f32::MAX
                };
                let lo = lower_edge(b);
                let t = lo + (hi - lo) * frac as f32;
                return (t, energy + self.energy[b] * frac);
            }
            below += c;
            energy += self.energy[b];
        }
        (f32::MAX, energy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_are_monotonic_and_edges_bound_their_values() {
        let mut prev = 0;
        for k in 0..2000 {
            let v = 1e-8f32 * 1.01f32.powi(k);
            let b = bin(v);
            assert!(b >= prev);
            prev = b;
            if b > 0 && b < N_BINS - 1 {
                assert!(
                    lower_edge(b) <= v && v < lower_edge(b + 1),
                    "{v} in bin {b}"
                );
            }
        }
        assert_eq!(bin(-2.0), bin(2.0));
        assert_eq!(bin(0.0), 0);
    }

    #[test]
    fn quantiles_match_the_exact_ones_within_a_bin() {
        let mut h = MagnitudeHistogram::default();
        let mut values: Vec<f32> = (0..10_000)
            .map(|i| ((i * 7919 % 10_000) as f32 / 10_000.0 - 0.5) * 3.0)
            .collect();
        for &v in &values {
            h.add(v, 1.0);
        }
        values.iter_mut().for_each(|v| *v = v.abs());
        values.sort_by(f32::total_cmp);
        for s in [0.1, 0.25, 0.4, 0.5, 0.9] {
            let (t, e) = h.cut(s);
            let exact = values[(s * values.len() as f64) as usize];
            assert!((t - exact).abs() <= exact * 0.032, "{s}: {t} vs {exact}");
            let exact_e: f64 = values
                .iter()
                .filter(|&&v| v < exact)
                .map(|&v| f64::from(v) * f64::from(v))
                .sum();
            assert!(
                (e - exact_e).abs() <= exact_e * 0.07 + 1e-9,
                "{s}: {e} vs {exact_e}"
            );
        }
        assert_eq!(h.cut(0.0), (0.0, 0.0));
        assert!((h.cut(1.0).1 - h.total_energy()).abs() < 1e-6 * h.total_energy());
    }
}
