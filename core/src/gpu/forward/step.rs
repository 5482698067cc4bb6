//! One token's forward pass recorded into a command buffer, step by step as the CPU's
//! `engine::session` runs it: per block the attention (norm, QKV with biases, QK-norm, RoPE, KV
//! append, attention, output projection, post-norm, residual) and the FFN (norm; the predictor's
//! mask in sparse mode; gate and up, masked; activation; down as a sparse axpy or a product;
//! post-norm, residual); then the final norm and the LM head.

use super::acts::Kind;
use super::model::{Down, GpuBlock};
use super::session::GpuSession;
use crate::engine::FfnMode;
use crate::gpu::matrix_ops::{Epilogue, Rows};
use crate::gpu::recorder::Recorder;
use crate::gpu::vector_ops::{ffn_act_id, AttentionBuffers};
use crate::gpu::weights::GpuMatrix;
use crate::gpu::{AttentionShape, RopeSettings};
use crate::{Error, Result};

/// One product of a step: the matrix, the rows it computes, where its outputs go, and its
/// post-processing.
struct Product<'a> {
    w: &'a GpuMatrix,
    rows: Rows<'a>,
    y: &'a wgpu::Buffer,
    epilogue: Epilogue,
}

impl<'a> Product<'a> {
    fn all(w: &'a GpuMatrix, y: &'a wgpu::Buffer) -> Product<'a> {
        Product {
            w,
            rows: Rows::All,
            y,
            epilogue: Epilogue::default(),
        }
    }
}

type Encoder<'a> = Recorder<'a>;

impl GpuSession {
    /// Records the forward pass through the model's blocks of the token whose residual (or
    /// embedding) is in `x`, at position `pos`, and (when `logits` and the model has its LM head)
    /// the head into the logits buffer.
    pub(super) fn record_token(
        &self,
        enc: &mut Encoder,
        pos: usize,
        mode: FfnMode,
        logits: bool,
    ) -> Result<()> {
        let m = &*self.model;
        for (i, block) in m.blocks.iter().enumerate() {
            let il = m.layers.start + i;
            self.attention(enc, il, block, pos)?;
            self.feed_forward(enc, il, block, mode)?;
        }
        if let (true, Some(head)) = (logits, &m.head) {
            let s = &self.scratch;
            self.normed_copy(enc, &s.x, &s.h, &head.norm, m.hp.n_embd);
            self.products(enc, &s.h, &[Product::all(&head.output, &s.logits)])?;
        }
        Ok(())
    }

    /// The attention half of block `il`: `x += post_norm(attention(norm(x)))`.
    fn attention(&self, enc: &mut Encoder, il: usize, b: &GpuBlock, pos: usize) -> Result<()> {
        let (m, s) = (&*self.model, &self.scratch);
        let hp = &m.hp;
        let ctx = &*m.ctx;
        self.normed_copy(enc, &s.x, &s.h, &b.attn_norm, hp.n_embd);
        self.products(
            enc,
            &s.h,
            &[
                Product::all(&b.wq, &s.q),
                Product::all(&b.wk, &s.k),
                Product::all(&b.wv, &s.v),
            ],
        )?;
        for (bias, y, n) in [
            (&b.bq, &s.q, hp.q_width()),
            (&b.bk, &s.k, hp.k_width()),
            (&b.bv, &s.v, hp.v_width()),
        ] {
            if let Some(bias) = bias {
                self.add(enc, y, bias, n);
            }
        }
        if let Some(w) = &b.q_norm {
            ctx.record_norm(enc, &s.q, w, hp.head_dim, hp.n_head, hp.rms_eps);
        }
        if let Some(w) = &b.k_norm {
            ctx.record_norm(enc, &s.k, w, hp.head_dim, hp.n_head_kv, hp.rms_eps);
        }
        let swa = hp.swa_layers[il];
        let rope = RopeSettings {
            style: hp.rope_style,
            n_rot: hp.n_rot,
            freq_base: if swa { hp.rope_base_swa } else { hp.rope_base },
            freq_scale: if swa { 1.0 } else { hp.rope_freq_scale },
        };
        ctx.record_rope(enc, &s.q, (hp.n_head, hp.head_dim), rope, pos, 1);
        ctx.record_rope(enc, &s.k, (hp.n_head_kv, hp.head_dim), rope, pos, 1);
        let (keys, values) = &self.kv[il - m.layers.start];
        self.store(enc, &s.k, keys, hp.k_width(), pos);
        self.store(enc, &s.v, values, hp.v_width(), pos);
        let shape = AttentionShape {
            n_head: hp.n_head,
            n_head_kv: hp.n_head_kv,
            head_dim: hp.head_dim,
            head_dim_v: hp.head_dim_v,
            scale: hp.attn_scale,
            window: hp.sliding_window.filter(|_| swa),
        };
        let io = AttentionBuffers {
            q: &s.q,
            keys,
            values,
            scratch: &s.scores,
            out: &s.attn,
        };
        ctx.record_attention(enc, &io, &shape, pos, 1, self.n_ctx);
        self.products(enc, &s.attn, &[Product::all(&b.wo, &s.o)])?;
        if let Some(bo) = &b.bo {
            self.add(enc, &s.o, bo, hp.n_embd);
        }
        self.residual(enc, &s.o, b.post_attn_norm.as_ref());
        Ok(())
    }

    /// The FFN half of block `il`: `x += post_norm(down(act(gate · h, up · h)))` with
    /// `h = norm(x)`; in sparse mode gate and up skip the neurons the predictor (on `x`) rejects.
    fn feed_forward(
        &self,
        enc: &mut Encoder,
        il: usize,
        b: &GpuBlock,
        mode: FfnMode,
    ) -> Result<()> {
        let (m, s) = (&*self.model, &self.scratch);
        let hp = &m.hp;
        let rows = match mode {
            FfnMode::Dense => Rows::All,
            FfnMode::Sparse => {
                self.predict(enc, il, b)?;
                Rows::Mask(&s.mask)
            }
            other => {
                return Err(Error::InvalidArgument(format!(
                    "the GPU-resident forward pass runs --ffn dense or sparse, not {other:?}"
                )))
            }
        };
        self.normed_copy(enc, &s.x, &s.h, &b.ffn_norm, hp.n_embd);
        let product = |w, y| Product {
            w,
            rows,
            y,
            epilogue: Epilogue::default(),
        };
        self.products(
            enc,
            &s.h,
            &[product(&b.gate, &s.gate), product(&b.up, &s.up)],
        )?;
        m.ctx.record_elementwise(
            enc,
            ("combine", &[("ACT", ffn_act_id(hp.ffn_act))]),
            &s.gate,
            &s.up,
            hp.n_ff,
            1.0,
        );
        match &b.down {
            Down::Neurons(down_t) => {
                let kind = Kind::of(down_t.ty)?;
                let a = s.acts.round(enc, kind, &s.gate, hp.n_ff)?;
                enc.clear(&s.ffn_out);
                let (all, all_buf) = &m.all_neurons;
                m.ctx
                    .record_sparse_axpy(enc, down_t, (all, all_buf), &a, &s.ffn_out, 1);
            }
            Down::Rows(down) => {
                self.products(enc, &s.gate, &[Product::all(down, &s.ffn_out)])?;
            }
        }
        self.residual(enc, &s.ffn_out, b.post_ffn_norm.as_ref());
        Ok(())
    }

    /// The predictor's mask: `fc2 · relu(fc1 · x) >= threshold` per neuron (1 or 0).
    fn predict(&self, enc: &mut Encoder, il: usize, b: &GpuBlock) -> Result<()> {
        let (m, s) = (&*self.model, &self.scratch);
        let (fc1, fc2) = b.predictor.as_ref().ok_or_else(|| Error::Tensor {
            tensor: format!("blk.{il}.fc1.weight"),
            message: "the file has no predictor for this layer (use --ffn dense)".into(),
        })?;
        let relu = Product {
            w: fc1,
            rows: Rows::All,
            y: &s.hidden,
            epilogue: Epilogue {
                relu: true,
                round_f16: false,
            },
        };
        self.products(enc, &s.x, &[relu])?;
        self.products(enc, &s.hidden, &[Product::all(fc2, &s.mask)])?;
        let threshold = m.hp.sparse_thresholds[il];
        m.ctx.record_elementwise(
            enc,
            ("threshold", &[]),
            &s.mask,
            &s.up,
            m.hp.n_ff,
            threshold,
        );
        Ok(())
    }

    /// Records `products`, all of the vector `x`: `x` is quantised once per activation format.
    fn products(&self, enc: &mut Encoder, x: &wgpu::Buffer, products: &[Product]) -> Result<()> {
        let ctx = &*self.model.ctx;
        let mut done: Vec<(Kind, crate::gpu::matrix_ops::ActBuffers)> = Vec::new();
        for p in products {
            let kind = Kind::of(p.w.ty)?;
            if !done.iter().any(|(k, _)| *k == kind) {
                let acts = self.scratch.acts.quantize(enc, kind, x, p.w.cols)?;
                done.push((kind, acts));
            }
            let acts = &done.iter().find(|(k, _)| *k == kind).expect("just added").1;
            ctx.record_matvec(enc, p.w, p.rows, acts, 1, (p.y, 0), p.epilogue);
        }
        Ok(())
    }

    /// `dst = norm(src)` with the weights `w` (rows of `n`).
    fn normed_copy(
        &self,
        enc: &mut Encoder,
        src: &wgpu::Buffer,
        dst: &wgpu::Buffer,
        w: &wgpu::Buffer,
        n: usize,
    ) {
        enc.copy((src, 0), (dst, 0), (n * 4) as u64);
        let m = &*self.model;
        m.ctx.record_norm(enc, dst, w, n, 1, m.hp.rms_eps);
    }

    /// `x += post_norm(y)` (or `x += y`).
    fn residual(&self, enc: &mut Encoder, y: &wgpu::Buffer, post_norm: Option<&wgpu::Buffer>) {
        let m = &*self.model;
        if let Some(w) = post_norm {
            m.ctx.record_norm(enc, y, w, m.hp.n_embd, 1, m.hp.rms_eps);
        }
        self.add(enc, &self.scratch.x, y, m.hp.n_embd);
    }

    /// `x += y` over `n` values.
    fn add(&self, enc: &mut Encoder, x: &wgpu::Buffer, y: &wgpu::Buffer, n: usize) {
        self.model
            .ctx
            .record_elementwise(enc, ("add", &[]), x, y, n, 1.0);
    }

    /// Appends `x` (`width` values) to a layer's cache at `pos`.
    fn store(
        &self,
        enc: &mut Encoder,
        x: &wgpu::Buffer,
        cache: &wgpu::Buffer,
        width: usize,
        pos: usize,
    ) {
        self.model.ctx.record_kv_store(enc, x, cache, width, pos);
    }
}
