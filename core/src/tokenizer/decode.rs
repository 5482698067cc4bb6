//! Detokenization: token pieces (llama.cpp's `token_to_piece`), whole sequences (`detokenize`)
//! and a streaming decoder that only ever hands out complete UTF-8.

use super::byte_level::char_to_byte;
use super::vocab::{TokenAttr, Vocab};
use super::Tokenizer;
use crate::{Error, Result};

/// Builds the piece of every token with special tokens rendered: one byte arena and the
/// offsets of each piece in it.
pub(crate) fn build_pieces(vocab: &Vocab, is_spm: bool) -> Result<(Vec<u8>, Vec<u32>)> {
    let mut pieces = Vec::with_capacity(vocab.len() * 6);
    let mut offsets = Vec::with_capacity(vocab.len() + 1);
    offsets.push(0u32);
    for id in 0..vocab.len() as u32 {
        let attr = vocab.attr(id);
        let text = vocab.bytes(id);
        if attr.intersects(TokenAttr::UNKNOWN | TokenAttr::CONTROL | TokenAttr::USER_DEFINED) {
            pieces.extend_from_slice(text);
        } else if attr.intersects(TokenAttr::NORMAL) {
            if is_spm {
                unescape_whitespace(text, &mut pieces);
            } else {
                decode_byte_level(vocab.text(id), &mut pieces);
            }
        } else if attr.intersects(TokenAttr::BYTE) {
            pieces.push(byte_token_value(text));
        }
        // Unused and undefined tokens have no piece.
        offsets.push(
            u32::try_from(pieces.len())
                .map_err(|_| Error::Tokenizer("token pieces exceed 4 GiB".into()))?,
        );
    }
    Ok((pieces, offsets))
}

/// `▁` (U+2581) back to a space.
fn unescape_whitespace(text: &[u8], out: &mut Vec<u8>) {
    const SPACE: &[u8] = "▁".as_bytes();
    let mut i = 0;
    while i < text.len() {
        if text[i..].starts_with(SPACE) {
            out.push(b' ');
            i += SPACE.len();
        } else {
            out.push(text[i]);
            i += 1;
        }
    }
}

/// GPT-2 byte characters back to bytes; a character outside the alphabet is written as llama.cpp
/// writes it (`[UNK_BYTE_0x…` followed by the whole token text and `]`).
fn decode_byte_level(text: &str, out: &mut Vec<u8>) {
    for c in text.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
}

/// The byte of a `<0xXX>` token: the hex digits after `<0x`, read like C's `strtol` (at most two;
/// none gives 0).
fn byte_token_value(text: &[u8]) -> u8 {
    text.iter()
        .skip(3)
        .take(2)
        .map_while(|&c| (c as char).to_digit(16))
        .fold(0u32, |acc, d| acc * 16 + d) as u8
}

/// `llama_detokenize(…, remove_special = false, unparse_special = render_special)`.
pub(crate) fn detokenize(tok: &Tokenizer, ids: &[u32], render_special: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(ids.len() * 4);
    let mut remove_space = tok.add_space_prefix;
    for &id in ids {
        let piece = tok.token_to_piece_with(id, render_special);
        out.extend_from_slice(strip_space(piece, remove_space));
        remove_space = false;
    }
    if tok.clean_spaces {
        clean_up_tokenization_spaces(&mut out);
    }
    out
}

fn strip_space(piece: &[u8], strip: bool) -> &[u8] {
    match piece {
        [b' ', rest @ ..] if strip => rest,
        _ => piece,
    }
}

/// Hugging Face's `clean_up_tokenization_spaces`, in llama.cpp's three passes: no space before
/// `? ! . ,`; a lone `'` between spaces loses both; no space before `'s`, `'m`, `'re`, `'ve`.
fn clean_up_tokenization_spaces(text: &mut Vec<u8>) {
    // Pass 1: " ?", " !", " .", " ,".
    let n = text.len();
    let mut total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }
    // Pass 2: " ' ".
    let n = total;
    total = usize::from(n > 0);
    let mut i = 1;
    while i < n {
        let x = text[i];
        if x == b'\'' && i + 1 < n && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0;
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    // Pass 3: " 's", " 'm", " 're", " 've".
    let n = total;
    total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < n {
            let x1 = text[i + 1];
            if matches!(x1, b's' | b'm') {
                total -= 1;
            } else if !matches!(x1, b't' | b'd') && i + 2 < n {
                let x2 = text[i + 2];
                if matches!((x1, x2), (b'r', b'e') | (b'v', b'e')) {
                    total -= 1;
                }
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
}

/// Turns a stream of token ids into text, handing out only complete UTF-8: bytes of a character
/// split across tokens are held back until the character is complete. Invalid bytes become
/// U+FFFD. Feed ids with [`push`](Self::push) and call [`finish`](Self::finish) at the end.
///
/// Like [`Tokenizer::decode`] it removes the space an SPM `add_space_prefix` vocabulary puts
/// first; unlike it, it does not apply `clean_up_tokenization_spaces` (which needs look-ahead).
#[derive(Debug)]
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    render_special: bool,
    pending: Vec<u8>,
    first: bool,
}

impl<'a> StreamDecoder<'a> {
    /// A decoder for `tok`'s ids; with `render_special = false` control tokens print nothing.
    pub fn new(tok: &'a Tokenizer, render_special: bool) -> StreamDecoder<'a> {
        StreamDecoder {
            tok,
            render_special,
            pending: Vec::new(),
            first: true,
        }
    }

    /// Adds token `id` and returns the text that is now complete (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        let piece = self.tok.token_to_piece_with(id, self.render_special);
        self.pending
            .extend_from_slice(strip_space(piece, self.first && self.tok.add_space_prefix));
        self.first = false;
        self.take(false)
    }

    /// Returns whatever is still held back, with an incomplete character as U+FFFD, and resets
    /// the decoder for a new sequence.
    pub fn finish(&mut self) -> String {
        let rest = self.take(true);
        self.first = true;
        rest
    }

    /// Bytes held back, waiting for the rest of a character.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    fn take(&mut self, flush: bool) -> String {
        let mut text = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    text.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // `valid` was just checked, so this cannot fail.
                    text.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        Some(len) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[len..];
                        }
                        None if flush => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            rest = &[];
                            break;
                        }
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let start = self.pending.len() - keep;
        self.pending.drain(..start);
        text
    }
}
