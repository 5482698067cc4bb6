//! Batched decoding: many independent sequences, each with its own KV cache and position, advanced
//! together. One [`Batch::step`] takes a few tokens (one when decoding, a chunk when reading a
//! prompt) from each sequence and runs them as one forward batch: every weight matrix is read once
//! for all rows (the sparse FFN computes the union of the rows' active sets), while attention runs
//! per sequence on its own cache. A row's result does not depend on the other rows of the batch,
//! so a sequence gives the same logits alone or in company (tested in `tests/batch_engine.rs`).

use std::sync::Arc;

use super::awake::with_awake_workers;
use super::ffn::{FfnDensity, FfnMode};
use super::kv_cache::KvCache;
use super::session::{check_tokens, Forward, SeqRows};
use crate::model::Model;
use crate::{Error, Result};

/// A sequence of a [`Batch`] (a slot index; valid until released).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SeqId(usize);

impl SeqId {
    /// The slot's index (`0..n_slots`).
    pub fn index(self) -> usize {
        self.0
    }
}

/// One sequence's part of a [`Batch::step`].
#[derive(Clone, Copy, Debug)]
pub struct Work<'a> {
    /// The sequence.
    pub seq: SeqId,
    /// Tokens appended to it (at least one).
    pub tokens: &'a [u32],
    /// Whether to return the logits of its last token.
    pub logits: bool,
}

struct Slot {
    cache: KvCache,
    n_past: usize,
    in_use: bool,
}

/// A fixed number of sequence slots sharing the model and its thread pool.
pub struct Batch<'m> {
    fwd: Forward<'m>,
    pool: Arc<rayon::ThreadPool>,
    slots: Vec<Slot>,
}

impl<'m> Batch<'m> {
    /// `n_slots` sequences of up to `n_ctx` positions each (their caches allocated now), running
    /// their kernels on `pool`.
    pub fn new(
        model: &'m Model,
        n_slots: usize,
        n_ctx: usize,
        pool: Arc<rayon::ThreadPool>,
    ) -> Batch<'m> {
        let slots = (0..n_slots)
            .map(|_| Slot {
                cache: KvCache::new(&model.hp, n_ctx),
                n_past: 0,
                in_use: false,
            })
            .collect();
        Batch {
            fwd: Forward::new(model),
            pool,
            slots,
        }
    }

    /// See [`Session::set_teal`](super::Session::set_teal).
    pub fn set_teal(&mut self, teal: std::sync::Arc<super::Teal>) {
        self.fwd.set_teal(teal);
    }

    /// See [`Session::set_sparse_prefill`](super::Session::set_sparse_prefill).
    pub fn set_sparse_prefill(&mut self, on: bool) {
        self.fwd.set_sparse_prefill(on);
    }

    /// Chooses how the FFN picks its neurons (see [`super::Session::set_ffn_mode`]).
    pub fn set_ffn_mode(&mut self, mode: FfnMode) -> Result<()> {
        self.fwd.set_ffn_mode(mode)
    }

    /// The FFN mode in use.
    pub fn ffn_mode(&self) -> FfnMode {
        self.fwd.ffn_mode()
    }

    /// Neurons computed per token so far, per layer, over all sequences.
    pub fn ffn_density(&self) -> &FfnDensity {
        self.fwd.density()
    }

    /// Number of slots.
    pub fn n_slots(&self) -> usize {
        self.slots.len()
    }

    /// Slots holding a sequence.
    pub fn n_active(&self) -> usize {
        self.slots.iter().filter(|s| s.in_use).count()
    }

    /// Context capacity of each sequence.
    pub fn n_ctx(&self) -> usize {
        self.slots.first().map_or(0, |s| s.cache.n_ctx())
    }

    /// Starts an empty sequence in a free slot, or `None` when all are taken.
    pub fn acquire(&mut self) -> Option<SeqId> {
        let (i, slot) = self.slots.iter_mut().enumerate().find(|(_, s)| !s.in_use)?;
        slot.in_use = true;
        slot.n_past = 0;
        Some(SeqId(i))
    }

    /// Ends a sequence and frees its slot (releasing a free slot does nothing).
    pub fn release(&mut self, seq: SeqId) {
        if let Some(slot) = self.slots.get_mut(seq.0) {
            slot.in_use = false;
            slot.n_past = 0;
        }
    }

    /// Positions the sequence holds.
    pub fn n_past(&self, seq: SeqId) -> Result<usize> {
        self.slot(seq).map(|s| s.n_past)
    }

    fn slot(&self, seq: SeqId) -> Result<&Slot> {
        self.slots
            .get(seq.0)
            .filter(|s| s.in_use)
            .ok_or_else(|| not_active(seq))
    }

    /// Appends each entry's tokens to its sequence in one forward batch. Returns, per entry, the
    /// logits of its last token when it asked for them (`n_vocab` values). Errors (nothing is
    /// evaluated then): an empty batch, a sequence that is not active or appears twice, tokens
    /// that are empty, outside the vocabulary or beyond the sequence's context.
    pub fn step(&mut self, work: &[Work]) -> Result<Vec<Option<Vec<f32>>>> {
        if work.is_empty() {
            return Err(Error::InvalidArgument("an empty batch".into()));
        }
        let model = self.fwd.model();
        let mut free: Vec<Option<&mut Slot>> = self
            .slots
            .iter_mut()
            .map(|s| s.in_use.then_some(s))
            .collect();
        let mut seqs = Vec::with_capacity(work.len());
        let mut tokens = Vec::new();
        let mut out_rows = Vec::new();
        for w in work {
            let slot =
                free.get_mut(w.seq.0)
                    .and_then(Option::take)
                    .ok_or_else(|| match self_has(work, w.seq) {
                        true => Error::InvalidArgument(format!(
                            "sequence {} appears twice in one batch step",
                            w.seq.0
                        )),
                        false => not_active(w.seq),
                    })?;
            check_tokens(model, w.tokens, slot.n_past, slot.cache.n_ctx())?;
            tokens.extend_from_slice(w.tokens);
            if w.logits {
                out_rows.push(tokens.len() - 1);
            }
            seqs.push(SeqRows {
                cache: &mut slot.cache,
                n_past: slot.n_past,
                n: w.tokens.len(),
            });
        }
        let fwd = &mut self.fwd;
        let logits = self
            .pool
            .install(|| with_awake_workers(|| fwd.forward(&tokens, &mut seqs, &out_rows)))?;
        drop(seqs);
        for w in work {
            self.slots[w.seq.0].n_past += w.tokens.len();
        }
        let n_vocab = model.hp.n_vocab;
        let mut rows = logits.chunks_exact(n_vocab);
        Ok(work
            .iter()
            .map(|w| w.logits.then(|| rows.next().map(<[f32]>::to_vec)).flatten())
            .collect())
    }
}

/// Whether `seq` names an entry of `work` more than once.
fn self_has(work: &[Work], seq: SeqId) -> bool {
    work.iter().filter(|w| w.seq == seq).count() > 1
}

fn not_active(seq: SeqId) -> Error {
    Error::InvalidArgument(format!("sequence {} is not active in the batch", seq.0))
}
