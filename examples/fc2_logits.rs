//! Time of the predictor's second layer per decoded token: the row-major `fc2` matrix-vector
//! product (what the engine did before) against the rank-major sparse axpy over the non-zero hidden
//! units ([`hotcold::predictor::RankMajorFc2`]), summed over the layers, with the predictors as the
//! CLI loads them (Q8_0 copies of float predictors).
//!
//!   cargo run --release --example fc2_logits -- MODEL.gguf [THREADS]
//!
//! Each call starts after writing 16 MiB elsewhere, so the weights come from beyond the core's
//! own caches as in a decode step. The predictor's input is a residual-like vector (dimension 0 the constant `synth` puts there,
//! the rest a fixed pseudo-random pattern), so `relu` zeroes hidden units as on real tokens.

use std::time::{Duration, Instant};

use hotcold::cpu::{matmul, Matrix};
use hotcold::engine::thread_pool;
use hotcold::model::Model;
use hotcold::quant::GgmlType;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: fc2_logits MODEL.gguf [THREADS]")?;
    let threads: usize = args.next().map_or(Ok(1), |s| s.parse())?;
    let mut model = Model::open(&path)?;
    model.quantize_predictors(GgmlType::Q8_0)?;
    let pool = thread_pool(threads)?;
    let e = model.hp.n_embd;
    let x: Vec<f32> = (0..e)
        .map(|i| match i {
            0 => 4.0,
            _ => ((i as f32 * 12.9898).sin() * 43758.547).fract() * 2.0 - 1.0,
        })
        .collect();
    let (mut dense, mut sparse, mut nonzero, mut units) = (Duration::ZERO, Duration::ZERO, 0, 0);
    let mut whole_t = Duration::ZERO;
    for layer in &model.layers {
        let Some(p) = &layer.predictor else { continue };
        let fc1 = model.matrix(&p.fc1);
        let fc2: Matrix = model.matrix(&p.fc2);
        let mut hidden = vec![0f32; fc1.rows];
        matmul(&fc1, &x, 1, &mut hidden)?;
        hidden.iter_mut().for_each(|v| *v = v.max(0.0));
        nonzero += hidden.iter().filter(|&&v| v != 0.0).count();
        units += hidden.len();
        let mut out = vec![0f32; fc2.rows];
        let mut flush = vec![0u8; 16 << 20];
        let mut best = |f: &mut dyn FnMut()| {
            (0..100)
                .map(|k| {
                    // evict the weights from the core's caches, as a decode step's other
                    // matrices do
                    flush.iter_mut().step_by(64).for_each(|b| *b = k as u8);
                    let t = Instant::now();
                    f();
                    t.elapsed()
                })
                .min()
                .unwrap_or_default()
        };
        // experiment: one whole rank-major Q8_0 matrix
        let mut vals = vec![0f32; fc2.rows * fc2.cols];
        for (r, row) in vals.chunks_exact_mut(fc2.cols).enumerate() {
            hotcold::cpu::dequantize_row(&fc2, r, row)?;
        }
        let mut t = vec![0f32; vals.len()];
        for r in 0..fc2.rows {
            for c in 0..fc2.cols {
                t[c * fc2.rows + r] = vals[r * fc2.cols + c];
            }
        }
        let mut bytes = vec![0u8; t.len() / 32 * 34];
        hotcold::quant::quantize(GgmlType::Q8_0, &t, &mut bytes)?;
        let whole = Matrix::new(GgmlType::Q8_0, fc2.cols, fc2.rows, &bytes)?;
        pool.install(|| {
            dense += best(&mut || matmul(&fc2, &hidden, 1, &mut out).unwrap());
            sparse += best(&mut || p.fc2_rank_major.logits(&hidden, 1, &mut out).unwrap());
            whole_t += best(&mut || {
                out.fill(0.0);
                hotcold::cpu::sparse_axpy(&whole, &hidden, 1, &mut out).unwrap()
            });
        });
    }
    println!(
        "{threads} thread(s): fc2 row-major matmul {:.1} µs/token, rank-major axpy over {nonzero} of \
         {units} hidden units {:.1} µs/token (min of 100 per layer with the caches flushed of 16 MiB first, summed)",
        dense.as_secs_f64() * 1e6,
        sparse.as_secs_f64() * 1e6
    );
    println!("whole-matrix axpy {:.1} µs", whole_t.as_secs_f64() * 1e6);
    Ok(())
}
