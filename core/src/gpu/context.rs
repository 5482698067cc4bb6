//! The wgpu device: adapter choice, limits, buffer helpers and blocking read-back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use wgpu::util::DeviceExt;

use super::workspace::Workspace;

use crate::{Error, Result};

/// Which adapters a context may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdapterChoice {
    /// Only a hardware GPU (integrated, discrete or virtual); software rasterisers are refused.
    Hardware,
    /// Any adapter, software ones (Mesa's lavapipe) included: what `--device gpu` and tests use.
    Any,
}

/// The largest storage binding this backend uses, whatever the device allows (wgpu's default
/// limit, and lavapipe's): bigger weights are bound in chunks.
pub const MAX_BINDING_BYTES: u64 = 128 << 20;

/// A wgpu device and queue with what the kernels need to know about them.
pub struct GpuContext {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    max_binding: u64,
    pub(crate) pipelines: super::pipelines::Pipelines,
    pub(crate) gelu: std::sync::OnceLock<wgpu::Buffer>,
    empty: std::sync::OnceLock<wgpu::Buffer>,
    created: Counters,
}

/// wgpu objects created through a context since it was opened (pipelines and layouts aside:
/// those are made once per kernel variant).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ObjectCounts {
    /// Buffers (weights, working vectors, parameter rings, read-back staging).
    pub buffers: u64,
    /// Bind groups.
    pub bind_groups: u64,
    /// Command encoders.
    pub encoders: u64,
}

impl ObjectCounts {
    /// The objects created between the counts `before` and `self`.
    pub fn since(self, before: ObjectCounts) -> ObjectCounts {
        ObjectCounts {
            buffers: self.buffers - before.buffers,
            bind_groups: self.bind_groups - before.bind_groups,
            encoders: self.encoders - before.encoders,
        }
    }
}

#[derive(Default)]
struct Counters {
    buffers: AtomicU64,
    bind_groups: AtomicU64,
    encoders: AtomicU64,
    dispatches: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl std::fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuContext")
            .field("adapter", &self.info.name)
            .field("max_binding", &self.max_binding)
            .finish()
    }
}

/// Ranks adapter types, best first (`None`: not allowed by `choice`).
fn rank(ty: wgpu::DeviceType, choice: AdapterChoice) -> Option<u8> {
    use wgpu::DeviceType::*;
    Some(match ty {
        DiscreteGpu => 0,
        IntegratedGpu => 1,
        VirtualGpu => 2,
        Other => 3,
        Cpu if choice == AdapterChoice::Any => 4,
        Cpu => return None,
    })
}

impl GpuContext {
    /// Opens the best adapter `choice` allows (discrete before integrated before software),
    /// blocking until it is ready (native only; the browser awaits [`GpuContext::request`]).
    ///
    /// Errors: [`Error::Gpu`] when no adapter qualifies or the device cannot be created.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new(choice: AdapterChoice) -> Result<Arc<GpuContext>> {
        pollster::block_on(GpuContext::request(choice))
    }

    /// Opens the best adapter `choice` allows: natively discrete before integrated before
    /// software; in the browser, the adapter WebGPU offers.
    ///
    /// Errors: [`Error::Gpu`] when no adapter qualifies or the device cannot be created.
    // WebGPU's objects are neither Send nor Sync (a page runs them on one thread).
    #[cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]
    pub async fn request(choice: AdapterChoice) -> Result<Arc<GpuContext>> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
        let none = || {
            Error::Gpu(match choice {
                AdapterChoice::Hardware => "no hardware GPU adapter found".into(),
                AdapterChoice::Any => "no GPU adapter found (for a software one install Mesa's lavapipe: apt-get install mesa-vulkan-drivers libvulkan1)".into(),
            })
        };
        #[cfg(not(target_arch = "wasm32"))]
        let adapter = instance
            .enumerate_adapters(wgpu::Backends::all())
            .await
            .into_iter()
            .filter_map(|a| rank(a.get_info().device_type, choice).map(|r| (r, a)))
            .min_by_key(|(r, _)| *r)
            .map(|(_, a)| a)
            .ok_or_else(none)?;
        #[cfg(target_arch = "wasm32")]
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions::default())
            .await
            .ok()
            .filter(|a| rank(a.get_info().device_type, choice).is_some())
            .ok_or_else(none)?;
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
            .map_err(|e| Error::Gpu(format!("cannot open {}: {e}", info.name)))?;
        let max_binding = MAX_BINDING_BYTES
            .min(limits.max_storage_buffer_binding_size)
            .min(limits.max_buffer_size);
        Ok(Arc::new(GpuContext {
            device,
            queue,
            info,
            max_binding,
            pipelines: Default::default(),
            gelu: Default::default(),
            empty: Default::default(),
            created: Counters::default(),
        }))
    }

    /// The adapter's name and backend, e.g. `llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan, Cpu)`.
    pub fn describe(&self) -> String {
        format!(
            "{} ({:?}, {:?})",
            self.info.name, self.info.backend, self.info.device_type
        )
    }

    /// Blocks until the submitted work is done and runs its callbacks, so that futures such as
    /// [`super::forward::PendingLogits`] complete (natively; a browser does this on its event
    /// loop).
    ///
    /// Errors: [`Error::Gpu`] when the device is lost.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn poll(&self) -> Result<()> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map(|_| ())
            .map_err(|e| Error::Gpu(format!("waiting for the GPU: {e}")))
    }

    /// Whether the adapter is a software rasteriser (its timings mean nothing).
    pub fn is_software(&self) -> bool {
        self.info.device_type == wgpu::DeviceType::Cpu
    }

    /// The largest storage binding used for one weight chunk.
    pub fn max_binding_bytes(&self) -> u64 {
        self.max_binding
    }

    /// The wgpu objects created through this context so far.
    pub fn objects_created(&self) -> ObjectCounts {
        let c = &self.created;
        ObjectCounts {
            buffers: c.buffers.load(Ordering::Relaxed),
            bind_groups: c.bind_groups.load(Ordering::Relaxed),
            encoders: c.encoders.load(Ordering::Relaxed),
        }
    }

    /// Kernel dispatches recorded through this context so far.
    pub fn dispatches_recorded(&self) -> u64 {
        self.created.dispatches.load(Ordering::Relaxed)
    }

    /// Counts one recorded dispatch.
    pub(crate) fn count_dispatch(&self) {
        bump(&self.created.dispatches);
    }

    /// Creates a buffer (counted).
    pub(crate) fn create_buffer(&self, desc: &wgpu::BufferDescriptor) -> wgpu::Buffer {
        bump(&self.created.buffers);
        self.device.create_buffer(desc)
    }

    /// Creates a bind group (counted).
    pub(crate) fn create_bind_group(&self, desc: &wgpu::BindGroupDescriptor) -> wgpu::BindGroup {
        bump(&self.created.bind_groups);
        self.device.create_bind_group(desc)
    }

    /// Lowers the chunk size (tests use it to exercise chunked weights on small tensors).
    pub fn set_max_binding_bytes(&mut self, bytes: u64) {
        self.max_binding = bytes.clamp(256, self.max_binding);
    }

    /// A read-only storage buffer holding `bytes` (padded to a whole number of u32, never empty).
    pub(crate) fn storage(&self, label: &str, bytes: &[u8]) -> wgpu::Buffer {
        let mut padded;
        let contents = if !bytes.len().is_multiple_of(4) || bytes.is_empty() {
            padded = bytes.to_vec();
            padded.resize(bytes.len().div_ceil(4).max(1) * 4, 0);
            &padded[..]
        } else {
            bytes
        };
        bump(&self.created.buffers);
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            })
    }

    /// A storage buffer of one zero word, for bindings a kernel variant does not read.
    pub(crate) fn empty_buffer(&self) -> &wgpu::Buffer {
        self.empty.get_or_init(|| self.storage("empty", &[]))
    }

    /// A zeroed read-write storage buffer of `n` f32 that can be copied out.
    pub(crate) fn output(&self, label: &str, n: usize) -> wgpu::Buffer {
        self.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: (n.max(1) * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// Submits `encoder` after copying the first `n` f32 of `src` to a new staging buffer; the
    /// returned [`Pending`] waits for the GPU and reads them.
    pub(crate) fn submit_read(
        &self,
        encoder: wgpu::CommandEncoder,
        src: &wgpu::Buffer,
        n: usize,
    ) -> Pending {
        Workspace::transient(self).submit_read(self, encoder, src, n)
    }

    /// A new command encoder.
    pub(crate) fn encoder(&self) -> wgpu::CommandEncoder {
        bump(&self.created.encoders);
        self.device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
    }
}

/// Submitted GPU work whose f32 result is read back by [`Pending::wait`].
#[must_use = "the result is only read by wait()"]
pub struct Pending {
    staging: wgpu::Buffer,
    index: wgpu::SubmissionIndex,
    n: usize,
}

impl Pending {
    /// The first `n` f32 of `staging`, once submission `index` is done.
    pub(crate) fn new(staging: wgpu::Buffer, index: wgpu::SubmissionIndex, n: usize) -> Pending {
        Pending { staging, index, n }
    }

    /// Blocks until the GPU has finished and returns the result.
    ///
    /// Errors: [`Error::Gpu`] when the device is lost or the buffer cannot be mapped, and always
    /// in the browser (which cannot block: the resident pass's read-back is a future there).
    pub fn wait(self, ctx: &GpuContext) -> Result<Vec<f32>> {
        if cfg!(target_arch = "wasm32") {
            return Err(Error::Gpu(
                "a blocking GPU read-back is not available in the browser".into(),
            ));
        }
        let slice = self.staging.slice(..);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        ctx.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(self.index),
                timeout: None,
            })
            .map_err(|e| Error::Gpu(format!("waiting for the GPU: {e}")))?;
        rx.recv()
            .map_err(|_| Error::Gpu("the read-back was dropped".into()))?
            .map_err(|e| Error::Gpu(format!("cannot map the read-back buffer: {e}")))?;
        let data = slice
            .get_mapped_range()
            .map_err(|e| Error::Gpu(format!("cannot read the read-back buffer: {e}")))?;
        let out = bytemuck::cast_slice::<u8, f32>(&data)[..self.n].to_vec();
        drop(data);
        self.staging.unmap();
        Ok(out)
    }
}
