#!/usr/bin/env bash
# Regenerates tests/data/powerinfer/greedy.jsonl: PowerInfer's CPU build (SJTU-IPADS/PowerInfer,
# built by ../shared/tools/build-references.sh with POWERINFER_GIT set, into $HOTCOLD_REF) running
# files that `hotcold synth` wrote, greedy, one thread (its sparse down-projection kernel races with
# more), no repetition penalty (its default is 1.1 even at --temp 0), EOS ignored.
# Each line: the synth settings, the prompt, n, and PowerInfer's stdout as hex.
set -euo pipefail
cd "$(dirname "$0")/../.."
REF=${HOTCOLD_REF:-$HOME/.cache/hotcold-ref}
PI=$REF/powerinfer/build/bin/main
TMP=$(mktemp -d)
cargo build -q --release -p hotcold-native
N=32
PROMPT="We hold these truths to be self-evident"
: > tests/data/powerinfer/greedy.jsonl
for spec in tiny:llama:f16 tiny:llama:q4_0 tiny:bamboo:q4_0 small:llama:q4_0 small:llama:f16 \
    tiny:falcon:f16 tiny:falcon:q4_0 tiny:opt:f16 tiny:opt:q4_0; do
  IFS=: read -r preset arch type <<< "$spec"
  file=$TMP/$preset-$arch-$type.gguf
  ./target/release/hotcold synth --preset "$preset" --arch "$arch" --type "$type" --seed 11 -o "$file" >/dev/null
  "$PI" -m "$file" -p "$PROMPT" -n $N -t 1 --temp 0 --repeat-penalty 1.0 --ignore-eos --verbose-prompt \
    2> "$TMP/err.txt" > "$TMP/out.bin"
  python3 - "$preset" "$arch" "$type" "$PROMPT" $N "$TMP/out.bin" "$TMP/err.txt" >> tests/data/powerinfer/greedy.jsonl <<'PY'
import json, re, sys
preset, arch, ty, prompt, n, out, err = sys.argv[1:]
# --verbose-prompt lists the prompt's token ids ("   313 -> 'W'"): the test feeds hotcold the same
# ids, so that the engines are compared and not the tokenizers (PowerInfer's main adds no space
# prefix to the prompt; llama.cpp's current SentencePiece tokenizer, and ours, do).
ids = [int(m.group(1)) for m in re.finditer(r"^\s+(\d+) -> '", open(err, errors="replace").read(), re.M)]
stdout = open(out, "rb").read()
assert stdout.startswith(prompt.encode()), "PowerInfer echoes the prompt first"
print(json.dumps({"preset": preset, "arch": arch, "type": ty, "seed": 11, "prompt": prompt,
                  "prompt_ids": ids, "n": int(n), "generated_hex": stdout[len(prompt.encode()):].hex()}))
PY
done
rm -rf "$TMP"
wc -l tests/data/powerinfer/greedy.jsonl
