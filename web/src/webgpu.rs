//! The browser's WebGPU device, opened through hotcold-core's GPU context (wgpu's WebGPU backend
//! on wasm32).
//!
//! Opening is asynchronous in a browser (`navigator.gpu.requestAdapter()` and
//! `adapter.requestDevice()` are promises), so [`open`] is an `async fn` that the bindings turn
//! into a JavaScript promise. The device gets the adapter's own limits and no optional feature:
//! the kernels need neither `shader-f16` nor subgroups.

use std::sync::Arc;

use hotcold_core::gpu::{AdapterChoice, GpuContext};
use serde::Serialize;

/// What the page shows about the WebGPU adapter in use.
#[derive(Clone, Debug, Serialize)]
pub struct AdapterReport {
    /// The adapter as wgpu describes it.
    pub name: String,
    /// Whether it is a software adapter (SwiftShader): its timings say nothing about a GPU.
    pub software: bool,
    /// The largest storage binding one weight chunk uses, in bytes.
    pub max_binding_bytes: u64,
}

/// Opens the browser's WebGPU adapter and a device on it.
///
/// Errors: a message when the browser has no WebGPU (`navigator.gpu` missing or no adapter) or
/// refuses the device.
pub async fn open() -> Result<(Arc<GpuContext>, AdapterReport), String> {
    let ctx = GpuContext::request(AdapterChoice::Any)
        .await
        .map_err(|e| format!("this browser offers no usable WebGPU adapter ({e})"))?;
    let report = AdapterReport {
        name: ctx.describe(),
        software: ctx.is_software(),
        max_binding_bytes: ctx.max_binding_bytes(),
    };
    Ok((ctx, report))
}
