//! Hot/cold placement: which FFN neurons and which dense tensors live on the GPU under a VRAM
//! budget, and what decode speed that plan should give. No GPU code: the browser runs it too.
//!
//! # Inputs ([`Problem`])
//! - Per layer `l`: the bytes `c_l` of one neuron (its `ffn_gate` row, `ffn_up` row and
//!   `ffn_down` column: the layer's FFN bytes over its neuron count, so every neuron of a layer
//!   costs the same), the firing frequency `f_{l,i} ∈ [0, 1]` of each neuron (from `calibrate`,
//!   or the targets a synthetic file was built with, see [`stats`]), and the bytes `d_l` of the
//!   layer's dense tensors (attention, norms, predictor).
//! - Global dense tensors `g` (`token_embd`, `output`, `output_norm`, …): bytes `b_g` and bytes
//!   read per token `r_g` (all of it for a matrix the decode step multiplies by; one row for an
//!   embedding table that is only looked up).
//! - A VRAM budget `B` in bytes (for weights: keep the KV cache and scratch buffers out of it).
//!
//! # Objective and constraints ([`solve`])
//! Choose a set `H_l` of hot neurons per layer, a number `m` of layers whose dense tensors go on
//! the GPU (the last `m`, as llama.cpp's `--n-gpu-layers` does) and a subset `G` of the global
//! tensors, to
//!
//! ```text
//! maximise   Σ_l Σ_{i∈H_l} f_{l,i}·c_l  +  Σ_{l ≥ L−m} d_l  +  Σ_{g∈G} r_g
//! subject to Σ_l |H_l|·c_l  +  Σ_{l ≥ L−m} d_l  +  Σ_{g∈G} b_g  ≤  B
//! ```
//!
//! i.e. the expected bytes read per decoded token that the GPU serves. Under the linear part of
//! the [`cost`] model (reading a byte costs `1/C` seconds on the CPU and `1/G` on the GPU, with
//! `G > C`), the serial time of a token is `(total read)/C − served·(1/C − 1/G)`, so this is
//! exactly the plan with the least serial time; the device speeds scale it but do not change the
//! argmax. Bus transfers and the overlap of the two devices are left out of the objective (they
//! would make it non-linear) and counted by [`cost::predict`] instead. Restricting the dense
//! choice to the last `m` layers loses nothing when layers are alike (every `m` layers cost and
//! serve the same); otherwise it is part of the constraints. [`solve`] returns an optimal plan (a brute-force test over thousands of small
//! instances checks it):
//! - For a fixed number `k` of hot neurons among layers of equal neuron cost, the best set is the
//!   `k` most frequent (exchange argument), so each cost class's value is a concave prefix sum
//!   of its frequencies sorted in descending order.
//! - Every choice of `(m, G)` (`(L+1)·2^|globals|`, a few hundred) is tried; for each, the
//!   remaining budget is split over the cost classes by enumerating the counts of all classes
//!   but the last, which takes as many as fit (its prefix sum never decreases). Files of one
//!   weight type have one class (`O(1)` per choice); mixed-quant files usually two (`O(N)`).
//!   A file whose classes would need more than a few billion evaluations is refused with an
//!   error rather than planned inexactly.
//!
//! Among plans of equal value, the one with more dense and global bytes on the GPU wins, then the
//! one with more neurons of the first-enumerated class (so a budget that holds everything places
//! everything, zero-frequency neurons included); plans are deterministic.
//!
//! # Outputs ([`Plan`])
//! Per layer the sorted hot neuron ids, which layers' dense tensors and which global tensors are
//! on the GPU, the bytes used and the objective's value; [`Plan::layer_gpu_share`] gives the
//! expected share of a layer's activated neurons that the GPU serves. [`cost::predict`] turns a
//! plan into a predicted decode speed, and [`gpuidx`] reads and writes PowerInfer's
//! `<model>.generated.gpuidx` side file.
//!
//! Dense models (no neuron-major `ffn_down_t`, so no neuron split) are placed by [`segment`]
//! instead: whole layers, attention, FFN and KV cache, within the budget.

pub mod cost;
pub mod gpuidx;
pub mod known;
mod problem;
pub mod segment;
mod solve;
pub mod stats;

pub use problem::{frequency_sum, GlobalTensor, Layer, Problem, MAX_GLOBALS};
pub use solve::{solve, Plan};
pub use stats::FREQUENCY_KEY_PREFIX;

#[cfg(test)]
mod tests;
