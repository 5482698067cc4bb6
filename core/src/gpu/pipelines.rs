//! Compute pipelines, one per (kernel family, entry point, override constants), created on first
//! use and cached, with one group-0 layout per family (its storage buffers) and one group-1 layout
//! shared by all (the parameters, a uniform with a dynamic offset: see `recorder`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::context::GpuContext;
use super::shaders::Shader;

/// How a kernel declares one storage binding.
#[derive(Clone, Copy)]
enum Binding {
    /// `var<storage, read>`.
    Read,
    /// `var<storage, read_write>`.
    ReadWrite,
}

/// The bindings of a family's group 0, in binding order (every entry point shares them); group 1
/// is always the parameters' uniform.
fn bindings(shader: Shader) -> &'static [Binding] {
    use Binding::*;
    match shader {
        Shader::Matvec => &[Read, Read, Read, Read, Read, Read, ReadWrite],
        Shader::SparseAxpy => &[Read, Read, Read, ReadWrite],
        Shader::Norm => &[ReadWrite, Read],
        Shader::Rope | Shader::Softmax => &[ReadWrite],
        Shader::Attention => &[Read, Read, Read, ReadWrite, ReadWrite],
        Shader::Elementwise => &[ReadWrite, Read, Read],
        Shader::Quantize => &[Read, ReadWrite, ReadWrite, ReadWrite, ReadWrite],
        Shader::Kv => &[Read, ReadWrite],
    }
}

/// A pipeline, its family and the layout of its group 0.
pub(crate) struct Pipeline {
    pub(crate) pipeline: wgpu::ComputePipeline,
    pub(crate) shader: Shader,
    layout: wgpu::BindGroupLayout,
}

type Key = (Shader, &'static str, Vec<(&'static str, u64)>);

/// The pipeline cache of a [`GpuContext`].
#[derive(Default)]
pub(crate) struct Pipelines {
    cache: Mutex<HashMap<Key, Arc<Pipeline>>>,
    modules: Mutex<HashMap<Shader, (wgpu::ShaderModule, wgpu::BindGroupLayout)>>,
    params: std::sync::OnceLock<wgpu::BindGroupLayout>,
}

/// Invocations per workgroup of every kernel (a power of two, at most 256).
pub(crate) const WG: u32 = 64;

impl GpuContext {
    /// The pipeline of `entry` in `shader` with `constants` (`WG` is [`WG`] unless they set it).
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
        let (module, layout) = {
            let mut modules = self
                .pipelines
                .modules
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            modules
                .entry(shader)
                .or_insert_with(|| (self.module(shader), self.storage_layout(shader)))
                .clone()
        };
        let pipeline_layout = self
            .device
            .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(shader.file()),
                bind_group_layouts: &[Some(&layout), Some(self.params_layout())],
                immediate_size: 0,
            });
        let mut all: Vec<(&str, f64)> = constants.to_vec();
        if !all.iter().any(|&(k, _)| k == "WG") {
            all.push(("WG", f64::from(WG)));
        }
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
        let p = Arc::new(Pipeline {
            pipeline,
            shader,
            layout,
        });
        cache.insert(key, p.clone());
        p
    }

    /// The shader module of `shader`.
    fn module(&self, shader: Shader) -> wgpu::ShaderModule {
        self.device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(shader.file()),
                source: wgpu::ShaderSource::Wgsl(shader.source().into()),
            })
    }

    /// The layout of `shader`'s group 0: its storage buffers.
    fn storage_layout(&self, shader: Shader) -> wgpu::BindGroupLayout {
        let entries: Vec<wgpu::BindGroupLayoutEntry> = bindings(shader)
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupLayoutEntry {
                binding: i as u32,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage {
                        read_only: matches!(b, Binding::Read),
                    },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            })
            .collect();
        self.device
            .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some(shader.file()),
                entries: &entries,
            })
    }

    /// The layout of every kernel's group 1: its parameters, a uniform at a dynamic offset.
    pub(crate) fn params_layout(&self) -> &wgpu::BindGroupLayout {
        self.pipelines.params.get_or_init(|| {
            self.device
                .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                    label: Some("params"),
                    entries: &[wgpu::BindGroupLayoutEntry {
                        binding: 0,
                        visibility: wgpu::ShaderStages::COMPUTE,
                        ty: wgpu::BindingType::Buffer {
                            ty: wgpu::BufferBindingType::Uniform,
                            has_dynamic_offset: true,
                            min_binding_size: None,
                        },
                        count: None,
                    }],
                })
        })
    }

    /// A group-0 bind group of `pipeline` with `buffers` bound to bindings 0, 1, ….
    pub(crate) fn bind_group(
        &self,
        pipeline: &Pipeline,
        buffers: &[&wgpu::Buffer],
    ) -> wgpu::BindGroup {
        let entries: Vec<wgpu::BindGroupEntry> = buffers
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: b.as_entire_binding(),
            })
            .collect();
        self.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.layout,
            entries: &entries,
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::recorder::PARAM_BYTES;

    /// Each kernel declares its storage buffers in group 0 as `bindings` lists them (same order
    /// and access) and its parameters as the uniform at group 1, binding 0, no larger than a
    /// ring slot: what the pipeline layouts and the recorder assume.
    #[test]
    fn shaders_declare_the_bindings_the_layouts_assume() {
        for shader in Shader::ALL {
            let module = naga::front::wgsl::parse_str(&shader.source()).unwrap();
            let layouter = {
                let mut l = naga::proc::Layouter::default();
                l.update(module.to_ctx()).unwrap();
                l
            };
            let (mut storage, mut uniforms) = (Vec::new(), Vec::new());
            for (_, var) in module.global_variables.iter() {
                let Some(rb) = &var.binding else { continue };
                match var.space {
                    naga::AddressSpace::Storage { access } => storage.push((
                        rb.group,
                        rb.binding,
                        access.contains(naga::StorageAccess::STORE),
                    )),
                    naga::AddressSpace::Uniform => {
                        uniforms.push((rb.group, rb.binding, layouter[var.ty].size))
                    }
                    _ => {}
                }
            }
            storage.sort();
            let want: Vec<(u32, u32, bool)> = bindings(shader)
                .iter()
                .enumerate()
                .map(|(i, b)| (0, i as u32, matches!(b, Binding::ReadWrite)))
                .collect();
            assert_eq!(storage, want, "{}", shader.file());
            assert_eq!(uniforms.len(), 1, "{}", shader.file());
            let (group, binding, size) = uniforms[0];
            assert_eq!((group, binding), (1, 0), "{}", shader.file());
            assert!(u64::from(size) <= PARAM_BYTES, "{}", shader.file());
        }
    }
}
