//! The inputs of the resident forward pass's matrix products: each f32 vector is quantised on the
//! GPU to the format the CPU's `matmul` quantises it to for the weight type (f32 as is, f16, Q8_0
//! or Q8_K), into one set of buffers per format.

use crate::gpu::context::GpuContext;
use crate::gpu::matrix_ops::ActBuffers;
use crate::gpu::pipelines::{grid, WG};
use crate::gpu::recorder::Recorder;
use crate::gpu::shaders::Shader;
use crate::quant::GgmlType;
use crate::{Error, Result};

/// An activation format (the CPU's `ActKind` for the GPU's weight types).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    F32,
    F16,
    Q8_0,
    Q8K,
}

impl Kind {
    /// The format products with weights of type `ty` take.
    pub fn of(ty: GgmlType) -> Result<Kind> {
        Ok(match ty {
            GgmlType::F32 => Kind::F32,
            GgmlType::F16 => Kind::F16,
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => Kind::Q8_0,
            GgmlType::Q4_K | GgmlType::Q6_K => Kind::Q8K,
            _ => {
                return Err(Error::UnsupportedType {
                    ty: ty.name(),
                    op: "the GPU-resident forward pass",
                })
            }
        })
    }

    /// Values per quantisation block.
    fn block(self) -> usize {
        match self {
            Kind::F32 | Kind::F16 => 1,
            Kind::Q8_0 => 32,
            Kind::Q8K => 256,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct QuantParams {
    n: u32,
    _pad: [u32; 3],
}

/// One buffer set per quantised format, each for up to `max_cols` values.
pub(super) struct ActSets {
    f16: ActBuffers,
    q8_0: ActBuffers,
    q8k: ActBuffers,
    empty: wgpu::Buffer,
}

/// The lengths (u32 words) of one set's buffers `f`, `q`, `d`, `b` for `max_cols` values.
fn lens(max_cols: usize) -> [usize; 4] {
    [
        max_cols,
        max_cols.div_ceil(4),
        max_cols.div_ceil(32),
        max_cols.div_ceil(16),
    ]
}

fn buffers(ctx: &GpuContext, max_cols: usize) -> ActBuffers {
    let [f, q, d, b] = lens(max_cols);
    ActBuffers {
        f: ctx.output("xf", f),
        q: ctx.output("xq", q),
        d: ctx.output("xd", d),
        b: ctx.output("xb", b),
    }
}

impl ActSets {
    /// Buffers for vectors of up to `max_cols` values.
    pub fn new(ctx: &GpuContext, max_cols: usize) -> ActSets {
        ActSets {
            f16: buffers(ctx, max_cols),
            q8_0: buffers(ctx, max_cols),
            q8k: buffers(ctx, max_cols),
            empty: ctx.storage("empty", &[]),
        }
    }

    /// Bytes [`ActSets::new`] allocates for `max_cols`.
    pub fn bytes(max_cols: usize) -> u64 {
        let set: usize = lens(max_cols).iter().map(|n| n.max(&1)).sum();
        (4 * (3 * set + 1)) as u64
    }

    /// Records the quantisation of the first `cols` values of `x` for products with weights of
    /// `kind`, and returns the buffers to bind.
    ///
    /// Errors: [`Error::InvalidArgument`] when `cols` is not a whole number of blocks.
    pub fn quantize(
        &self,
        rec: &mut Recorder,
        kind: Kind,
        x: &wgpu::Buffer,
        cols: usize,
    ) -> Result<ActBuffers> {
        if !cols.is_multiple_of(kind.block()) {
            return Err(Error::InvalidArgument(format!(
                "{cols} values are not a whole number of {}-value blocks",
                kind.block()
            )));
        }
        let set = match kind {
            Kind::F32 => {
                return Ok(ActBuffers {
                    f: x.clone(),
                    q: self.empty.clone(),
                    d: self.empty.clone(),
                    b: self.empty.clone(),
                })
            }
            Kind::F16 => &self.f16,
            Kind::Q8_0 => &self.q8_0,
            Kind::Q8K => &self.q8k,
        };
        self.record(rec, kind, false, x, set, cols);
        Ok(ActBuffers {
            f: set.f.clone(),
            q: set.q.clone(),
            d: set.d.clone(),
            b: set.b.clone(),
        })
    }

    /// Records `x` rounded as a product with weights of `kind` sees it (quantised and back), and
    /// returns the buffer holding the rounded values (`x` itself for f32).
    ///
    /// Errors: as [`ActSets::quantize`], and [`Error::UnsupportedType`] for Q8_K (no GPU axpy
    /// reads K-quants).
    pub fn round(
        &self,
        rec: &mut Recorder,
        kind: Kind,
        x: &wgpu::Buffer,
        cols: usize,
    ) -> Result<wgpu::Buffer> {
        match kind {
            Kind::F32 => Ok(x.clone()),
            Kind::F16 => Ok(self.quantize(rec, kind, x, cols)?.f),
            Kind::Q8_0 => {
                if !cols.is_multiple_of(32) {
                    return Err(Error::InvalidArgument(format!(
                        "{cols} values are not a whole number of 32-value blocks"
                    )));
                }
                self.record(rec, kind, true, x, &self.q8_0, cols);
                Ok(self.q8_0.f.clone())
            }
            Kind::Q8K => Err(Error::UnsupportedType {
                ty: "q8_K",
                op: "the GPU sparse axpy",
            }),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        rec: &mut Recorder,
        kind: Kind,
        round_out: bool,
        x: &wgpu::Buffer,
        set: &ActBuffers,
        cols: usize,
    ) {
        let (entry, invocations) = match kind {
            Kind::F16 => ("to_f16", cols),
            Kind::Q8_0 => ("q8_0", cols / 32),
            _ => ("q8_k", cols / 256),
        };
        let pipeline = rec.ctx().pipeline(
            Shader::Quantize,
            entry,
            &[("ROUND_OUT", f64::from(u8::from(round_out)))],
        );
        let params = QuantParams {
            n: cols as u32,
            _pad: [0; 3],
        };
        let [gx, gy] = grid((invocations as u32).div_ceil(WG));
        rec.dispatch(
            &pipeline,
            &[x, &set.f, &set.q, &set.d, &set.b],
            &params,
            [gx, gy, 1],
        );
    }
}
