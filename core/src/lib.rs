//! hotcold-core: everything that decides *what* to compute, identical on native and in the browser.
//!
//! Modules (one job each, see `DESIGN.md` in the repository's shared design notes):
//! - [`gguf`]: read and write GGUF v2/v3 files (and PowerInfer's `PWRI` variant), validating every
//!   count, offset and size before use.
//! - [`quant`]: ggml block formats: layouts, dequantisation, quantisation.
//! - [`models`]: locate the default models in the local cache.

pub mod error;
pub mod gguf;
pub mod models;
pub mod quant;

pub use error::{Error, Result};
