//! `hotcold synth`: write a synthetic ReLU model in PowerInfer's format, its dense twin in
//! llama.cpp's (`--layout llama.cpp`), or a dense SwiGLU llama (`--activation silu`, llama.cpp's
//! layout) (see [`hotcold_core::synth`]).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use hotcold_core::quant::GgmlType;
use hotcold_core::synth::{self, SynthArch, SynthConfig, SynthLayout};

/// Arguments of `hotcold synth`.
#[derive(clap::Args)]
pub struct Args {
    /// Model shape: tiny (< 2 MB), small (~170 MB in F16), relullama-7b (ReluLLaMA-7B's shape), llama2-7b-layers (4 layers of Llama-2-7B's shape).
    #[arg(long, default_value = "tiny")]
    preset: String,
    /// Architecture: llama (ReLU gate × up), bamboo (dReLU), falcon (parallel attention,
    /// relu(up)) or opt (learned positions, biases, relu(up)).
    #[arg(long, default_value = "llama")]
    arch: String,
    /// Type of the large matrices: f16, q8_0 or q4_0.
    #[arg(long = "type", default_value = "f16")]
    ty: String,
    /// Target fraction of inactive FFN neurons per token.
    #[arg(long, default_value_t = 0.9)]
    sparsity: f32,
    /// FFN activation of a llama: relu (a ReLU PowerInfer file with predictors, the default) or
    /// silu (a dense SwiGLU llama.cpp file: no predictor, row-major ffn_down, for CATS / TEAL).
    #[arg(long, default_value = "relu")]
    activation: String,
    /// File layout: powerinfer (PWRI magic, neuron-major ffn_down_t, predictors) or llama.cpp
    /// (alias dense: the same weights as an ordinary GGUF with row-major ffn_down and no
    /// predictor, the fair dense baseline). --activation silu implies llama.cpp.
    #[arg(long, default_value = "powerinfer")]
    layout: String,
    /// Seed of every random choice (the same seed gives the same file).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output file.
    #[arg(short = 'o', long = "output", value_name = "OUT.gguf")]
    output: PathBuf,
}

/// Runs `hotcold synth`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let mut cfg = SynthConfig::preset(&args.preset)?;
    cfg.arch = SynthArch::parse(&args.arch)?;
    cfg.ty = match args.ty.to_ascii_lowercase().as_str() {
        "f16" => GgmlType::F16,
        "q8_0" => GgmlType::Q8_0,
        "q4_0" => GgmlType::Q4_0,
        other => anyhow::bail!("unknown --type {other:?} (expected f16, q8_0 or q4_0)"),
    };
    cfg.dense_silu = match args.activation.to_ascii_lowercase().as_str() {
        "relu" => false,
        "silu" => true,
        other => anyhow::bail!("unknown --activation {other:?} (expected relu or silu)"),
    };
    cfg.layout = SynthLayout::parse(&args.layout.to_ascii_lowercase())?;
    cfg.sparsity = args.sparsity;
    cfg.seed = args.seed;
    let start = Instant::now();
    let report = synth::write(&cfg, &args.output)
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let mean_density =
        report.layer_density.iter().sum::<f32>() / report.layer_density.len().max(1) as f32;
    let mean_top =
        report.layer_top10_share.iter().sum::<f32>() / report.layer_top10_share.len().max(1) as f32;
    println!(
        "wrote {} in {:.1} s: preset {}, arch {}, type {}, seed {}",
        args.output.display(),
        start.elapsed().as_secs_f64(),
        cfg.preset,
        cfg.arch.name(),
        cfg.ty,
        cfg.seed
    );
    println!(
        "  n_embd {}, n_ff {}, {} layers, {} heads ({} kv), vocab {}, ctx {}, predictor hidden units {}",
        cfg.n_embd,
        cfg.n_ff,
        cfg.n_layer,
        cfg.n_head,
        cfg.n_head_kv,
        cfg.n_vocab,
        cfg.n_ctx,
        2 * cfg.rank
    );
    println!(
        "  {:.1} MiB, {} tensors; FFN {:.1} MiB ({:.1}% of weights), predictors {:.1} MiB",
        mib(report.bytes),
        report.n_tensors,
        mib(report.ffn_bytes),
        100.0 * report.ffn_bytes as f64 / report.weight_bytes as f64,
        mib(report.predictor_bytes)
    );
    if cfg.dense_silu {
        println!("  dense SwiGLU FFN (silu, no predictor)");
        return Ok(());
    }
    print!(
        "  target density {mean_density:.3} per layer (sparsity {}), top 10% of neurons make \
         {:.0}% of firings",
        cfg.sparsity,
        100.0 * mean_top,
    );
    match cfg.llama_cpp_layout() {
        true => println!(", llama.cpp layout (row-major ffn_down, no predictor)"),
        false => println!(", predictor threshold {}", report.threshold),
    }
    Ok(())
}
