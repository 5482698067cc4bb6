//! Cutting special tokens written in the text out before tokenization (llama.cpp's
//! `tokenizer_st_partition`).
//!
//! llama.cpp takes the control, user-defined and unknown tokens longest first and, for each,
//! splits every stretch of text not yet claimed at the token's leftmost non-overlapping
//! occurrences. That is the same as: among all occurrences of all those tokens, go through them
//! by (token priority, position) and keep each one that overlaps nothing kept before. hotcold
//! finds the occurrences with a byte trie in one pass over the text, so the cost does not grow
//! with the number of special tokens (Gemma 3 has 6414).

use std::ops::Range;

use hashbrown::HashMap;

use super::vocab::{TokenAttr, Vocab};

/// A piece of the text after partitioning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    /// Ordinary text to tokenize: a byte range of the input.
    Text(Range<usize>),
    /// A special token matched in the text.
    Token(u32),
}

/// The special tokens of a vocabulary, ready to be found in text.
#[derive(Debug, Default)]
pub(crate) struct SpecialTokens {
    /// Special ids in priority order: longer text first, then lower id.
    by_priority: Vec<u32>,
    /// Trie edges `(node, byte) -> node`; node 0 is the root.
    edges: HashMap<(u32, u8), u32>,
    /// `terminal[node]`: the best priority whose text ends at `node`.
    terminal: Vec<Option<u32>>,
    /// `first[b]`: the root's child for byte `b`, kept apart for speed.
    first: Vec<Option<u32>>,
}

/// Stretch state while partitioning.
const FREE: u8 = 0;
const TOKEN: u8 = 1;
const STRIPPED: u8 = 2;

impl SpecialTokens {
    /// The attributes that make a token special (matched as a whole in text).
    pub const ATTRS: TokenAttr = TokenAttr::CONTROL
        .union(TokenAttr::USER_DEFINED)
        .union(TokenAttr::UNKNOWN);

    /// Collects the vocabulary's control, user-defined and unknown tokens.
    pub fn new(vocab: &Vocab) -> SpecialTokens {
        let mut by_priority: Vec<u32> = (0..vocab.len() as u32)
            .filter(|&id| vocab.attr(id).intersects(Self::ATTRS))
            .collect();
        by_priority.sort_by(|&a, &b| {
            vocab
                .bytes(b)
                .len()
                .cmp(&vocab.bytes(a).len())
                .then(a.cmp(&b))
        });

        let mut edges = HashMap::with_capacity(by_priority.len() * 8);
        let mut terminal = vec![None];
        let mut first = vec![None; 256];
        for (rank, &id) in by_priority.iter().enumerate() {
            let text = vocab.bytes(id);
            let mut node = 0u32;
            for (i, &b) in text.iter().enumerate() {
                let next_free = terminal.len() as u32;
                let child = *edges.entry((node, b)).or_insert(next_free);
                if child == next_free {
                    terminal.push(None);
                }
                if i == 0 {
                    first[b as usize] = Some(child);
                }
                node = child;
            }
            let slot = &mut terminal[node as usize];
            if slot.is_none() {
                *slot = Some(rank as u32);
            }
        }
        SpecialTokens {
            by_priority,
            edges,
            terminal,
            first,
        }
    }

    /// Splits `text` into ordinary text and special tokens. Control and unknown tokens are only
    /// matched with `parse_special`; user-defined ones always. Empty text gives no fragment.
    pub fn partition(&self, text: &str, parse_special: bool, vocab: &Vocab) -> Vec<Fragment> {
        let bytes = text.as_bytes();
        if bytes.is_empty() {
            return Vec::new();
        }
        if self.by_priority.is_empty() {
            return vec![Fragment::Text(0..bytes.len())];
        }

        // Every occurrence of every eligible special token: (priority, start, len).
        let mut found: Vec<(u32, usize, usize)> = Vec::new();
        for start in 0..bytes.len() {
            let Some(mut node) = self.first[bytes[start] as usize] else {
                continue;
            };
            let mut end = start + 1;
            loop {
                if let Some(rank) = self.terminal[node as usize] {
                    let id = self.by_priority[rank as usize];
                    if parse_special
                        || !vocab
                            .attr(id)
                            .intersects(TokenAttr::CONTROL | TokenAttr::UNKNOWN)
                    {
                        found.push((rank, start, end - start));
                    }
                }
                if end == bytes.len() {
                    break;
                }
                match self.edges.get(&(node, bytes[end])) {
                    Some(&child) => node = child,
                    None => break,
                }
                end += 1;
            }
        }
        if found.is_empty() {
            return vec![Fragment::Text(0..bytes.len())];
        }
        found.sort_unstable();

        // Keep occurrences greedily by (priority, position).
        let mut state = vec![FREE; bytes.len()];
        let mut kept: Vec<(usize, u32)> = Vec::new();
        for (rank, start, len) in found {
            let span = start..start + len;
            if state[span.clone()].iter().any(|&s| s != FREE) {
                continue;
            }
            let id = self.by_priority[rank as usize];
            state[span.clone()].fill(TOKEN);
            kept.push((start, id));
            let attr = vocab.attr(id);
            if attr.intersects(TokenAttr::LSTRIP) {
                let mut i = start;
                while i > 0 && state[i - 1] == FREE && c_isspace(bytes[i - 1]) {
                    i -= 1;
                    state[i] = STRIPPED;
                }
            }
            if attr.intersects(TokenAttr::RSTRIP) {
                let mut i = span.end;
                while i < bytes.len() && state[i] == FREE && c_isspace(bytes[i]) {
                    state[i] = STRIPPED;
                    i += 1;
                }
            }
        }
        kept.sort_unstable();

        let mut fragments = Vec::with_capacity(kept.len() * 2 + 1);
        let mut pos = 0;
        let push_text = |from: usize, to: usize, fragments: &mut Vec<Fragment>| {
            // Stripped whitespace only ever borders a token, so the free bytes form one run.
            let s = (from..to).find(|&i| state[i] == FREE);
            if let Some(s) = s {
                let e = (s..to).find(|&i| state[i] != FREE).unwrap_or(to);
                fragments.push(Fragment::Text(s..e));
            }
        };
        for (start, id) in kept {
            push_text(pos, start, &mut fragments);
            fragments.push(Fragment::Token(id));
            pos = start + vocab.bytes(id).len();
        }
        push_text(pos, bytes.len(), &mut fragments);
        fragments
    }
}

/// C's `isspace` on one byte.
fn c_isspace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}
