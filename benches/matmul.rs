//! `cargo bench --bench matmul`: the dense quantised matmul kernels at Gemma 3 270M's shapes.
//!
//! For each weight type and shape (rows × cols: 2048×640 as ffn_gate/up, 640×2048 as ffn_down, and
//! the 262144×640 Q8_0 LM head), with 1 token (decode), 8 (a step of 8 batched streams) and 64
//! tokens (prompt), prints the time per call, the weight bandwidth (GB/s of weight bytes per call)
//! and GFLOP/s, for the scalar path and the best SIMD path of this CPU, and their ratio. Then,
//! when the Gemma file is in the cache, it times every matrix of one forward pass of the real
//! model (weights from the file, LM head included for decode and excluded for the prompt, as
//! llama.cpp computes logits only for the last token) and prints the matmul-only tokens per
//! second.
//!
//! Runs on rayon's global pool (`RAYON_NUM_THREADS` sets its size). `HOTCOLD_BENCH_QUICK=1`
//! shortens each measurement; `HOTCOLD_BENCH_FILTER=q4_K,model` runs only the cases whose type
//! name (or `model`, `lm_head`) is listed. `HOTCOLD_BENCH_FILTER=dram` (only when named) streams one
//! token through ~600 MB of Qwen2.5 0.5B ffn_down-sized (896×4864) matrices per type, row-major
//! and interleaved, to measure the kernels at DRAM bandwidth rather than from cache.

mod common;

use std::time::Duration;

use common::{random_f32, time, weights};

use hotcold::cpu::{matmul, matmul_with_simd, simd_level, Interleaved, Matrix};
use hotcold::gguf::GgufFile;
use hotcold::models::DefaultModel;
use hotcold::quant::GgmlType;

fn main() {
    let quick = std::env::var_os("HOTCOLD_BENCH_QUICK").is_some();
    let budget = Duration::from_millis(if quick { 60 } else { 300 });
    let simd = simd_level();
    println!(
        "hotcold matmul bench: simd = {simd}, threads = {}",
        rayon::current_num_threads_hint()
    );
    println!(
        "{:<6} {:>13} {:>4} {:>7} {:>11} {:>8} {:>9} {:>8}",
        "type", "rows×cols", "tok", "path", "µs/call", "GB/s", "GFLOP/s", "speedup"
    );

    let types = hotcold::cpu::MATMUL_TYPES;
    let mut cases: Vec<(GgmlType, usize, usize)> = Vec::new();
    for &ty in types {
        for &(rows, cols) in &[(2048usize, 640usize), (640, 2048)] {
            if cols % ty.block_size() == 0 {
                cases.push((ty, rows, cols));
            }
        }
    }
    cases.push((GgmlType::Q8_0, 262_144, 640));

    let filter: Option<Vec<String>> = std::env::var("HOTCOLD_BENCH_FILTER")
        .ok()
        .map(|f| f.split(',').map(|s| s.trim().to_string()).collect());
    let wanted = |name: &str| filter.as_ref().is_none_or(|f| f.iter().any(|x| x == name));
    for (ty, rows, cols) in cases {
        let lm_head = rows > 100_000;
        if !wanted(if lm_head { "lm_head" } else { ty.name() }) {
            continue;
        }
        let data = weights(ty, rows, cols);
        let w = Matrix::new(ty, rows, cols, &data).unwrap();
        // the interleaved types also in the 16-row layout, where this CPU runs it fast
        let interleaved =
            Interleaved::is_fast_for(ty).then(|| Interleaved::from_matrix(&w).unwrap());
        for n in [1usize, 8, 64] {
            if lm_head && n > 1 && quick {
                continue;
            }
            let x = random_f32(n * cols, 7 + n as u64);
            let mut y = vec![0f32; n * rows];
            let mut paths = vec![simd];
            // the scalar LM head over 64 tokens takes seconds per call: skip it
            if simd != "scalar" && !(lm_head && n > 1) {
                paths.push("scalar");
            }
            let mut first = 0.0;
            for (i, path) in paths.iter().enumerate() {
                let secs = time(budget, || {
                    matmul_with_simd(path, &w, &x, n, &mut y).unwrap()
                });
                if i == 0 {
                    first = secs;
                }
                let gbs = data.len() as f64 / secs / 1e9;
                let gflops = 2.0 * (rows * cols * n) as f64 / secs / 1e9;
                let speedup = if i == 0 {
                    String::new()
                } else {
                    format!("{:.1}×", secs / first)
                };
                row(ty, rows, cols, n, path, secs, gbs, gflops, &speedup);
            }
            if let Some(il) = &interleaved {
                let secs = time(budget, || il.matmul(&x, n, &mut y).unwrap());
                let gbs = il.n_bytes() as f64 / secs / 1e9;
                let gflops = 2.0 * (rows * cols * n) as f64 / secs / 1e9;
                let speedup = format!("{:.2}×", first / secs);
                row(ty, rows, cols, n, "x16", secs, gbs, gflops, &speedup);
            }
        }
    }

    if wanted("model") {
        model_pass(budget);
    }
    if filter
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == "dram"))
    {
        dram_pass(budget);
    }
}

/// One token through ~600 MB of distinct 896×4864 matrices of each interleaved type: the decode
/// case where every weight byte comes from DRAM.
fn dram_pass(budget: Duration) {
    const TOTAL: usize = 600_000_000;
    let (rows, cols) = (896, 4864);
    println!(
        "\none token through ~{} MB of {rows}×{cols} matrices (from DRAM):",
        TOTAL / 1_000_000
    );
    let x = random_f32(cols, 3);
    let mut y = vec![0f32; rows];
    for ty in Interleaved::TYPES {
        let data = weights(ty, rows, cols);
        let copies: Vec<Vec<u8>> = (0..TOTAL.div_ceil(data.len()))
            .map(|_| data.clone())
            .collect();
        let mats: Vec<Matrix> = copies
            .iter()
            .map(|d| Matrix::new(ty, rows, cols, d).unwrap())
            .collect();
        let bytes = (copies.len() * data.len()) as f64;
        let flops = 2.0 * (rows * cols * mats.len()) as f64;
        let row_major = time(budget, || {
            for m in &mats {
                matmul(m, &x, 1, &mut y).unwrap();
            }
        });
        row(
            ty,
            rows,
            cols,
            1,
            simd_level(),
            row_major / mats.len() as f64,
            bytes / row_major / 1e9,
            flops / row_major / 1e9,
            "",
        );
        if !Interleaved::is_fast_for(ty) {
            continue;
        }
        let ils: Vec<Interleaved> = mats
            .iter()
            .map(|m| Interleaved::from_matrix(m).unwrap())
            .collect();
        let il_bytes: usize = ils.iter().map(Interleaved::n_bytes).sum();
        let secs = time(budget, || {
            for il in &ils {
                il.matmul(&x, 1, &mut y).unwrap();
            }
        });
        let speedup = format!("{:.2}×", row_major / secs);
        row(
            ty,
            rows,
            cols,
            1,
            "x16",
            secs / ils.len() as f64,
            il_bytes as f64 / secs / 1e9,
            flops / secs / 1e9,
            &speedup,
        );
    }
}

/// Every matrix of one forward pass of Gemma 3 270M, from the real file.
fn model_pass(budget: Duration) {
    let Ok(path) = DefaultModel::Gemma3_270m.locate() else {
        println!(
            "\n(Gemma 3 270M not in the cache: run scripts/fetch-models.sh for the model pass)"
        );
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let mut mats = Vec::new();
    let mut lm_head = None;
    for info in file.tensors() {
        if info.shape.len() != 2 {
            continue;
        }
        let (cols, rows) = (info.shape[0] as usize, info.shape[1] as usize);
        let m = Matrix::new(info.ty, rows, cols, file.tensor_data(info)).unwrap();
        if info.name == "token_embd.weight" {
            lm_head = Some(m);
        } else if info.name.starts_with("blk.") {
            mats.push(m);
        }
    }
    let lm_head = lm_head.expect("token_embd.weight");
    let layer_bytes: usize = mats.iter().map(|m| m.data.len()).sum();
    println!(
        "\nGemma 3 270M forward pass, matmuls only ({} matrices, {:.1} MB + LM head {:.1} MB), simd = {}:",
        mats.len(),
        layer_bytes as f64 / 1e6,
        lm_head.data.len() as f64 / 1e6,
        simd_level()
    );
    for n in [1usize, 64] {
        let xs: Vec<Vec<f32>> = [640usize, 1024, 2048]
            .iter()
            .map(|&c| random_f32(n * c, c as u64))
            .collect();
        let x_for = |cols: usize| match cols {
            640 => &xs[0],
            1024 => &xs[1],
            _ => &xs[2],
        };
        let mut y = vec![0f32; n * 262_144];
        let secs = time(budget, || {
            for m in &mats {
                matmul(m, x_for(m.cols), n, &mut y[..n * m.rows]).unwrap();
            }
        });
        let head = time(budget, || {
            matmul(&lm_head, &xs[0][..640], 1, &mut y[..262_144]).unwrap();
        });
        if n == 1 {
            let total = secs + head;
            println!(
                "  decode (1 token): layers {:.2} ms ({:.1} GB/s) + LM head {:.2} ms ({:.1} GB/s) = {:.2} ms → {:.0} tok/s",
                secs * 1e3,
                layer_bytes as f64 / secs / 1e9,
                head * 1e3,
                lm_head.data.len() as f64 / head / 1e9,
                total * 1e3,
                1.0 / total
            );
        } else {
            let total = secs + head;
            println!(
                "  prompt ({n} tokens): layers {:.2} ms + LM head for the last token {:.2} ms = {:.2} ms → {:.0} tok/s",
                secs * 1e3,
                head * 1e3,
                total * 1e3,
                n as f64 / total
            );
        }
    }
}

/// rayon's pool size without depending on rayon: `RAYON_NUM_THREADS` or the CPU count.
mod rayon {
    pub fn current_num_threads_hint() -> usize {
        std::env::var("RAYON_NUM_THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }
}

/// One table row (`speedup`: the ratio to the first path, or empty).
#[allow(clippy::too_many_arguments)]
fn row(
    ty: GgmlType,
    rows: usize,
    cols: usize,
    n: usize,
    path: &str,
    secs: f64,
    gbs: f64,
    gflops: f64,
    speedup: &str,
) {
    println!(
        "{:<6} {:>13} {:>4} {:>7} {:>11.1} {:>8.2} {:>9.2} {:>8}",
        ty.name(),
        format!("{rows}×{cols}"),
        n,
        path,
        secs * 1e6,
        gbs,
        gflops,
        speedup
    );
}
