//! The forward pass over a model on the CPU: embeddings, a loop over blocks of named steps, the
//! LM head; the KV cache; sessions, and batches of sequences decoded together.

mod attention;
mod awake;
mod batch;
mod ffn;
mod generate;
#[cfg(all(feature = "gpu", not(target_arch = "wasm32")))]
mod gpu_ffn;
mod kv_cache;
mod linear;
mod norm;
mod offload;
mod parallel;
mod perplexity;
mod positions;
mod session;
mod teal;

pub use batch::{Batch, SeqId, Work};
pub use ffn::{FfnDensity, FfnMode, FfnObserver, FfnTrace};
pub use generate::{generate, GenerateOptions, GenerationStats, Generator, Step, StopReason};
#[cfg(all(feature = "gpu", not(target_arch = "wasm32")))]
pub use gpu_ffn::{layer_fits_kernels, GpuFfn};
pub use kv_cache::KvCache;
pub use linear::{DenseLinear, Linear, Proj};
pub use offload::{
    ffn_bytes, hot_from_index, hot_neurons, neuron_bytes, CpuFfn, FfnOffload, FfnTensor,
};
pub use perplexity::{perplexity, ChunkScore};
pub use positions::OPT_POSITION_OFFSET;
#[cfg(feature = "gpu")]
pub(crate) use session::{check_tokens, embed_tokens};
pub use session::{default_ffn_mode, Logits, Session};
pub use teal::{
    block_errors, measured_allocation, repack_type, Allocation, ChannelRule, LayerAllocation,
    MagnitudeHistogram, Teal, TealCalibration, TealCriterion, TealOptions, TealRecorder, TealStats,
    TEAL_CRITERION_KEY, TEAL_NEEDS_THRESHOLDS, TEAL_SPARSITY_KEY, TEAL_TARGET_KEY,
    TEAL_THRESHOLDS_KEY,
};

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
