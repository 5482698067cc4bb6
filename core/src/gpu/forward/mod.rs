//! The whole forward pass resident on the GPU: weights, KV cache and activations stay there; a
//! decode step uploads one embedding row, records every block and the LM head into one command
//! buffer, submits once and reads the logits back once, as a future ([`PendingLogits`]) that
//! native code waits on and the browser can `.await`.
//!
//! Precision mirrors the CPU pass: each product's input is quantised on the GPU as the CPU's
//! `matmul` quantises it (f16, Q8_0, Q8_K), the KV cache is f16, attention rounds as `attend`
//! does; only float summation order (and hence, rarely, a quant at a rounding tie) differs.
//!
//! A model can also be uploaded as a segment of consecutive blocks (no LM head) that runs on a
//! residual stream the CPU hands over and hands back (`GpuSession::run_segment`): the
//! llama.cpp-style layer offload of dense models under a VRAM budget.
//!
//! Runs RMSNorm models with gated FFNs (llama, bamboo/TurboSparse, Gemma 3, Qwen2) in `--ffn
//! dense` and `--ffn sparse`; [`check_supported`] names what it does not run.

mod acts;
mod model;
mod readback;
mod segment;
mod session;
mod step;

pub use model::{block_bytes, check_supported, resident_bytes, GpuModel};
pub use readback::PendingLogits;
pub use segment::segment_costs;
pub use session::{session_bytes, GpuSession, MAX_TOKENS_PER_SUBMIT};
