#!/usr/bin/env bash
# Dense vs sparse decode of the same synthetic 90%-sparse `small` ReLU model, in hotcold and (when
# its `main` binary is given) in PowerInfer's CPU build, same weights and thread count:
#   bash benches/sparse_vs_dense.sh [POWERINFER_MAIN] [THREADS] [TYPE]
# The fair dense baseline is the model's dense twin (`synth --layout llama.cpp`: the same weights
# as an ordinary GGUF, row-major ffn_down, no predictor), run with the plain dense matmul as a
# dense engine (llama.cpp) runs it. "dense on the PowerInfer file" is kept for reference: there the
# down projection is stored neuron-major only, so `--ffn dense` skips the down rows of zero ReLU
# activations and reads less than a dense engine.
# Prints decode tok/s, the FFN density, bytes of weights per token, and the ratios.
# HOTCOLD=path/to/hotcold runs that binary instead of building this checkout's (to compare builds
# side by side on the same files).
set -euo pipefail
cd "$(dirname "$0")/.."
PI_MAIN=${1:-}
THREADS=${2:-2}
TYPE=${3:-q4_0}
OUT=${TMPDIR:-/tmp}/hotcold-bench-small-$TYPE.gguf
TWIN=${TMPDIR:-/tmp}/hotcold-bench-small-$TYPE-dense.gguf
if [[ -z ${HOTCOLD:-} ]]; then
  cargo build -q --release -p hotcold-native
  HOTCOLD=./target/release/hotcold
fi
[[ -f $OUT ]] || "$HOTCOLD" synth --preset small --type "$TYPE" --sparsity 0.9 -o "$OUT"
[[ -f $TWIN ]] || "$HOTCOLD" synth --preset small --type "$TYPE" --sparsity 0.9 --layout llama.cpp -o "$TWIN"
declare -A rate
bench() { # label file mode
  local out
  out=$("$HOTCOLD" bench -m "$2" --ffn "$3" -t "$THREADS" -p 0 -n 64 -r 3 2>&1)
  echo "$out" | grep -E "tg64|ffn |weights read" | sed "s/^/[$1] /" || true
  rate[$1]=$(echo "$out" | sed -n 's/.*| tg64 | \([0-9.]*\).*/\1/p')
}
bench twin-dense "$TWIN" dense
bench pwri-dense "$OUT" dense
bench oracle "$OUT" oracle
bench sparse "$OUT" sparse
python3 - "${rate[twin-dense]}" "${rate[pwri-dense]}" "${rate[oracle]}" "${rate[sparse]}" <<'PY'
import sys
twin, pwri, oracle, sparse = map(float, sys.argv[1:])
print(f"decode tok/s: dense (twin, llama.cpp layout) {twin:.2f} | dense on the PowerInfer file "
      f"(skips zero down rows) {pwri:.2f} | oracle {oracle:.2f} | sparse {sparse:.2f}")
print(f"sparse / dense: {sparse / twin:.2f}x against the twin (the fair baseline), "
      f"{sparse / pwri:.2f}x against dense on the PowerInfer file; oracle / twin {oracle / twin:.2f}x")
PY
if [[ -n $PI_MAIN ]]; then
  # PowerInfer: one thread for a deterministic reference (its sparse down kernel races), then THREADS.
  for t in 1 "$THREADS"; do
    "$PI_MAIN" -m "$OUT" -p "Once upon a time" -n 64 -t "$t" --temp 0 --repeat-penalty 1.0 2>&1 \
      | grep -E "eval time" | sed "s/^/PowerInfer -t $t: /"
  done
fi
