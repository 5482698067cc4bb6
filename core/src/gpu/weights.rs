//! Weight matrices on the GPU: all rows of a tensor, or a chosen subset (the hot neurons), stored
//! as packed ggml blocks in `array<u32>` buffers of whole rows, each at most
//! [`GpuContext::max_binding_bytes`] (a storage binding may be capped at 128 MiB).

use super::context::GpuContext;
use crate::cpu::Matrix;
use crate::quant::GgmlType;
use crate::{Error, Result};

/// The weight types the dense and gathered matvec kernels read.
pub const MATVEC_TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

/// The weight types the sparse axpy kernel reads.
pub const AXPY_TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
];

/// The ggml type id the kernels' `WTYPE` constant takes.
pub(crate) fn type_id(ty: GgmlType) -> f64 {
    match ty {
        GgmlType::F32 => 0.0,
        GgmlType::F16 => 1.0,
        GgmlType::Q4_0 => 2.0,
        GgmlType::Q5_0 => 6.0,
        GgmlType::Q8_0 => 8.0,
        GgmlType::Q4_K => 12.0,
        _ => 14.0,
    }
}

/// A run of consecutive held rows in one buffer.
pub(crate) struct Chunk {
    /// The first held row (index into the held rows) in this buffer.
    pub first: usize,
    /// Rows in this buffer.
    pub rows: usize,
    /// The packed rows.
    pub buffer: wgpu::Buffer,
}

/// Rows of a weight matrix held on the GPU.
pub struct GpuMatrix {
    /// Element type.
    pub ty: GgmlType,
    /// Rows held (the held row `k` is row `k` of the uploaded matrix, or `rows[k]` of a subset).
    pub rows: usize,
    /// Values per row.
    pub cols: usize,
    /// Bytes per row.
    pub(crate) row_bytes: usize,
    pub(crate) chunks: Vec<Chunk>,
}

impl std::fmt::Debug for GpuMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuMatrix")
            .field("ty", &self.ty)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("chunks", &self.chunks.len())
            .finish()
    }
}

impl GpuMatrix {
    /// Uploads every row of `m`.
    ///
    /// Errors: [`Error::UnsupportedType`] for a type no GPU kernel reads; [`Error::Gpu`] for a row
    /// larger than a storage binding.
    pub fn upload(ctx: &GpuContext, m: &Matrix) -> Result<GpuMatrix> {
        GpuMatrix::upload_with(ctx, m, m.rows, |r| r)
    }

    /// Uploads the rows `rows` of `m` (held row `k` is row `rows[k]`).
    ///
    /// Errors: as [`GpuMatrix::upload`], and [`Error::InvalidArgument`] for a row out of range.
    pub fn upload_rows(ctx: &GpuContext, m: &Matrix, rows: &[u32]) -> Result<GpuMatrix> {
        if let Some(&bad) = rows.iter().find(|&&r| r as usize >= m.rows) {
            return Err(Error::InvalidArgument(format!(
                "row {bad} out of range for a matrix of {} rows",
                m.rows
            )));
        }
        GpuMatrix::upload_with(ctx, m, rows.len(), |k| rows[k] as usize)
    }

    fn upload_with(
        ctx: &GpuContext,
        m: &Matrix,
        n_rows: usize,
        source_row: impl Fn(usize) -> usize,
    ) -> Result<GpuMatrix> {
        if !MATVEC_TYPES.contains(&m.ty) {
            return Err(Error::UnsupportedType {
                ty: m.ty.name(),
                op: "the GPU kernels",
            });
        }
        let row_bytes = m.cols / m.ty.block_size() * m.ty.block_bytes();
        if row_bytes * m.rows != m.data.len() || !m.cols.is_multiple_of(m.ty.block_size()) {
            return Err(Error::InvalidArgument(format!(
                "a {}×{} {} matrix cannot hold {} bytes",
                m.rows,
                m.cols,
                m.ty,
                m.data.len()
            )));
        }
        let per_chunk = ((ctx.max_binding_bytes() as usize).saturating_sub(4) / row_bytes.max(1))
            .min(n_rows.max(1));
        if per_chunk == 0 {
            return Err(Error::Gpu(format!(
                "a row of {row_bytes} bytes exceeds the largest storage binding ({} bytes)",
                ctx.max_binding_bytes()
            )));
        }
        let mut chunks = Vec::new();
        let mut first = 0;
        while first < n_rows {
            let rows = per_chunk.min(n_rows - first);
            let mut bytes = Vec::with_capacity(rows * row_bytes);
            for k in first..first + rows {
                let r = source_row(k);
                bytes.extend_from_slice(&m.data[r * row_bytes..(r + 1) * row_bytes]);
            }
            chunks.push(Chunk {
                first,
                rows,
                buffer: ctx.storage("weights", &bytes),
            });
            first += rows;
        }
        Ok(GpuMatrix {
            ty: m.ty,
            rows: n_rows,
            cols: m.cols,
            row_bytes,
            chunks,
        })
    }

    /// Bytes of weights held.
    pub fn bytes(&self) -> u64 {
        (self.rows * self.row_bytes) as u64
    }

    /// Buffers the rows are split over.
    pub fn n_chunks(&self) -> usize {
        self.chunks.len()
    }
}
