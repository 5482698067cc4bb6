//! Unit tests: bitsets, splitting, measuring, and training on a synthetic low-rank rule.

use super::rng::Rng;
use super::*;

#[test]
fn push_sets_bits_and_frequencies() {
    let mut s = Samples::new(2, 70);
    let mut a = vec![0f32; 70];
    a[0] = 1.0;
    a[63] = -0.5; // non-zero counts as active, whatever the sign
    a[64] = 2.0;
    a[69] = 1e-30;
    s.push(&[1.0, 2.0], &a);
    let mut b = vec![0f32; 70];
    b[0] = 3.0;
    b[5] = 1.0;
    s.push(&[3.0, 4.0], &b);
    assert_eq!(s.len(), 2);
    assert_eq!(s.words_per_row(), 2);
    assert_eq!(s.active.len(), 4);
    assert_eq!(s.active[0], 1 | 1 << 63);
    assert_eq!(s.active[1], 1 | 1 << 5);
    assert_eq!(s.active[2], 1 | 1 << 5);
    assert_eq!(s.active[3], 0);
    assert!(s.is_active(0, 69) && !s.is_active(1, 69) && s.is_active(1, 5));
    assert_eq!(s.x_row(1), &[3.0, 4.0]);
    let fr = s.frequencies();
    assert_eq!(fr.len(), 70);
    for (i, &v) in fr.iter().enumerate() {
        let want = match i {
            0 => 1.0,
            5 | 63 | 64 | 69 => 0.5,
            _ => 0.0,
        };
        assert_eq!(v, want, "neuron {i}");
    }
    assert!((s.density() - 6.0 / 140.0).abs() < 1e-12);
    assert_eq!(Samples::new(3, 5).frequencies(), vec![0.0; 5]);
}

fn numbered(n: usize) -> Samples {
    let mut s = Samples::new(1, 3);
    for i in 0..n {
        s.push(&[i as f32], &[(i % 2) as f32, 0.0, 1.0]);
    }
    s
}

#[test]
fn split_is_deterministic_and_partitions() {
    let s = numbered(100);
    let (t1, h1) = s.split(0.2, 7);
    let (t2, h2) = s.split(0.2, 7);
    assert_eq!((&t1, &h1), (&t2, &h2));
    assert_eq!((t1.len(), h1.len()), (80, 20));
    let mut ids: Vec<f32> = t1.x.iter().chain(&h1.x).copied().collect();
    ids.sort_by(f32::total_cmp);
    assert_eq!(ids, (0..100).map(|i| i as f32).collect::<Vec<_>>());
    // Rows keep their bits, and relative order is preserved.
    for part in [&t1, &h1] {
        assert!(part.x.windows(2).all(|w| w[0] < w[1]));
        for k in 0..part.len() {
            let i = part.x_row(k)[0] as usize;
            assert_eq!(part.is_active(k, 0), i % 2 == 1);
            assert!(part.is_active(k, 2) && !part.is_active(k, 1));
        }
    }
    let (_, h3) = s.split(0.2, 8);
    assert_ne!(h1, h3, "another seed draws another holdout");
    assert_eq!(s.split(0.0, 1).1.len(), 0);
    assert_eq!(s.split(1.0, 1).0.len(), 0);
}

/// An identity-like predictor: n_embd = n_ff = 2, rank 2, logits = relu(x).
fn identity_predictor(threshold: f32) -> TrainedPredictor {
    TrainedPredictor {
        rank: 2,
        fc1: vec![1.0, 0.0, 0.0, 1.0],
        fc2: vec![1.0, 0.0, 0.0, 1.0],
        threshold,
    }
}

#[test]
fn logits_and_evaluate_by_hand() {
    let p = identity_predictor(0.5);
    assert_eq!(
        p.logits(&[1.0, -2.0, 0.25, 3.0], 2),
        vec![1.0, 0.0, 0.25, 3.0]
    );
    let mut s = Samples::new(2, 2);
    s.push(&[1.0, -2.0], &[1.0, 1.0]); // predicted {0}, actual {0, 1}: TP 1, FN 1
    s.push(&[0.25, 3.0], &[0.0, 0.0]); // predicted {1}, actual {}: FP 1
    s.push(&[0.5, 0.0], &[1.0, 0.0]); // predicted {0} (>= is inclusive), actual {0}: TP 1
    let m = evaluate(&p, &s);
    assert_eq!(m.recall, 2.0 / 3.0);
    assert_eq!(m.precision, 2.0 / 3.0);
    assert_eq!(m.density, 3.0 / 6.0);
    assert_eq!(m.true_density, 3.0 / 6.0);
    // Nothing predicted, nothing active: both ratios default to 1.
    let mut z = Samples::new(2, 2);
    z.push(&[-1.0, -1.0], &[0.0, 0.0]);
    let m = evaluate(&p, &z);
    assert_eq!(
        (m.recall, m.precision, m.density, m.true_density),
        (1.0, 1.0, 0.0, 0.0)
    );
}

#[test]
fn with_threshold_keeps_decisions() {
    let p = identity_predictor(0.5);
    let q = p.with_threshold(2.0).unwrap();
    assert_eq!(q.fc2, vec![4.0, 0.0, 0.0, 4.0]);
    assert_eq!(q.threshold, 2.0);
    assert!(p.with_threshold(-1.0).is_none());
    assert!(identity_predictor(0.0).with_threshold(1.0).is_none());
}

/// x ~ N(0, σ²) per dimension with dimension 0 constant; active = (U·V·x > b) for a rank-8 U·V,
/// b set for about 10% firing per neuron. Dimension 0 plays no part in the rule; it is there as a
/// bias input for the predictor, which has none of its own.
fn synthetic(n: usize, seed: u64) -> Samples {
    const E: usize = 64;
    const F: usize = 256;
    const K: usize = 8;
    let mut rng = Rng::new(1234);
    let u: Vec<f32> = (0..F * K).map(|_| rng.normal()).collect();
    let v: Vec<f32> = (0..K * E).map(|_| rng.normal()).collect();
    let mut w = vec![0f32; F * E];
    for i in 0..F {
        for k in 0..K {
            for j in 1..E {
                w[i * E + j] += u[i * K + k] * v[k * E + j];
            }
        }
    }
    // Dimensions with different scales (the trainer must cope), dimension 0 a constant 3.
    let sigma: Vec<f32> = (0..E).map(|j| 0.5 + (j % 5) as f32).collect();
    let b: Vec<f32> = (0..F)
        .map(|i| {
            let var: f32 = (1..E).map(|j| (w[i * E + j] * sigma[j]).powi(2)).sum();
            1.2816 * var.sqrt() // P(N(0,1) > 1.2816) = 0.10
        })
        .collect();
    let mut rng = Rng::new(seed);
    let mut s = Samples::new(E, F);
    let mut act = vec![0f32; F];
    for _ in 0..n {
        let mut x: Vec<f32> = (0..E).map(|j| rng.normal() * sigma[j]).collect();
        x[0] = 3.0;
        for i in 0..F {
            let z: f32 = (1..E).map(|j| w[i * E + j] * x[j]).sum();
            act[i] = if z > b[i] { z - b[i] } else { 0.0 };
        }
        s.push(&x, &act);
    }
    s
}

#[test]
fn trains_low_rank_rule() {
    let all = synthetic(2500, 99);
    let (tr, ho) = all.split(0.2, 5);
    let cfg = TrainConfig {
        rank: 16,
        epochs: 40,
        batch: 64,
        learning_rate: 1e-2,
        calibration_fraction: 0.1,
        ..TrainConfig::default()
    };
    let t0 = std::time::Instant::now();
    let mut losses = Vec::new();
    let p = train(&tr, &cfg, |_, l| losses.push(l));
    let secs = t0.elapsed().as_secs_f64();
    assert_eq!(losses.len(), cfg.epochs);
    assert!(losses.last() < losses.first(), "loss fell: {losses:?}");
    assert_eq!((p.rank, p.n_embd(), p.n_ff()), (16, 64, 256));
    let mt = evaluate(&p, &tr);
    let mh = evaluate(&p, &ho);
    eprintln!(
        "synthetic: {secs:.2}s, loss {:.4} -> {:.4}, threshold {:.3}\n  train {mt:?}\n  holdout {mh:?}",
        losses[0],
        losses.last().unwrap(),
        p.threshold
    );
    assert!(mt.recall >= 0.98, "train recall {mt:?}");
    assert!(mh.recall >= 0.97, "holdout recall {mh:?}");
    assert!(mh.precision >= 0.5, "holdout precision {mh:?}");
    assert!(mh.density < 2.0 * mh.true_density, "holdout {mh:?}");
}

#[test]
fn training_is_deterministic() {
    let s = synthetic(300, 3);
    let cfg = TrainConfig {
        rank: 8,
        epochs: 2,
        batch: 32,
        seed: 11,
        ..TrainConfig::default()
    };
    let a = train(&s, &cfg, |_, _| {});
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let b = one.install(|| train(&s, &cfg, |_, _| {}));
    assert_eq!(a, b);
    let c = train(&s, &TrainConfig { seed: 12, ..cfg }, |_, _| {});
    assert_ne!(a.fc1, c.fc1);
}
