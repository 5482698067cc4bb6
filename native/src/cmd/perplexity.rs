//! `hotcold perplexity`: llama.cpp's perplexity method (score the second half of each chunk).

use anyhow::Context;
use hotcold_core::engine::Logits;
use hotcold_core::models::DefaultModel;

use super::common::ModelArgs;

/// Arguments of `hotcold perplexity`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// The text to score.
    #[arg(short = 'f', long = "file")]
    file: std::path::PathBuf,
    /// Most chunks to score (default: all).
    #[arg(long = "chunks")]
    chunks: Option<usize>,
}

/// Runs `hotcold perplexity`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let mut model_args = args.model.clone();
    model_args.ctx_size = Some(model_args.ctx_size.unwrap_or(512));
    let loaded = model_args.load(DefaultModel::Gemma3_270m)?;
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let tokens = loaded.tokenizer.encode(&text, true, false)?;
    let n_ctx = loaded.n_ctx;
    anyhow::ensure!(n_ctx >= 8, "-c must be at least 8 for perplexity");
    let n_chunks = (tokens.len() / n_ctx).min(args.chunks.unwrap_or(usize::MAX));
    anyhow::ensure!(
        n_chunks > 0,
        "the text has {} tokens, fewer than one chunk of {n_ctx} (use a smaller -c)",
        tokens.len()
    );
    eprintln!(
        "perplexity: {} tokens, {n_chunks} chunks of {n_ctx}",
        tokens.len()
    );
    let n_vocab = loaded.model.hp.n_vocab;
    let first = n_ctx / 2;
    let (mut nll, mut count) = (0f64, 0usize);
    let mut session = loaded.session()?;
    for chunk in 0..n_chunks {
        let mut batch = tokens[chunk * n_ctx..(chunk + 1) * n_ctx].to_vec();
        if let (true, Some(bos)) = (loaded.tokenizer.add_bos(), loaded.tokenizer.bos()) {
            batch[0] = bos;
        }
        session.truncate(0);
        let logits = session.eval(&batch, Logits::All)?;
        for pos in first..n_ctx - 1 {
            let row = &logits[pos * n_vocab..(pos + 1) * n_vocab];
            nll -= log_softmax_at(row, batch[pos + 1] as usize);
            count += 1;
        }
        eprint!("[{}]{:.4},", chunk + 1, (nll / count as f64).exp());
    }
    eprintln!();
    println!("PPL = {:.4}", (nll / count as f64).exp());
    Ok(())
}

fn log_softmax_at(logits: &[f32], index: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    logits[index] as f64 - max - sum.ln()
}
