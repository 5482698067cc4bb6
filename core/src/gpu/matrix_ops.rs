//! Matrix kernels on the GPU: dense and gathered matvec, the sparse axpy, the predictor MLP. Each
//! takes f32 activations, quantises them on the CPU exactly as the CPU's `matmul` does, and runs
//! the integer block dot products on the GPU. `submit_*` return at once (the CPU can work
//! meanwhile); [`Pending::wait`] reads the result.

use super::context::{GpuContext, Pending};
use super::pipelines::grid;
use super::recorder::Recorder;
use super::shaders::Shader;
use super::weights::{type_id, GpuMatrix, AXPY_TYPES};
use super::workspace::{Use, Workspace};
use crate::cpu::{quantize_like_matmul, ActKind};
use crate::quant::GgmlType;
use crate::{Error, Result};

/// Output columns of one sparse-axpy workgroup (`COLS` in sparse_axpy.wgsl).
const AXPY_COLUMNS: u32 = 16;

/// Invocations of one sparse-axpy workgroup: [`AXPY_COLUMNS`] columns × 16 coefficient ranges.
const AXPY_WG: u32 = 256;

/// `matvec.wgsl`'s parameters.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct MatvecParams {
    cols: u32,
    row_bytes: u32,
    count: u32,
    y_stride: u32,
    y_off: u32,
    first: u32,
    row_base: u32,
    y_base: u32,
}

/// `sparse_axpy.wgsl`'s parameters.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct AxpyParams {
    cols: u32,
    row_bytes: u32,
    count: u32,
    first: u32,
    a_stride: u32,
    row_base: u32,
    n_tokens: u32,
    _pad: u32,
}

/// Quantised activations on the GPU: float values, quants, scales, Q8_K sums.
pub(crate) struct ActBuffers {
    pub f: wgpu::Buffer,
    pub q: wgpu::Buffer,
    pub d: wgpu::Buffer,
    pub b: wgpu::Buffer,
}

/// Post-processing of a matvec's outputs.
#[derive(Clone, Copy, Default)]
pub(crate) struct Epilogue {
    pub relu: bool,
    pub round_f16: bool,
}

/// Which rows of a matrix a matvec computes.
#[derive(Clone, Copy)]
pub(crate) enum Rows<'a> {
    /// Every held row.
    All,
    /// The sorted held rows listed, on the CPU and uploaded.
    Gather(&'a [u32], &'a wgpu::Buffer),
    /// Every held row whose word in the mask (one per row) is non-zero; the others output 0.
    Mask(&'a wgpu::Buffer),
}

fn check_x(w: &GpuMatrix, x: &[f32], n: usize) -> Result<()> {
    if n.checked_mul(w.cols) != Some(x.len()) {
        return Err(Error::InvalidArgument(format!(
            "x has {} values, expected {n} tokens × {} columns",
            x.len(),
            w.cols
        )));
    }
    Ok(())
}

fn check_rows(w: &GpuMatrix, rows: &[u32]) -> Result<()> {
    match rows.iter().find(|&&r| r as usize >= w.rows) {
        Some(bad) => Err(Error::InvalidArgument(format!(
            "row {bad} out of range: {} rows are on the GPU",
            w.rows
        ))),
        None => Ok(()),
    }
}

impl GpuContext {
    /// Uploads `x` quantised for weights of type `ty` into `ws`'s activation buffers `set`.
    fn upload_acts(
        &self,
        ws: &mut Workspace,
        set: usize,
        ty: GgmlType,
        x: &[f32],
        n: usize,
        cols: usize,
    ) -> Result<ActBuffers> {
        let acts = quantize_like_matmul(ty, x, n, cols)?;
        let float = matches!(acts.kind, ActKind::F32 | ActKind::F16);
        let empty: &[u8] = &[];
        let bsums: Vec<i32> = if acts.kind == ActKind::Q8K {
            acts.bsums[..n * cols / 256 * 16]
                .iter()
                .map(|&v| i32::from(v))
                .collect()
        } else {
            Vec::new()
        };
        let (f, q, d): (&[u8], &[u8], &[u8]) = if float {
            (bytemuck::cast_slice(&acts.f[..n * cols]), empty, empty)
        } else {
            (
                empty,
                bytemuck::cast_slice(&acts.q[..n * cols]),
                bytemuck::cast_slice(&acts.d[..n * acts.nb()]),
            )
        };
        Ok(ActBuffers {
            f: ws.upload(self, ("x", set), f),
            q: ws.upload(self, ("xq", set), q),
            d: ws.upload(self, ("xd", set), d),
            b: ws.upload(self, ("xb", set), bytemuck::cast_slice(&bsums)),
        })
    }

    /// Records the matvec dispatches of `w` for the held rows `sel` for `n` tokens into `y` from
    /// `y_base` on.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record_matvec(
        &self,
        rec: &mut Recorder,
        w: &GpuMatrix,
        sel: Rows,
        acts: &ActBuffers,
        n: usize,
        (y, y_base): (&wgpu::Buffer, usize),
        epilogue: Epilogue,
    ) {
        let rows = match sel {
            Rows::Gather(rows, _) => Some(rows),
            _ => None,
        };
        let pipeline = self.pipeline(
            Shader::Matvec,
            "main",
            &[
                ("WTYPE", type_id(w.ty)),
                ("GATHER", f64::from(u8::from(rows.is_some()))),
                ("RELU", f64::from(u8::from(epilogue.relu))),
                ("ROUND_F16", f64::from(u8::from(epilogue.round_f16))),
                ("MASK", f64::from(u8::from(matches!(sel, Rows::Mask(_))))),
            ],
        );
        let y_stride = rows.map_or(w.rows, <[u32]>::len);
        let idx = match sel {
            Rows::Mask(mask) => mask,
            Rows::All => self.empty_buffer(),
            Rows::Gather(_, idx) => idx,
        };
        for chunk in &w.chunks {
            // The outputs of this chunk: its rows (dense), or the indices that fall in it (the
            // index list is sorted within each chunk's range; find the contiguous run).
            let (first, count, y_off) = match rows {
                None => (0, chunk.rows, chunk.first),
                Some(rows) => {
                    let lo = rows.partition_point(|&r| (r as usize) < chunk.first);
                    let hi = rows.partition_point(|&r| (r as usize) < chunk.first + chunk.rows);
                    (lo, hi - lo, lo)
                }
            };
            if count == 0 || n == 0 {
                continue;
            }
            let params = MatvecParams {
                cols: w.cols as u32,
                row_bytes: w.row_bytes as u32,
                count: count as u32,
                y_stride: y_stride as u32,
                y_off: y_off as u32,
                first: first as u32,
                row_base: chunk.first as u32,
                y_base: y_base as u32,
            };
            let [gx, gy] = grid(count as u32);
            rec.dispatch(
                &pipeline,
                &[&chunk.buffer, &acts.f, &acts.q, &acts.d, &acts.b, idx, y],
                &params,
                [gx, gy, n as u32],
            );
        }
    }

    /// Submits `y = W · x` over every held row of `w` for `n` token rows (`y` is `n × w.rows`).
    ///
    /// Errors: [`Error::InvalidArgument`] for a wrong `x` length.
    pub fn submit_matvec(&self, w: &GpuMatrix, x: &[f32], n: usize) -> Result<Pending> {
        self.submit_products(&mut Workspace::transient(self), &[w], None, x, n)
    }

    /// Submits the gathered product `y[t][k] = dot(held row rows[k], x_t)` (`y` is
    /// `n × rows.len()`). `rows` must be sorted (it may repeat).
    ///
    /// Errors: [`Error::InvalidArgument`] for an unsorted or out-of-range index or a wrong `x`.
    pub fn submit_gather_matvec(
        &self,
        w: &GpuMatrix,
        rows: &[u32],
        x: &[f32],
        n: usize,
    ) -> Result<Pending> {
        self.submit_products(&mut Workspace::transient(self), &[w], Some(rows), x, n)
    }

    /// Submits the products of the matrices `ws` (all of one width) with the same `n` token rows
    /// `x`, over every held row (`rows` None) or the sorted held rows `rows`, as one submission
    /// with the buffers and bind groups of `space`: `x` is quantised and uploaded once per weight
    /// type, and the outputs are read back at once, `ws[0]`'s `n × rows` values, then `ws[1]`'s, …
    ///
    /// Errors: [`Error::InvalidArgument`] for matrices of different widths, an unsorted or
    /// out-of-range index, or a wrong `x` length.
    pub(crate) fn submit_products(
        &self,
        space: &mut Workspace,
        ws: &[&GpuMatrix],
        rows: Option<&[u32]>,
        x: &[f32],
        n: usize,
    ) -> Result<Pending> {
        for w in ws {
            check_x(w, x, n)?;
            if let Some(rows) = rows {
                check_rows(w, rows)?;
            }
        }
        if rows.is_some_and(|r| !r.is_sorted()) {
            return Err(Error::InvalidArgument(
                "gathered rows must be sorted".into(),
            ));
        }
        let mut types: Vec<GgmlType> = Vec::new();
        let mut acts = Vec::new();
        for w in ws {
            if !types.contains(&w.ty) {
                acts.push(self.upload_acts(space, types.len(), w.ty, x, n, w.cols)?);
                types.push(w.ty);
            }
        }
        let idx = rows.map(|r| space.upload(self, ("rows", 0), bytemuck::cast_slice(r)));
        let outs: Vec<usize> = ws
            .iter()
            .map(|w| n * rows.map_or(w.rows, <[u32]>::len))
            .collect();
        let n_out = outs.iter().sum();
        let y = space.buffer(self, ("y", 0), (n_out * 4) as u64, Use::Storage);
        let sel = match (rows, &idx) {
            (Some(rows), Some(idx)) => Rows::Gather(rows, idx),
            _ => Rows::All,
        };
        let (encoder, ()) = self.record(space.binder(), |rec| {
            let mut base = 0;
            for (w, out) in ws.iter().zip(&outs) {
                let a = &acts[types.iter().position(|&t| t == w.ty).expect("uploaded")];
                self.record_matvec(rec, w, sel, a, n, (&y, base), Epilogue::default());
                base += out;
            }
            Ok(())
        })?;
        Ok(space.submit_read(self, encoder, &y, n_out))
    }

    /// Submits the gathered products of two matrices of the same type and width over the same
    /// rows and input (an FFN's gate and up), quantising and uploading `x` once and reading both
    /// back at once: the result is `w1`'s `n × rows.len()` outputs followed by `w2`'s.
    ///
    /// Errors: as [`GpuContext::submit_gather_matvec`], and [`Error::InvalidArgument`] when the
    /// matrices differ in type or width.
    pub fn submit_gather_matvec_pair(
        &self,
        w1: &GpuMatrix,
        w2: &GpuMatrix,
        rows: &[u32],
        x: &[f32],
        n: usize,
    ) -> Result<Pending> {
        if w1.ty != w2.ty || w1.cols != w2.cols {
            return Err(Error::InvalidArgument(format!(
                "a pair of products needs one type and width ({} × {}, {} × {})",
                w1.ty, w1.cols, w2.ty, w2.cols
            )));
        }
        let space = &mut Workspace::transient(self);
        self.submit_products(space, &[w1, w2], Some(rows), x, n)
    }

    /// [`GpuContext::submit_matvec`], waited for.
    pub fn matvec(&self, w: &GpuMatrix, x: &[f32], n: usize) -> Result<Vec<f32>> {
        self.submit_matvec(w, x, n)?.wait(self)
    }

    /// [`GpuContext::submit_gather_matvec`], waited for.
    pub fn gather_matvec(
        &self,
        w: &GpuMatrix,
        rows: &[u32],
        x: &[f32],
        n: usize,
    ) -> Result<Vec<f32>> {
        self.submit_gather_matvec(w, rows, x, n)?.wait(self)
    }

    /// Submits the sparse down projection: `out[t] = Σ_k a[t][k] · held row rows[k]` of the
    /// neuron-major `w_t` (`a` is `n × rows.len()`, already rounded as the CPU's `matmul` rounds
    /// its input; `out` is `n × w_t.cols`). Zero coefficients are skipped; `rows` must be sorted.
    ///
    /// Errors: [`Error::UnsupportedType`] for a type the axpy kernel does not read,
    /// [`Error::InvalidArgument`] for bad indices or lengths.
    pub fn submit_sparse_axpy(
        &self,
        w_t: &GpuMatrix,
        rows: &[u32],
        a: &[f32],
        n: usize,
    ) -> Result<Pending> {
        self.submit_sparse_axpy_in(&mut Workspace::transient(self), w_t, rows, a, n)
    }

    /// [`GpuContext::submit_sparse_axpy`] with the buffers and bind groups of `space`.
    ///
    /// Errors: as [`GpuContext::submit_sparse_axpy`].
    pub(crate) fn submit_sparse_axpy_in(
        &self,
        space: &mut Workspace,
        w_t: &GpuMatrix,
        rows: &[u32],
        a: &[f32],
        n: usize,
    ) -> Result<Pending> {
        if !AXPY_TYPES.contains(&w_t.ty) {
            return Err(Error::UnsupportedType {
                ty: w_t.ty.name(),
                op: "the GPU sparse axpy",
            });
        }
        check_rows(w_t, rows)?;
        if !rows.is_sorted() {
            return Err(Error::InvalidArgument("axpy rows must be sorted".into()));
        }
        if n.checked_mul(rows.len()) != Some(a.len()) {
            return Err(Error::InvalidArgument(format!(
                "a has {} values, expected {n} tokens × {} rows",
                a.len(),
                rows.len()
            )));
        }
        let n_out = n * w_t.cols;
        let y = space.buffer(self, ("axpy", 0), (n_out * 4) as u64, Use::Storage);
        let a_buf = space.upload(self, ("a", 0), bytemuck::cast_slice(a));
        let idx = space.upload(self, ("rows", 0), bytemuck::cast_slice(rows));
        let (encoder, ()) = self.record(space.binder(), |rec| {
            rec.clear(&y);
            self.record_sparse_axpy(rec, w_t, (rows, &idx), &a_buf, &y, n);
            Ok(())
        })?;
        Ok(space.submit_read(self, encoder, &y, n_out))
    }

    /// Records `y[t] += Σ_k a[t][k] · held row rows[k]` of `w_t` (`rows` sorted, given on the CPU
    /// and as the buffer `idx`), skipping zero coefficients.
    pub(crate) fn record_sparse_axpy(
        &self,
        rec: &mut Recorder,
        w_t: &GpuMatrix,
        (rows, idx): (&[u32], &wgpu::Buffer),
        a: &wgpu::Buffer,
        y: &wgpu::Buffer,
        n: usize,
    ) {
        let constants = [("WTYPE", type_id(w_t.ty)), ("WG", f64::from(AXPY_WG))];
        let pipeline = self.pipeline(Shader::SparseAxpy, "main", &constants);
        for chunk in &w_t.chunks {
            let lo = rows.partition_point(|&r| (r as usize) < chunk.first);
            let hi = rows.partition_point(|&r| (r as usize) < chunk.first + chunk.rows);
            if hi == lo || n == 0 {
                continue;
            }
            let params = AxpyParams {
                cols: w_t.cols as u32,
                row_bytes: w_t.row_bytes as u32,
                count: (hi - lo) as u32,
                first: lo as u32,
                a_stride: rows.len() as u32,
                row_base: chunk.first as u32,
                n_tokens: n as u32,
                _pad: 0,
            };
            rec.dispatch(
                &pipeline,
                &[&chunk.buffer, a, idx, y],
                &params,
                [(w_t.cols as u32).div_ceil(AXPY_COLUMNS), n as u32, 1],
            );
        }
    }

    /// [`GpuContext::submit_sparse_axpy`], waited for.
    pub fn sparse_axpy(
        &self,
        w_t: &GpuMatrix,
        rows: &[u32],
        a: &[f32],
        n: usize,
    ) -> Result<Vec<f32>> {
        self.submit_sparse_axpy(w_t, rows, a, n)?.wait(self)
    }

    /// PowerInfer's predictor logits `fc2 · relu(fc1 · x)` (`n × fc2.rows`), both layers on the
    /// GPU in one submission. The hidden layer is rounded on the GPU as the CPU's `matmul`
    /// rounds `fc2`'s input, so `fc2` must be F32 or F16.
    ///
    /// Errors: [`Error::UnsupportedType`] for another `fc2` type, [`Error::InvalidArgument`]
    /// for mismatched shapes.
    pub fn predictor(
        &self,
        fc1: &GpuMatrix,
        fc2: &GpuMatrix,
        x: &[f32],
        n: usize,
    ) -> Result<Vec<f32>> {
        if !matches!(fc2.ty, GgmlType::F32 | GgmlType::F16) {
            return Err(Error::UnsupportedType {
                ty: fc2.ty.name(),
                op: "the GPU predictor's second layer",
            });
        }
        if fc2.cols != fc1.rows {
            return Err(Error::InvalidArgument(format!(
                "fc1 has {} outputs, fc2 takes {}",
                fc1.rows, fc2.cols
            )));
        }
        check_x(fc1, x, n)?;
        let acts = self.upload_acts(&mut Workspace::transient(self), 0, fc1.ty, x, n, fc1.cols)?;
        let hidden = self.output("hidden", n * fc1.rows);
        let epilogue = Epilogue {
            relu: true,
            round_f16: fc2.ty == GgmlType::F16,
        };
        let empty = self.storage("empty", &[]);
        let hidden_acts = ActBuffers {
            f: hidden.clone(),
            q: empty.clone(),
            d: empty.clone(),
            b: empty,
        };
        let n_out = n * fc2.rows;
        let y = self.output("logits", n_out);
        let (encoder, ()) = self.record_once(|rec| {
            self.record_matvec(rec, fc1, Rows::All, &acts, n, (&hidden, 0), epilogue);
            let e = Epilogue::default();
            self.record_matvec(rec, fc2, Rows::All, &hidden_acts, n, (&y, 0), e);
            Ok(())
        })?;
        self.submit_read(encoder, &y, n_out).wait(self)
    }
}
