//! A GPU segment: consecutive blocks of a model whose other layers run on the CPU
//! (llama.cpp-style layer offload). The CPU hands over the residual stream of a run of tokens,
//! the GPU runs the segment's blocks on it (their KV cache lives there) and hands it back: the
//! residual crosses the bus once each way per segment and submission.

use std::ops::Range;

use super::model::block_bytes;
use super::session::{session_bytes, GpuSession};
use crate::model::Model;
use crate::placement::segment::LayerCost;

/// What each of `model`'s layers costs on the GPU as part of a segment whose sessions hold
/// `n_ctx` positions (weights and KV cache), and the bytes of a segment session's working
/// vectors: the inputs of [`crate::placement::segment::dense_segment`].
pub fn segment_costs(model: &Model, n_ctx: usize) -> (Vec<LayerCost>, u64) {
    let scratch = session_bytes(model, 0, n_ctx, false);
    let kv_cache = session_bytes(model, 1, n_ctx, false) - scratch;
    let layers = (0..model.hp.n_layer)
        .map(|il| LayerCost {
            weights: block_bytes(model, il),
            kv_cache,
        })
        .collect();
    (layers, scratch)
}

impl GpuSession {
    /// The layers this session runs (all of them for a whole model).
    pub fn layers(&self) -> Range<usize> {
        self.model.layers()
    }

    /// Whether this session runs the whole model (`submit`) rather than a segment
    /// (`run_segment`).
    pub fn is_whole(&self) -> bool {
        self.model.is_whole()
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod native {
    use std::sync::atomic::Ordering;

    use super::super::readback::PendingLogits;
    use super::super::session::{GpuSession, MAX_TOKENS_PER_SUBMIT};
    use crate::engine::FfnMode;
    use crate::{Error, Result};

    impl GpuSession {
        /// Runs this session's segment of layers ([`super::GpuModel::upload_segment`]) on the
        /// residual stream `x` of `x.len() / n_embd` consecutive tokens at positions `pos, pos + 1, …`,
        /// with the FFN in `mode`, and returns the stream after the segment's last block: up to
        /// [`MAX_TOKENS_PER_SUBMIT`] tokens per submission, each with one upload and one read-back.
        /// The segment's cache then holds positions up to the last token's.
        ///
        /// Errors: [`Error::InvalidArgument`] for a whole model (use `submit`), a stream that is not
        /// whole rows, a position past the cached ones, or a full context; [`Error::Gpu`] when the
        /// read-back fails.
        pub fn run_segment(&mut self, x: &[f32], pos: usize, mode: FfnMode) -> Result<Vec<f32>> {
            let n_embd = self.model.hp.n_embd;
            if self.model.is_whole() {
                return Err(Error::InvalidArgument(
                    "this GPU model is the whole model: run it with submit".into(),
                ));
            }
            if x.is_empty() || !x.len().is_multiple_of(n_embd) {
                return Err(Error::InvalidArgument(format!(
                    "a residual stream of {} values is not whole rows of {n_embd}",
                    x.len()
                )));
            }
            let n = x.len() / n_embd;
            if pos > self.n_past || pos + n > self.n_ctx {
                return Err(Error::InvalidArgument(format!(
                "{n} tokens at position {pos} do not follow the {} cached positions of a context of {}",
                self.n_past, self.n_ctx
            )));
            }
            let mut out = Vec::with_capacity(x.len());
            for (c, rows) in x.chunks(MAX_TOKENS_PER_SUBMIT * n_embd).enumerate() {
                let first = pos + c * MAX_TOKENS_PER_SUBMIT;
                out.extend(self.submit_residual(rows, first, mode)?.wait()?);
                self.n_past = first + rows.len() / n_embd;
            }
            Ok(out)
        }

        /// Records and submits the segment on up to [`MAX_TOKENS_PER_SUBMIT`] rows of `x` at
        /// positions from `pos`: one upload, each token's blocks, one copy of each token's output
        /// row into the read-back buffer.
        fn submit_residual(
            &mut self,
            x: &[f32],
            pos: usize,
            mode: FfnMode,
        ) -> Result<PendingLogits> {
            let ctx = self.model.ctx.clone();
            let n_embd = self.model.hp.n_embd;
            let n = x.len() / n_embd;
            ctx.queue
                .write_buffer(&self.scratch.embd, 0, bytemuck::cast_slice(x));
            let row_bytes = (n_embd * 4) as u64;
            let staging = self.staging.take(&ctx, row_bytes * n as u64);
            let mut binder = self.binder.lock().unwrap_or_else(|e| e.into_inner());
            let recorded = ctx.record(&mut binder, |rec| {
                for t in 0..n {
                    let row = t as u64 * row_bytes;
                    rec.copy((&self.scratch.embd, row), (&self.scratch.x, 0), row_bytes);
                    self.record_token(rec, pos + t, mode, false)?;
                    rec.copy((&self.scratch.x, 0), (&staging.0, row), row_bytes);
                }
                Ok(())
            });
            drop(binder);
            let (encoder, ()) =
                recorded.inspect_err(|_| staging.1.store(true, Ordering::Release))?;
            ctx.queue.submit([encoder.finish()]);
            Ok(PendingLogits::new(&ctx.device, staging, n * n_embd, None))
        }
    }
}
