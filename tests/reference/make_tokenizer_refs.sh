#!/usr/bin/env bash
# Regenerates tests/data/tokenizer/<model>.json: the token ids llama.cpp's llama-tokenize gives for
# a fixed list of texts, for the default models and for variants of Qwen's vocabulary with other
# pre-tokenizers (written by `cargo test --test tokenizer_reference -- --ignored write_variants`).
#
# Usage: tests/reference/make_tokenizer_refs.sh
#   LLAMA_CPP_BIN  folder with llama-tokenize (default ~/.cache/hotcold-ref/llama.cpp/build/bin)
#   HOTCOLD_CACHE  model cache (default ~/.cache/hotcold; scripts/fetch-models.sh fills it)
# Needs python3 (standard library only).
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${LLAMA_CPP_BIN:-$HOME/.cache/hotcold-ref/llama.cpp/build/bin}"
cache="${HOTCOLD_CACHE:-$HOME/.cache/hotcold}"
out="$root/tests/data/tokenizer"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

[[ -x "$bin/llama-tokenize" ]] || { echo "llama-tokenize not found in $bin (set LLAMA_CPP_BIN)" >&2; exit 1; }
for f in gemma-3-270m-q4_k_m.gguf qwen2.5-coder-0.5b-instruct-q4_k_m.gguf; do
    [[ -f "$cache/$f" ]] || { echo "$cache/$f missing: run scripts/fetch-models.sh" >&2; exit 1; }
done

# Metadata-only copies of Qwen's vocabulary with tokenizer.ggml.pre = llama-bpe, gpt-2, default.
(cd "$root" && HOTCOLD_VARIANT_DIR="$work" cargo test -q --test tokenizer_reference -- --ignored --exact write_variants >/dev/null)

mkdir -p "$out"
python3 - "$bin/llama-tokenize" "$out" "$work" \
    "gemma-3-270m=$cache/gemma-3-270m-q4_k_m.gguf" \
    "qwen2.5-coder-0.5b-instruct=$cache/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" \
    "qwen-vocab-llama-bpe=$work/qwen-vocab-llama-bpe.gguf" \
    "qwen-vocab-gpt-2=$work/qwen-vocab-gpt-2.gguf" \
    "qwen-vocab-default=$work/qwen-vocab-default.gguf" <<'PY'
import json, os, subprocess, sys

tokenize, out_dir, work = sys.argv[1:4]
models = [a.split("=", 1) for a in sys.argv[4:]]

PARAGRAPH = (
    "The quick brown fox jumps over the lazy dog. In 1987, researchers at a small laboratory "
    "discovered that tokenizers behave strangely at boundaries: \"quotes\", (parentheses), "
    "[brackets] and {braces} all split differently, and numbers like 3,141,592.65 or 1e-9 are "
    "cut into pieces. Isn't it odd? They'll say it's fine; we'd disagree. Meanwhile, naïve café "
    "owners in São Paulo serve crème brûlée, Ελληνικά and русский text sits beside 日本語の文章 "
    "and 한국어 문장. URLs such as https://example.com/path?query=1&x=y#frag, e-mails like "
    "someone@example.org, and paths like C:\\Users\\me\\file.txt appear too.\n\n"
    "Second paragraph:\tit has tabs,   runs of spaces,\r\nWindows line ends and trailing space. "
)

COMMON = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    " leading space",
    "trailing space ",
    "   three leading spaces",
    "multiple   spaces    inside",
    "\ttab\tseparated\t",
    "line one\nline two\n\nline four\n",
    "\n\n\n",
    "Hello\n\n\tworld  !",
    "12345 3.14159",
    "0 00 000 0000 1234567890",
    "你好，世界",
    "🦀🔥👍🏽",
    "I'm sure it's fine, isn't it? You'll see. THEY'RE HERE'S",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "fn main() {\n\tlet x = vec![1, 2, 3];\n\tprintln!(\"{:?}\", x);\n}\n",
    "a+b=c; x^2 | y~z <tag> $5 && 100%",
    "Ünïcödé ﬁ ½ ℃ ⅷ ٣ ꙮ 𝔘𝔫𝔦",
    "mixed\u3000ideographic\u00a0nbsp\u2009thin",
    "",
    " ",
    "  ",
    "\n",
    PARAGRAPH,
]
SPECIAL = {
    "gemma-3-270m": [
        "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
        "<bos>text<eos>",
        "a<start_of_turn>b <end_of_turn> c",
        "x</s>y",
        "<unused5> and <mask>",
    ],
}
QWEN_SPECIAL = [
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWrite code<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    "x</s>y",
    "<|im_start|><|im_start|>nested<|im_end|",
]

def run(path, text, add_special, parse_special, ids):
    f = os.path.join(work, "prompt.txt")
    with open(f, "wb") as fh:
        fh.write(text.encode("utf-8"))
    cmd = [tokenize, "-m", path, "-f", f, "--no-escape", "--log-disable"]
    if ids:
        cmd.append("--ids")
    if not add_special:
        cmd.append("--no-bos")
    if not parse_special:
        cmd.append("--no-parse-special")
    return subprocess.run(cmd, check=True, capture_output=True).stdout

def pieces(raw, ids):
    """llama-tokenize without --ids prints `%6d -> '<piece>'\\n` per token; cut the pieces out."""
    result = []
    pos = 0
    for i, t in enumerate(ids):
        head = ("%6d -> '" % t).encode()
        assert raw.startswith(head, pos), (raw[pos:pos + 40], head)
        start = pos + len(head)
        if i + 1 < len(ids):
            end = raw.index(("'\n%6d -> '" % ids[i + 1]).encode(), start)
        else:
            end = raw.rindex(b"'\n")
        result.append(raw[start:end])
        pos = end + 2
    return result

def wants_bos(path):
    # llama-tokenize passes add_special = (model adds BOS) and not --no-bos.
    return json.loads(run(path, "a", True, True, True)) != json.loads(run(path, "a", False, True, True))

for name, path in models:
    texts = COMMON + SPECIAL.get(name, QWEN_SPECIAL if name.startswith("qwen") else [])
    combos = [(True, True), (False, True), (True, False), (False, False)]
    if not wants_bos(path):
        combos = [(False, True), (False, False)]
    cases = []
    for text in texts:
        for add_special, parse_special in combos:
            ids = json.loads(run(path, text, add_special, parse_special, True))
            detok = b"".join(pieces(run(path, text, add_special, parse_special, False), ids))
            cases.append({
                "text": text,
                "add_special": add_special,
                "parse_special": parse_special,
                "ids": ids,
                # llama.cpp's pieces (special tokens rendered), concatenated: its detokenization
                # for these vocabularies (no space-prefix removal or space cleaning applies).
                "detok": detok.decode("utf-8", "replace"),
            })
    with open(os.path.join(out_dir, name + ".json"), "w", encoding="utf-8") as fh:
        json.dump({"model": name, "llama_tokenize": os.path.basename(tokenize), "cases": cases},
                  fh, ensure_ascii=False, indent=1)
        fh.write("\n")
    print(f"{name}: {len(cases)} cases")
PY
