//! `hotcold perplexity`: llama.cpp's perplexity method (score the second half of each chunk).

use anyhow::Context;
use hotcold_core::engine::perplexity;
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
    eprintln!(
        "perplexity: {} tokens, chunks of {}",
        tokens.len(),
        loaded.n_ctx
    );
    let bos = loaded
        .tokenizer
        .bos()
        .filter(|_| loaded.tokenizer.add_bos());
    let mut session = loaded.session()?;
    let ppl = perplexity(
        &mut session,
        &tokens,
        bos,
        args.chunks.unwrap_or(usize::MAX),
        |s| eprint!("[{}]{:.4},", s.chunks, s.perplexity),
    )?;
    eprintln!();
    eprintln!("{}", super::common::sparsity_summary(&loaded, &session));
    println!("PPL = {ppl:.4}");
    Ok(())
}
