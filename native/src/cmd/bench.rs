//! `hotcold bench`: prompt processing and decode speed, like `llama-bench` (pp and tg tests).

use std::time::Instant;

use hotcold_core::engine::{Logits, Session};
use hotcold_core::models::DefaultModel;

use super::common::ModelArgs;

/// Arguments of `hotcold bench`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt tokens of the pp test.
    #[arg(short = 'p', long = "n-prompt", default_value_t = 64)]
    n_prompt: usize,
    /// Generated tokens of the tg test.
    #[arg(short = 'n', long = "n-gen", default_value_t = 64)]
    n_gen: usize,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
    repetitions: usize,
}

/// Runs `hotcold bench`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let loaded = args.model.load(DefaultModel::Gemma3_270m)?;
    let model = &loaded.model;
    anyhow::ensure!(args.repetitions > 0, "-r must be at least 1");
    let n_ctx = (args.n_prompt + args.n_gen + 1).max(loaded.n_ctx.min(args.n_prompt + args.n_gen + 1));
    // Deterministic pseudo-random tokens, as llama-bench uses random tokens.
    let tokens: Vec<u32> = (0..args.n_prompt.max(args.n_gen))
        .map(|i| ((i as u64 * 2_654_435_761) % model.hp.n_vocab as u64) as u32)
        .collect();
    let mut session = Session::new(model, n_ctx, loaded.pool.clone());
    session.eval(&tokens[..1], Logits::Last)?; // warm-up: page in the weights
    let threads = loaded.pool.current_num_threads();
    println!("| model | size | threads | simd | test | t/s |");
    println!("| --- | ---: | ---: | --- | --- | ---: |");
    let name = model.file().get_str("general.name")?.unwrap_or("?").to_string();
    let size = format!("{:.2} MiB", model.file().file_size() as f64 / (1 << 20) as f64);
    let report = |test: String, rates: &[f64]| {
        let mean = rates.iter().sum::<f64>() / rates.len() as f64;
        let sd = (rates.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / rates.len() as f64).sqrt();
        println!(
            "| {name} | {size} | {threads} | {} | {test} | {mean:.2} ± {sd:.2} |",
            hotcold_core::cpu::simd_level()
        );
    };
    if args.n_prompt > 0 {
        let rates: Vec<f64> = (0..args.repetitions)
            .map(|_| {
                session.truncate(0);
                let start = Instant::now();
                session.eval(&tokens[..args.n_prompt], Logits::Last)?;
                Ok(args.n_prompt as f64 / start.elapsed().as_secs_f64())
            })
            .collect::<anyhow::Result<_>>()?;
        report(format!("pp{}", args.n_prompt), &rates);
    }
    if args.n_gen > 0 {
        let rates: Vec<f64> = (0..args.repetitions)
            .map(|_| {
                session.truncate(0);
                let start = Instant::now();
                for &t in &tokens[..args.n_gen] {
                    session.eval(&[t], Logits::Last)?;
                }
                Ok(args.n_gen as f64 / start.elapsed().as_secs_f64())
            })
            .collect::<anyhow::Result<_>>()?;
        report(format!("tg{}", args.n_gen), &rates);
    }
    let bytes = model.bytes_per_token();
    println!(
        "\nweights read per decoded token: {:.1} MiB",
        bytes as f64 / (1 << 20) as f64
    );
    Ok(())
}
