//! The vocabulary (token texts, scores, attributes, text → id lookup) and the building of a
//! [`Tokenizer`] from GGUF metadata, with llama.cpp's defaults and special-token detection.

use std::hash::BuildHasher;
use std::ops::BitOr;

use hashbrown::{DefaultHashBuilder, HashTable};

use super::bpe::Merges;
use super::pretok::PreTokenizer;
use super::special::SpecialTokens;
use super::{byte_level, decode, Algorithm, SpecialIds, Tokenizer, SUPPORTED_MODELS};
use crate::gguf::{GgufFile, MetaArray};
use crate::{Error, Result};

/// Attributes of a token, as bit flags (llama.cpp's `llama_token_attr`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TokenAttr(u16);

impl TokenAttr {
    /// No attribute (token type 0 or an unknown type).
    pub const UNDEFINED: TokenAttr = TokenAttr(0);
    /// The unknown token (type 2).
    pub const UNKNOWN: TokenAttr = TokenAttr(1 << 0);
    /// An unused slot (type 5, or a control token whose text says "unused").
    pub const UNUSED: TokenAttr = TokenAttr(1 << 1);
    /// An ordinary piece of text (type 1).
    pub const NORMAL: TokenAttr = TokenAttr(1 << 2);
    /// A control token: BOS, EOS, `<|im_start|>`, … (type 3).
    pub const CONTROL: TokenAttr = TokenAttr(1 << 3);
    /// A user-defined token, always matched as a whole in text (type 4).
    pub const USER_DEFINED: TokenAttr = TokenAttr(1 << 4);
    /// A byte-fallback token `<0xXX>` (type 6).
    pub const BYTE: TokenAttr = TokenAttr(1 << 5);
    /// Whitespace before the token is swallowed when it is matched in text.
    pub const LSTRIP: TokenAttr = TokenAttr(1 << 7);
    /// Whitespace after the token is swallowed when it is matched in text.
    pub const RSTRIP: TokenAttr = TokenAttr(1 << 8);

    /// The attribute a GGUF `tokenizer.ggml.token_type` value stands for.
    pub fn from_token_type(token_type: i64) -> TokenAttr {
        match token_type {
            1 => TokenAttr::NORMAL,
            2 => TokenAttr::UNKNOWN,
            3 => TokenAttr::CONTROL,
            4 => TokenAttr::USER_DEFINED,
            5 => TokenAttr::UNUSED,
            6 => TokenAttr::BYTE,
            _ => TokenAttr::UNDEFINED,
        }
    }

    /// The flags of both.
    pub const fn union(self, other: TokenAttr) -> TokenAttr {
        TokenAttr(self.0 | other.0)
    }

    /// These flags less those of `other`.
    pub const fn without(self, other: TokenAttr) -> TokenAttr {
        TokenAttr(self.0 & !other.0)
    }

    /// Whether any flag of `other` is set.
    pub fn intersects(self, other: TokenAttr) -> bool {
        self.0 & other.0 != 0
    }

    /// The raw bits.
    pub fn bits(self) -> u16 {
        self.0
    }
}

impl BitOr for TokenAttr {
    type Output = TokenAttr;
    fn bitor(self, rhs: TokenAttr) -> TokenAttr {
        self.union(rhs)
    }
}

/// Token texts in one arena, with a hash index from text to id.
pub(crate) struct Vocab {
    text: Vec<u8>,
    offsets: Vec<u32>,
    scores: Vec<f32>,
    attrs: Vec<TokenAttr>,
    index: HashTable<u32>,
    hasher: DefaultHashBuilder,
}

impl std::fmt::Debug for Vocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vocab")
            .field("tokens", &self.len())
            .finish_non_exhaustive()
    }
}

impl Vocab {
    /// Builds the vocabulary; a text that occurs twice maps to its last id (as in llama.cpp).
    pub fn new(texts: &[String], scores: Vec<f32>, attrs: Vec<TokenAttr>) -> Result<Vocab> {
        let n = texts.len();
        debug_assert!(scores.len() == n && attrs.len() == n);
        let mut text = Vec::with_capacity(texts.iter().map(|t| t.len().max(12)).sum());
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0u32);
        for (i, t) in texts.iter().enumerate() {
            if t.is_empty() {
                // llama.cpp names empty tokens so that they can never match text.
                text.extend_from_slice(format!("[EMPTY_{i}]").as_bytes());
            } else {
                text.extend_from_slice(t.as_bytes());
            }
            let end = u32::try_from(text.len()).map_err(|_| Error::Metadata {
                key: "tokenizer.ggml.tokens".into(),
                message: "token texts exceed 4 GiB".into(),
            })?;
            offsets.push(end);
        }
        let hasher = DefaultHashBuilder::default();
        let mut index = HashTable::with_capacity(n);
        let slice =
            |id: u32| &text[offsets[id as usize] as usize..offsets[id as usize + 1] as usize];
        for id in 0..n as u32 {
            let bytes = slice(id);
            let hash = hasher.hash_one(bytes);
            match index.entry(
                hash,
                |&other| slice(other) == bytes,
                |&other| hasher.hash_one(slice(other)),
            ) {
                hashbrown::hash_table::Entry::Occupied(mut e) => *e.get_mut() = id,
                hashbrown::hash_table::Entry::Vacant(e) => {
                    e.insert(id);
                }
            }
        }
        let vocab = Vocab {
            text,
            offsets,
            scores,
            attrs,
            index,
            hasher,
        };
        Ok(vocab)
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.attrs.len()
    }

    /// The token's text bytes; `id` must be in range.
    #[inline]
    pub fn bytes(&self, id: u32) -> &[u8] {
        &self.text[self.offsets[id as usize] as usize..self.offsets[id as usize + 1] as usize]
    }

    /// The token's text; `id` must be in range.
    pub fn text(&self, id: u32) -> &str {
        // Every text came from a `String` (or an ASCII `[EMPTY_i]`), so this cannot fail.
        std::str::from_utf8(self.bytes(id)).unwrap_or("")
    }

    /// The id of the token whose text is `bytes`.
    #[inline]
    pub fn get(&self, bytes: &[u8]) -> Option<u32> {
        let hash = self.hasher.hash_one(bytes);
        self.index
            .find(hash, |&id| self.bytes(id) == bytes)
            .copied()
    }

    /// The token's score; `id` must be in range.
    #[inline]
    pub fn score(&self, id: u32) -> f32 {
        self.scores[id as usize]
    }

    /// The token's attributes; `id` must be in range.
    #[inline]
    pub fn attr(&self, id: u32) -> TokenAttr {
        self.attrs[id as usize]
    }

    fn set_attr(&mut self, id: u32, attr: TokenAttr) {
        self.attrs[id as usize] = attr;
    }

    fn add_attr(&mut self, id: u32, attr: TokenAttr) {
        self.attrs[id as usize] = self.attrs[id as usize] | attr;
    }

    /// Whether `id` is the id its text maps to (the last id of a text that occurs twice is).
    fn is_canonical(&self, id: u32) -> bool {
        self.get(self.bytes(id)) == Some(id)
    }
}

/// Texts that llama.cpp takes as the end-of-turn token when the file names none, in the order
/// hotcold tries them.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];

/// Texts of tokens that end generation (llama.cpp's list).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

fn meta_err(key: &str, message: impl Into<String>) -> Error {
    Error::Metadata {
        key: key.into(),
        message: message.into(),
    }
}

/// Per-model flags before the metadata overrides them.
struct Defaults {
    add_space_prefix: bool,
    clean_spaces: bool,
    add_bos: bool,
    add_eos: bool,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
}

/// Builds a tokenizer from `file`'s metadata.
pub(crate) fn build(file: &GgufFile) -> Result<Tokenizer> {
    const MODEL: &str = "tokenizer.ggml.model";
    let model = file
        .get_str(MODEL)?
        .ok_or_else(|| meta_err(MODEL, "missing: the file has no tokenizer"))?;
    let is_spm = match model {
        "llama" => true,
        "gpt2" => false,
        other => {
            return Err(meta_err(
                MODEL,
                format!(
                    "tokenizer model {other:?} is not supported (supported: {})",
                    SUPPORTED_MODELS.map(|m| format!("{m:?}")).join(", ")
                ),
            ))
        }
    };

    // Token texts, scores and types.
    const TOKENS: &str = "tokenizer.ggml.tokens";
    let texts = file
        .get_array(TOKENS)?
        .ok_or_else(|| meta_err(TOKENS, "missing: the file has no vocabulary"))?
        .as_strings()
        .ok_or_else(|| meta_err(TOKENS, "must be an array of strings"))?;
    let n = texts.len();
    if n == 0 {
        return Err(meta_err(TOKENS, "the vocabulary is empty"));
    }
    if n > i32::MAX as usize {
        return Err(meta_err(
            TOKENS,
            format!("{n} tokens is more than token ids can address"),
        ));
    }
    let scores = read_scores(file, n)?;
    let attrs = read_types(file, n)?;
    let mut vocab = Vocab::new(texts, scores, attrs)?;

    // Algorithm and its defaults (llama.cpp's `llama_vocab::impl::load`).
    let mut ignore_merges = false;
    let (algorithm_kind, mut d) = if is_spm {
        let d = Defaults {
            add_space_prefix: true,
            clean_spaces: false,
            add_bos: true,
            add_eos: false,
            bos: Some(1),
            eos: Some(2),
            unk: Some(0),
        };
        (None, d)
    } else {
        const PRE: &str = "tokenizer.ggml.pre";
        let pre_name = file.get_str(PRE)?.unwrap_or("default");
        let info = PreTokenizer::from_name(pre_name).ok_or_else(|| {
            meta_err(
                PRE,
                format!(
                    "pre-tokenizer {pre_name:?} is not supported (supported: {})",
                    PreTokenizer::supported_names().join(", ")
                ),
            )
        })?;
        ignore_merges = info.ignore_merges;
        let d = Defaults {
            add_space_prefix: false,
            clean_spaces: info.clean_spaces,
            add_bos: info.add_bos,
            add_eos: false,
            bos: Some(11),
            eos: Some(11),
            unk: None,
        };
        (Some(info.pre), d)
    };
    if let Some(v) = file.get_bool("tokenizer.ggml.add_space_prefix")? {
        d.add_space_prefix = v;
    }

    // Special ids: defaults outside the vocabulary are dropped; ids from the file must be inside.
    let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
    let mut ids = SpecialIds {
        bos: in_range(d.bos),
        eos: in_range(d.eos),
        unk: in_range(d.unk),
        ..SpecialIds::default()
    };
    type Slot = fn(&mut SpecialIds) -> &mut Option<u32>;
    let slots: [(&str, Slot); 17] = [
        ("tokenizer.ggml.bos_token_id", |i| &mut i.bos),
        ("tokenizer.ggml.eos_token_id", |i| &mut i.eos),
        ("tokenizer.ggml.eot_token_id", |i| &mut i.eot),
        ("tokenizer.ggml.eom_token_id", |i| &mut i.eom),
        ("tokenizer.ggml.unknown_token_id", |i| &mut i.unk),
        ("tokenizer.ggml.seperator_token_id", |i| &mut i.sep),
        ("tokenizer.ggml.padding_token_id", |i| &mut i.pad),
        ("tokenizer.ggml.mask_token_id", |i| &mut i.mask),
        ("tokenizer.ggml.fim_pre_token_id", |i| &mut i.fim_pre),
        ("tokenizer.ggml.fim_suf_token_id", |i| &mut i.fim_suf),
        ("tokenizer.ggml.fim_mid_token_id", |i| &mut i.fim_mid),
        ("tokenizer.ggml.fim_pad_token_id", |i| &mut i.fim_pad),
        ("tokenizer.ggml.fim_rep_token_id", |i| &mut i.fim_rep),
        ("tokenizer.ggml.fim_sep_token_id", |i| &mut i.fim_sep),
        ("tokenizer.ggml.prefix_token_id", |i| &mut i.fim_pre),
        ("tokenizer.ggml.suffix_token_id", |i| &mut i.fim_suf),
        ("tokenizer.ggml.middle_token_id", |i| &mut i.fim_mid),
    ];
    for (key, slot) in slots {
        let Some(id) = file.get_u64(key)? else {
            continue;
        };
        if id < n as u64 {
            *slot(&mut ids) = Some(id as u32);
        } else if key != "tokenizer.ggml.padding_token_id" {
            return Err(meta_err(
                key,
                format!("token id {id} is outside the vocabulary of {n} tokens"),
            ));
        }
        // A padding id one past the vocabulary is common in real files and harmless: llama.cpp
        // ignores it, and so does hotcold.
    }
    if let Some(v) = file.get_bool("tokenizer.ggml.add_bos_token")? {
        d.add_bos = v;
    }
    if let Some(v) = file.get_bool("tokenizer.ggml.add_eos_token")? {
        d.add_eos = v;
    }

    detect_special_by_text(&mut vocab, &mut ids);
    mark_unused(&mut vocab);
    let eog = end_of_generation(&mut vocab, &ids);
    apply_name_hacks(file, &mut vocab)?;

    let algorithm = match algorithm_kind {
        None => Algorithm::Spm,
        Some(pre) => Algorithm::Bpe {
            merges: Merges::from_gguf(file, &vocab)?,
            pre,
            ignore_merges,
        },
    };

    let mut byte_tokens = [None; 256];
    for (b, slot) in byte_tokens.iter_mut().enumerate() {
        let b = b as u8;
        *slot = if is_spm {
            vocab
                .get(format!("<0x{b:02X}>").as_bytes())
                .or_else(|| vocab.get(&[b]))
        } else {
            let mut buf = [0u8; 4];
            vocab.get(byte_level::byte_to_char(b).encode_utf8(&mut buf).as_bytes())
        };
    }

    let special = SpecialTokens::new(&vocab);
    let (pieces, piece_offsets) = decode::build_pieces(&vocab, is_spm)?;
    Ok(Tokenizer {
        vocab,
        algorithm,
        special,
        ids,
        eog,
        byte_tokens,
        add_bos: d.add_bos,
        add_eos: d.add_eos,
        add_space_prefix: d.add_space_prefix,
        clean_spaces: d.clean_spaces,
        pieces,
        piece_offsets,
    })
}

fn read_scores(file: &GgufFile, n: usize) -> Result<Vec<f32>> {
    const KEY: &str = "tokenizer.ggml.scores";
    let Some(array) = file.get_array(KEY)? else {
        return Ok(vec![0.0; n]);
    };
    let scores = match array {
        MetaArray::F32(_) | MetaArray::F64(_) => array.to_f32_vec(),
        _ => array
            .to_i64_vec()
            .map(|v| v.into_iter().map(|s| s as f32).collect()),
    }
    .ok_or_else(|| {
        meta_err(
            KEY,
            format!(
                "must be an array of numbers, found {}[]",
                array.elem_type().name()
            ),
        )
    })?;
    if scores.len() != n {
        return Err(meta_err(
            KEY,
            format!("has {} entries for {n} tokens", scores.len()),
        ));
    }
    // Merge priorities are compared with a total order: make -0 equal to 0 (as C++'s `<` has it)
    // and give a NaN (which no converter writes) the lowest priority.
    Ok(scores
        .into_iter()
        .map(|s| {
            if s.is_nan() {
                f32::NEG_INFINITY
            } else {
                s + 0.0
            }
        })
        .collect())
}

fn read_types(file: &GgufFile, n: usize) -> Result<Vec<TokenAttr>> {
    const KEY: &str = "tokenizer.ggml.token_type";
    let Some(array) = file.get_array(KEY)? else {
        return Ok(vec![TokenAttr::NORMAL; n]);
    };
    let types = array.to_i64_vec().ok_or_else(|| {
        meta_err(
            KEY,
            format!(
                "must be an array of integers, found {}[]",
                array.elem_type().name()
            ),
        )
    })?;
    if types.len() != n {
        return Err(meta_err(
            KEY,
            format!("has {} entries for {n} tokens", types.len()),
        ));
    }
    Ok(types.into_iter().map(TokenAttr::from_token_type).collect())
}

/// Finds EOT, EOM and fill-in-the-middle tokens by their text when the file names none, and
/// makes sure each found token is a control token (llama.cpp's text-based detection).
fn detect_special_by_text(vocab: &mut Vocab, ids: &mut SpecialIds) {
    let lists: [(&mut Option<u32>, &[&str]); 8] = [
        (&mut ids.eot, EOT_TEXTS),
        (&mut ids.eom, EOM_TEXTS),
        (&mut ids.fim_pre, FIM_PRE_TEXTS),
        (&mut ids.fim_suf, FIM_SUF_TEXTS),
        (&mut ids.fim_mid, FIM_MID_TEXTS),
        (&mut ids.fim_pad, FIM_PAD_TEXTS),
        (&mut ids.fim_rep, FIM_REP_TEXTS),
        (&mut ids.fim_sep, FIM_SEP_TEXTS),
    ];
    for (slot, texts) in lists {
        if slot.is_some() {
            continue;
        }
        if let Some(id) = texts.iter().find_map(|t| vocab.get(t.as_bytes())) {
            *slot = Some(id);
            vocab.add_attr(id, TokenAttr::CONTROL);
        }
    }
}

/// Control tokens whose text contains "unused" are unused slots.
fn mark_unused(vocab: &mut Vocab) {
    let unused: Vec<u32> = (0..vocab.len() as u32)
        .filter(|&id| {
            let attr = vocab.attr(id);
            attr.intersects(TokenAttr::CONTROL)
                && !attr.intersects(TokenAttr::UNUSED)
                && contains(vocab.bytes(id), b"unused")
                && vocab.is_canonical(id)
        })
        .collect();
    for id in unused {
        vocab.add_attr(id, TokenAttr::UNUSED);
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The end-of-generation set, as llama.cpp builds it (including its model-specific exceptions).
fn end_of_generation(vocab: &mut Vocab, ids: &SpecialIds) -> Vec<u32> {
    let mut eog: Vec<u32> = [ids.fim_pad, ids.fim_rep, ids.fim_sep]
        .into_iter()
        .flatten()
        .collect();
    for text in EOG_TEXTS {
        if let Some(id) = vocab.get(text.as_bytes()) {
            eog.push(id);
            vocab.add_attr(id, TokenAttr::CONTROL);
        }
    }
    // gpt-oss: these are always rendered.
    for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
        if let Some(id) = vocab.get(text.as_bytes()) {
            vocab.set_attr(id, TokenAttr::USER_DEFINED);
        }
    }
    eog.extend([ids.eos, ids.eot, ids.eom].into_iter().flatten());
    eog.sort_unstable();
    eog.dedup();

    let find = |eog: &[u32], vocab: &Vocab, text: &str| {
        eog.iter()
            .copied()
            .find(|&id| vocab.bytes(id) == text.as_bytes())
    };
    // o200k_harmony and solar-open: "<|end|>" ends a message, not the generation.
    let has = |t: &str| find(&eog, vocab, t).is_some();
    let has_call = has("<|call|>") || has("<|calls|>");
    if let Some(end) = find(&eog, vocab, "<|end|>") {
        if has_call && (has("<|return|>") || has("<|flush|>")) {
            eog.retain(|&id| id != end);
            vocab.set_attr(end, TokenAttr::USER_DEFINED);
        }
    }
    // gemma4 and plamo have an ordinary "</s>".
    if let Some(s) = find(&eog, vocab, "</s>") {
        if find(&eog, vocab, "<|tool_response>").is_some()
            || find(&eog, vocab, "<|plamo:eos|>").is_some()
        {
            eog.retain(|&id| id != s);
            vocab.set_attr(s, TokenAttr::NORMAL);
        }
    }
    eog
}

/// Per-model token attributes that GGUF does not store, keyed by name as llama.cpp does.
fn apply_name_hacks(file: &GgufFile, vocab: &mut Vocab) -> Result<()> {
    let name = file.get_str("general.name")?.unwrap_or("").to_lowercase();
    if name.contains("phi-3") || name.contains("phi3") {
        let special: Vec<u32> = (0..vocab.len() as u32)
            .filter(|&id| vocab.attr(id).intersects(SpecialTokens::ATTRS))
            .collect();
        for id in special {
            vocab.add_attr(id, TokenAttr::RSTRIP);
        }
        if let Some(id) = vocab.get(b"</s>") {
            vocab.add_attr(id, TokenAttr::RSTRIP);
        }
        for text in ["<unk>", "<s>", "<|endoftext|>"] {
            if let Some(id) = vocab.get(text.as_bytes()) {
                vocab.set_attr(id, vocab.attr(id).without(TokenAttr::RSTRIP));
            }
        }
    }
    Ok(())
}
