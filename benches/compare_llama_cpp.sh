#!/usr/bin/env bash
# Side-by-side speed of hotcold and llama.cpp on the same files and thread count:
#   bash benches/compare_llama_cpp.sh [LLAMA_BENCH] [THREADS]
# LLAMA_BENCH defaults to the reference build of ../shared/tools/build-references.sh. Prints
# pp64/tg64 tok/s of both, the ratios, and hotcold's bytes per token against the measured memory
# read bandwidth (% of the decode roofline). DEPTHS="0 2048" also runs every test with that many
# tokens already in the context (llama-bench's -d; default: 0 only).
set -euo pipefail
cd "$(dirname "$0")/.."
LLAMA_BENCH=${1:-${HOTCOLD_REF:-$HOME/.cache/hotcold-ref}/llama.cpp/build/bin/llama-bench}
THREADS=${2:-2}
CACHE=${HOTCOLD_CACHE:-$HOME/.cache/hotcold}
cargo build -q --release -p hotcold-native
DEPTHS=${DEPTHS:-0}
for model in gemma-3-270m-q4_k_m qwen2.5-coder-0.5b-instruct-q4_k_m; do
  file=$CACHE/$model.gguf
  for depth in $DEPTHS; do
    echo "== $model, $THREADS threads, depth $depth"
    ours=$(./target/release/hotcold bench -m "$file" -t "$THREADS" -p 64 -n 64 -d "$depth" -r 3)
    theirs=$("$LLAMA_BENCH" -m "$file" -t "$THREADS" -p 64 -n 64 -d "$depth" -r 3 -o csv 2>/dev/null)
    echo "$ours"
    python3 - "$ours" "$theirs" <<'PY'
import csv, io, re, sys
ours, theirs = sys.argv[1], sys.argv[2]
mine = {m.group(1): float(m.group(2)) for m in re.finditer(r"\| ((?:pp|tg)\d+(?: @ d\d+)?) \| ([\d.]+)", ours)}
peer = {}
for row in csv.DictReader(io.StringIO(theirs)):
    test = f"pp{row['n_prompt']}" if int(row["n_prompt"]) else f"tg{row['n_gen']}"
    if int(row.get("n_depth") or 0):
        test += f" @ d{row['n_depth']}"
    peer[test] = float(row["avg_ts"])
for test in sorted(mine):
    print(f"{test}: hotcold {mine[test]:8.2f} tok/s | llama.cpp {peer.get(test, float('nan')):8.2f} tok/s | ratio {mine[test] / peer.get(test, float('nan')):.2f}x")
PY
  done
done
