//! Perplexity as llama.cpp's `llama-perplexity` computes it: the text cut into chunks of the
//! context size, each evaluated from an empty cache (its first token replaced by BOS when the
//! tokenizer adds one), and the second half of each chunk scored.

use super::session::{Logits, Session};
use crate::{Error, Result};

/// The running result after each chunk.
#[derive(Clone, Copy, Debug)]
pub struct ChunkScore {
    /// Chunks scored so far.
    pub chunks: usize,
    /// Perplexity over all tokens scored so far.
    pub perplexity: f64,
}

/// Scores `tokens` in at most `max_chunks` chunks of the session's context size; `bos` replaces
/// each chunk's first token when given. Calls `on_chunk` after every chunk and returns the final
/// perplexity.
pub fn perplexity(
    session: &mut Session,
    tokens: &[u32],
    bos: Option<u32>,
    max_chunks: usize,
    mut on_chunk: impl FnMut(ChunkScore),
) -> Result<f64> {
    let n_ctx = session.n_ctx();
    if n_ctx < 8 {
        return Err(Error::InvalidArgument(
            "perplexity needs a context of at least 8".into(),
        ));
    }
    let n_chunks = (tokens.len() / n_ctx).min(max_chunks);
    if n_chunks == 0 {
        return Err(Error::InvalidArgument(format!(
            "the text has {} tokens, fewer than one chunk of {n_ctx} (use a smaller -c)",
            tokens.len()
        )));
    }
    let first = n_ctx / 2;
    let (mut nll, mut count) = (0f64, 0usize);
    for chunk in 0..n_chunks {
        let mut batch = tokens[chunk * n_ctx..(chunk + 1) * n_ctx].to_vec();
        if let Some(bos) = bos {
            batch[0] = bos;
        }
        session.truncate(0);
        let logits = session.eval(&batch, Logits::All)?;
        let n_vocab = logits.len() / n_ctx;
        for pos in first..n_ctx - 1 {
            let row = &logits[pos * n_vocab..(pos + 1) * n_vocab];
            nll -= log_softmax_at(row, batch[pos + 1] as usize);
            count += 1;
        }
        on_chunk(ChunkScore {
            chunks: chunk + 1,
            perplexity: (nll / count as f64).exp(),
        });
    }
    Ok((nll / count as f64).exp())
}

fn log_softmax_at(logits: &[f32], index: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    logits[index] as f64 - max - sum.ln()
}
