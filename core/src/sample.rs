//! Token sampling: greedy, temperature, top-k, top-p, min-p and repetition penalty, with a seeded
//! generator so that a run is reproducible. The chain follows llama.cpp's default order:
//! penalties, top-k, top-p, min-p, temperature, then a draw.

/// Sampling settings (llama.cpp's names and defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// Temperature; `<= 0` means greedy.
    pub temperature: f32,
    /// Keep the `k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `p` (1 = all).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one (0 = none).
    pub min_p: f32,
    /// Divide positive logits (multiply negative ones) of recently seen tokens by this (1 = off).
    pub repeat_penalty: f32,
    /// How many recent tokens the penalty looks at.
    pub repeat_last_n: usize,
    /// Seed of the random generator.
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0x5EED,
        }
    }
}

/// A sampler with its random state and the recent-token window for the penalty.
pub struct Sampler {
    config: SamplerConfig,
    rng: SplitMix64,
    recent: Vec<u32>,
}

impl Sampler {
    /// A sampler for `config`.
    pub fn new(config: SamplerConfig) -> Sampler {
        let rng = SplitMix64(config.seed);
        Sampler {
            config,
            rng,
            recent: Vec::new(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// Records tokens (the prompt, or accepted tokens) for the repetition penalty.
    pub fn accept(&mut self, token: u32) {
        self.recent.push(token);
        let keep = self.config.repeat_last_n;
        if self.recent.len() > keep.max(1) * 2 {
            let drop = self.recent.len() - keep;
            self.recent.drain(..drop);
        }
    }

    /// Picks the next token from `logits` (and records it).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let token = self.choose(logits);
        self.accept(token);
        token
    }

    fn choose(&mut self, logits: &[f32]) -> u32 {
        let mut penalised;
        let logits = if self.penalty_applies() {
            penalised = logits.to_vec();
            self.apply_penalty(&mut penalised);
            &penalised[..]
        } else {
            logits
        };
        let c = &self.config;
        if c.temperature <= 0.0 {
            return argmax(logits);
        }
        let mut cands = if c.top_k > 0 && c.top_k < logits.len() {
            top_k(logits, c.top_k)
        } else {
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, l))
                .collect()
        };
        cands.sort_by(by_logit_desc);
        if c.top_p < 1.0 {
            let probs = softmax_of(&cands, 1.0);
            let mut cum = 0.0;
            let mut keep = cands.len();
            for (i, p) in probs.iter().enumerate() {
                cum += p;
                if cum >= f64::from(c.top_p) {
                    keep = i + 1;
                    break;
                }
            }
            cands.truncate(keep.max(1));
        }
        if c.min_p > 0.0 {
            let max = cands[0].1;
            let threshold = max + c.min_p.ln();
            let keep = cands.iter().take_while(|(_, l)| *l >= threshold).count();
            cands.truncate(keep.max(1));
        }
        let probs = softmax_of(&cands, c.temperature);
        let r = self.rng.next_f64();
        let mut cum = 0.0;
        for (&(id, _), p) in cands.iter().zip(&probs) {
            cum += p;
            if r < cum {
                return id;
            }
        }
        cands[cands.len() - 1].0
    }

    fn penalty_applies(&self) -> bool {
        self.config.repeat_penalty != 1.0 && self.config.repeat_last_n > 0
    }

    fn apply_penalty(&self, logits: &mut [f32]) {
        let penalty = self.config.repeat_penalty;
        let start = self.recent.len().saturating_sub(self.config.repeat_last_n);
        let mut seen: Vec<u32> = self.recent[start..].to_vec();
        seen.sort_unstable();
        seen.dedup();
        for t in seen {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = if *l > 0.0 { *l / penalty } else { *l * penalty };
            }
        }
    }
}

/// Candidates in sampling order: the larger logit first, the lower id among equal logits (a
/// total order, so the `k` best are one set whatever the method).
fn by_logit_desc(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// A candidate ordered so that the worse one is the greater (the top of a max-heap is the worst
/// of those kept).
struct Kept((u32, f32));

impl PartialEq for Kept {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}
impl Eq for Kept {}
impl PartialOrd for Kept {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Kept {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        by_logit_desc(&self.0, &other.0)
    }
}

/// The `k` (≥ 1) best candidates of `logits` under [`by_logit_desc`], in no particular order: one
/// pass with a heap of `k`, where a quickselect over a vocabulary of 262,144 moved and compared
/// every candidate several times (a sampled token cost milliseconds, on the thread that feeds
/// the batch).
fn top_k(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut heap = std::collections::BinaryHeap::with_capacity(k + 1);
    let mut worst = f32::NEG_INFINITY;
    for (i, &l) in logits.iter().enumerate() {
        if heap.len() == k {
            // most logits lose to the worst kept one on the first comparison
            if l < worst {
                continue;
            }
            let cand = Kept((i as u32, l));
            let mut top = heap.peek_mut().expect("k >= 1");
            if cand < *top {
                *top = cand;
            }
        } else {
            heap.push(Kept((i as u32, l)));
        }
        if heap.len() == k {
            worst = heap.peek().expect("k >= 1").0 .1;
        }
    }
    heap.into_iter().map(|c| c.0).collect()
}

/// Index of the largest logit (the lowest index among ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

fn softmax_of(cands: &[(u32, f32)], temperature: f32) -> Vec<f64> {
    let max = cands.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f64> = cands
        .iter()
        .map(|c| (f64::from(c.1 - max) / f64::from(temperature)).exp())
        .collect();
    let sum: f64 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

/// SplitMix64: a small, seeded, portable generator (identical on native and wasm).
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(temperature: f32) -> SamplerConfig {
        SamplerConfig {
            temperature,
            ..SamplerConfig::default()
        }
    }

    #[test]
    fn greedy_takes_the_argmax() {
        let mut s = Sampler::new(config(0.0));
        assert_eq!(s.sample(&[0.1, 3.0, -2.0, 2.9]), 1);
    }

    #[test]
    fn same_seed_same_tokens() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let run = |seed| {
            let mut s = Sampler::new(SamplerConfig {
                seed,
                ..config(1.0)
            });
            (0..20).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
    }

    #[test]
    fn top_k_keeps_the_set_a_full_sort_keeps() {
        // ties (the values repeat), NaN and infinities, k from 1 to past the length
        let mut logits: Vec<f32> = (0..500).map(|i| ((i * 7919) % 61) as f32 * 0.25).collect();
        logits[17] = f32::NAN;
        logits[40] = f32::INFINITY;
        logits[41] = f32::NEG_INFINITY;
        let mut all: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        all.sort_by(by_logit_desc);
        for k in [1, 2, 3, 40, 61, 499, 500] {
            let mut got = top_k(&logits, k);
            got.sort_by(by_logit_desc);
            let bits =
                |v: &[(u32, f32)]| v.iter().map(|c| (c.0, c.1.to_bits())).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&all[..k]), "k = {k}");
        }
    }

    #[test]
    fn top_k_one_is_greedy() {
        let mut s = Sampler::new(SamplerConfig {
            top_k: 1,
            ..config(5.0)
        });
        for _ in 0..20 {
            assert_eq!(s.sample(&[1.0, 2.0, 1.5]), 1);
        }
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        let mut s = Sampler::new(SamplerConfig {
            min_p: 0.5,
            top_k: 0,
            top_p: 1.0,
            ..config(1.0)
        });
        for _ in 0..50 {
            // exp(-3) < 0.5: only token 0 survives.
            assert_eq!(s.sample(&[3.0, 0.0, -1.0]), 0);
        }
    }

    #[test]
    fn repetition_penalty_discourages_seen_tokens() {
        let mut s = Sampler::new(SamplerConfig {
            repeat_penalty: 2.0,
            ..config(0.0)
        });
        s.accept(0);
        assert_eq!(s.sample(&[2.0, 1.5]), 1);
    }
}
