//! Tokenizers rebuilt from GGUF vocabulary metadata, matching llama.cpp token for token.
//!
//! [`Tokenizer::from_gguf`] reads `tokenizer.ggml.*` and builds one of the two tokenizers that
//! llama.cpp calls SPM and BPE:
//! - `tokenizer.ggml.model = "llama"`: SentencePiece-style. Spaces become `▁`, characters are merged
//!   pairwise by the score of the token they form (highest first, through a priority queue), and
//!   characters no token covers fall back to `<0xXX>` byte tokens.
//! - `tokenizer.ggml.model = "gpt2"`: byte-level BPE. The text is split into words by the
//!   pre-tokenizer that `tokenizer.ggml.pre` names ([`PreTokenizer`]), each word's bytes are mapped
//!   to GPT-2's printable characters, and the merges of `tokenizer.ggml.merges` are applied by rank.
//!
//! Before either runs, control, user-defined and unknown tokens written in the text are cut out as
//! single tokens (control and unknown ones only when `parse_special` is on), as llama.cpp's
//! `tokenizer_st_partition` does. Detokenisation ([`Tokenizer::token_to_piece`],
//! [`Tokenizer::decode`], [`StreamDecoder`]) follows llama.cpp's `token_to_piece`/`detokenize`.
//! [`ChatTemplate`] renders a model's Jinja chat template (or its family's known format).
//!
//! Hostile metadata (mismatched array lengths, merges naming unknown tokens, out-of-range special
//! ids) is reported as an [`Error`](crate::Error::Metadata), never a panic.

mod bpe;
mod byte_level;
pub mod chat;
mod decode;
mod pretok;
mod special;
mod spm;
mod unicode;
mod vocab;

#[cfg(test)]
mod tests;

pub use chat::{ChatMessage, ChatTemplate};
pub use decode::StreamDecoder;
pub use pretok::PreTokenizer;
pub use vocab::TokenAttr;

use crate::gguf::GgufFile;
use crate::{Error, Result};
use bpe::Merges;
use special::SpecialTokens;
use vocab::Vocab;

/// The tokenizer algorithms `tokenizer.ggml.model` can name that hotcold supports.
pub const SUPPORTED_MODELS: [&str; 2] = ["llama", "gpt2"];

/// Which algorithm a [`Tokenizer`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenizerKind {
    /// SentencePiece-style (`tokenizer.ggml.model = "llama"`; llama.cpp's `LLAMA_VOCAB_TYPE_SPM`).
    Spm,
    /// Byte-level BPE (`tokenizer.ggml.model = "gpt2"`; llama.cpp's `LLAMA_VOCAB_TYPE_BPE`).
    Bpe,
}

/// The algorithm-specific part of a tokenizer.
enum Algorithm {
    Spm,
    Bpe {
        merges: Merges,
        pre: PreTokenizer,
        ignore_merges: bool,
    },
}

/// Special token ids of a vocabulary (each `None` when the vocabulary has none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecialIds {
    /// Beginning of sequence.
    pub bos: Option<u32>,
    /// End of sequence.
    pub eos: Option<u32>,
    /// End of turn (`tokenizer.ggml.eot_token_id`, else found by text, e.g. `<|im_end|>`).
    pub eot: Option<u32>,
    /// End of message (`<|eom_id|>`).
    pub eom: Option<u32>,
    /// Unknown token.
    pub unk: Option<u32>,
    /// Separator.
    pub sep: Option<u32>,
    /// Padding.
    pub pad: Option<u32>,
    /// Mask.
    pub mask: Option<u32>,
    /// Fill-in-the-middle: prefix.
    pub fim_pre: Option<u32>,
    /// Fill-in-the-middle: suffix.
    pub fim_suf: Option<u32>,
    /// Fill-in-the-middle: middle.
    pub fim_mid: Option<u32>,
    /// Fill-in-the-middle: padding.
    pub fim_pad: Option<u32>,
    /// Fill-in-the-middle: repository name.
    pub fim_rep: Option<u32>,
    /// Fill-in-the-middle: file separator.
    pub fim_sep: Option<u32>,
}

/// A tokenizer rebuilt from a GGUF file's vocabulary; see the [module docs](self).
pub struct Tokenizer {
    vocab: Vocab,
    algorithm: Algorithm,
    special: SpecialTokens,
    ids: SpecialIds,
    /// End-of-generation ids, sorted.
    eog: Vec<u32>,
    /// `byte_tokens[b]`: the token that stands for byte `b` (SPM `<0xXX>`; BPE the GPT-2 character).
    byte_tokens: [Option<u32>; 256],
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
    /// Pieces with special tokens rendered (llama.cpp's `token_to_piece(special = true)`), one
    /// arena with `piece_offsets[id]..piece_offsets[id + 1]` per token.
    pieces: Vec<u8>,
    piece_offsets: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind())
            .field("pre_tokenizer", &self.pre_tokenizer())
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.ids.bos)
            .field("eos", &self.ids.eos)
            .field("eot", &self.ids.eot)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .field("add_space_prefix", &self.add_space_prefix)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer that `file`'s `tokenizer.ggml.*` metadata describes.
    ///
    /// Errors on an unsupported `tokenizer.ggml.model` or `tokenizer.ggml.pre` (naming the
    /// supported ones) and on inconsistent metadata.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer> {
        vocab::build(file)
    }

    /// Which algorithm this tokenizer runs.
    pub fn kind(&self) -> TokenizerKind {
        match self.algorithm {
            Algorithm::Spm => TokenizerKind::Spm,
            Algorithm::Bpe { .. } => TokenizerKind::Bpe,
        }
    }

    /// The BPE pre-tokenizer (`None` for SPM, which has none).
    pub fn pre_tokenizer(&self) -> Option<PreTokenizer> {
        match self.algorithm {
            Algorithm::Spm => None,
            Algorithm::Bpe { pre, .. } => Some(pre),
        }
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    /// Tokenizes `text` like llama.cpp's `llama_tokenize`: with `add_special`, BOS and/or EOS are
    /// added as the metadata says (`add_bos_token`, `add_eos_token`); with `parse_special`,
    /// control and unknown tokens written in the text become single tokens (user-defined tokens
    /// always do).
    ///
    /// Errors only when the vocabulary lacks a byte-fallback token the text needs, or BOS/EOS is
    /// to be added but the vocabulary has none.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.push(self.ids.bos.ok_or_else(|| {
                Error::Tokenizer("the vocabulary asks for a BOS token but has none".into())
            })?);
        }
        let fragments = self.special.partition(text, parse_special, &self.vocab);
        match &self.algorithm {
            Algorithm::Spm => spm::encode_fragments(self, text, &fragments, &mut out)?,
            Algorithm::Bpe {
                merges,
                pre,
                ignore_merges,
            } => bpe::encode_fragments(
                self,
                merges,
                *pre,
                *ignore_merges,
                text,
                &fragments,
                &mut out,
            ),
        }
        if add_special && self.add_eos {
            out.push(self.ids.eos.ok_or_else(|| {
                Error::Tokenizer("the vocabulary asks for an EOS token but has none".into())
            })?);
        }
        Ok(out)
    }

    /// The bytes token `id` stands for, with control tokens rendered as their text (llama.cpp's
    /// `token_to_piece(…, special = true)`). Unused tokens give nothing; so do ids outside the
    /// vocabulary. A piece need not be valid UTF-8 on its own (byte tokens).
    pub fn token_to_piece(&self, id: u32) -> &[u8] {
        let i = id as usize;
        if i >= self.vocab.len() {
            return &[];
        }
        &self.pieces[self.piece_offsets[i] as usize..self.piece_offsets[i + 1] as usize]
    }

    /// Like [`token_to_piece`](Self::token_to_piece), but with `render_special = false` control
    /// and unknown tokens give nothing (what a user should see of generated text).
    pub fn token_to_piece_with(&self, id: u32, render_special: bool) -> &[u8] {
        if !render_special
            && self
                .token_attr(id)
                .intersects(TokenAttr::CONTROL | TokenAttr::UNKNOWN)
        {
            return &[];
        }
        self.token_to_piece(id)
    }

    /// Detokenizes `ids` with special tokens rendered as their text, as llama.cpp's
    /// `llama_detokenize(…, remove_special = false, unparse_special = true)`: the leading space an
    /// SPM `add_space_prefix` vocabulary adds is removed again, and vocabularies that ask for it get
    /// `clean_up_tokenization_spaces`. Invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.decode_bytes(ids, true)).into_owned()
    }

    /// Detokenizes `ids` to raw bytes; with `render_special = false` control and unknown tokens
    /// are left out.
    pub fn decode_bytes(&self, ids: &[u32], render_special: bool) -> Vec<u8> {
        decode::detokenize(self, ids, render_special)
    }

    /// A decoder for streaming output, fed one token at a time; see [`StreamDecoder`].
    pub fn stream_decoder(&self, render_special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, render_special)
    }

    /// The token's text as stored in the vocabulary (`▁` and GPT-2 byte characters included).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        ((id as usize) < self.vocab.len()).then(|| self.vocab.text(id))
    }

    /// The id of the token whose vocabulary text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.get(text.as_bytes())
    }

    /// The token's score (SPM merge priority; 0 when the file has no scores).
    pub fn token_score(&self, id: u32) -> f32 {
        if (id as usize) < self.vocab.len() {
            self.vocab.score(id)
        } else {
            0.0
        }
    }

    /// The token's attributes (from `tokenizer.ggml.token_type`, adjusted as llama.cpp does).
    /// Ids outside the vocabulary give [`TokenAttr::UNDEFINED`].
    pub fn token_attr(&self, id: u32) -> TokenAttr {
        if (id as usize) < self.vocab.len() {
            self.vocab.attr(id)
        } else {
            TokenAttr::UNDEFINED
        }
    }

    /// Whether the token is a control token (BOS, `<|im_start|>`, …).
    pub fn is_control(&self, id: u32) -> bool {
        self.token_attr(id).intersects(TokenAttr::CONTROL)
    }

    /// Every special id of the vocabulary.
    pub fn special_ids(&self) -> &SpecialIds {
        &self.ids
    }

    /// Beginning-of-sequence token.
    pub fn bos(&self) -> Option<u32> {
        self.ids.bos
    }

    /// End-of-sequence token.
    pub fn eos(&self) -> Option<u32> {
        self.ids.eos
    }

    /// End-of-turn token.
    pub fn eot(&self) -> Option<u32> {
        self.ids.eot
    }

    /// Whether [`encode`](Self::encode) with `add_special` puts BOS first.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether [`encode`](Self::encode) with `add_special` puts EOS last.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Whether SPM encoding puts a space before text at the start and after special tokens.
    pub fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }

    /// Whether generation should stop at `id`: EOS, EOT, EOM and the tokens llama.cpp marks as
    /// end-of-generation by their text (`<|im_end|>`, `<|endoftext|>`, `<end_of_turn>`, …).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// All end-of-generation ids, ascending.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }
}
