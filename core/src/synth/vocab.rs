//! A llama-style SentencePiece vocabulary for synthetic models: `<unk>`, `<s>`, `</s>`, the 256
//! byte-fallback tokens `<0x00>`..`<0xFF>`, the characters of an embedded English corpus, then
//! pieces learnt by byte-pair merges over that corpus (each merge's result scored by its rank, so
//! SentencePiece's highest-score-first merging rebuilds them), padded to the requested size with
//! unreachable word pairs.

use std::collections::{BTreeMap, HashMap, HashSet};

/// SentencePiece's word-boundary marker.
pub const SPACE: char = '\u{2581}';

/// English text the merges are learnt from (and that the tests tokenise).
pub const CORPUS: &str = "\
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single \
step. It was the best of times, it was the worst of times, it was the age of wisdom, it was the \
age of foolishness. In the beginning there was nothing but a small town by the river, where people \
worked in the fields during the day and told stories by the fire at night. Children played in the \
streets, and their parents watched them from the windows of their houses. Every morning the baker \
opened his shop and sold fresh bread to everyone who came by. The weather was often cold in winter \
and warm in summer, and the farmers knew when to plant their seeds and when to bring in the harvest. \
Language models predict the next word from the words that came before it. They are trained on large \
amounts of text and learn which words often appear together. A model that has learned well can \
write sentences that sound natural, answer questions about many different subjects, and translate \
between languages. Most of the neurons in a large network are quiet for any given input, and only a \
few of them fire. This is called sparsity, and it means that a computer could skip most of the work \
if it knew in advance which neurons would be active. Some neurons are hot: they fire for almost \
every word. Others are cold and fire only rarely, for particular topics or rare words. The \
government announced a new plan to improve public schools and build more roads between the cities. \
Scientists have discovered that the water on the planet is much older than the sun itself. She \
said that she would come back later, but he did not believe her, because she had said the same \
thing many times before. What do you think about this idea? I think it is a good one, although it \
will take a long time and a lot of money to make it work. We should start as soon as possible and \
keep going until the job is done. Thank you for your help; we could not have finished without you. \
People should always be kind to each other, because life is short and the world is large. \
Numbers like one, two, three, four, five, six, seven, eight, nine and ten are used every day. \
The history of science shows how people learned to measure, count and understand the world around \
them, from the stars in the sky to the smallest parts of living things.";

/// Common English words, added to the corpus (three times each) so that they become whole pieces.
pub const COMMON_WORDS: &str = "the of and to a in is it you that he was for on are with as I his \
they be at one have this from or had by hot word but what some we can out other were all there when \
up use your how said an each she which do their time if will way about many then them write would \
like so these her long make thing see him two has look more day could go come did number sound no \
most people my over know water than call first who may down side been now find any new work part \
take get place made live where after back little only round man year came show every good me give \
our under name very through just form sentence great think say help low line differ turn cause much \
mean before move right boy old too same tell does set three want air well also play small end put \
home read hand port large spell add even land here must big high such follow act why ask men change \
went light kind off need house picture try us again animal point mother world near build self earth \
father head stand own page should country found answer school grow study still learn plant cover \
food sun four between state keep eye never last let thought city tree cross farm hard start might \
story saw far sea draw left late run while press close night real life few north open seem together \
next white children begin got walk example ease paper group always music those both mark often \
letter until mile river car feet care second book carry took science eat room friend began idea \
fish mountain stop once base hear horse cut sure watch color face wood main enough plain girl usual \
young ready above ever red list though feel talk bird soon body dog family direct pose leave song \
measure door product black short numeral class wind question happen complete ship area half rock \
order fire south problem piece told knew pass since top whole king space heard best hour better \
true during hundred five remember step early hold west ground interest reach fast verb sing listen \
six table travel less morning ten simple several vowel toward war lay against pattern slow center \
love person money serve appear road map rain rule govern pull cold notice voice unit power town \
fine certain fly fall lead cry dark machine note wait plan figure star box noun field rest correct \
able pound done beauty drive stood contain front teach week final gave green oh quick develop ocean \
warm free minute strong special mind behind clear tail produce fact street inch multiply nothing \
course stay wheel full force blue object decide surface deep moon island foot system busy test \
record boat common gold possible plane stead dry wonder laugh thousand ago ran check game shape \
equate miss brought heat snow tire bring yes distant fill east paint language among model neuron \
sparse active computer network predict token layer weight";

/// One vocabulary entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Piece {
    /// The token's text (`▁` for a space).
    pub text: String,
    /// Its SentencePiece score (higher merges first).
    pub score: f32,
    /// GGUF `token_type`: 1 normal, 2 unknown, 3 control, 6 byte.
    pub token_type: i32,
}

/// Builds a vocabulary of exactly `size` tokens (at least 259 + the corpus characters).
pub fn build(size: usize) -> Vec<Piece> {
    let mut out = vec![
        Piece {
            text: "<unk>".into(),
            score: 0.0,
            token_type: 2,
        },
        Piece {
            text: "<s>".into(),
            score: 0.0,
            token_type: 3,
        },
        Piece {
            text: "</s>".into(),
            score: 0.0,
            token_type: 3,
        },
    ];
    for b in 0..=255u8 {
        out.push(Piece {
            text: format!("<0x{b:02X}>"),
            score: 0.0,
            token_type: 6,
        });
    }
    let mut seen: HashSet<String> = HashSet::new();
    let mut push = |out: &mut Vec<Piece>, text: String, score: f32| {
        if out.len() < size && seen.insert(text.clone()) {
            out.push(Piece {
                text,
                score,
                token_type: 1,
            });
        }
    };

    // word frequencies ("▁word" units)
    let mut freq: BTreeMap<String, u64> = BTreeMap::new();
    for w in CORPUS.split_whitespace() {
        *freq.entry(format!("{SPACE}{w}")).or_default() += 1;
    }
    for w in COMMON_WORDS.split_whitespace() {
        *freq.entry(format!("{SPACE}{w}")).or_default() += 3;
    }
    // base characters: every character of the corpus and printable ASCII
    let mut chars: Vec<char> = freq.keys().flat_map(|w| w.chars()).collect();
    chars.extend((0x21u8..0x7f).map(char::from));
    chars.push(SPACE);
    chars.sort_unstable();
    chars.dedup();
    for c in &chars {
        push(&mut out, c.to_string(), -1e6);
    }

    // byte-pair merges
    let mut words: Vec<(Vec<String>, u64)> = freq
        .iter()
        .map(|(w, &n)| (w.chars().map(String::from).collect(), n))
        .collect();
    let mut rank = 0u32;
    while out.len() < size {
        let mut pairs: HashMap<(&str, &str), u64> = HashMap::new();
        for (syms, n) in &words {
            for p in syms.windows(2) {
                *pairs.entry((p[0].as_str(), p[1].as_str())).or_default() += n;
            }
        }
        // most frequent pair, ties broken by the text for determinism
        let best = pairs
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)))
            .map(|((a, b), _)| (a.to_owned(), b.to_owned()));
        let Some((a, b)) = best else { break };
        let merged = format!("{a}{b}");
        for (syms, _) in &mut words {
            let mut i = 0;
            while i + 1 < syms.len() {
                if syms[i] == a && syms[i + 1] == b {
                    syms[i] = merged.clone();
                    syms.remove(i + 1);
                }
                i += 1;
            }
        }
        rank += 1;
        push(&mut out, merged, -(rank as f32));
    }

    // padding: pairs of common words, never formed by the merges above in ordinary text
    let list: Vec<&str> = COMMON_WORDS.split_whitespace().collect();
    'pad: for a in &list {
        for b in &list {
            if out.len() >= size {
                break 'pad;
            }
            rank += 1;
            push(&mut out, format!("{SPACE}{a}{b}"), -(rank as f32));
        }
    }
    let mut n = 0;
    while out.len() < size {
        rank += 1;
        push(&mut out, format!("<extra_{n}>"), -(rank as f32));
        n += 1;
    }
    out
}
