//! `hotcold bench`: prompt processing and decode speed, like `llama-bench` (pp and tg tests).

use std::time::Instant;

use hotcold_core::engine::Logits;
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
    /// Tokens already in the context (KV cache) when each test starts, as llama-bench's `-d`:
    /// decode and prompt speed at depth, where attention over the cache costs more.
    #[arg(short = 'd', long = "n-depth", default_value_t = 0)]
    n_depth: usize,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
    repetitions: usize,
}

/// Runs `hotcold bench`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let loaded = args.model.load(DefaultModel::Gemma3_270m)?;
    let model = &loaded.model;
    anyhow::ensure!(args.repetitions > 0, "-r must be at least 1");
    let depth = args.n_depth;
    // each test starts from the same depth, so the longest one sets the positions used
    let longest = args.n_prompt.max(args.n_gen);
    anyhow::ensure!(longest > 0, "-p and -n are both 0: there is no test to run");
    anyhow::ensure!(
        depth + longest <= model.hp.n_ctx_train.max(longest),
        "-d {depth} plus the test's {longest} tokens exceed the model's context of {} tokens",
        model.hp.n_ctx_train
    );
    let n_ctx = depth + longest + 1;
    // Deterministic pseudo-random tokens, as llama-bench uses random tokens.
    let tokens: Vec<u32> = (0..depth + longest)
        .map(|i| ((i as u64 * 2_654_435_761) % model.hp.n_vocab as u64) as u32)
        .collect();
    let (context, tokens) = tokens.split_at(depth);
    let mut session = loaded.session_with_ctx(n_ctx)?;
    session.eval(&tokens[..1], Logits::Last)?; // warm-up: page in the weights
    let threads = loaded.pool.current_num_threads();
    println!("| model | size | threads | simd | test | t/s |");
    println!("| --- | ---: | ---: | --- | --- | ---: |");
    let name = model
        .file()
        .get_str("general.name")?
        .unwrap_or("?")
        .to_string();
    let size = format!(
        "{:.2} MiB",
        model.file().file_size() as f64 / (1 << 20) as f64
    );
    // llama-bench's label of a test at depth
    let at_depth = |test: String| match depth {
        0 => test,
        d => format!("{test} @ d{d}"),
    };
    // the context of every repetition: the cache emptied, then `depth` tokens (not timed)
    let start_at_depth = |session: &mut hotcold_core::engine::Session| {
        session.truncate(0);
        if !context.is_empty() {
            session.eval(context, Logits::Last)?;
        }
        anyhow::Ok(())
    };
    let report = |test: String, rates: &[f64]| {
        let mean = rates.iter().sum::<f64>() / rates.len() as f64;
        let sd =
            (rates.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / rates.len() as f64).sqrt();
        println!(
            "| {name} | {size} | {threads} | {} | {test} | {mean:.2} ± {sd:.2} |",
            hotcold_core::cpu::simd_level()
        );
    };
    if args.n_prompt > 0 {
        let rates: Vec<f64> = (0..args.repetitions)
            .map(|_| {
                start_at_depth(&mut session)?;
                let start = Instant::now();
                session.eval(&tokens[..args.n_prompt], Logits::Last)?;
                Ok(args.n_prompt as f64 / start.elapsed().as_secs_f64())
            })
            .collect::<anyhow::Result<_>>()?;
        report(at_depth(format!("pp{}", args.n_prompt)), &rates);
    }
    let mut tg_mean = None;
    if args.n_gen > 0 {
        let rates: Vec<f64> = (0..args.repetitions)
            .map(|_| {
                start_at_depth(&mut session)?;
                let start = Instant::now();
                for &t in &tokens[..args.n_gen] {
                    session.eval(&[t], Logits::Last)?;
                }
                Ok(args.n_gen as f64 / start.elapsed().as_secs_f64())
            })
            .collect::<anyhow::Result<_>>()?;
        report(at_depth(format!("tg{}", args.n_gen)), &rates);
        let tg = rates.iter().sum::<f64>() / rates.len() as f64;
        tg_mean = Some(tg);
        let head = loaded.pool.install(|| lm_head_secs(model, args.n_gen))?;
        println!(
            "decode {:.3} ms/token: LM head {:.3} ms, layers alone {:.3} ms/token",
            1e3 / tg,
            1e3 * head,
            1e3 * (1.0 / tg - head)
        );
    }
    eprintln!("{}", super::common::sparsity_summary(&loaded, &session));
    // what the FFN mode really reads at the density measured above (predictor and chosen neurons)
    let bytes = session
        .ffn_density()
        .weight_bytes_per_token(model, session.ffn_mode());
    let bandwidth = loaded.pool.install(|| read_bandwidth(model));
    let roofline = bandwidth / bytes as f64;
    println!(
        "\nweights read per decoded token (ffn {:?}): {:.1} MiB; memory read bandwidth ({threads} threads, streaming the weights): {:.2} GB/s; decode roofline {:.1} tok/s",
        session.ffn_mode(),
        bytes as f64 / (1 << 20) as f64,
        bandwidth / 1e9,
        roofline
    );
    println!(
        "layer weights read per decoded token (dense): {:.2} MiB",
        (bytes - model.output.n_bytes()) as f64 / (1 << 20) as f64
    );
    if let Some(tg) = tg_mean {
        println!(
            "tg{} = {:.1}% of the roofline",
            args.n_gen,
            100.0 * tg / roofline
        );
    }
    Ok(())
}

/// Seconds of one decode step's final norm and LM head (mean of `reps`): subtracted from the
/// decode time, it leaves the time of the layers alone.
fn lm_head_secs(model: &hotcold_core::model::Model, reps: usize) -> anyhow::Result<f64> {
    let hp = &model.hp;
    let x: Vec<f32> = (0..hp.n_embd)
        .map(|i| ((i % 7) as f32 - 3.0) * 0.1)
        .collect();
    model.matmul(&model.output, &x, 1)?; // warm-up (and the interleaved copy, where made)
    let start = Instant::now();
    for _ in 0..reps.max(1) {
        let mut h = x.clone();
        hotcold_core::cpu::ops::rms_norm(&mut h, &vec![1.0; hp.n_embd], hp.rms_eps);
        model.matmul(&model.output, &h, 1)?;
    }
    Ok(start.elapsed().as_secs_f64() / reps.max(1) as f64)
}

/// Bytes per second at which the pool's threads can read the model's weights (best of three
/// passes over every tensor).
fn read_bandwidth(model: &hotcold_core::model::Model) -> f64 {
    use rayon::prelude::*;
    let file = model.file();
    let tensors: Vec<&[u8]> = file.tensors().iter().map(|t| file.tensor_data(t)).collect();
    let total: usize = tensors.iter().map(|t| t.len()).sum();
    let mut best = f64::MAX;
    for _ in 0..3 {
        let start = Instant::now();
        let sum: u64 = tensors
            .par_iter()
            .flat_map(|t| t.par_chunks(1 << 16))
            .map(|chunk| {
                let mut acc = [0u64; 8];
                for block in chunk.chunks_exact(64) {
                    for (a, word) in acc.iter_mut().zip(block.chunks_exact(8)) {
                        *a = a.wrapping_add(u64::from_le_bytes(word.try_into().unwrap()));
                    }
                }
                acc.iter().fold(0u64, |x, &y| x.wrapping_add(y))
            })
            .reduce(|| 0, u64::wrapping_add);
        std::hint::black_box(sum);
        best = best.min(start.elapsed().as_secs_f64());
    }
    total as f64 / best
}
