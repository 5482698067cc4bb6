//! Buffers that one-shot products (the hybrid FFN's calls: upload activations, run, read back)
//! reuse from call to call. A reusing [`Workspace`] keeps each buffer it hands out, grows it only
//! when a call needs more, and records with a caching [`Binder`], so repeated calls of the same
//! shapes create no wgpu object but their command encoder; a transient one makes fresh buffers
//! per call (for the public one-off helpers).

use std::collections::HashMap;

use super::context::{GpuContext, Pending};
use super::recorder::Binder;

/// What a buffer is for.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Use {
    /// Bound to kernels, written by the queue, copied from.
    Storage,
    /// Mapped for a read-back.
    Staging,
}

/// Reused (or transient) buffers and the binder of a sequence of submissions.
pub(crate) struct Workspace {
    binder: Binder,
    /// Buffers kept by name and set (`None` in a transient workspace).
    kept: Option<HashMap<(&'static str, usize), wgpu::Buffer>>,
}

impl Workspace {
    /// A workspace that keeps its buffers and bind groups (only for one user at a time: a
    /// buffer handed out is handed out again by the next call). The hybrid FFN's (native only).
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    pub(crate) fn new(ctx: &GpuContext) -> Workspace {
        Workspace {
            binder: Binder::new(ctx, true),
            kept: Some(HashMap::new()),
        }
    }

    /// A workspace that makes fresh buffers and bind groups for each call.
    pub(crate) fn transient(ctx: &GpuContext) -> Workspace {
        Workspace {
            binder: Binder::new(ctx, false),
            kept: None,
        }
    }

    /// The binder to record with.
    pub(crate) fn binder(&mut self) -> &mut Binder {
        &mut self.binder
    }

    /// A buffer `(label, set)` of at least `bytes` (a multiple of 4) for `usage`: the kept one
    /// when it is large enough, else a new one (kept, rounded up to a power of two, and the bind
    /// groups of the old one forgotten).
    pub(crate) fn buffer(
        &mut self,
        ctx: &GpuContext,
        (label, set): (&'static str, usize),
        bytes: u64,
        usage: Use,
    ) -> wgpu::Buffer {
        let bytes = bytes.max(4);
        let Some(kept) = &mut self.kept else {
            return make(ctx, label, bytes, usage);
        };
        if let Some(b) = kept.get(&(label, set)).filter(|b| b.size() >= bytes) {
            return b.clone();
        }
        let b = make(ctx, label, bytes.next_power_of_two(), usage);
        if kept.insert((label, set), b.clone()).is_some() {
            self.binder.forget_groups();
        }
        b
    }

    /// A storage buffer `(label, set)` holding `data` (padded with zeros to whole words).
    pub(crate) fn upload(
        &mut self,
        ctx: &GpuContext,
        key: (&'static str, usize),
        data: &[u8],
    ) -> wgpu::Buffer {
        if self.kept.is_none() {
            return ctx.storage(key.0, data);
        }
        let words = data.len().div_ceil(4);
        let b = self.buffer(ctx, key, (words * 4) as u64, Use::Storage);
        if !data.len().is_multiple_of(4) {
            let mut padded = data.to_vec();
            padded.resize(words * 4, 0);
            ctx.queue.write_buffer(&b, 0, &padded);
        } else if !data.is_empty() {
            ctx.queue.write_buffer(&b, 0, data);
        }
        b
    }

    /// Submits `encoder` after copying the first `n` f32 of `src` to this workspace's read-back
    /// buffer; the returned [`Pending`] waits for the GPU and reads them.
    pub(crate) fn submit_read(
        &mut self,
        ctx: &GpuContext,
        mut encoder: wgpu::CommandEncoder,
        src: &wgpu::Buffer,
        n: usize,
    ) -> Pending {
        let size = (n.max(1) * 4) as u64;
        let staging = self.buffer(ctx, ("read-back", 0), size, Use::Staging);
        encoder.copy_buffer_to_buffer(src, 0, &staging, 0, size);
        let index = ctx.queue.submit([encoder.finish()]);
        Pending::new(staging, index, n)
    }
}

fn make(ctx: &GpuContext, label: &str, size: u64, usage: Use) -> wgpu::Buffer {
    let usage = match usage {
        Use::Storage => {
            wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST
        }
        Use::Staging => wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
    };
    ctx.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size,
        usage,
        mapped_at_creation: false,
    })
}
