//! Compute pipelines, one per (kernel family, entry point, override constants), created on first
//! use and cached; and the dispatch helper that binds buffers in declaration order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::context::GpuContext;
use super::shaders::Shader;

/// How a kernel declares one binding.
#[derive(Clone, Copy)]
enum Binding {
    /// `var<storage, read>`.
    Read,
    /// `var<storage, read_write>`.
    ReadWrite,
    /// `var<uniform>`.
    Uniform,
}

/// The bindings of a family's group 0, in binding order (every entry point shares them).
fn bindings(shader: Shader) -> &'static [Binding] {
    use Binding::*;
    match shader {
        Shader::Matvec => &[Read, Read, Read, Read, Read, Read, ReadWrite, Uniform],
        Shader::SparseAxpy => &[Read, Read, Read, ReadWrite, Uniform],
        Shader::Norm => &[ReadWrite, Read, Uniform],
        Shader::Rope | Shader::Softmax => &[ReadWrite, Uniform],
        Shader::Attention => &[Read, Read, Read, ReadWrite, ReadWrite, Uniform],
        Shader::Elementwise => &[ReadWrite, Read, Read, Uniform],
        Shader::Quantize => &[Read, ReadWrite, ReadWrite, ReadWrite, ReadWrite, Uniform],
        Shader::Kv => &[Read, ReadWrite, Uniform],
    }
}

/// A pipeline and the layout of its bind group.
pub(crate) struct Pipeline {
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
}

type Key = (Shader, &'static str, Vec<(&'static str, u64)>);

/// The pipeline cache of a [`GpuContext`].
#[derive(Default)]
pub(crate) struct Pipelines {
    cache: Mutex<HashMap<Key, Arc<Pipeline>>>,
    modules: Mutex<HashMap<Shader, wgpu::ShaderModule>>,
}

/// Invocations per workgroup of every kernel (a power of two, at most 256).
pub(crate) const WG: u32 = 64;

impl GpuContext {
    /// The pipeline of `entry` in `shader` with `constants` (`WG` is always set).
    pub(crate) fn pipeline(
        &self,
        shader: Shader,
        entry: &'static str,
        constants: &[(&'static str, f64)],
    ) -> Arc<Pipeline> {
        let key: Key = (
            shader,
            entry,
            constants.iter().map(|&(k, v)| (k, v.to_bits())).collect(),
        );
        let mut cache = self
            .pipelines
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(p) = cache.get(&key) {
            return p.clone();
        }
        let module = {
            let mut modules = self
                .pipelines
                .modules
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            modules
                .entry(shader)
                .or_insert_with(|| {
                    self.device
                        .create_shader_module(wgpu::ShaderModuleDescriptor {
                            label: Some(shader.file()),
                            source: wgpu::ShaderSource::Wgsl(shader.source().into()),
                        })
                })
                .clone()
        };
        let entries: Vec<wgpu::BindGroupLayoutEntry> = bindings(shader)
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupLayoutEntry {
                binding: i as u32,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: match b {
                    Binding::Uniform => wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    Binding::Read | Binding::ReadWrite => wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Storage {
                            read_only: matches!(b, Binding::Read),
                        },
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                },
                count: None,
            })
            .collect();
        let layout = self
            .device
            .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some(shader.file()),
                entries: &entries,
            });
        let pipeline_layout = self
            .device
            .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(shader.file()),
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
        let mut all: Vec<(&str, f64)> = constants.to_vec();
        all.push(("WG", f64::from(WG)));
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(entry),
                layout: Some(&pipeline_layout),
                module: &module,
                entry_point: Some(entry),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &all,
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            });
        let p = Arc::new(Pipeline { pipeline, layout });
        cache.insert(key, p.clone());
        p
    }

    /// Records one dispatch of `pipeline` over `groups` workgroups with `buffers` bound to
    /// bindings 0, 1, … of group 0.
    pub(crate) fn dispatch(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        pipeline: &Pipeline,
        buffers: &[&wgpu::Buffer],
        groups: [u32; 3],
    ) {
        let entries: Vec<wgpu::BindGroupEntry> = buffers
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: b.as_entire_binding(),
            })
            .collect();
        let group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.layout,
            entries: &entries,
        });
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: None,
            timestamp_writes: None,
        });
        pass.set_pipeline(&pipeline.pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
    }
}

/// Workgroups along x and y covering `count` workgroups (x at most 32768 per row).
pub(crate) fn grid(count: u32) -> [u32; 2] {
    const MAX_X: u32 = 32768;
    if count <= MAX_X {
        [count.max(1), 1]
    } else {
        [MAX_X, count.div_ceil(MAX_X)]
    }
}
