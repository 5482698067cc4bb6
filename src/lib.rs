//! hotcold: LLM inference that splits every FFN layer by neuron between GPU (hot) and CPU (cold).
//!
//! This root crate re-exports [`hotcold_core`]; it exists so that the workspace's integration tests
//! (`tests/`) and benchmarks (`benches/`) drive the public API from outside the core crate.
pub use hotcold_core::*;
