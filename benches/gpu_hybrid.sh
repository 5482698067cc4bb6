#!/usr/bin/env bash
# Decode tok/s of CPU-only, the hybrid CPU+GPU pass at budgets holding 10%, 50% and 100% of the
# FFN, and the whole model resident on the GPU, as one table:
#   bash benches/gpu_hybrid.sh prepare                   # on the build machine (has cargo)
#   bash benches/gpu_hybrid.sh [THREADS] [N_GEN] [REPS]  # on the GPU machine (or here: lavapipe)
# Rows: the synthetic 90%-sparse ReLU model (`--ffn sparse`: hot neurons on the GPU, cold on the
# CPU), a synthetic dense SwiGLU model and the default Gemma model (dense: the budget takes the
# last layers whole, attention, FFN and KV cache, as a GPU segment). PRESET=small (default) or
# tiny (seconds, to check the script) or relullama-7b (4.6 GB files, made in minutes) chooses the
# synthetic models' shape; ROWS="sparse dense gemma" (default) chooses the rows.
#
# `prepare` builds the release binary here, strips it and puts it in target/gpu-bench/ (ignored,
# ~30 MiB: carry that folder to the GPU machine, which needs only an NVIDIA driver and the Vulkan
# loader: no cargo, no network). The synthetic models are made on the GPU machine by that binary
# (`hotcold synth`, seeded: the same files everywhere; small ones are too big to carry). Gemma
# (~240 MB, downloaded by scripts/fetch-models.sh, not regenerable) cannot be carried: its row
# runs only where ~/.cache/hotcold already has it, and is skipped otherwise. Under 10 minutes on a
# machine with an NVIDIA GPU. Without a GPU it runs on Mesa's lavapipe (software Vulkan): the
# table then only shows the paths work; its timings mean nothing.
#
# A PowerInfer index `<model>.generated.gpuidx` next to a model (`hotcold plan --write-gpuidx`)
# sets the hybrid columns' hot neurons when it fits the budget. CPU cost of recording one resident
# step: cargo run --release --example gpu_encode -- MODEL.gguf [STEPS] [sparse]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=target/gpu-bench
PRESET=${PRESET:-small}

if [[ ${1:-} == prepare ]]; then
  cargo build -q --release -p hotcold-native
  mkdir -p "$OUT"
  strip -o "$OUT/hotcold" target/release/hotcold
  du -h "$OUT/hotcold"
  echo "carry $OUT to the GPU machine, then run: bash benches/gpu_hybrid.sh [THREADS] [N_GEN] [REPS]"
  exit 0
fi

THREADS=${1:-$(nproc)}
N_GEN=${2:-64}
REPS=${3:-3}
if [[ -x $OUT/hotcold ]]; then
  HC=$OUT/hotcold
else
  cargo build -q --release -p hotcold-native
  HC=./target/release/hotcold
fi
mkdir -p "$OUT"
SPARSE=$OUT/synth-$PRESET-q4_0-relu.gguf
DENSE=$OUT/synth-$PRESET-q4_0-silu.gguf
ROWS=${ROWS:-sparse dense gemma}
if [[ " $ROWS " == *" sparse "* && ! -f $SPARSE ]]; then
  $HC synth --preset "$PRESET" --type q4_0 --sparsity 0.9 -o "$SPARSE" >/dev/null
fi
if [[ " $ROWS " == *" dense "* && ! -f $DENSE ]]; then
  $HC synth --preset "$PRESET" --type q4_0 --activation silu -o "$DENSE" >/dev/null
fi
GEMMA=$HOME/.cache/hotcold/gemma-3-270m-q4_k_m.gguf

# decode tok/s of one configuration (extra flags after the model); its placement line on stderr
rate() {
  local model=$1
  shift
  local out
  out=$($HC bench -m "$model" -t "$THREADS" -p 0 -n "$N_GEN" -r "$REPS" -c 256 "$@" 2>&1) || {
    echo "$out" >&2
    return 1
  }
  echo "$out" | grep -m1 '^device:\|; hybrid instead' >&2 || true
  echo "$out" | sed -n "s/.*| tg$N_GEN | \([0-9.]*\).*/\1/p"
}

rows=()
for name in $ROWS; do
  case $name in
    sparse) model=$SPARSE label="synth $PRESET q4_0 (90% sparse, hybrid neurons)" ;;
    dense) model=$DENSE label="synth $PRESET q4_0 silu (dense, GPU segments)" ;;
    gemma) model=$GEMMA label="gemma-3-270m q4_k_m (dense, GPU segments)" ;;
  esac
  if [[ ! -f $model ]]; then
    echo "skipping $label: $model is not here (fetch it with scripts/fetch-models.sh where there is a network)" >&2
    continue
  fi
  row="$label"
  row+="|$(rate "$model" --device cpu)"
  for share in 10 50 100; do
    row+="|$(rate "$model" --device gpu --vram-budget "$share%")"
  done
  row+="|$(rate "$model" --device gpu)"
  echo "row: $row" >&2
  rows+=("$row")
done

python3 - "$N_GEN" "$THREADS" "${rows[@]}" <<'PY'
import sys
n_gen, threads, *rows = sys.argv[1:]
print(f"\ndecode tok/s (tg{n_gen}, {threads} threads; ratio to CPU-only in brackets)")
print("| model | CPU only | GPU 10% | GPU 50% | GPU 100% | GPU-only (resident) |")
print("| --- | --- | --- | --- | --- | --- |")
for row in rows:
    name, *v = row.split("|")
    v = [float(x) for x in v]
    cells = [f"{v[0]:.2f}"] + [f"{r:.2f} ({r / v[0]:.2f}x)" for r in v[1:]]
    print(f"| {name} | " + " | ".join(cells) + " |")
print("GPU N%: --vram-budget N% of the FFN's bytes (sparse: hot neurons; dense: the last layers "
      "whole with their KV cache within those bytes)")
PY
