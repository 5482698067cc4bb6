//! SentencePiece-style tokenization (llama.cpp's `llm_tokenizer_spm`).
//!
//! Spaces become `▁`; the text starts as one symbol per character; the adjacent pair whose
//! concatenation is the highest-scoring token (leftmost on ties) is merged, again and again,
//! through a priority queue of candidate pairs, so the work is O(n log n) in the text length.
//! A symbol left that is no token is written as its bytes' `<0xXX>` tokens.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::special::Fragment;
use super::vocab::Vocab;
use super::Tokenizer;
use crate::{Error, Result};

/// Tokenizes the partitioned text.
pub(crate) fn encode_fragments(
    tok: &Tokenizer,
    text: &str,
    fragments: &[Fragment],
    out: &mut Vec<u32>,
) -> Result<()> {
    let mut session = Session::default();
    let mut buf = String::new();
    // A space goes before the first text and before text that follows a special token.
    let mut is_prev_special = true;
    for fragment in fragments {
        match fragment {
            Fragment::Text(range) => {
                buf.clear();
                if tok.add_space_prefix && is_prev_special {
                    buf.push('▁');
                }
                for c in text[range.clone()].chars() {
                    buf.push(if c == ' ' { '▁' } else { c });
                }
                session.tokenize(&tok.vocab, &tok.byte_tokens, &buf, out)?;
                is_prev_special = false;
            }
            Fragment::Token(id) => {
                out.push(*id);
                is_prev_special = true;
            }
        }
    }
    Ok(())
}

/// A run of the text: `text[start..start + len]`, linked to its neighbours (`-1`: none).
#[derive(Clone, Copy, Debug)]
struct Symbol {
    start: u32,
    len: u32,
    prev: i32,
    next: i32,
}

/// A candidate merge of `left` with the symbol after it, forming a token of `score`.
#[derive(Clone, Copy, Debug)]
struct Bigram {
    score: f32,
    left: u32,
    right: u32,
    size: u32,
}

impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        // Highest score first; on a tie, the leftmost pair. Scores are never NaN (see `vocab`).
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

/// Buffers reused across fragments.
#[derive(Default)]
struct Session {
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Bigram>,
}

impl Session {
    fn tokenize(
        &mut self,
        vocab: &Vocab,
        byte_tokens: &[Option<u32>; 256],
        text: &str,
        out: &mut Vec<u32>,
    ) -> Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        let bytes = text.as_bytes();
        self.symbols.clear();
        self.queue.clear();
        let mut iter = text.char_indices().peekable();
        while let Some((start, c)) = iter.next() {
            let index = self.symbols.len() as i32;
            self.symbols.push(Symbol {
                start: start as u32,
                len: c.len_utf8() as u32,
                prev: index - 1,
                next: if iter.peek().is_some() { index + 1 } else { -1 },
            });
        }
        for right in 1..self.symbols.len() {
            self.try_add(vocab, bytes, right as i32 - 1, right as i32);
        }

        while let Some(bigram) = self.queue.pop() {
            let left = self.symbols[bigram.left as usize];
            let right = self.symbols[bigram.right as usize];
            // Skip pairs of which one side has been merged away or has grown since.
            if left.len == 0 || right.len == 0 || left.len + right.len != bigram.size {
                continue;
            }
            let l = &mut self.symbols[bigram.left as usize];
            l.len += right.len;
            l.next = right.next;
            self.symbols[bigram.right as usize].len = 0;
            if right.next >= 0 {
                self.symbols[right.next as usize].prev = bigram.left as i32;
            }
            let (prev, next) = (left.prev, right.next);
            self.try_add(vocab, bytes, prev, bigram.left as i32);
            self.try_add(vocab, bytes, bigram.left as i32, next);
        }

        let mut i = 0i32;
        while i != -1 {
            let sym = self.symbols[i as usize];
            let piece = &bytes[sym.start as usize..(sym.start + sym.len) as usize];
            match vocab.get(piece) {
                Some(id) => out.push(id),
                None => {
                    // Only single characters can be left without a token: merges always form one.
                    for &b in piece {
                        let id = byte_tokens[b as usize].ok_or_else(|| {
                            Error::Tokenizer(format!(
                                "the vocabulary has no byte-fallback token <0x{b:02X}> for {:?}",
                                String::from_utf8_lossy(piece)
                            ))
                        })?;
                        out.push(id);
                    }
                }
            }
            i = sym.next;
        }
        Ok(())
    }

    fn try_add(&mut self, vocab: &Vocab, bytes: &[u8], left: i32, right: i32) {
        if left < 0 || right < 0 {
            return;
        }
        let (l, r) = (self.symbols[left as usize], self.symbols[right as usize]);
        let size = l.len + r.len;
        let piece = &bytes[l.start as usize..(l.start + size) as usize];
        if let Some(id) = vocab.get(piece) {
            self.queue.push(Bigram {
                score: vocab.score(id),
                left: left as u32,
                right: right as u32,
                size,
            });
        }
    }
}
