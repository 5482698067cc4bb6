//! The browser's WebGPU device, opened through wgpu's WebGPU backend (wasm32 only).
//!
//! Opening is asynchronous in a browser (`navigator.gpu.requestAdapter()` and
//! `adapter.requestDevice()` are promises), so [`open`] is an `async fn` that the bindings turn
//! into a JavaScript promise. The device asks for the adapter's own limits (Chromium gives 1 GiB
//! storage bindings where wgpu's defaults stop at 128 MiB) and no optional feature: the kernels
//! need neither `shader-f16` nor subgroups, which SwiftShader and many devices lack.

use std::sync::Arc;

use hotcold_core::gpu::GpuContext;
use serde::Serialize;

/// What the page shows about the WebGPU adapter in use.
#[derive(Clone, Debug, Serialize)]
pub struct AdapterReport {
    /// Vendor, architecture and description, as far as the browser tells them.
    pub name: String,
    /// Whether it is a software adapter (SwiftShader): its timings say nothing about a GPU.
    pub software: bool,
    /// Largest storage buffer binding the device accepts, in bytes.
    pub max_storage_buffer_binding_size: u64,
    /// Largest buffer, in bytes.
    pub max_buffer_size: u64,
    /// Storage buffers one compute shader may bind.
    pub max_storage_buffers_per_shader_stage: u32,
    /// The adapter's optional features (wgpu's names).
    pub features: String,
}

/// Opens the browser's WebGPU adapter and a device on it, as hotcold-core's GPU context.
///
/// Errors: a message when the browser has no WebGPU (`navigator.gpu` missing or no adapter) or
/// refuses the device.
pub async fn open() -> Result<(Arc<GpuContext>, AdapterReport), String> {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::BROWSER_WEBGPU;
    let instance = wgpu::Instance::new(desc);
    let adapter = instance
        .request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("this browser offers no WebGPU adapter ({e})"))?;
    let info = adapter.get_info();
    let limits = adapter.limits();
    let (device, queue) = adapter
        .request_device(&wgpu::DeviceDescriptor {
            label: Some("hotcold"),
            required_features: wgpu::Features::empty(),
            required_limits: limits.clone(),
            ..Default::default()
        })
        .await
        .map_err(|e| format!("the WebGPU adapter refused a device: {e}"))?;
    let features = format!("{:?}", adapter.features());
    let name = [
        info.name.as_str(),
        info.driver.as_str(),
        info.driver_info.as_str(),
    ]
    .iter()
    .filter(|s| !s.is_empty())
    .copied()
    .collect::<Vec<_>>()
    .join(" ");
    let report = AdapterReport {
        name: if name.is_empty() {
            "unnamed adapter".into()
        } else {
            name
        },
        software: info.device_type == wgpu::DeviceType::Cpu
            || info.name.to_ascii_lowercase().contains("swiftshader"),
        max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size,
        max_buffer_size: limits.max_buffer_size,
        max_storage_buffers_per_shader_stage: limits.max_storage_buffers_per_shader_stage,
        features,
    };
    Ok((
        GpuContext::from_device(device, queue, info, &limits),
        report,
    ))
}
