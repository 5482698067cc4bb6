//! `cpu::matmul` on real tensors of the Gemma 3 270M Q4_K_M file: for each weight type present,
//! the product with a random activation batch is compared with dequantise-then-f32-dot.

use hotcold_core::cpu::{dequantize_row, matmul, Matrix};
use hotcold_core::gguf::GgufFile;
use hotcold_core::models::DefaultModel;
use hotcold_core::quant::GgmlType;

fn open_gemma() -> GgufFile {
    let path = DefaultModel::Gemma3_270m.locate().unwrap_or_else(|e| {
        panic!("{e}\nthe real-weights tests need the Gemma model: run scripts/fetch-models.sh")
    });
    GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// xorshift: deterministic activations with a few large values, like real hidden states.
fn activations(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let v = (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
            if i % 61 == 0 {
                8.0 * v
            } else {
                v
            }
        })
        .collect()
}

#[test]
fn matmul_matches_dequantised_reference_on_gemma_tensors() {
    let file = open_gemma();
    let mut seen = std::collections::BTreeMap::new();
    for info in file.tensors() {
        if info.shape.len() != 2 || !info.name.ends_with(".weight") {
            continue;
        }
        if seen.contains_key(info.ty.name()) {
            continue;
        }
        let (cols, rows_total) = (info.shape[0] as usize, info.shape[1] as usize);
        let data = file.tensor_data(info);
        // at most 256 rows (the embedding has 262144)
        let rows = rows_total.min(256);
        let rb = info.ty.row_bytes(cols as u64).unwrap() as usize;
        let w = Matrix::new(info.ty, rows, cols, &data[..rows * rb])
            .unwrap_or_else(|e| panic!("{}: {e}", info.name));
        let n = 5;
        let x = activations(n * cols, 0x9e37_79b9_7f4a_7c15 ^ cols as u64);
        let mut y = vec![0f32; n * rows];
        matmul(&w, &x, n, &mut y).unwrap_or_else(|e| panic!("{}: {e}", info.name));

        let mut row = vec![0f32; cols];
        let mut worst = 0f64;
        for r in 0..rows {
            dequantize_row(&w, r, &mut row).unwrap();
            for t in 0..n {
                let xt = &x[t * cols..(t + 1) * cols];
                let exact: f64 = row.iter().zip(xt).map(|(&a, &b)| a as f64 * b as f64).sum();
                let mag: f64 = row
                    .iter()
                    .zip(xt)
                    .map(|(&a, &b)| (a as f64 * b as f64).abs())
                    .sum();
                // Q8 activations carry ~0.4% relative error per element; F32/F16 far less.
                let rel = match info.ty {
                    GgmlType::F32 => 1e-5,
                    GgmlType::F16 | GgmlType::BF16 => 2e-3,
                    _ => 1e-2,
                };
                let err = (y[t * rows + r] as f64 - exact).abs() / mag.max(1e-30);
                worst = worst.max(err);
                assert!(
                    err <= rel,
                    "{} ({}) row {r} token {t}: {} vs {exact} (error {err:.2e} of Σ|w·x| = {mag:.3e})",
                    info.name,
                    info.ty,
                    y[t * rows + r]
                );
            }
        }
        seen.insert(info.ty.name(), (info.name.clone(), worst));
    }
    eprintln!("checked (type: tensor, worst error / Σ|w·x|): {seen:#?}");
    for ty in ["q8_0", "q5_0", "q4_K", "q6_K"] {
        assert!(
            seen.contains_key(ty),
            "no {ty} tensor found in the Gemma file: {seen:?}"
        );
    }
}

#[test]
fn lm_head_rows_match_dequantised_reference() {
    // the tied embedding / LM head (262144 × 640 Q8_0): the last rows, a single token
    let file = open_gemma();
    let info = file.tensor("token_embd.weight").expect("token_embd.weight");
    let (cols, rows_total) = (info.shape[0] as usize, info.shape[1] as usize);
    let rb = info.ty.row_bytes(cols as u64).unwrap() as usize;
    let rows = 1000;
    let data = &file.tensor_data(info)[(rows_total - rows) * rb..];
    let w = Matrix::new(info.ty, rows, cols, data).unwrap();
    let x = activations(cols, 3);
    let mut y = vec![0f32; rows];
    matmul(&w, &x, 1, &mut y).unwrap();
    let mut row = vec![0f32; cols];
    for (r, &got) in y.iter().enumerate() {
        dequantize_row(&w, r, &mut row).unwrap();
        let exact: f64 = row.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
        let mag: f64 = row
            .iter()
            .zip(&x)
            .map(|(&a, &b)| (a as f64 * b as f64).abs())
            .sum();
        assert!(
            (got as f64 - exact).abs() <= 1e-2 * mag,
            "row {r}: {got} vs {exact}"
        );
    }
}
