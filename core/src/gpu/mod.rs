//! The wgpu backend: device, weight buffers, one pipeline per WGSL kernel of `shaders/`, and
//! dispatch helpers. The kernels hold no model logic: the engine decides what runs here
//! (`engine::gpu_ffn`); [`forward`] strings them into the whole forward pass, resident on the GPU.
//!
//! Kernels take f32 activations and quantise them on the CPU with the CPU kernels' own code, so the
//! GPU sees the same Q8 quants and scales as `cpu::matmul` and only float summation order differs.
//! Quantised blocks are read from `array<u32>` with shifts (WGSL has no u8); f16 is decoded and
//! rounded with integer arithmetic; no optional feature (shader-f16, subgroups) is needed.

mod context;
pub mod forward;
mod matrix_ops;
mod pipelines;
mod recorder;
mod shaders;
mod vector_ops;
mod weights;
mod workspace;

pub use context::{AdapterChoice, GpuContext, ObjectCounts, Pending, MAX_BINDING_BYTES};
pub use shaders::Shader;
pub use vector_ops::{AttentionShape, RopeSettings};
pub use weights::{GpuMatrix, AXPY_TYPES, MATVEC_TYPES};
#[cfg(not(target_arch = "wasm32"))]
pub(crate) use workspace::Workspace;
