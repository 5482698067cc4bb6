//! The forward pass over a model on the CPU: embeddings, a loop over blocks of named steps, the
//! LM head; the KV cache; sessions.

mod attention;
mod ffn;
mod generate;
mod kv_cache;
mod norm;
mod parallel;
mod perplexity;
mod positions;
mod session;

pub use ffn::{FfnDensity, FfnMode, FfnObserver, FfnTrace};
pub use generate::{generate, GenerateOptions, GenerationStats, StopReason};
pub use kv_cache::KvCache;
pub use perplexity::{perplexity, ChunkScore};
pub use positions::OPT_POSITION_OFFSET;
pub use session::{Logits, Session};

use std::sync::Arc;

/// A pool of exactly `n_threads` worker threads (0 = one per core) for a session's kernels.
pub fn thread_pool(n_threads: usize) -> crate::Result<Arc<rayon::ThreadPool>> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n_threads)
        .thread_name(|i| format!("hotcold-{i}"))
        .build()
        .map(Arc::new)
        .map_err(|e| {
            crate::Error::InvalidArgument(format!("cannot start {n_threads} threads: {e}"))
        })
}
