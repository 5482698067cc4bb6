//! Row and element-wise kernels on the GPU: RMSNorm, RoPE, softmax, attention over an f16 KV
//! cache, and the FFN's gate/up combine, `x += y`, `x *= s`. Each uploads its inputs, runs, and
//! reads the result back (they are checked one by one against the CPU's kernels).

use half::f16;

use super::context::GpuContext;
use super::pipelines::{grid, WG};
use super::recorder::Recorder;
use super::shaders::Shader;
use crate::cpu::ops::RopeStyle;
use crate::model::FfnActivation;
use crate::{Error, Result};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct NormParams {
    n: u32,
    eps: f32,
    _pad: [u32; 2],
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct RopeParams {
    n_heads: u32,
    head_dim: u32,
    n_rot: u32,
    neox: u32,
    pos0: u32,
    n_tokens: u32,
    theta_scale: f32,
    freq_scale: f32,
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct AttentionParams {
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
    head_dim_v: u32,
    pos0: u32,
    window: u32,
    s_stride: u32,
    scale: f32,
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct KvParams {
    n_pairs: u32,
    offset: u32,
    _pad: [u32; 2],
}

/// The shape of an attention call (as the CPU's attention takes it).
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (a divisor of `n_head`).
    pub n_head_kv: usize,
    /// Values per query/key head.
    pub head_dim: usize,
    /// Values per value head.
    pub head_dim_v: usize,
    /// Multiplies the scores.
    pub scale: f32,
    /// Sliding window in positions.
    pub window: Option<usize>,
}

/// RoPE settings (as `cpu::ops::Rope::new` takes them).
#[derive(Clone, Copy, Debug)]
pub struct RopeSettings {
    /// Pairing of the rotated dimensions.
    pub style: RopeStyle,
    /// Rotated dimensions per head.
    pub n_rot: usize,
    /// Frequency base.
    pub freq_base: f32,
    /// Linear position scale.
    pub freq_scale: f32,
}

/// The buffers of an attention call.
pub(crate) struct AttentionBuffers<'a> {
    /// Queries.
    pub q: &'a wgpu::Buffer,
    /// The layer's f16 keys.
    pub keys: &'a wgpu::Buffer,
    /// The layer's f16 values.
    pub values: &'a wgpu::Buffer,
    /// Scores.
    pub scratch: &'a wgpu::Buffer,
    /// Outputs.
    pub out: &'a wgpu::Buffer,
}

/// The `ACT` constant of `elementwise.wgsl`'s `combine` for `act`.
pub(crate) fn ffn_act_id(act: FfnActivation) -> f64 {
    match act {
        FfnActivation::Silu => 0.0,
        FfnActivation::Gelu => 1.0,
        FfnActivation::Relu => 2.0,
        FfnActivation::DRelu => 3.0,
    }
}

fn same_len(a: &[f32], b: &[f32], what: &str) -> Result<()> {
    if a.len() != b.len() {
        return Err(Error::InvalidArgument(format!(
            "{what}: {} and {} values",
            a.len(),
            b.len()
        )));
    }
    Ok(())
}

impl GpuContext {
    /// Uploads `x`, records `work` on it, runs it and reads `x` back.
    fn in_place(&self, x: &[f32], work: impl Fn(&mut Recorder, &wgpu::Buffer)) -> Result<Vec<f32>> {
        let xb = self.output("x", x.len());
        self.queue.write_buffer(&xb, 0, bytemuck::cast_slice(x));
        let (encoder, ()) = self.record_once(|rec| {
            work(rec, &xb);
            Ok(())
        })?;
        self.submit_read(encoder, &xb, x.len()).wait(self)
    }

    /// RMSNorm of each row of `x` (rows of `w.len()` values) with weights `w`.
    ///
    /// Errors: [`Error::InvalidArgument`] when `x` is not a whole number of rows.
    pub fn rms_norm(&self, x: &[f32], w: &[f32], eps: f32) -> Result<Vec<f32>> {
        if w.is_empty() || !x.len().is_multiple_of(w.len()) {
            return Err(Error::InvalidArgument(format!(
                "{} values are not rows of {}",
                x.len(),
                w.len()
            )));
        }
        let rows = x.len() / w.len();
        if grid(rows as u32)[1] > 1 {
            return Err(Error::InvalidArgument(format!("{rows} rows are too many")));
        }
        let nw = self.storage("norm", bytemuck::cast_slice(w));
        self.in_place(x, |rec, xb| {
            self.record_norm(rec, xb, &nw, w.len(), rows, eps)
        })
    }

    /// Records RMSNorm in place of the `rows` rows of `n` values of `x`, with weights `w`.
    pub(crate) fn record_norm(
        &self,
        rec: &mut Recorder,
        x: &wgpu::Buffer,
        w: &wgpu::Buffer,
        n: usize,
        rows: usize,
        eps: f32,
    ) {
        let params = NormParams {
            n: n as u32,
            eps,
            _pad: [0; 2],
        };
        let pipeline = self.pipeline(Shader::Norm, "main", &[]);
        rec.dispatch(&pipeline, &[x, w], &params, [rows as u32, 1, 1]);
    }

    /// RoPE of `x` (`n_tokens × n_heads × head_dim`), token `t` at position `pos0 + t`.
    ///
    /// Errors: [`Error::InvalidArgument`] for inconsistent shapes.
    pub fn rope(
        &self,
        x: &[f32],
        n_heads: usize,
        head_dim: usize,
        rope: RopeSettings,
        pos0: usize,
    ) -> Result<Vec<f32>> {
        let row = n_heads * head_dim;
        if row == 0 || !x.len().is_multiple_of(row) || rope.n_rot > head_dim {
            return Err(Error::InvalidArgument(format!(
                "{} values are not rows of {n_heads} heads × {head_dim} (n_rot {})",
                x.len(),
                rope.n_rot
            )));
        }
        let n_tokens = x.len() / row;
        self.in_place(x, |rec, xb| {
            self.record_rope(rec, xb, (n_heads, head_dim), rope, pos0, n_tokens)
        })
    }

    /// Records RoPE in place of `x` (`n_tokens × n_heads × head_dim`), token `t` at `pos0 + t`.
    pub(crate) fn record_rope(
        &self,
        rec: &mut Recorder,
        x: &wgpu::Buffer,
        (n_heads, head_dim): (usize, usize),
        rope: RopeSettings,
        pos0: usize,
        n_tokens: usize,
    ) {
        let params = RopeParams {
            n_heads: n_heads as u32,
            head_dim: head_dim as u32,
            n_rot: rope.n_rot as u32,
            neox: u32::from(rope.style == RopeStyle::Neox),
            pos0: pos0 as u32,
            n_tokens: n_tokens as u32,
            theta_scale: rope.freq_base.powf(-2.0 / rope.n_rot as f32),
            freq_scale: rope.freq_scale,
        };
        let groups = [
            ((rope.n_rot / 2) as u32).div_ceil(WG).max(1),
            n_heads as u32,
            n_tokens as u32,
        ];
        let pipeline = self.pipeline(Shader::Rope, "main", &[]);
        rec.dispatch(&pipeline, &[x], &params, groups);
    }

    /// Softmax of each row of `x` (rows of `n` values).
    ///
    /// Errors: [`Error::InvalidArgument`] when `x` is not a whole number of rows.
    pub fn softmax(&self, x: &[f32], n: usize) -> Result<Vec<f32>> {
        if n == 0 || !x.len().is_multiple_of(n) {
            return Err(Error::InvalidArgument(format!(
                "{} values are not rows of {n}",
                x.len()
            )));
        }
        let params = [n as u32, 0, 0, 0];
        let rows = (x.len() / n) as u32;
        let pipeline = self.pipeline(Shader::Softmax, "main", &[]);
        self.in_place(x, |rec, xb| {
            rec.dispatch(&pipeline, &[xb], &params, [rows, 1, 1])
        })
    }

    /// Attention of `q` (`n_tokens × n_head × head_dim`, token `t` at position `pos0 + t`) over
    /// the cached `keys` and `values` (position-major, `n_head_kv` heads per position, at least
    /// `pos0 + n_tokens` positions). Returns `n_tokens × n_head × head_dim_v`.
    ///
    /// Errors: [`Error::InvalidArgument`] for inconsistent shapes or a cache that is too short.
    pub fn attention(
        &self,
        q: &[f32],
        keys: &[f16],
        values: &[f16],
        shape: &AttentionShape,
        pos0: usize,
    ) -> Result<Vec<f32>> {
        let s = shape;
        let q_row = s.n_head * s.head_dim;
        let (k_width, v_width) = (s.n_head_kv * s.head_dim, s.n_head_kv * s.head_dim_v);
        if s.n_head_kv == 0
            || !s.n_head.is_multiple_of(s.n_head_kv)
            || q_row == 0
            || !q.len().is_multiple_of(q_row)
            || k_width == 0
            || v_width == 0
        {
            return Err(Error::InvalidArgument(format!(
                "attention shape {s:?} does not fit {} query values",
                q.len()
            )));
        }
        let n_tokens = q.len() / q_row;
        let n_ctx = keys.len() / k_width;
        if n_ctx < pos0 + n_tokens || values.len() / v_width < pos0 + n_tokens {
            return Err(Error::InvalidArgument(format!(
                "the cache holds {n_ctx} positions, {} needed",
                pos0 + n_tokens
            )));
        }
        let qb = self.storage("q", bytemuck::cast_slice(q));
        let kb = self.storage("k", bytemuck::cast_slice(keys));
        let vb = self.storage("v", bytemuck::cast_slice(values));
        let scratch = self.output("scores", n_tokens * s.n_head * n_ctx);
        let out_len = n_tokens * s.n_head * s.head_dim_v;
        let out = self.output("attn", out_len);
        let io = AttentionBuffers {
            q: &qb,
            keys: &kb,
            values: &vb,
            scratch: &scratch,
            out: &out,
        };
        let (encoder, ()) = self.record_once(|rec| {
            self.record_attention(rec, &io, s, pos0, n_tokens, n_ctx);
            Ok(())
        })?;
        self.submit_read(encoder, &out, out_len).wait(self)
    }

    /// Records attention of the `n_tokens` query rows (at `pos0 + t`) over a cache of `n_ctx`
    /// positions (the scratch holds `n_tokens × n_head × n_ctx` scores).
    pub(crate) fn record_attention(
        &self,
        rec: &mut Recorder,
        io: &AttentionBuffers,
        s: &AttentionShape,
        pos0: usize,
        n_tokens: usize,
        n_ctx: usize,
    ) {
        let params = AttentionParams {
            n_head: s.n_head as u32,
            n_head_kv: s.n_head_kv as u32,
            head_dim: s.head_dim as u32,
            head_dim_v: s.head_dim_v as u32,
            pos0: pos0 as u32,
            window: s.window.unwrap_or(0) as u32,
            s_stride: n_ctx as u32,
            scale: s.scale,
        };
        let pipeline = self.pipeline(Shader::Attention, "main", &[]);
        rec.dispatch(
            &pipeline,
            &[io.q, io.keys, io.values, io.scratch, io.out],
            &params,
            [s.n_head as u32, n_tokens as u32, 1],
        );
    }

    /// Records the append of the `width` values of `x` (even) to the f16 `cache` at `pos`.
    pub(crate) fn record_kv_store(
        &self,
        rec: &mut Recorder,
        x: &wgpu::Buffer,
        cache: &wgpu::Buffer,
        width: usize,
        pos: usize,
    ) {
        let n_pairs = width / 2;
        let params = KvParams {
            n_pairs: n_pairs as u32,
            offset: (pos * n_pairs) as u32,
            _pad: [0; 2],
        };
        let pipeline = self.pipeline(Shader::Kv, "store", &[]);
        let [gx, gy] = grid((n_pairs as u32).div_ceil(WG));
        rec.dispatch(&pipeline, &[x, cache], &params, [gx, gy, 1]);
    }

    /// The FFN neurons' outputs `act.combine(gate[i], up[i])`.
    ///
    /// Errors: [`Error::InvalidArgument`] for different lengths.
    pub fn combine(&self, act: FfnActivation, gate: &[f32], up: &[f32]) -> Result<Vec<f32>> {
        same_len(gate, up, "combine")?;
        self.elementwise("combine", &[("ACT", ffn_act_id(act))], gate, up, 1.0)
    }

    /// `x + y`.
    ///
    /// Errors: [`Error::InvalidArgument`] for different lengths.
    pub fn add(&self, x: &[f32], y: &[f32]) -> Result<Vec<f32>> {
        same_len(x, y, "add")?;
        self.elementwise("add", &[], x, y, 1.0)
    }

    /// `x · s`.
    pub fn scale(&self, x: &[f32], s: f32) -> Result<Vec<f32>> {
        self.elementwise("scale", &[], x, &[], s)
    }

    fn elementwise(
        &self,
        entry: &'static str,
        constants: &[(&'static str, f64)],
        x: &[f32],
        y: &[f32],
        s: f32,
    ) -> Result<Vec<f32>> {
        let yb = self.storage("y", bytemuck::cast_slice(y));
        self.in_place(x, |rec, xb| {
            self.record_elementwise(rec, (entry, constants), xb, &yb, x.len(), s)
        })
    }

    /// Records the element-wise kernel `entry` over the first `n` values of `x` (in place), with
    /// the second operand `y` and the factor or threshold `s`.
    pub(crate) fn record_elementwise(
        &self,
        rec: &mut Recorder,
        (entry, constants): (&'static str, &[(&'static str, f64)]),
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        n: usize,
        s: f32,
    ) {
        let params = NormParams {
            n: n as u32,
            eps: s,
            _pad: [0; 2],
        };
        let [gx, gy] = grid((n as u32).div_ceil(WG));
        let pipeline = self.pipeline(Shader::Elementwise, entry, constants);
        let table = self.gelu_table();
        rec.dispatch(&pipeline, &[x, y, table], &params, [gx, gy, 1]);
    }

    /// ggml's GELU table (the f16 of `gelu_tanh(x)` for every f16 `x`), uploaded once.
    fn gelu_table(&self) -> &wgpu::Buffer {
        self.gelu.get_or_init(|| {
            let table: Vec<u16> = (0..=u16::MAX)
                .map(|bits| {
                    let x = f16::from_bits(bits).to_f32();
                    f16::from_f32(crate::cpu::ops::gelu_tanh(x)).to_bits()
                })
                .collect();
            self.storage("gelu", bytemuck::cast_slice(&table))
        })
    }
}
