#!/usr/bin/env bash
# Dense vs sparse decode on the same synthetic 90%-sparse `small` ReLU model, in hotcold and (when
# its `main` binary is given) in PowerInfer's CPU build, same file and thread count:
#   bash benches/sparse_vs_dense.sh [POWERINFER_MAIN] [THREADS] [TYPE]
# Prints decode tok/s, the FFN density, bytes of weights per token, and the ratios.
# HOTCOLD=path/to/hotcold runs that binary instead of building this checkout's (to compare builds
# side by side on the same file).
set -euo pipefail
cd "$(dirname "$0")/.."
PI_MAIN=${1:-}
THREADS=${2:-2}
TYPE=${3:-q4_0}
OUT=${TMPDIR:-/tmp}/hotcold-bench-small-$TYPE.gguf
if [[ -z ${HOTCOLD:-} ]]; then
  cargo build -q --release -p hotcold-native
  HOTCOLD=./target/release/hotcold
fi
[[ -f $OUT ]] || "$HOTCOLD" synth --preset small --type "$TYPE" --sparsity 0.9 -o "$OUT"
declare -A rate
for mode in dense oracle sparse; do
  out=$("$HOTCOLD" bench -m "$OUT" --ffn "$mode" -t "$THREADS" -p 0 -n 64 -r 3 2>&1)
  echo "$out" | grep -E "tg64|ffn |weights read" || true
  rate[$mode]=$(echo "$out" | sed -n 's/.*| tg64 | \([0-9.]*\).*/\1/p')
done
python3 - "${rate[dense]}" "${rate[oracle]}" "${rate[sparse]}" <<'PY'
import sys
dense, oracle, sparse = map(float, sys.argv[1:])
print(f"decode tok/s: dense {dense:.2f} | oracle {oracle:.2f} ({oracle / dense:.2f}x) | sparse {sparse:.2f} ({sparse / dense:.2f}x)")
PY
if [[ -n $PI_MAIN ]]; then
  # PowerInfer: one thread for a deterministic reference (its sparse down kernel races), then THREADS.
  for t in 1 "$THREADS"; do
    "$PI_MAIN" -m "$OUT" -p "Once upon a time" -n 64 -t "$t" --temp 0 --repeat-penalty 1.0 2>&1 \
      | grep -E "eval time" | sed "s/^/PowerInfer -t $t: /"
  done
fi
