//! Tokenizers on small synthetic vocabularies: the algorithms' rules one at a time, and hostile
//! metadata. (The real models are checked against llama.cpp in `tests/tokenizer_reference.rs`.)

use super::byte_level::byte_to_char;
use super::*;
use crate::gguf::{GgufFile, GgufWriter, Magic, MetaArray, MetaValue};

const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER: i32 = 4;
const BYTE: i32 = 6;

fn file(kvs: Vec<(&str, MetaValue)>) -> GgufFile {
    let mut w = GgufWriter::new(Magic::Gguf);
    w.set("general.architecture", MetaValue::String("llama".into()));
    for (k, v) in kvs {
        w.set(k, v);
    }
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

fn strings(v: &[String]) -> MetaValue {
    MetaValue::Array(MetaArray::String(v.to_vec()))
}

/// An SPM vocabulary: `<unk> <s> </s>`, 256 byte tokens, then `(text, score, type)` pieces.
fn spm_kvs(pieces: &[(&str, f32, i32)]) -> Vec<(&'static str, MetaValue)> {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut scores = vec![0.0f32; 3];
    let mut types = vec![2, CONTROL, CONTROL];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        scores.push(0.0);
        types.push(BYTE);
    }
    for &(t, s, ty) in pieces {
        tokens.push(t.into());
        scores.push(s);
        types.push(ty);
    }
    vec![
        ("tokenizer.ggml.model", MetaValue::String("llama".into())),
        ("tokenizer.ggml.tokens", strings(&tokens)),
        (
            "tokenizer.ggml.scores",
            MetaValue::Array(MetaArray::F32(scores)),
        ),
        (
            "tokenizer.ggml.token_type",
            MetaValue::Array(MetaArray::I32(types)),
        ),
    ]
}

fn spm(pieces: &[(&str, f32, i32)]) -> Tokenizer {
    Tokenizer::from_gguf(&file(spm_kvs(pieces))).unwrap()
}

fn ids(tok: &Tokenizer, texts: &[&str]) -> Vec<u32> {
    texts
        .iter()
        .map(|t| tok.token_id(t).unwrap_or_else(|| panic!("no token {t:?}")))
        .collect()
}

const HELLO: &[(&str, f32, i32)] = &[
    ("▁", -1.0, NORMAL),
    ("h", -1.0, NORMAL),
    ("e", -1.0, NORMAL),
    ("l", -1.0, NORMAL),
    ("o", -1.0, NORMAL),
    ("w", -1.0, NORMAL),
    ("r", -1.0, NORMAL),
    ("d", -1.0, NORMAL),
    ("▁h", -2.0, NORMAL),
    ("▁he", -3.0, NORMAL),
    ("ll", -2.5, NORMAL),
    ("▁hell", -4.0, NORMAL),
    ("▁hello", -5.0, NORMAL),
    ("▁w", -2.0, NORMAL),
    ("or", -2.0, NORMAL),
    ("orl", -3.0, NORMAL),
    ("orld", -3.5, NORMAL),
    ("▁world", -6.0, NORMAL),
    ("<|user|>", 0.0, USER),
    ("<ctl>", 0.0, CONTROL),
    ("<unused7>", 0.0, CONTROL),
    ("<|im_end|>", 0.0, NORMAL),
];

#[test]
fn tokenizers_and_templates_can_be_shared_across_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<Tokenizer>();
    shared::<ChatTemplate>();
    let tok = spm(HELLO);
    let debug = format!("{tok:?}");
    assert!(
        debug.contains("vocab_size: 281") && debug.len() < 400,
        "{debug}"
    );
}

#[test]
fn spm_merges_words_and_adds_bos_and_space_prefix() {
    let tok = spm(HELLO);
    assert_eq!(tok.kind(), TokenizerKind::Spm);
    assert_eq!((tok.bos(), tok.eos()), (Some(1), Some(2)));
    assert!(tok.add_bos() && !tok.add_eos() && tok.add_space_prefix());
    let got = tok.encode("hello world", true, false).unwrap();
    let mut want = vec![1];
    want.extend(ids(&tok, &["▁hello", "▁world"]));
    assert_eq!(got, want);
    assert_eq!(tok.encode("hello world", false, false).unwrap(), want[1..]);
    assert_eq!(tok.encode("", true, false).unwrap(), [1]);
    assert!(tok.encode("", false, false).unwrap().is_empty());
    // The space the prefix added is removed again when decoding.
    assert_eq!(tok.decode(&want[1..]), "hello world");
}

#[test]
fn spm_merges_highest_score_first_and_leftmost_on_ties() {
    let tok = spm(&[
        ("a", -1.0, NORMAL),
        ("b", -1.0, NORMAL),
        ("c", -1.0, NORMAL),
        ("ab", -5.0, NORMAL),
        ("bc", -1.0, NORMAL),
    ]);
    let no_prefix = |text: &str| tok.encode(text, false, false).unwrap();
    // "▁" is no token here, so the prefix space falls back to its three bytes.
    let space: Vec<u32> = "▁".bytes().map(|b| 3 + u32::from(b)).collect();
    let mut want = space.clone();
    want.extend(ids(&tok, &["a", "bc"]));
    assert_eq!(no_prefix("abc"), want);

    let tok = spm(&[("a", -1.0, NORMAL), ("aa", -1.0, NORMAL)]);
    let got = tok.encode("aaa", false, false).unwrap();
    assert_eq!(got[space.len()..], ids(&tok, &["aa", "a"]));
}

#[test]
fn spm_byte_fallback_and_pieces() {
    let tok = spm(HELLO);
    let got = tok.encode("hé", false, false).unwrap();
    // "▁h" is a token; "é" is not, so it becomes <0xC3> <0xA9>.
    assert_eq!(got, [tok.token_id("▁h").unwrap(), 3 + 0xC3, 3 + 0xA9]);
    assert_eq!(tok.token_to_piece(3 + 0xC3), [0xC3]);
    assert_eq!(tok.decode(&got), "hé");
    assert_eq!(
        tok.token_to_piece(tok.token_id("▁hello").unwrap()),
        b" hello"
    );
    assert_eq!(tok.token_to_piece(1), b"<s>");
    assert_eq!(tok.token_to_piece_with(1, false), b"");
    assert_eq!(tok.token_to_piece(u32::MAX), b"");
    assert_eq!(
        tok.decode_bytes(&[1, 3 + 0xC3, 3 + 0xA9], false),
        "é".as_bytes()
    );

    // A vocabulary without byte tokens cannot encode what it has no token for.
    let kvs = vec![
        ("tokenizer.ggml.model", MetaValue::String("llama".into())),
        (
            "tokenizer.ggml.tokens",
            strings(&["<unk>".into(), "<s>".into(), "</s>".into(), "a".into()]),
        ),
    ];
    let tok = Tokenizer::from_gguf(&file(kvs)).unwrap();
    let err = tok.encode("é", false, false).unwrap_err();
    assert!(err.to_string().contains("byte-fallback"), "{err}");
}

#[test]
fn special_tokens_in_text() {
    let tok = spm(HELLO);
    let ctl = tok.token_id("<ctl>").unwrap();
    let user = tok.token_id("<|user|>").unwrap();
    // User-defined tokens are always matched; control tokens only with parse_special.
    let got = tok.encode("<|user|>hello<ctl>", false, true).unwrap();
    let hello = tok.token_id("▁hello").unwrap();
    assert_eq!(got, [user, hello, ctl]);
    let got = tok.encode("<|user|>hello<ctl>", false, false).unwrap();
    assert_eq!(got[..2], [user, hello]);
    assert!(!got.contains(&ctl));
    // Text that follows a special token gets the space prefix again.
    let got = tok.encode("<ctl>hello", false, true).unwrap();
    assert_eq!(got, [ctl, hello]);
    assert_eq!(tok.decode(&[ctl, hello]), "<ctl> hello");

    // "unused" control tokens are unused; "<|im_end|>" is end-of-generation and control.
    let unused = tok.token_id("<unused7>").unwrap();
    assert!(tok
        .token_attr(unused)
        .intersects(TokenAttr::UNUSED | TokenAttr::CONTROL));
    let im_end = tok.token_id("<|im_end|>").unwrap();
    assert!(tok.is_eog(im_end) && tok.is_control(im_end));
    assert_eq!(tok.eot(), Some(im_end));
    assert!(tok.is_eog(2) && !tok.is_eog(1));
}

#[test]
fn longest_special_token_wins_and_overlaps_are_resolved_by_priority() {
    let tok = spm(&[
        ("<a>", 0.0, USER),
        ("<a><b>", 0.0, USER),
        ("<b>", 0.0, USER),
        ("x", 0.0, NORMAL),
    ]);
    let [a, ab, b] = [0, 1, 2].map(|i| tok.token_id(["<a>", "<a><b>", "<b>"][i]).unwrap());
    assert_eq!(
        tok.encode("<a><b><b><a>", false, false).unwrap(),
        [ab, b, a]
    );
}

#[test]
fn rstrip_for_phi3_special_tokens() {
    let mut kvs = spm_kvs(HELLO);
    kvs.push(("general.name", MetaValue::String("Phi-3 mini".into())));
    let tok = Tokenizer::from_gguf(&file(kvs)).unwrap();
    let ctl = tok.token_id("<ctl>").unwrap();
    let hello = tok.token_id("▁hello").unwrap();
    // The spaces after <ctl> are swallowed; the prefix space is still added.
    assert_eq!(
        tok.encode("<ctl>   hello", false, true).unwrap(),
        [ctl, hello]
    );
}

#[test]
fn long_inputs_are_not_quadratic() {
    let tok = spm(&[
        ("a", -1.0, NORMAL),
        ("aa", -1.0, NORMAL),
        ("aaaa", -1.0, NORMAL),
        ("<x>", 0.0, USER),
    ]);
    let text = "a".repeat(200_000) + &"<x>".repeat(20_000);
    let start = std::time::Instant::now();
    let got = tok.encode(&text, false, false).unwrap();
    assert_eq!(got.len(), 3 + 50_000 + 20_000);
    assert!(start.elapsed().as_secs() < 20, "{:?}", start.elapsed());
}

/// A byte-level BPE vocabulary: the 256 byte characters, then `extra` tokens and `merges`.
fn bpe_kvs(extra: &[&str], merges: &[&str], pre: &str) -> Vec<(&'static str, MetaValue)> {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_to_char(b).to_string()).collect();
    tokens.extend(extra.iter().map(|t| t.to_string()));
    let types = MetaValue::Array(MetaArray::I32(
        tokens
            .iter()
            .map(|t| if t.starts_with("<|") { CONTROL } else { NORMAL })
            .collect(),
    ));
    vec![
        ("tokenizer.ggml.model", MetaValue::String("gpt2".into())),
        ("tokenizer.ggml.pre", MetaValue::String(pre.into())),
        ("tokenizer.ggml.tokens", strings(&tokens)),
        ("tokenizer.ggml.token_type", types),
        (
            "tokenizer.ggml.merges",
            strings(&merges.iter().map(|m| m.to_string()).collect::<Vec<_>>()),
        ),
        (
            "tokenizer.ggml.eos_token_id",
            MetaValue::U32(256 + extra.len() as u32 - 1),
        ),
    ]
}

const BPE_TOKENS: &[&str] = &[
    "he",
    "ll",
    "hell",
    "hello",
    "Ġw",
    "or",
    "Ġwor",
    "ld",
    "Ġworld",
    "<|endoftext|>",
];
const BPE_MERGES: &[&str] = &[
    "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld",
];

#[test]
fn bpe_applies_merges_by_rank_within_words() {
    let tok = Tokenizer::from_gguf(&file(bpe_kvs(BPE_TOKENS, BPE_MERGES, "gpt-2"))).unwrap();
    assert_eq!(tok.kind(), TokenizerKind::Bpe);
    assert_eq!(tok.pre_tokenizer(), Some(PreTokenizer::Gpt2));
    assert!(!tok.add_bos());
    let got = tok.encode("hello world!", true, true).unwrap();
    assert_eq!(got, ids(&tok, &["hello", "Ġworld", "!"]));
    assert_eq!(tok.decode(&got), "hello world!");
    // Merges never cross words: "o w" is no pair because " w" starts a new word.
    let got = tok.encode("hellowor", false, false).unwrap();
    assert_eq!(got, ids(&tok, &["hello", "w", "or"]));
    let eot = tok.token_id("<|endoftext|>").unwrap();
    assert_eq!(
        tok.encode("hi<|endoftext|>", false, true).unwrap(),
        [u32::from(b'h'), u32::from(b'i'), eot]
    );
    assert!(tok.is_eog(eot));
    // Raw bytes (here a newline and an emoji) come back from their GPT-2 characters.
    let text = "\n🦀";
    assert_eq!(tok.decode(&tok.encode(text, false, false).unwrap()), text);
}

#[test]
fn bpe_decode_cleans_spaces_for_gpt2() {
    let tok = Tokenizer::from_gguf(&file(bpe_kvs(BPE_TOKENS, BPE_MERGES, "gpt-2"))).unwrap();
    let ids = tok.encode("hello , world 's", false, false).unwrap();
    assert_eq!(tok.decode(&ids), "hello, world's");
    let tok = Tokenizer::from_gguf(&file(bpe_kvs(BPE_TOKENS, BPE_MERGES, "qwen2"))).unwrap();
    assert_eq!(
        tok.decode(&tok.encode("hello , world 's", false, false).unwrap()),
        "hello , world 's"
    );
}

#[test]
fn llama3_pre_takes_whole_words_that_are_tokens() {
    // "hello" is a token, but no merge forms it: llama3 ignores merges for whole-word tokens.
    let tok = Tokenizer::from_gguf(&file(bpe_kvs(&["hello", "<|x|>"], &[], "llama-bpe"))).unwrap();
    assert_eq!(tok.pre_tokenizer(), Some(PreTokenizer::Llama3));
    assert!(tok.add_bos());
    assert_eq!(
        tok.encode("hello", false, false).unwrap(),
        ids(&tok, &["hello"])
    );
    let tok = Tokenizer::from_gguf(&file(bpe_kvs(&["hello", "<|x|>"], &[], "qwen2"))).unwrap();
    assert_eq!(tok.encode("hello", false, false).unwrap().len(), 5);
}

#[test]
fn stream_decoder_holds_back_partial_characters() {
    let tok = spm(HELLO);
    let crab: Vec<u32> = "🦀".bytes().map(|b| 3 + u32::from(b)).collect();
    let mut s = tok.stream_decoder(false);
    assert_eq!(s.push(tok.token_id("▁hello").unwrap()), "hello");
    assert_eq!(s.push(crab[0]), "");
    assert_eq!(s.push(crab[1]), "");
    assert_eq!(s.pending().len(), 2);
    assert_eq!(s.push(crab[2]), "");
    assert_eq!(s.push(crab[3]), "🦀");
    assert_eq!(
        s.push(1),
        "",
        "control tokens print nothing with render_special = false"
    );
    assert_eq!(s.push(3 + 0xFF), "\u{FFFD}");
    assert_eq!(s.push(crab[0]), "");
    assert_eq!(s.push(tok.token_id("▁world").unwrap()), "\u{FFFD} world");
    assert_eq!(s.push(crab[0]), "");
    assert_eq!(s.finish(), "\u{FFFD}");
    assert_eq!(s.finish(), "");
}

fn build_err(kvs: Vec<(&str, MetaValue)>) -> String {
    Tokenizer::from_gguf(&file(kvs)).unwrap_err().to_string()
}

fn replace(
    mut kvs: Vec<(&'static str, MetaValue)>,
    key: &'static str,
    value: Option<MetaValue>,
) -> Vec<(&'static str, MetaValue)> {
    kvs.retain(|(k, _)| *k != key);
    if let Some(v) = value {
        kvs.push((key, v));
    }
    kvs
}

#[test]
fn unsupported_models_and_pre_tokenizers_are_named() {
    let err = build_err(replace(
        spm_kvs(HELLO),
        "tokenizer.ggml.model",
        Some(MetaValue::String("bert".into())),
    ));
    assert!(
        err.contains("\"bert\"") && err.contains("\"llama\"") && err.contains("\"gpt2\""),
        "{err}"
    );
    let err = build_err(replace(
        bpe_kvs(BPE_TOKENS, BPE_MERGES, "x"),
        "tokenizer.ggml.pre",
        Some(MetaValue::String("tekken".into())),
    ));
    assert!(
        err.contains("tekken") && err.contains("qwen2") && err.contains("llama-bpe"),
        "{err}"
    );
    let err = build_err(replace(spm_kvs(HELLO), "tokenizer.ggml.model", None));
    assert!(err.contains("tokenizer.ggml.model"), "{err}");
}

#[test]
fn hostile_metadata_gives_errors() {
    let n = 256 + 3 + HELLO.len();
    let cases: Vec<(Vec<(&str, MetaValue)>, &str)> = vec![
        (
            replace(spm_kvs(HELLO), "tokenizer.ggml.tokens", None),
            "no vocabulary",
        ),
        (
            replace(spm_kvs(HELLO), "tokenizer.ggml.tokens", Some(strings(&[]))),
            "empty",
        ),
        (
            replace(
                spm_kvs(HELLO),
                "tokenizer.ggml.tokens",
                Some(MetaValue::Array(MetaArray::U8(vec![1]))),
            ),
            "strings",
        ),
        (
            replace(
                spm_kvs(HELLO),
                "tokenizer.ggml.tokens",
                Some(MetaValue::U32(3)),
            ),
            "array",
        ),
        (
            replace(
                spm_kvs(HELLO),
                "tokenizer.ggml.scores",
                Some(MetaValue::Array(MetaArray::F32(vec![0.0; 5]))),
            ),
            "5 entries",
        ),
        (
            replace(
                spm_kvs(HELLO),
                "tokenizer.ggml.scores",
                Some(strings(&["x".into()])),
            ),
            "numbers",
        ),
        (
            replace(
                spm_kvs(HELLO),
                "tokenizer.ggml.token_type",
                Some(MetaValue::Array(MetaArray::I32(vec![1; n + 1]))),
            ),
            "entries",
        ),
        (
            replace(
                spm_kvs(HELLO),
                "tokenizer.ggml.token_type",
                Some(MetaValue::Array(MetaArray::F32(vec![1.0; n]))),
            ),
            "integers",
        ),
        (
            replace(
                spm_kvs(HELLO),
                "tokenizer.ggml.bos_token_id",
                Some(MetaValue::U32(n as u32)),
            ),
            "outside",
        ),
        (
            replace(
                spm_kvs(HELLO),
                "tokenizer.ggml.eos_token_id",
                Some(MetaValue::I32(-1)),
            ),
            "eos_token_id",
        ),
        (
            replace(
                spm_kvs(HELLO),
                "tokenizer.ggml.add_bos_token",
                Some(MetaValue::U32(1)),
            ),
            "add_bos_token",
        ),
        (
            replace(
                bpe_kvs(BPE_TOKENS, BPE_MERGES, "gpt-2"),
                "tokenizer.ggml.merges",
                None,
            ),
            "needs merges",
        ),
        (
            bpe_kvs(BPE_TOKENS, &["h e", "he x1"], "gpt-2"),
            "\"x1\", which is not a token",
        ),
        (bpe_kvs(BPE_TOKENS, &["hex"], "gpt-2"), "no space"),
        (bpe_kvs(BPE_TOKENS, &["l o"], "gpt-2"), "forms \"lo\""),
        (
            replace(
                bpe_kvs(BPE_TOKENS, BPE_MERGES, "gpt-2"),
                "tokenizer.ggml.merges",
                Some(MetaValue::Array(MetaArray::I32(vec![1]))),
            ),
            "strings",
        ),
    ];
    for (kvs, needle) in cases {
        let err = build_err(kvs);
        assert!(err.contains(needle), "{err:?} should mention {needle:?}");
    }
    // A padding id past the vocabulary is ignored (as llama.cpp does); real files have it.
    let tok = Tokenizer::from_gguf(&file(replace(
        spm_kvs(HELLO),
        "tokenizer.ggml.padding_token_id",
        Some(MetaValue::U32(n as u32)),
    )))
    .unwrap();
    assert_eq!(tok.special_ids().pad, None);
}

#[test]
fn odd_but_valid_vocabularies_do_not_panic() {
    // Empty and duplicate token texts, NaN scores, unknown token types, byte tokens with bad text.
    let tokens: Vec<String> = ["", "a", "a", "<0xZZ>", "<0x", "b", "ab"]
        .map(String::from)
        .to_vec();
    let kvs = vec![
        ("tokenizer.ggml.model", MetaValue::String("llama".into())),
        ("tokenizer.ggml.tokens", strings(&tokens)),
        (
            "tokenizer.ggml.scores",
            MetaValue::Array(MetaArray::F32(vec![
                f32::NAN,
                0.0,
                -0.0,
                1.0,
                1.0,
                f32::NAN,
                f32::INFINITY,
            ])),
        ),
        (
            "tokenizer.ggml.token_type",
            MetaValue::Array(MetaArray::I32(vec![1, 1, 1, 6, 6, 99, 1])),
        ),
        ("tokenizer.ggml.bos_token_id", MetaValue::U32(0)),
        ("tokenizer.ggml.add_space_prefix", MetaValue::Bool(false)),
    ];
    let tok = Tokenizer::from_gguf(&file(kvs)).unwrap();
    assert_eq!(tok.token_text(0), Some("[EMPTY_0]"));
    assert_eq!(
        tok.token_id("a"),
        Some(2),
        "a duplicate text maps to its last id"
    );
    assert_eq!(tok.token_to_piece(3), [0]);
    assert_eq!(tok.token_to_piece(5), b"", "undefined tokens have no piece");
    let got = tok.encode("ab", true, true).unwrap();
    assert_eq!(got, [0, 6]);
    let _ = tok.decode(&[0, 1, 2, 3, 4, 5, 6, 7, u32::MAX]);
    assert!(tok.encode("é", false, false).is_err());
}

/// A tiny deterministic generator for the randomized test below.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn text(&mut self, max_chars: usize) -> String {
        const ALPHABET: &[&str] = &[
            "a", "b", " ", "\n", "\t", "'", "s", "1", "é", "你", "🦀", "<", ">", "|", "▁", "Ġ",
            "x", ".",
        ];
        (0..self.below(max_chars + 1))
            .map(|_| ALPHABET[self.below(ALPHABET.len())])
            .collect()
    }
}

#[test]
fn random_vocabularies_and_texts_never_panic() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut built = 0;
    for round in 0..300 {
        let bpe = round % 2 == 1;
        let n = 1 + rng.below(40);
        let mut tokens: Vec<String> = (0..n).map(|_| rng.text(4)).collect();
        if bpe && round % 4 == 1 {
            tokens.extend((0..=255u8).map(|b| byte_to_char(b).to_string()));
        }
        if round % 3 == 0 {
            tokens.extend(
                ["<0x41>", "<0xC3>", "<0xA9>", "<s>", "</s>", "<|im_end|>"].map(String::from),
            );
        }
        let n = tokens.len();
        let types: Vec<i32> = (0..n).map(|_| rng.below(8) as i32).collect();
        let scores: Vec<f32> = (0..n).map(|_| rng.below(100) as f32 - 50.0).collect();
        let mut kvs = vec![
            (
                "tokenizer.ggml.model",
                MetaValue::String(if bpe { "gpt2" } else { "llama" }.into()),
            ),
            ("tokenizer.ggml.tokens", strings(&tokens)),
            (
                "tokenizer.ggml.scores",
                MetaValue::Array(MetaArray::F32(scores)),
            ),
            (
                "tokenizer.ggml.token_type",
                MetaValue::Array(MetaArray::I32(types)),
            ),
            (
                "tokenizer.ggml.add_eos_token",
                MetaValue::Bool(round % 5 == 0),
            ),
        ];
        if bpe {
            let pres = ["default", "gpt-2", "llama-bpe", "qwen2"];
            kvs.push((
                "tokenizer.ggml.pre",
                MetaValue::String(pres[rng.below(pres.len())].into()),
            ));
            // Merges of pairs whose concatenation is a token, plus now and then a bad one.
            let mut merges = Vec::new();
            for _ in 0..rng.below(30) {
                let (a, b) = (&tokens[rng.below(n)], &tokens[rng.below(n)]);
                if tokens.contains(&format!("{a}{b}")) || rng.below(10) == 0 {
                    merges.push(format!("{a} {b}"));
                }
            }
            kvs.push(("tokenizer.ggml.merges", strings(&merges)));
        }
        if rng.below(4) == 0 {
            kvs.push((
                "tokenizer.ggml.bos_token_id",
                MetaValue::U32(rng.below(n + 2) as u32),
            ));
        }
        let Ok(tok) = Tokenizer::from_gguf(&file(kvs)) else {
            continue;
        };
        built += 1;
        for _ in 0..20 {
            let text = rng.text(30);
            for (add, parse) in [(true, true), (true, false), (false, true), (false, false)] {
                if let Ok(ids) = tok.encode(&text, add, parse) {
                    let _ = tok.decode(&ids);
                    let mut s = tok.stream_decoder(parse);
                    for &id in &ids {
                        let _ = s.push(id);
                    }
                    let _ = s.finish();
                }
            }
        }
    }
    assert!(
        built > 100,
        "only {built} random vocabularies were accepted"
    );
}
