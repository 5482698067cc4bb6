//! A session: one sequence being evaluated, with its KV cache and position.

use std::sync::Arc;

use super::attention::{attend, AttentionShape};
use super::awake::with_awake_workers;
use super::ffn::{feed_forward, FfnDensity, FfnMode, FfnObserver};
use super::kv_cache::KvCache;
use super::linear::{DenseLinear, Linear, Proj};
use super::norm::{norm_rows, norm_rows_in_place};
use super::offload::{CpuFfn, FfnOffload};
use super::parallel::parallel_residual;
use super::positions::add_learned_positions;
use super::teal::Teal;
use rayon::prelude::*;

use crate::cpu;
use crate::cpu::ops::{self, Rope};
use crate::model::{LayerWeights, Model, Norm};
use crate::{Error, Result};

/// Which logits an evaluation returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token's (generation).
    Last,
    /// Every token's, `n × n_vocab` (perplexity).
    All,
}

/// Tokens evaluated per forward batch (llama.cpp's default `n_ubatch`).
const MAX_BATCH: usize = 512;

/// One sequence being evaluated: the KV cache and the number of positions already filled.
pub struct Session<'m> {
    fwd: Forward<'m>,
    pool: Arc<rayon::ThreadPool>,
    cache: KvCache,
    n_past: usize,
    /// The whole forward pass on the GPU instead, when set.
    #[cfg(all(feature = "gpu", not(target_arch = "wasm32")))]
    gpu: Option<crate::gpu::forward::GpuSession>,
}

/// One sequence's share of a forward batch: its cache, the positions it already holds, and how
/// many consecutive rows of the batch (tokens) are its.
pub(super) struct SeqRows<'c> {
    /// The sequence's cache.
    pub cache: &'c mut KvCache,
    /// Positions the cache already holds.
    pub n_past: usize,
    /// Rows of the batch that belong to the sequence.
    pub n: usize,
}

/// What the forward pass shares between the sequences it evaluates: the model, the RoPE tables,
/// the FFN mode, the density counters, the FFN observer and the operators of the projections.
pub(super) struct Forward<'m> {
    model: &'m Model,
    rope_global: Rope,
    rope_swa: Rope,
    ffn_mode: FfnMode,
    density: FfnDensity,
    observer: Option<FfnObserver>,
    offload: Arc<dyn FfnOffload>,
    /// The attention projections' operator (decode; see [`Forward::ops`]).
    linear: Arc<dyn Linear>,
    /// The FFN products of a dense prompt-processing batch when `offload` is a sparse operator.
    dense_offload: Arc<dyn FfnOffload>,
    /// Training-free sparsity also on prompt processing.
    sparse_prefill: bool,
    /// Whether the batch in progress processes a prompt (some sequence has more than one row).
    prefill: bool,
}

/// The operators of one forward step: the projections', the FFN's and its mode.
struct Ops {
    linear: Arc<dyn Linear>,
    offload: Arc<dyn FfnOffload>,
    ffn_mode: FfnMode,
}

impl<'m> Session<'m> {
    /// A new session of up to `n_ctx` positions, running its kernels on `pool`.
    pub fn new(model: &'m Model, n_ctx: usize, pool: Arc<rayon::ThreadPool>) -> Session<'m> {
        Session {
            fwd: Forward::new(model),
            pool,
            cache: KvCache::new(&model.hp, n_ctx),
            n_past: 0,
            #[cfg(all(feature = "gpu", not(target_arch = "wasm32")))]
            gpu: None,
        }
    }

    /// Runs this session's whole forward pass on the GPU, on `gpu` (uploaded from this session's
    /// model): KV cache and activations live there, one submission and one read-back per call
    /// of [`Session::eval`] (per 32 tokens). A segment (`GpuModel::upload_segment`) runs only
    /// its layers there, on the residual stream the CPU hands over once per evaluation (per 32
    /// tokens) and takes back. Only before the first token.
    ///
    /// Errors: [`Error::InvalidArgument`] after tokens were evaluated, or for a model or FFN mode
    /// the resident pass does not run ([`crate::gpu::forward::check_supported`]).
    #[cfg(all(feature = "gpu", not(target_arch = "wasm32")))]
    pub fn set_gpu_model(&mut self, gpu: Arc<crate::gpu::forward::GpuModel>) -> Result<()> {
        if self.n_past > 0 {
            return Err(Error::InvalidArgument(
                "the GPU model must be set before the first token".into(),
            ));
        }
        crate::gpu::forward::check_supported(self.fwd.model, self.fwd.ffn_mode)?;
        self.gpu = Some(crate::gpu::forward::GpuSession::new(gpu, self.n_ctx())?);
        Ok(())
    }

    /// Whether the whole forward pass runs on the GPU ([`Session::set_gpu_model`] with a whole
    /// model).
    pub fn on_gpu(&self) -> bool {
        #[cfg(all(feature = "gpu", not(target_arch = "wasm32")))]
        return self.gpu.as_ref().is_some_and(|g| g.is_whole());
        #[cfg(not(all(feature = "gpu", not(target_arch = "wasm32"))))]
        false
    }

    /// Chooses where the FFN's matrix products run (default: [`CpuFfn`]).
    pub fn set_ffn_offload(&mut self, offload: Arc<dyn FfnOffload>) {
        self.fwd.dense_offload = offload.clone();
        self.fwd.offload = offload;
    }

    /// Runs the attention projections through `linear` (default: [`DenseLinear`]).
    pub fn set_linear(&mut self, linear: Arc<dyn Linear>) {
        self.fwd.linear = linear;
    }

    /// Runs the block's projections through `teal`'s input-sparse operators (FFN mode `Dense`:
    /// TEAL thresholds the FFN's inputs itself). Prompt processing keeps the dense operators
    /// unless [`Session::set_sparse_prefill`].
    pub fn set_teal(&mut self, teal: Arc<Teal>) {
        self.fwd.set_teal(teal);
    }

    /// Whether training-free sparsity (CATS, TEAL) also applies to prompt processing (a batch in
    /// which some sequence has more than one token); default: dense prompts.
    pub fn set_sparse_prefill(&mut self, on: bool) {
        self.fwd.set_sparse_prefill(on);
    }

    /// Installs (or removes) a callback that sees every layer's FFN input and activations. An
    /// observer needs the CPU pass: installing one turns the GPU-resident pass off (and forgets
    /// the sequence when it had tokens there).
    pub fn set_ffn_observer(&mut self, observer: Option<FfnObserver>) {
        #[cfg(all(feature = "gpu", not(target_arch = "wasm32")))]
        if observer.is_some() && self.gpu.take().is_some() {
            self.n_past = 0;
        }
        self.fwd.observer = observer;
    }

    /// Chooses how the FFN picks its neurons (default: `Sparse` when every layer has a
    /// predictor, else `Dense`). `Sparse` on a file without predictors is an error.
    pub fn set_ffn_mode(&mut self, mode: FfnMode) -> Result<()> {
        #[cfg(all(feature = "gpu", not(target_arch = "wasm32")))]
        if self.gpu.is_some() {
            crate::gpu::forward::check_supported(self.fwd.model, mode)?;
        }
        self.fwd.set_ffn_mode(mode)
    }

    /// The FFN mode in use.
    pub fn ffn_mode(&self) -> FfnMode {
        self.fwd.ffn_mode
    }

    /// Neurons computed per token so far, per layer.
    pub fn ffn_density(&self) -> &FfnDensity {
        &self.fwd.density
    }

    /// Positions already in the cache.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Context capacity.
    pub fn n_ctx(&self) -> usize {
        self.cache.n_ctx()
    }

    /// Forgets everything from position `pos` on (e.g. to reuse a shared prompt prefix).
    pub fn truncate(&mut self, pos: usize) {
        self.n_past = self.n_past.min(pos);
        #[cfg(all(feature = "gpu", not(target_arch = "wasm32")))]
        if let Some(gpu) = &mut self.gpu {
            gpu.truncate(pos);
        }
    }

    /// Appends `tokens` to the sequence and returns their logits (the last token's, or all).
    pub fn eval(&mut self, tokens: &[u32], which: Logits) -> Result<Vec<f32>> {
        check_tokens(self.fwd.model, tokens, self.n_past, self.n_ctx())?;
        #[cfg(all(feature = "gpu", not(target_arch = "wasm32")))]
        if let Some(gpu) = self.gpu.as_mut().filter(|g| g.is_whole()) {
            let mut logits = Vec::new();
            for chunk in tokens.chunks(crate::gpu::forward::MAX_TOKENS_PER_SUBMIT) {
                let pending = gpu.submit(self.fwd.model, chunk, which, self.fwd.ffn_mode)?;
                let chunk_logits = pending.wait()?;
                self.n_past += chunk.len();
                if which == Logits::All {
                    logits.extend_from_slice(&chunk_logits);
                } else {
                    logits = chunk_logits;
                }
            }
            return Ok(logits);
        }
        let pool = self.pool.clone();
        pool.install(|| {
            with_awake_workers(|| {
                let mut logits = Vec::new();
                for chunk in tokens.chunks(MAX_BATCH) {
                    let n = chunk.len();
                    let out_rows: Vec<usize> = match which {
                        Logits::All => (0..n).collect(),
                        Logits::Last => vec![n - 1],
                    };
                    let chunk_logits = self.forward_chunk(chunk, &out_rows)?;
                    self.n_past += n;
                    if which == Logits::All {
                        logits.extend_from_slice(&chunk_logits);
                    } else {
                        logits = chunk_logits;
                    }
                }
                Ok(logits)
            })
        })
    }
}

impl Session<'_> {
    /// One forward batch of this session's `tokens` on the CPU, the layers of a GPU segment
    /// ([`Session::set_gpu_model`]) excepted; the logits of the rows `out_rows`.
    fn forward_chunk(&mut self, tokens: &[u32], out_rows: &[usize]) -> Result<Vec<f32>> {
        let mut seq = [SeqRows {
            cache: &mut self.cache,
            n_past: self.n_past,
            n: tokens.len(),
        }];
        #[cfg(all(feature = "gpu", not(target_arch = "wasm32")))]
        if let Some(gpu) = &mut self.gpu {
            let (pos, mode) = (self.n_past, self.fwd.ffn_mode);
            let layers = gpu.layers();
            let mut run = |x: &[f32]| gpu.run_segment(x, pos, mode);
            let segment = Segment {
                layers,
                run: &mut run,
            };
            return self
                .fwd
                .forward_with(tokens, &mut seq, out_rows, Some(segment));
        }
        self.fwd.forward(tokens, &mut seq, out_rows)
    }
}

/// Consecutive layers another device runs (a GPU segment): `run` takes the residual stream
/// before layer `layers.start` and returns it after layer `layers.end - 1`.
pub(super) struct Segment<'a> {
    /// The layers the segment runs.
    pub layers: std::ops::Range<usize>,
    /// Runs them on the residual stream.
    pub run: &'a mut dyn FnMut(&[f32]) -> Result<Vec<f32>>,
}

/// The embeddings (`tokens.len() × n_embd`) of `tokens` at positions `pos0, pos0 + 1, …`: the
/// dequantised rows, scaled by the model's embedding scale, plus learned positions (OPT).
pub(crate) fn embed_tokens(model: &Model, tokens: &[u32], pos0: usize) -> Result<Vec<f32>> {
    let hp = &model.hp;
    let table = model.matrix(&model.token_embd);
    let mut x = vec![0f32; tokens.len() * hp.n_embd];
    for (row, &t) in x.chunks_exact_mut(hp.n_embd).zip(tokens) {
        cpu::dequantize_row(&table, t as usize, row)?;
        if hp.embed_scale != 1.0 {
            ops::scale(row, hp.embed_scale);
        }
    }
    add_learned_positions(model, &mut x, pos0)?;
    Ok(x)
}

/// Checks that `tokens` are non-empty, in the vocabulary and fit after `n_past` positions of a
/// context of `n_ctx`.
pub(crate) fn check_tokens(
    model: &Model,
    tokens: &[u32],
    n_past: usize,
    n_ctx: usize,
) -> Result<()> {
    if tokens.is_empty() {
        return Err(Error::InvalidArgument("no tokens to evaluate".into()));
    }
    if n_past + tokens.len() > n_ctx {
        return Err(Error::InvalidArgument(format!(
            "{} tokens after {n_past} already in the context exceed the context size of {n_ctx} (use a larger -c)",
            tokens.len(),
        )));
    }
    let n_vocab = model.hp.n_vocab;
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
        return Err(Error::InvalidArgument(format!(
            "token id {bad} is outside the vocabulary of {n_vocab}"
        )));
    }
    Ok(())
}

impl<'m> Forward<'m> {
    /// The shared state for `model`, with its default FFN mode.
    pub(super) fn new(model: &'m Model) -> Forward<'m> {
        let hp = &model.hp;
        Forward {
            model,
            rope_global: Rope::new(hp.rope_style, hp.n_rot, hp.rope_base, hp.rope_freq_scale),
            rope_swa: Rope::new(hp.rope_style, hp.n_rot, hp.rope_base_swa, 1.0),
            ffn_mode: default_ffn_mode(model),
            density: FfnDensity::new(hp.n_layer, hp.n_ff),
            observer: None,
            offload: Arc::new(CpuFfn),
            linear: Arc::new(DenseLinear),
            dense_offload: Arc::new(CpuFfn),
            sparse_prefill: false,
            prefill: false,
        }
    }

    /// See [`Session::set_teal`].
    pub(super) fn set_teal(&mut self, teal: Arc<Teal>) {
        self.linear = teal.clone();
        self.offload = teal;
        self.ffn_mode = FfnMode::Dense;
    }

    /// Runs every projection through `linear` and the FFN's products through `offload`, prompt
    /// batches included (TEAL's measured calibration runs one block under trial thresholds).
    pub(super) fn set_operators(&mut self, linear: Arc<dyn Linear>, offload: Arc<dyn FfnOffload>) {
        self.linear = linear;
        self.dense_offload = offload.clone();
        self.offload = offload;
        self.sparse_prefill = true;
    }

    /// See [`Session::set_sparse_prefill`].
    pub(super) fn set_sparse_prefill(&mut self, on: bool) {
        self.sparse_prefill = on;
    }

    /// See [`Session::set_ffn_mode`].
    pub(super) fn set_ffn_mode(&mut self, mode: FfnMode) -> Result<()> {
        if mode == FfnMode::Cats && self.model.hp.cats_thresholds.is_none() {
            return Err(Error::InvalidArgument(
                super::ffn::CATS_NEEDS_THRESHOLDS.into(),
            ));
        }
        if mode == FfnMode::Sparse && self.model.layers.iter().any(|l| l.predictor.is_none()) {
            return Err(Error::InvalidArgument(
                "--ffn sparse needs a predictor (blk.N.fc1/fc2) in every layer; use --ffn oracle or dense".into(),
            ));
        }
        self.ffn_mode = mode;
        Ok(())
    }

    /// The model.
    pub(super) fn model(&self) -> &'m Model {
        self.model
    }

    /// The FFN mode in use.
    pub(super) fn ffn_mode(&self) -> FfnMode {
        self.ffn_mode
    }

    /// Neurons computed per token so far, per layer.
    pub(super) fn density(&self) -> &FfnDensity {
        &self.density
    }

    /// One forward batch: `tokens` are the rows of `seqs`, one sequence after the other. Runs the
    /// embeddings and every block (each weight read once for all rows, attention per sequence on
    /// its own cache), then the final norm and the LM head on the rows `out_rows`, whose logits it
    /// returns (`out_rows.len() × n_vocab`). The caller advances each sequence's `n_past`.
    pub(super) fn forward(
        &mut self,
        tokens: &[u32],
        seqs: &mut [SeqRows],
        out_rows: &[usize],
    ) -> Result<Vec<f32>> {
        self.forward_with(tokens, seqs, out_rows, None)
    }

    /// [`Forward::forward`] with the layers of `segment` run by it instead of the CPU.
    pub(super) fn forward_with(
        &mut self,
        tokens: &[u32],
        seqs: &mut [SeqRows],
        out_rows: &[usize],
        mut segment: Option<Segment>,
    ) -> Result<Vec<f32>> {
        let mut x = self.embed(tokens, seqs)?;
        self.prefill = seqs.iter().any(|s| s.n > 1);
        let mut il = 0;
        while il < self.model.hp.n_layer {
            match &mut segment {
                Some(s) if s.layers.start == il && !s.layers.is_empty() => {
                    x = (s.run)(&x)?;
                    il = s.layers.end;
                }
                _ => {
                    self.block(il, &mut x, seqs)?;
                    il += 1;
                }
            }
        }
        self.logits(&x, out_rows)
    }

    /// The final norm and the LM head on the rows `out_rows` of the residual stream `x`.
    fn logits(&self, x: &[f32], out_rows: &[usize]) -> Result<Vec<f32>> {
        let hp = &self.model.hp;
        let mut normed = Vec::with_capacity(out_rows.len() * hp.n_embd);
        for &r in out_rows {
            normed.extend_from_slice(&x[r * hp.n_embd..(r + 1) * hp.n_embd]);
        }
        norm_rows_in_place(hp, &self.model.output_norm, &mut normed);
        let mut logits = self.matmul(&self.model.output, &normed, out_rows.len())?;
        if let Some(cap) = hp.final_logit_softcap {
            logits.iter_mut().for_each(|l| *l = (*l / cap).tanh() * cap);
        }
        Ok(logits)
    }

    /// The token embeddings of the batch's rows, with each sequence's learned positions (OPT).
    pub(super) fn embed(&self, tokens: &[u32], seqs: &[SeqRows]) -> Result<Vec<f32>> {
        let n_embd = self.model.hp.n_embd;
        let mut x = Vec::with_capacity(tokens.len() * n_embd);
        let mut rest = tokens;
        for seq in seqs {
            let (rows, tail) = rest.split_at(seq.n);
            x.extend(embed_tokens(self.model, rows, seq.n_past)?);
            rest = tail;
        }
        Ok(x)
    }

    /// One transformer block on the residual stream `x` (the rows of `seqs`).
    pub(super) fn block(&mut self, il: usize, x: &mut [f32], seqs: &mut [SeqRows]) -> Result<()> {
        let layer = &self.model.layers[il];
        let n = x.len() / self.model.hp.n_embd;
        let h = self.norm_rows(x, &layer.attn_norm);
        if self.model.hp.arch.parallel_attention() {
            let attn_in = match &layer.attn_norm_2 {
                Some(norm) => self.norm_rows(x, norm),
                None => h.clone(),
            };
            let attn = self.self_attention(il, layer, &attn_in, seqs)?;
            let ffn = self.feed_forward(il, x, &h, n)?;
            parallel_residual(x, &attn, ffn);
            return Ok(());
        }
        let attn = self.self_attention(il, layer, &h, seqs)?;
        residual_add(
            x,
            attn,
            layer.post_attn_norm.as_deref(),
            self.model.hp.rms_eps,
        );
        let h = self.norm_rows(x, &layer.ffn_norm);
        let ffn = self.feed_forward(il, x, &h, n)?;
        residual_add(
            x,
            ffn,
            layer.post_ffn_norm.as_deref(),
            self.model.hp.rms_eps,
        );
        Ok(())
    }

    /// The operators of the step in progress: a prompt-processing batch runs training-free
    /// sparsity's operators densely unless sparse prefill is on.
    fn ops(&self) -> Ops {
        if self.prefill && !self.sparse_prefill {
            let ffn_mode = match self.ffn_mode {
                FfnMode::Cats => FfnMode::Dense,
                mode => mode,
            };
            return Ops {
                linear: Arc::new(DenseLinear),
                offload: self.dense_offload.clone(),
                ffn_mode,
            };
        }
        Ops {
            linear: self.linear.clone(),
            offload: self.offload.clone(),
            ffn_mode: self.ffn_mode,
        }
    }

    /// The FFN of layer `il`: `x` is the predictor's input, `h` the normed FFN input.
    fn feed_forward(&mut self, il: usize, x: &[f32], h: &[f32], n: usize) -> Result<Vec<f32>> {
        let Ops {
            offload, ffn_mode, ..
        } = self.ops();
        feed_forward(
            self.model,
            &*offload,
            ffn_mode,
            il,
            x,
            h,
            n,
            &mut self.density,
            self.observer.as_mut(),
        )
    }

    /// Self-attention of layer `il` on the normed input `h` (`n` rows).
    fn self_attention(
        &mut self,
        il: usize,
        layer: &LayerWeights,
        h: &[f32],
        seqs: &mut [SeqRows],
    ) -> Result<Vec<f32>> {
        let hp = &self.model.hp;
        let n = h.len() / hp.n_embd;
        // The three projections run as one parallel region (nested rayon tasks), so the workers
        // synchronise once instead of three times.
        let ops = self.ops();
        let linear = &*ops.linear;
        let (q, (k, v)) = rayon::join(
            || self.projection(linear, il, Proj::Q, layer.bq.as_deref(), h, n),
            || {
                rayon::join(
                    || self.projection(linear, il, Proj::K, layer.bk.as_deref(), h, n),
                    || self.projection(linear, il, Proj::V, layer.bv.as_deref(), h, n),
                )
            },
        );
        let (mut q, mut k, v) = (q?, k?, v?);
        if let Some(w) = &layer.q_norm {
            q.chunks_exact_mut(hp.head_dim)
                .for_each(|head| ops::rms_norm(head, w, hp.rms_eps));
        }
        if let Some(w) = &layer.k_norm {
            k.chunks_exact_mut(hp.head_dim)
                .for_each(|head| ops::rms_norm(head, w, hp.rms_eps));
        }
        let swa = hp.swa_layers[il];
        let rope = if swa {
            &self.rope_swa
        } else {
            &self.rope_global
        };
        let positions = seqs.iter().flat_map(|s| s.n_past..s.n_past + s.n);
        let mut angles = Vec::new();
        for (t, pos) in positions.enumerate() {
            rope.angles(pos, &mut angles);
            rope.apply(
                &mut q[t * hp.q_width()..(t + 1) * hp.q_width()],
                hp.head_dim,
                &angles,
            );
            rope.apply(
                &mut k[t * hp.k_width()..(t + 1) * hp.k_width()],
                hp.head_dim,
                &angles,
            );
        }
        let mut t = 0;
        for seq in seqs.iter_mut() {
            seq.cache.store(
                il,
                seq.n_past,
                &k[t * hp.k_width()..(t + seq.n) * hp.k_width()],
                &v[t * hp.v_width()..(t + seq.n) * hp.v_width()],
            );
            t += seq.n;
        }
        let shape = AttentionShape {
            n_head: hp.n_head,
            n_head_kv: hp.n_head_kv,
            head_dim: hp.head_dim,
            head_dim_v: hp.head_dim_v,
            scale: hp.attn_scale,
            window: hp.sliding_window.filter(|_| swa),
        };
        let out_width = hp.n_head * hp.head_dim_v;
        let mut out = vec![0f32; n * out_width];
        // Each sequence attends over its own cache; the sequences run in parallel.
        let mut jobs = Vec::with_capacity(seqs.len());
        let (mut q_rest, mut out_rest) = (&q[..], &mut out[..]);
        for seq in seqs.iter() {
            let (q_seq, q_tail) = q_rest.split_at(seq.n * hp.q_width());
            let (out_seq, out_tail) = out_rest.split_at_mut(seq.n * out_width);
            jobs.push((&*seq.cache, seq.n_past, q_seq, out_seq));
            (q_rest, out_rest) = (q_tail, out_tail);
        }
        jobs.into_par_iter().for_each(|(cache, n_past, q, out)| {
            attend(cache, il, &shape, q, n_past, out);
        });
        self.projection(linear, il, Proj::O, layer.bo.as_deref(), &out, n)
    }

    fn norm_rows(&self, x: &[f32], norm: &Norm) -> Vec<f32> {
        norm_rows(&self.model.hp, norm, x)
    }

    /// Layer `il`'s projection `which` of `x` (`n` rows) through `linear`, plus its bias.
    fn projection(
        &self,
        linear: &dyn Linear,
        il: usize,
        which: Proj,
        bias: Option<&[f32]>,
        x: &[f32],
        n: usize,
    ) -> Result<Vec<f32>> {
        let mut y = linear.project(self.model, il, which, x, n)?;
        if let Some(b) = bias {
            y.chunks_exact_mut(b.len())
                .for_each(|row| ops::add_assign(row, b));
        }
        Ok(y)
    }

    fn matmul(&self, w: &crate::model::Weight, x: &[f32], n: usize) -> Result<Vec<f32>> {
        self.model.matmul(w, x, n)
    }
}

/// The FFN mode a new session starts in: `Sparse` when every layer has a predictor, else `Dense`.
pub fn default_ffn_mode(model: &Model) -> FfnMode {
    if model.layers.iter().all(|l| l.predictor.is_some()) {
        FfnMode::Sparse
    } else {
        FfnMode::Dense
    }
}

/// `x += norm(y)` (or `x += y` without a post-norm), row by row.
fn residual_add(x: &mut [f32], mut y: Vec<f32>, post_norm: Option<&[f32]>, eps: f32) {
    if let Some(w) = post_norm {
        y.chunks_exact_mut(w.len())
            .for_each(|row| ops::rms_norm(row, w, eps));
    }
    ops::add_assign(x, &y);
}
