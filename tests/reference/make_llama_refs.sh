#!/usr/bin/env bash
# Regenerates tests/data/llama_cpp/*.jsonl: greedy continuations (64 tokens) and the top-10 raw
# logits of the first 4 steps, from llama.cpp (the llama-cpp-python 0.3.36 vendored copy, built
# CPU-only by ../shared/tools/build-references.sh into $HOTCOLD_REF, default ~/.cache/hotcold-ref).
# The reference mode is a batched prompt without flash attention. Each line also records
# `self_agreement`: for how many greedy tokens llama.cpp agrees with itself across three modes
# (batched, batched with flash attention, prompt fed one token at a time), and
# `self_logit_spread`: the largest change of a first-step top-10 logit across those modes.
set -euo pipefail
cd "$(dirname "$0")/../.."
REF=${HOTCOLD_REF:-$HOME/.cache/hotcold-ref}
LCPP=$REF/llama.cpp
TMP=$(mktemp -d)
BIN=$TMP/dump_greedy
gcc -O2 -o "$BIN" tests/reference/dump_greedy.c -I"$LCPP/include" -I"$LCPP/ggml/include" \
  -L"$LCPP/build/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$LCPP/build/bin"
CACHE=${HOTCOLD_CACHE:-$HOME/.cache/hotcold}

# run NAME MODEL PROMPT...: the three modes, merged into tests/data/llama_cpp/NAME.jsonl
run() {
  local name=$1 model=$2; shift 2
  "$BIN" "$model" 64 4 "$@" 2>/dev/null > "$TMP/batch.jsonl"
  REF_FLASH_ATTN=1 "$BIN" "$model" 64 4 "$@" 2>/dev/null > "$TMP/fa.jsonl"
  REF_ONE_BY_ONE=1 "$BIN" "$model" 64 4 "$@" 2>/dev/null > "$TMP/seq.jsonl"
  python3 - "$TMP" > "tests/data/llama_cpp/$name.jsonl" <<'PY'
import json, sys
d = sys.argv[1]
modes = [[json.loads(l) for l in open(f"{d}/{m}.jsonl")] for m in ("batch", "fa", "seq")]
for ref, *others in zip(*modes):
    agree = len(ref["ids"])
    spread = 0.0
    top = dict(map(tuple, ref["top_logits"][0]))
    for o in others:
        agree = min(agree, next((i for i, (a, b) in enumerate(zip(ref["ids"], o["ids"])) if a != b), agree))
        spread = max([spread] + [abs(top[t] - v) for t, v in o["top_logits"][0] if t in top])
    ref["self_agreement"] = agree
    ref["self_logit_spread"] = round(spread, 6)
    print(json.dumps(ref, ensure_ascii=False))
PY
}

run gemma-3-270m "$CACHE/gemma-3-270m-q4_k_m.gguf" \
  "The capital of France is" \
  "Once upon a time, in a small village," \
  "The three laws of thermodynamics are" \
  "def fibonacci(n):" \
  "Water boils at"
run qwen2.5-coder-0.5b-instruct "$CACHE/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" \
  "def quicksort(arr):" \
  "The capital of France is" \
  "// A function in C that reverses a string
" \
  "<|im_start|>user
Write a haiku about Rust.<|im_end|>
<|im_start|>assistant
" \
  "SELECT name FROM users WHERE"
# The `llama` architecture (NORM RoPE), on real weights: Qwen2's file relabelled as `llama`.
RELABEL_SRC=$CACHE/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf RELABEL_ARCH=llama RELABEL_DST=$TMP/qwen-as-llama.gguf \
  cargo test -q --release --test relabel_tool -- --ignored >/dev/null
run qwen-as-llama "$TMP/qwen-as-llama.gguf" \
  "def quicksort(arr):" \
  "The capital of France is" \
  "SELECT name FROM users WHERE"
rm -rf "$TMP"
wc -l tests/data/llama_cpp/*.jsonl
