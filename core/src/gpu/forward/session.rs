//! A sequence evaluated on the GPU: its KV cache and working vectors live there; each call
//! records a run of tokens into one command buffer, submits it once and reads the logits back once.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use super::acts::ActSets;
use super::model::{widths, GpuModel};
use super::readback::{PendingLogits, StagingPool};
use crate::engine::{embed_tokens, FfnMode, Logits};
use crate::gpu::recorder::Binder;
use crate::model::{HyperParams, Model};
use crate::{Error, Result};

/// Tokens recorded into one command buffer at most (bounds the staging memory of `Logits::All`).
pub const MAX_TOKENS_PER_SUBMIT: usize = 32;

/// The working vectors of one token's forward pass.
pub(super) struct Scratch {
    /// The embeddings of the tokens being recorded (`tokens × n_embd`).
    pub embd: wgpu::Buffer,
    pub x: wgpu::Buffer,
    pub h: wgpu::Buffer,
    pub q: wgpu::Buffer,
    pub k: wgpu::Buffer,
    pub v: wgpu::Buffer,
    pub attn: wgpu::Buffer,
    pub scores: wgpu::Buffer,
    pub o: wgpu::Buffer,
    pub gate: wgpu::Buffer,
    pub up: wgpu::Buffer,
    pub ffn_out: wgpu::Buffer,
    pub hidden: wgpu::Buffer,
    pub mask: wgpu::Buffer,
    pub logits: wgpu::Buffer,
    pub acts: ActSets,
}

/// One sequence on a [`GpuModel`]: KV cache and position.
pub struct GpuSession {
    pub(super) model: Arc<GpuModel>,
    pub(super) scratch: Scratch,
    /// Keys and values of each layer (f16 pairs per u32, position-major).
    pub(super) kv: Vec<(wgpu::Buffer, wgpu::Buffer)>,
    pub(super) n_ctx: usize,
    pub(super) n_past: usize,
    /// The parameter ring and the bind groups of this session's buffers.
    pub(super) binder: Mutex<Binder>,
    pub(super) staging: StagingPool,
}

/// The lengths (f32) of the [`Scratch`] vectors, in field order: `hidden` is the predictors'
/// widest hidden layer, `head` whether there is an LM head (its logits).
fn scratch_lens(
    hp: &HyperParams,
    n_ctx: usize,
    hidden: usize,
    head: bool,
) -> [(&'static str, usize); 15] {
    [
        ("embd", MAX_TOKENS_PER_SUBMIT * hp.n_embd),
        ("x", hp.n_embd),
        ("h", hp.n_embd),
        ("q", hp.q_width()),
        ("k", hp.k_width()),
        ("v", hp.v_width()),
        ("attn", hp.n_head * hp.head_dim_v),
        ("scores", hp.n_head * n_ctx),
        ("o", hp.n_embd),
        ("gate", hp.n_ff),
        ("up", hp.n_ff),
        ("ffn_out", hp.n_embd),
        ("hidden", hidden),
        ("mask", hp.n_ff),
        ("logits", if head { hp.n_vocab } else { 1 }),
    ]
}

/// The two f16 vectors of one layer's KV cache, in u32 words: keys, values.
fn kv_words(hp: &HyperParams, n_ctx: usize) -> [usize; 2] {
    [
        (n_ctx * hp.k_width()).div_ceil(2),
        (n_ctx * hp.v_width()).div_ceil(2),
    ]
}

/// Bytes a [`GpuSession`] of `n_ctx` positions allocates on the GPU for `n_layers` layers of
/// `model` (with the LM head's logits when `head`): the KV cache (f16) and the working vectors.
pub fn session_bytes(model: &Model, n_layers: usize, n_ctx: usize, head: bool) -> u64 {
    let (max_cols, hidden) = widths(model);
    let hp = &model.hp;
    let scratch: usize = scratch_lens(hp, n_ctx, hidden, head)
        .iter()
        .map(|(_, n)| n.max(&1))
        .sum();
    let kv: usize = kv_words(hp, n_ctx).iter().map(|n| n.max(&1)).sum();
    4 * (scratch + n_layers * kv) as u64 + ActSets::bytes(max_cols)
}

impl GpuSession {
    /// A new sequence of up to `n_ctx` positions on `model`.
    ///
    /// Errors: [`Error::InvalidArgument`] for `n_ctx == 0` or a layer's cache larger than a storage
    /// binding.
    pub fn new(model: Arc<GpuModel>, n_ctx: usize) -> Result<GpuSession> {
        let ctx = &model.ctx;
        let hp = &model.hp;
        let cache_bytes = (n_ctx * hp.k_width().max(hp.v_width()) * 2) as u64;
        if n_ctx == 0 || cache_bytes > ctx.max_binding_bytes() {
            return Err(Error::InvalidArgument(format!(
                "a context of {n_ctx} positions does not fit the GPU's KV cache (at most {} bytes per layer)",
                ctx.max_binding_bytes()
            )));
        }
        let lens = scratch_lens(hp, n_ctx, model.hidden, model.is_whole());
        let [embd, x, h, q, k, v, attn, scores, o, gate, up, ffn_out, hidden, mask, logits] =
            lens.map(|(label, n)| ctx.output(label, n));
        let scratch = Scratch {
            embd,
            x,
            h,
            q,
            k,
            v,
            attn,
            scores,
            o,
            gate,
            up,
            ffn_out,
            hidden,
            mask,
            logits,
            acts: ActSets::new(ctx, model.max_cols),
        };
        let kv = model
            .layers
            .clone()
            .map(|_| {
                let [keys, values] = kv_words(hp, n_ctx);
                (ctx.output("keys", keys), ctx.output("values", values))
            })
            .collect();
        let binder = Mutex::new(Binder::new(ctx, true));
        Ok(GpuSession {
            model,
            scratch,
            kv,
            n_ctx,
            n_past: 0,
            binder,
            staging: StagingPool::default(),
        })
    }

    /// Positions already in the cache.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Context capacity.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Forgets everything from position `pos` on.
    pub fn truncate(&mut self, pos: usize) {
        self.n_past = self.n_past.min(pos);
    }

    /// Appends `tokens` (at most 32; `model` is the one this GPU model was uploaded from) and
    /// submits their forward passes, with the FFN in `mode`, as one command buffer; the returned
    /// future reads back the last token's logits or every token's (`tokens.len() × n_vocab`).
    ///
    /// Errors: [`Error::InvalidArgument`] for bad tokens, a full context, a mode the model was not
    /// uploaded for, or another model.
    pub fn submit(
        &mut self,
        model: &Model,
        tokens: &[u32],
        which: Logits,
        mode: FfnMode,
    ) -> Result<PendingLogits> {
        let hp = &self.model.hp;
        if !self.model.is_whole() {
            return Err(Error::InvalidArgument(format!(
                "this GPU model holds layers {:?} only: run it with run_segment",
                self.model.layers
            )));
        }
        if model.hp.n_embd != hp.n_embd || model.hp.n_vocab != hp.n_vocab {
            return Err(Error::InvalidArgument(
                "this GPU model was uploaded from another model".into(),
            ));
        }
        if tokens.len() > MAX_TOKENS_PER_SUBMIT {
            return Err(Error::InvalidArgument(format!(
                "at most {MAX_TOKENS_PER_SUBMIT} tokens per GPU submission, got {}",
                tokens.len()
            )));
        }
        crate::engine::check_tokens(model, tokens, self.n_past, self.n_ctx)?;
        let embd = embed_tokens(model, tokens, self.n_past)?;
        let ctx = self.model.ctx.clone();
        ctx.queue
            .write_buffer(&self.scratch.embd, 0, bytemuck::cast_slice(&embd));
        let n_out = match which {
            Logits::All => tokens.len(),
            Logits::Last => 1,
        };
        let n_vocab = hp.n_vocab;
        let row_bytes = (n_vocab * 4) as u64;
        let staging = self.staging.take(&ctx, row_bytes * n_out as u64);
        let embd_bytes = (hp.n_embd * 4) as u64;
        let mut binder = self.binder.lock().unwrap_or_else(|e| e.into_inner());
        let recorded = ctx.record(&mut binder, |rec| {
            for t in 0..tokens.len() {
                let embd = (&self.scratch.embd, t as u64 * embd_bytes);
                rec.copy(embd, (&self.scratch.x, 0), embd_bytes);
                let last = t + 1 == tokens.len();
                let pos = self.n_past + t;
                self.record_token(rec, pos, mode, which == Logits::All || last)?;
                let slot = match which {
                    Logits::All => t,
                    Logits::Last if last => 0,
                    Logits::Last => continue,
                };
                let dst = (&staging.0, slot as u64 * row_bytes);
                rec.copy((&self.scratch.logits, 0), dst, row_bytes);
            }
            Ok(())
        });
        drop(binder);
        let (encoder, ()) = recorded.inspect_err(|_| staging.1.store(true, Ordering::Release))?;
        ctx.queue.submit([encoder.finish()]);
        self.n_past += tokens.len();
        Ok(PendingLogits::new(
            &ctx.device,
            staging,
            n_out * n_vocab,
            hp.final_logit_softcap,
        ))
    }
}
