//! hotcold-core: everything that decides *what* to compute, identical on native and in the browser.
//!
//! Modules (one job each, see `DESIGN.md` in the repository's shared design notes):
//! - [`gguf`]: read and write GGUF v2/v3 files (and PowerInfer's `PWRI` variant), validating every
//!   count, offset and size before use.
//! - [`quant`]: ggml block formats: layouts, dequantisation, quantisation.
//! - [`cpu`]: CPU kernels: quantised matrix products, norms, RoPE, softmax, activations.
//! - [`model`]: hyper-parameters per architecture and weights by role.
//! - [`engine`]: the forward pass, the KV cache, sessions.
//! - [`predictor`]: train and measure PowerInfer-shape activation predictors from calibration traces.
//! - [`sample`]: greedy and stochastic token sampling.
//! - [`tokenizer`]: tokenizers rebuilt from GGUF vocabularies; chat templates.
//! - [`placement`]: hot/cold neuron placement under a VRAM budget, its cost model, PowerInfer's
//!   GPU index files.
//! - [`models`]: locate the default models in the local cache.
//! - [`synth`]: synthetic ReLU models in PowerInfer's format with power-law activation sparsity.

pub mod cpu;
pub mod engine;
pub mod error;
pub mod gguf;
#[cfg(feature = "gpu")]
pub mod gpu;
pub mod model;
pub mod models;
pub mod placement;
pub mod predictor;
pub mod quant;
pub mod sample;
pub mod synth;
pub mod tokenizer;

pub use error::{Error, Result};
