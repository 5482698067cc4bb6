#!/usr/bin/env bash
# Decode speed of the hybrid CPU+GPU FFN and of the GPU-resident model against CPU-only, on the
# synthetic 90%-sparse `small` ReLU model (`--ffn sparse`) and on the default Gemma model (dense:
# whole-layer offload):
#   bash benches/gpu_hybrid.sh [THREADS] [N_GEN] [REPS]
# Columns: CPU only; hybrid with budgets that hold 10%, 50% and 100% of the FFN (attention, norms
# and the LM head on the CPU); GPU-only: the whole model resident on the GPU (no --vram-budget: one
# submission and one read-back per token). On a machine without a GPU it runs on Mesa's lavapipe
# (software Vulkan): the table then only shows the paths work, its timings mean nothing. Under 10
# minutes on a machine with an NVIDIA GPU. A PowerInfer index `<model>.generated.gpuidx` next to a
# model (`hotcold plan --write-gpuidx`) sets the hybrid columns' hot neurons when it fits the budget:
# remove it to measure the planner's split. CPU cost of recording one resident step:
#   cargo run --release --example gpu_encode -- MODEL.gguf [STEPS] [sparse]
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-$(nproc)}
N_GEN=${2:-64}
REPS=${3:-3}
SYNTH=${TMPDIR:-/tmp}/hotcold-bench-small-q4_0.gguf
cargo build -q --release -p hotcold-native
HC=./target/release/hotcold
[[ -f $SYNTH ]] || $HC synth --preset small --type q4_0 --sparsity 0.9 -o "$SYNTH" >/dev/null
bash scripts/fetch-models.sh >/dev/null
GEMMA=$HOME/.cache/hotcold/gemma-3-270m-q4_k_m.gguf

# decode tok/s of one configuration (extra flags after the model)
rate() {
  local model=$1
  shift
  local out
  out=$($HC bench -m "$model" -t "$THREADS" -p 0 -n "$N_GEN" -r "$REPS" "$@" 2>&1) || {
    echo "$out" >&2
    return 1
  }
  echo "$out" | grep -m1 '^device:' >&2 || true
  echo "$out" | sed -n "s/.*| tg$N_GEN | \([0-9.]*\).*/\1/p"
}

declare -A tps
for name in synth gemma; do
  model=$SYNTH
  [[ $name == gemma ]] && model=$GEMMA
  tps[$name,cpu]=$(rate "$model" --device cpu)
  for share in 10 50 100; do
    tps[$name,$share]=$(rate "$model" --device gpu --vram-budget "$share%")
  done
  tps[$name,gpu]=$(rate "$model" --device gpu)
done

python3 - "$N_GEN" "$THREADS" \
  "${tps[synth,cpu]}" "${tps[synth,10]}" "${tps[synth,50]}" "${tps[synth,100]}" "${tps[synth,gpu]}" \
  "${tps[gemma,cpu]}" "${tps[gemma,10]}" "${tps[gemma,50]}" "${tps[gemma,100]}" "${tps[gemma,gpu]}" <<'PY'
import sys
n_gen, threads, *v = sys.argv[1:]
v = [float(x) for x in v]
print(f"\ndecode tok/s (tg{n_gen}, {threads} threads; ratio to CPU-only in brackets)")
print(f"| model | CPU only | hybrid 10% | hybrid 50% | hybrid 100% | GPU-only (resident) |")
print(f"| --- | --- | --- | --- | --- | --- |")
for name, row in (("synth small q4_0 (90% sparse)", v[:5]), ("gemma-3-270m q4_k_m (dense)", v[5:])):
    cpu = row[0]
    cells = [f"{cpu:.2f}"] + [f"{r:.2f} ({r / cpu:.2f}x)" for r in row[1:]]
    print(f"| {name} | " + " | ".join(cells) + " |")
PY
