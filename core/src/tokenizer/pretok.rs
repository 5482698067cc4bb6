//! BPE pre-tokenizers: split text into the words that merges run within.
//!
//! Each is the regex list llama.cpp uses for a `tokenizer.ggml.pre` value, written out by hand as
//! llama.cpp itself does for these patterns (`unicode_regex_split_custom_*`), so the splits agree
//! with it exactly, including where its hand-written versions and the regexes differ.

use std::ops::Range;

use super::unicode::{is_number, is_punctuation, Flags};

/// The pre-tokenizers hotcold implements, named after llama.cpp's `LLAMA_VOCAB_PRE_TYPE_*`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// llama.cpp's fallback: `[\p{P}\$\+<=>\^~\|]+`, then GPT-2's pattern, then `\p{N}+`, then
    /// `[0-9][0-9][0-9]`.
    Default,
    /// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`.
    Gpt2,
    /// Llama 3: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
    /// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
    Llama3,
    /// Qwen 2: Llama 3's pattern with single digits (`\p{N}`).
    Qwen2,
}

/// What a `tokenizer.ggml.pre` name selects.
pub(crate) struct PreInfo {
    pub pre: PreTokenizer,
    /// Whether a word that is a token is taken whole, without running merges.
    pub ignore_merges: bool,
    /// Whether BOS is added by default (before `tokenizer.ggml.add_bos_token` overrides it).
    pub add_bos: bool,
    /// Whether detokenization applies `clean_up_tokenization_spaces`.
    pub clean_spaces: bool,
}

/// `(name, pre-tokenizer, ignore_merges, add_bos, clean_spaces)` for every accepted name.
const NAMES: &[(&str, PreTokenizer, bool, bool, bool)] = &[
    ("default", PreTokenizer::Default, false, false, true),
    ("gpt-2", PreTokenizer::Gpt2, false, false, true),
    ("phi-2", PreTokenizer::Gpt2, false, false, true),
    ("gigachat", PreTokenizer::Gpt2, false, false, true),
    ("a.x-4.0", PreTokenizer::Gpt2, false, false, true),
    ("mellum", PreTokenizer::Gpt2, false, false, true),
    ("exaone4", PreTokenizer::Gpt2, false, false, true),
    ("mpt", PreTokenizer::Gpt2, false, false, true),
    ("olmo", PreTokenizer::Gpt2, false, false, true),
    ("llama3", PreTokenizer::Llama3, true, true, true),
    ("llama-v3", PreTokenizer::Llama3, true, true, true),
    ("llama-bpe", PreTokenizer::Llama3, true, true, true),
    ("falcon3", PreTokenizer::Llama3, true, true, true),
    ("falcon-h1", PreTokenizer::Llama3, true, true, true),
    ("pixtral", PreTokenizer::Llama3, true, true, true),
    ("midm-2.0", PreTokenizer::Llama3, true, true, true),
    ("lfm2", PreTokenizer::Llama3, true, true, true),
    ("jina-v5-nano", PreTokenizer::Llama3, true, true, true),
    ("dbrx", PreTokenizer::Llama3, false, false, true),
    ("smaug-bpe", PreTokenizer::Llama3, false, false, true),
    ("qwen2", PreTokenizer::Qwen2, false, false, false),
    ("deepseek-r1-qwen", PreTokenizer::Qwen2, false, false, false),
    ("kormo", PreTokenizer::Qwen2, false, false, false),
    ("f2llmv2", PreTokenizer::Qwen2, false, false, false),
    ("hunyuan", PreTokenizer::Qwen2, false, false, false),
    ("solar-open", PreTokenizer::Qwen2, false, false, false),
    ("megrez", PreTokenizer::Qwen2, false, false, true),
    ("stablelm2", PreTokenizer::Qwen2, false, false, true),
];

impl PreTokenizer {
    /// What llama.cpp does for the `tokenizer.ggml.pre` value `name`, if hotcold supports it.
    pub(crate) fn from_name(name: &str) -> Option<PreInfo> {
        NAMES.iter().find(|(n, ..)| *n == name).map(
            |&(_, pre, ignore_merges, add_bos, clean_spaces)| PreInfo {
                pre,
                ignore_merges,
                add_bos,
                clean_spaces,
            },
        )
    }

    /// Every `tokenizer.ggml.pre` value hotcold accepts.
    pub fn supported_names() -> Vec<&'static str> {
        NAMES.iter().map(|(n, ..)| *n).collect()
    }

    /// Splits `text` into words: byte ranges that cover it, in order, without gaps.
    pub fn split(self, text: &str) -> Vec<Range<usize>> {
        let chars: Vec<char> = text.chars().collect();
        let mut byte_at = Vec::with_capacity(chars.len() + 1);
        byte_at.extend(text.char_indices().map(|(i, _)| i));
        byte_at.push(text.len());

        let all: Vec<Range<usize>> = std::iter::once(0..chars.len()).collect();
        let pieces = match self {
            PreTokenizer::Gpt2 => split_gpt2(&chars, &all),
            PreTokenizer::Llama3 => split_llama3(&chars, &all, Digits::UpToThree),
            PreTokenizer::Qwen2 => split_llama3(&chars, &all, Digits::One),
            PreTokenizer::Default => {
                let p = split_runs(&chars, &all, |c| {
                    is_punctuation(c) || matches!(c, '$' | '+' | '<' | '=' | '>' | '^' | '~' | '|')
                });
                let p = split_gpt2(&chars, &p);
                let p = split_runs(&chars, &p, is_number);
                split_ascii_digit_triples(&chars, &p)
            }
        };
        pieces
            .into_iter()
            .map(|r| byte_at[r.start]..byte_at[r.end])
            .collect()
    }
}

/// The characters of one piece being split, with llama.cpp's view past its ends (no flags).
struct Piece<'a> {
    chars: &'a [char],
    end: usize,
}

impl Piece<'_> {
    #[inline]
    fn cpt(&self, pos: usize) -> Option<char> {
        (pos < self.end).then(|| self.chars[pos])
    }

    #[inline]
    fn flags(&self, pos: usize) -> Flags {
        match self.cpt(pos) {
            Some(c) => Flags::of(c),
            None => Flags::default(),
        }
    }

    /// The length of the contraction `'s`, `'t`, `'re`, … at `pos`, if there is one.
    fn contraction(&self, pos: usize, fold_case: bool) -> Option<usize> {
        if self.cpt(pos) != Some('\'') || pos + 1 >= self.end {
            return None;
        }
        let fold = |c: Option<char>| c.map(|c| if fold_case { c.to_ascii_lowercase() } else { c });
        let next = fold(self.cpt(pos + 1));
        if matches!(next, Some('s' | 't' | 'm' | 'd')) {
            return Some(2);
        }
        if pos + 2 < self.end {
            let next2 = fold(self.cpt(pos + 2));
            if matches!(
                (next, next2),
                (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l'))
            ) {
                return Some(3);
            }
        }
        None
    }

    /// Counts whitespace from `pos`; also gives the end of the last `\r`/`\n` in the run.
    fn whitespace_run(&self, pos: usize) -> (usize, Option<usize>) {
        let mut n = 0;
        let mut last_newline_end = None;
        while self.flags(pos + n).whitespace {
            if matches!(self.cpt(pos + n), Some('\r' | '\n')) {
                last_newline_end = Some(pos + n + 1);
            }
            n += 1;
        }
        (n, last_newline_end)
    }
}

/// Collects words as ranges, skipping empty ones.
struct Words {
    out: Vec<Range<usize>>,
    prev_end: usize,
}

impl Words {
    fn start(&mut self, at: usize) {
        self.prev_end = at;
    }

    fn add(&mut self, end: usize) {
        if end > self.prev_end {
            self.out.push(self.prev_end..end);
        }
        self.prev_end = end;
    }
}

fn split_gpt2(chars: &[char], pieces: &[Range<usize>]) -> Vec<Range<usize>> {
    let mut words = Words {
        out: Vec::with_capacity(chars.len() / 3 + pieces.len()),
        prev_end: 0,
    };
    for range in pieces {
        let p = Piece {
            chars,
            end: range.end,
        };
        words.start(range.start);
        let mut pos = range.start;
        while pos < range.end {
            if let Some(n) = p.contraction(pos, false) {
                pos += n;
                words.add(pos);
                continue;
            }
            let c = p.cpt(pos);
            let space = c == Some(' ');
            let mut f2 = if space {
                p.flags(pos + 1)
            } else {
                p.flags(pos)
            };
            // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`
            let classes: [fn(Flags) -> bool; 3] = [
                |f| f.letter,
                |f| f.number,
                |f| f.present && !(f.whitespace || f.letter || f.number),
            ];
            if let Some(class) = classes.iter().find(|class| class(f2)) {
                pos += usize::from(space);
                while class(f2) {
                    pos += 1;
                    f2 = p.flags(pos);
                }
                words.add(pos);
                continue;
            }
            let (n, _) = p.whitespace_run(pos);
            if n > 1 && p.cpt(pos + n).is_some() {
                // `\s+(?!\S)`: leave the last space to the word after.
                pos += n - 1;
                words.add(pos);
                continue;
            }
            pos += n.max(1);
            words.add(pos);
        }
    }
    words.out
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Digits {
    /// `\p{N}{1,3}` (Llama 3).
    UpToThree,
    /// `\p{N}` (Qwen 2).
    One,
}

fn split_llama3(chars: &[char], pieces: &[Range<usize>], digits: Digits) -> Vec<Range<usize>> {
    let mut words = Words {
        out: Vec::with_capacity(chars.len() / 3 + pieces.len()),
        prev_end: 0,
    };
    for range in pieces {
        let p = Piece {
            chars,
            end: range.end,
        };
        words.start(range.start);
        let mut pos = range.start;
        while pos < range.end {
            if let Some(n) = p.contraction(pos, true) {
                pos += n;
                words.add(pos);
                continue;
            }
            let c = p.cpt(pos);
            let f = p.flags(pos);
            // `[^\r\n\p{L}\p{N}]?\p{L}+`
            if !(matches!(c, Some('\r' | '\n')) || f.number)
                && (f.letter || p.flags(pos + 1).letter)
            {
                pos += 1;
                while p.flags(pos).letter {
                    pos += 1;
                }
                words.add(pos);
                continue;
            }
            // `\p{N}{1,3}` or `\p{N}`
            if f.number {
                match digits {
                    Digits::One => {
                        pos += 1;
                        words.add(pos);
                    }
                    Digits::UpToThree => {
                        let mut first = pos;
                        while p.flags(pos).number {
                            pos += 1;
                            if pos - first >= 3 {
                                words.add(pos);
                                first = pos;
                            }
                        }
                        words.add(pos);
                    }
                }
                continue;
            }
            // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
            let space = c == Some(' ');
            let mut f2 = if space { p.flags(pos + 1) } else { f };
            let other = |f: Flags| !(f.whitespace || f.letter || f.number);
            if other(f2) && f.present {
                pos += usize::from(space);
                while other(f2) && f2.present {
                    pos += 1;
                    f2 = p.flags(pos);
                }
                while matches!(p.cpt(pos), Some('\r' | '\n')) {
                    pos += 1;
                }
                words.add(pos);
                continue;
            }
            let (n, last_newline_end) = p.whitespace_run(pos);
            // `\s*[\r\n]+`
            if let Some(end) = last_newline_end {
                pos = end;
                words.add(pos);
                continue;
            }
            // `\s+(?!\S)`
            if n > 1 && p.cpt(pos + n).is_some() {
                pos += n - 1;
                words.add(pos);
                continue;
            }
            // `\s+`, or a lone character nothing matched
            pos += n.max(1);
            words.add(pos);
        }
    }
    words.out
}

/// Splits each piece into maximal runs of characters matching `pred` and the stretches between
/// them (a regex `[…]+` applied with llama.cpp's "keep both matches and gaps" splitting).
fn split_runs(
    chars: &[char],
    pieces: &[Range<usize>],
    pred: impl Fn(char) -> bool,
) -> Vec<Range<usize>> {
    let mut out = Vec::with_capacity(pieces.len());
    for range in pieces {
        let mut start = range.start;
        while start < range.end {
            let inside = pred(chars[start]);
            let mut end = start + 1;
            while end < range.end && pred(chars[end]) == inside {
                end += 1;
            }
            out.push(start..end);
            start = end;
        }
    }
    out
}

/// `[0-9][0-9][0-9]`: three ASCII digits in a row, leftmost first, and the stretches between.
fn split_ascii_digit_triples(chars: &[char], pieces: &[Range<usize>]) -> Vec<Range<usize>> {
    let mut out = Vec::with_capacity(pieces.len());
    for range in pieces {
        let mut gap_start = range.start;
        let mut pos = range.start;
        while pos + 3 <= range.end {
            if chars[pos..pos + 3].iter().all(char::is_ascii_digit) {
                if pos > gap_start {
                    out.push(gap_start..pos);
                }
                out.push(pos..pos + 3);
                pos += 3;
                gap_start = pos;
            } else {
                pos += 1;
            }
        }
        if range.end > gap_start {
            out.push(gap_start..range.end);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: PreTokenizer, text: &str) -> Vec<&str> {
        pre.split(text).into_iter().map(|r| &text[r]).collect()
    }

    #[test]
    fn gpt2_words() {
        assert_eq!(
            words(PreTokenizer::Gpt2, "Hello world's  12 ok!!\n\n x"),
            ["Hello", " world", "'s", " ", " 12", " ok", "!!", "\n\n", " x"]
        );
        assert_eq!(words(PreTokenizer::Gpt2, "a   "), ["a", "   "]);
    }

    #[test]
    fn llama3_and_qwen2_words() {
        assert_eq!(
            words(PreTokenizer::Llama3, "I'M 12345 x\n\n\tyes  !"),
            ["I", "'M", " ", "123", "45", " x", "\n\n", "\tyes", " ", " !"]
        );
        assert_eq!(
            words(PreTokenizer::Qwen2, "x 123"),
            ["x", " ", "1", "2", "3"]
        );
        assert_eq!(words(PreTokenizer::Qwen2, "a.\n\nb"), ["a", ".\n\n", "b"]);
    }

    #[test]
    fn default_words() {
        assert_eq!(
            words(PreTokenizer::Default, "a+b 12345"),
            ["a", "+", "b", " ", "123", "45"]
        );
    }

    #[test]
    fn empty_text_has_no_words() {
        for pre in [
            PreTokenizer::Default,
            PreTokenizer::Gpt2,
            PreTokenizer::Llama3,
            PreTokenizer::Qwen2,
        ] {
            assert!(pre.split("").is_empty());
        }
    }
}
