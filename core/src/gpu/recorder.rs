//! Recording kernel dispatches without creating wgpu objects per dispatch.
//!
//! Every kernel binds its storage buffers as group 0 and its parameters as group 1, a uniform
//! bound with a dynamic offset. A [`Binder`] owns the parameter ring (one uniform buffer, a slot
//! per dispatch, written once per submission with one `write_buffer`) and, when it caches, the
//! group-0 bind groups by buffer set: they depend only on the buffers, never on the token, so a
//! session that reuses its buffers creates them during its first step only. A [`Recorder`] records
//! the dispatches of one submission into one command encoder, inside as few compute passes as the
//! copies between them allow.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::num::NonZeroU64;

use super::context::GpuContext;
use super::pipelines::Pipeline;
use super::shaders::Shader;
use crate::{Error, Result};

/// Bytes of one dispatch's parameters at most (the largest `Params` struct of the kernels).
pub(crate) const PARAM_BYTES: u64 = 32;

/// Slots of a new ring.
const INITIAL_SLOTS: usize = 64;

/// Group-0 bind groups of one hash bucket: the family, its buffers, the group.
type Bucket = Vec<(Shader, Vec<wgpu::Buffer>, wgpu::BindGroup)>;

/// The parameter ring and the bind-group cache of a sequence of submissions.
pub(crate) struct Binder {
    stride: u64,
    slots: usize,
    ring: wgpu::Buffer,
    ring_group: wgpu::BindGroup,
    /// Cached group-0 bind groups (`None`: create one per dispatch, for transient buffers).
    groups: Option<HashMap<u64, Bucket>>,
    /// The parameters of the submission being recorded (kept to reuse its allocation).
    params: Vec<u8>,
}

impl Binder {
    /// A binder whose bind groups are cached (`cache`) or made per dispatch: cache only when the
    /// buffers outlive many submissions (a cached group keeps its buffers alive).
    pub(crate) fn new(ctx: &GpuContext, cache: bool) -> Binder {
        let align = u64::from(ctx.device.limits().min_uniform_buffer_offset_alignment).max(1);
        let stride = PARAM_BYTES.div_ceil(align) * align;
        let (ring, ring_group) = ring(ctx, stride, INITIAL_SLOTS);
        Binder {
            stride,
            slots: INITIAL_SLOTS,
            ring,
            ring_group,
            groups: cache.then(HashMap::new),
            params: Vec::new(),
        }
    }

    /// Forgets the cached bind groups (and so releases their buffers): for a user that replaced
    /// buffers it had recorded with.
    pub(crate) fn forget_groups(&mut self) {
        if let Some(groups) = &mut self.groups {
            groups.clear();
        }
    }

    /// Replaces the ring by one of at least `slots` slots.
    fn grow(&mut self, ctx: &GpuContext, slots: usize) {
        self.slots = slots.next_power_of_two();
        (self.ring, self.ring_group) = ring(ctx, self.stride, self.slots);
    }

    /// The group-0 bind group of `buffers` for a kernel of `shader`.
    fn group(
        &mut self,
        ctx: &GpuContext,
        pipeline: &Pipeline,
        buffers: &[&wgpu::Buffer],
    ) -> wgpu::BindGroup {
        let Some(groups) = &mut self.groups else {
            return ctx.bind_group(pipeline, buffers);
        };
        let mut h = std::collections::hash_map::DefaultHasher::new();
        pipeline.shader.hash(&mut h);
        buffers.iter().for_each(|b| b.hash(&mut h));
        let bucket = groups.entry(h.finish()).or_default();
        let found = bucket.iter().find(|(s, bs, _)| {
            *s == pipeline.shader
                && bs.len() == buffers.len()
                && bs.iter().zip(buffers).all(|(a, b)| a == *b)
        });
        match found {
            Some((_, _, g)) => g.clone(),
            None => {
                let g = ctx.bind_group(pipeline, buffers);
                let owned = buffers.iter().map(|&b| b.clone()).collect();
                bucket.push((pipeline.shader, owned, g.clone()));
                g
            }
        }
    }
}

/// A uniform ring of `slots` slots of `stride` bytes and its bind group.
fn ring(ctx: &GpuContext, stride: u64, slots: usize) -> (wgpu::Buffer, wgpu::BindGroup) {
    let buffer = ctx.create_buffer(&wgpu::BufferDescriptor {
        label: Some("params"),
        size: stride * slots as u64,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let group = ctx.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("params"),
        layout: ctx.params_layout(),
        entries: &[wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &buffer,
                offset: 0,
                size: NonZeroU64::new(PARAM_BYTES),
            }),
        }],
    });
    (buffer, group)
}

/// The commands of one submission being recorded.
pub(crate) struct Recorder<'a> {
    ctx: &'a GpuContext,
    binder: &'a mut Binder,
    encoder: wgpu::CommandEncoder,
    pass: Option<wgpu::ComputePass<'static>>,
    /// Slots used (may exceed the ring: the recording is then redone with a larger ring).
    used: usize,
}

impl<'a> Recorder<'a> {
    fn new(ctx: &'a GpuContext, binder: &'a mut Binder) -> Recorder<'a> {
        binder.params.clear();
        Recorder {
            ctx,
            encoder: ctx.encoder(),
            binder,
            pass: None,
            used: 0,
        }
    }

    /// The context recorded for.
    pub(crate) fn ctx(&self) -> &'a GpuContext {
        self.ctx
    }

    /// Records one dispatch of `pipeline` over `groups` workgroups, with `buffers` bound to group
    /// 0's bindings 0, 1, … and `params` (at most [`PARAM_BYTES`]) to group 1.
    pub(crate) fn dispatch<P: bytemuck::Pod>(
        &mut self,
        pipeline: &Pipeline,
        buffers: &[&wgpu::Buffer],
        params: &P,
        groups: [u32; 3],
    ) {
        let bytes = bytemuck::bytes_of(params);
        debug_assert!(bytes.len() as u64 <= PARAM_BYTES);
        let slot = self.used;
        self.used += 1;
        self.ctx.count_dispatch();
        let p = &mut self.binder.params;
        p.resize(slot * self.binder.stride as usize, 0);
        p.extend_from_slice(bytes);
        if slot >= self.binder.slots {
            return; // Redone with a larger ring by `GpuContext::record`.
        }
        let group = self.binder.group(self.ctx, pipeline, buffers);
        let pass = self.pass.get_or_insert_with(|| {
            self.encoder
                .begin_compute_pass(&wgpu::ComputePassDescriptor::default())
                .forget_lifetime()
        });
        pass.set_pipeline(&pipeline.pipeline);
        pass.set_bind_group(0, &group, &[]);
        let offset = (slot as u64 * self.binder.stride) as u32;
        pass.set_bind_group(1, &self.binder.ring_group, &[offset]);
        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
    }

    /// The encoder, outside any compute pass (for copies).
    pub(crate) fn encoder(&mut self) -> &mut wgpu::CommandEncoder {
        self.pass = None;
        &mut self.encoder
    }

    /// Records a copy of `size` bytes from `src` at `src_offset` to `dst` at `dst_offset`.
    pub(crate) fn copy(
        &mut self,
        (src, src_offset): (&wgpu::Buffer, u64),
        (dst, dst_offset): (&wgpu::Buffer, u64),
        size: u64,
    ) {
        self.encoder()
            .copy_buffer_to_buffer(src, src_offset, dst, dst_offset, size);
    }

    /// Records the zeroing of `buffer`.
    pub(crate) fn clear(&mut self, buffer: &wgpu::Buffer) {
        self.encoder().clear_buffer(buffer, 0, None);
    }

    /// Ends the recording: writes the parameters to the ring and returns the encoder, or the
    /// slots needed when the ring was too small.
    fn finish(mut self) -> std::result::Result<wgpu::CommandEncoder, usize> {
        self.pass = None;
        if self.used > self.binder.slots {
            return Err(self.used);
        }
        if !self.binder.params.is_empty() {
            self.ctx
                .queue
                .write_buffer(&self.binder.ring, 0, &self.binder.params);
        }
        Ok(self.encoder)
    }
}

impl GpuContext {
    /// Records with `binder` what `work` records, redoing it once with a larger ring when the
    /// ring was too small, and returns the encoder (parameters written, not yet submitted) and
    /// `work`'s result.
    ///
    /// Errors: those of `work`.
    pub(crate) fn record<T>(
        &self,
        binder: &mut Binder,
        mut work: impl FnMut(&mut Recorder) -> Result<T>,
    ) -> Result<(wgpu::CommandEncoder, T)> {
        for _ in 0..2 {
            let mut rec = Recorder::new(self, binder);
            let out = work(&mut rec)?;
            match rec.finish() {
                Ok(encoder) => return Ok((encoder, out)),
                Err(slots) => binder.grow(self, slots),
            }
        }
        Err(Error::Gpu(
            "the recording needs more parameter slots on each try".into(),
        ))
    }

    /// [`GpuContext::record`] with a binder of its own, for one submission of transient buffers.
    ///
    /// Errors: those of `work`.
    pub(crate) fn record_once<T>(
        &self,
        work: impl FnMut(&mut Recorder) -> Result<T>,
    ) -> Result<(wgpu::CommandEncoder, T)> {
        self.record(&mut Binder::new(self, false), work)
    }
}
