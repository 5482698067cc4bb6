//! Byte-level BPE (llama.cpp's `llm_tokenizer_bpe`).
//!
//! Each word from the pre-tokenizer starts as one symbol per byte (the token of the byte's GPT-2
//! character); the adjacent pair with the lowest merge rank (leftmost on ties) is merged, again
//! and again, through a priority queue. Merges are validated when loaded so that every one
//! names two tokens and forms a token, which lets symbols be token ids instead of strings.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use hashbrown::HashMap;

use super::byte_level::byte_to_char;
use super::pretok::PreTokenizer;
use super::special::Fragment;
use super::vocab::Vocab;
use super::Tokenizer;
use crate::gguf::GgufFile;
use crate::{Error, Result};

/// The merge table: `(left, right) -> (rank, merged)`.
#[derive(Debug, Default)]
pub(crate) struct Merges {
    table: HashMap<(u32, u32), (u32, u32)>,
}

impl Merges {
    /// Reads and validates `tokenizer.ggml.merges` (`"left right"` strings, lowest rank first).
    pub fn from_gguf(file: &GgufFile, vocab: &Vocab) -> Result<Merges> {
        const KEY: &str = "tokenizer.ggml.merges";
        let bad = |message: String| Error::Metadata {
            key: KEY.into(),
            message,
        };
        let merges = file
            .get_array(KEY)?
            .ok_or_else(|| bad("missing: a BPE tokenizer needs merges".into()))?
            .as_strings()
            .ok_or_else(|| bad("must be an array of strings".into()))?;
        let mut table = HashMap::with_capacity(merges.len());
        let mut joined = Vec::new();
        for (rank, merge) in merges.iter().enumerate() {
            // The separator is the first space after the first byte (a part may be a space).
            let split = merge
                .bytes()
                .skip(1)
                .position(|b| b == b' ')
                .map(|p| p + 1)
                .ok_or_else(|| {
                    bad(format!(
                        "merge {rank} ({merge:?}) has no space between its two parts"
                    ))
                })?;
            let (left, right) = (&merge[..split], &merge[split + 1..]);
            let id = |part: &str| {
                vocab.get(part.as_bytes()).ok_or_else(|| {
                    bad(format!(
                        "merge {rank} ({merge:?}) names {part:?}, which is not a token"
                    ))
                })
            };
            let (l, r) = (id(left)?, id(right)?);
            joined.clear();
            joined.extend_from_slice(left.as_bytes());
            joined.extend_from_slice(right.as_bytes());
            let merged = vocab.get(&joined).ok_or_else(|| {
                bad(format!(
                    "merge {rank} ({merge:?}) forms {:?}, which is not a token",
                    String::from_utf8_lossy(&joined)
                ))
            })?;
            // A pair listed twice keeps its first (lowest) rank, as in llama.cpp.
            table.entry((l, r)).or_insert((rank as u32, merged));
        }
        Ok(Merges { table })
    }

    #[inline]
    fn get(&self, left: u32, right: u32) -> Option<(u32, u32)> {
        self.table.get(&(left, right)).copied()
    }
}

/// Tokenizes the partitioned text.
pub(crate) fn encode_fragments(
    tok: &Tokenizer,
    merges: &Merges,
    pre: PreTokenizer,
    ignore_merges: bool,
    text: &str,
    fragments: &[Fragment],
    out: &mut Vec<u32>,
) {
    let mut session = Session::default();
    for fragment in fragments {
        match fragment {
            Fragment::Token(id) => out.push(*id),
            Fragment::Text(range) => {
                let piece = &text[range.clone()];
                for word in pre.split(piece) {
                    session.word(tok, merges, ignore_merges, &piece.as_bytes()[word], out);
                }
            }
        }
    }
}

/// One symbol of a word: a token (or `None` for a byte whose character is no token).
#[derive(Clone, Copy, Debug)]
struct Symbol {
    id: Option<u32>,
    prev: i32,
    next: i32,
    alive: bool,
}

/// A candidate merge of symbol `left` (token `left_id`) with `right` (token `right_id`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Candidate {
    rank: u32,
    left: u32,
    right: u32,
    left_id: u32,
    right_id: u32,
}

/// Buffers reused across words.
#[derive(Default)]
struct Session {
    symbols: Vec<Symbol>,
    /// Candidate merges, lowest rank (then leftmost) first.
    queue: BinaryHeap<Reverse<Candidate>>,
    encoded: String,
}

impl Session {
    fn word(
        &mut self,
        tok: &Tokenizer,
        merges: &Merges,
        ignore_merges: bool,
        word: &[u8],
        out: &mut Vec<u32>,
    ) {
        if ignore_merges {
            self.encoded.clear();
            self.encoded.extend(word.iter().map(|&b| byte_to_char(b)));
            if let Some(id) = tok.vocab.get(self.encoded.as_bytes()) {
                out.push(id);
                return;
            }
        }
        self.symbols.clear();
        self.queue.clear();
        let n = word.len() as i32;
        self.symbols
            .extend(word.iter().enumerate().map(|(i, &b)| Symbol {
                id: tok.byte_tokens[b as usize],
                prev: i as i32 - 1,
                next: if i as i32 + 1 < n { i as i32 + 1 } else { -1 },
                alive: true,
            }));
        for right in 1..self.symbols.len() {
            self.try_add(merges, right as i32 - 1, right as i32);
        }
        while let Some(Reverse(Candidate {
            left,
            right,
            left_id,
            right_id,
            ..
        })) = self.queue.pop()
        {
            let (l, r) = (self.symbols[left as usize], self.symbols[right as usize]);
            // Skip pairs of which one side has been merged away or changed since.
            if !l.alive || !r.alive || l.id != Some(left_id) || r.id != Some(right_id) {
                continue;
            }
            let Some((_, merged)) = merges.get(left_id, right_id) else {
                continue;
            };
            let sym = &mut self.symbols[left as usize];
            sym.id = Some(merged);
            sym.next = r.next;
            self.symbols[right as usize].alive = false;
            if r.next >= 0 {
                self.symbols[r.next as usize].prev = left as i32;
            }
            self.try_add(merges, l.prev, left as i32);
            self.try_add(merges, left as i32, r.next);
        }
        // A byte whose character is no token has no piece at all (llama.cpp drops it too).
        out.extend(self.symbols.iter().filter(|s| s.alive).filter_map(|s| s.id));
    }

    fn try_add(&mut self, merges: &Merges, left: i32, right: i32) {
        if left < 0 || right < 0 {
            return;
        }
        let (Some(l), Some(r)) = (
            self.symbols[left as usize].id,
            self.symbols[right as usize].id,
        ) else {
            return;
        };
        if let Some((rank, _)) = merges.get(l, r) {
            self.queue.push(Reverse(Candidate {
                rank,
                left: left as u32,
                right: right as u32,
                left_id: l,
                right_id: r,
            }));
        }
    }
}
