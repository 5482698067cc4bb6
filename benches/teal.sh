#!/usr/bin/env bash
# Training-free sparsity (issue 6), one command: on the default model (Gemma 3 270M) perplexity on
# public-domain text and decode speed, dense vs CATS vs TEAL at 25/40/50% target, side by side,
# with the achieved sparsity per layer and the time of the layers alone (decode minus the LM
# head); then on four synthetic layers of Llama-2-7B's shape, per-layer decode time dense vs TEAL
# 50% and the bytes of weights read per token.
#
# Calibration: the Declaration of Independence; perplexity: the Gettysburg Address after it
# (tests/data/text/declaration.txt, public domain). Decode runs are interleaved (dense, cats, teal
# per target) and repeated ROUNDS times; the table shows the mean. Note `uptime`: other jobs on the
# machine skew the figures.
#
# Environment: THREADS (default: all cores), ROUNDS (default 2), N_GEN (default 64),
# WORK (scratch directory, default /tmp/hotcold-teal-bench), SKIP_7B=1 to skip the 7B layers.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${THREADS:-$(nproc)}
ROUNDS=${ROUNDS:-2}
N_GEN=${N_GEN:-64}
WORK=${WORK:-/tmp/hotcold-teal-bench}
mkdir -p "$WORK"
cargo build --release -q -p hotcold-native
H=target/release/hotcold
bash scripts/fetch-models.sh >/dev/null
GEMMA=$(ls ~/.cache/hotcold/gemma-3-270m*.gguf | head -1)
python3 - "$WORK" <<'PY'
import sys
t = open("tests/data/text/declaration.txt").read()
i = t.find("Four score")
open(sys.argv[1] + "/cal.txt", "w").write(t[:i])
open(sys.argv[1] + "/held.txt", "w").write(t[i:])
PY
echo "uptime: $(uptime)"
echo "threads: $THREADS, rounds: $ROUNDS, decode tokens: $N_GEN"

for S in 0.25 0.40 0.50; do
    for MODE in cats teal; do
        out="$WORK/$MODE-$S.gguf"
        [ -f "$out" ] || $H calibrate -m "$GEMMA" -f "$WORK/cal.txt" --target-sparsity "$S" \
            --sparsity-mode "$MODE" -o "$out" -t "$THREADS" >/dev/null 2>&1
    done
done
# TEAL 40% with the uniform allocation, to compare with the greedy one
out="$WORK/teal-uniform-0.40.gguf"
[ -f "$out" ] || $H calibrate -m "$GEMMA" -f "$WORK/cal.txt" --target-sparsity 0.40 \
    --sparsity-mode teal --teal-allocation uniform -o "$out" -t "$THREADS" >/dev/null 2>&1

# name file flags...
CONFIGS=(
    "dense|$GEMMA|--ffn dense"
    "cats-0.25|$WORK/cats-0.25.gguf|--ffn sparse --sparsity-mode cats"
    "teal-0.25|$WORK/teal-0.25.gguf|--ffn sparse --sparsity-mode teal"
    "cats-0.40|$WORK/cats-0.40.gguf|--ffn sparse --sparsity-mode cats"
    "teal-0.40|$WORK/teal-0.40.gguf|--ffn sparse --sparsity-mode teal"
    "teal-uniform-0.40|$WORK/teal-uniform-0.40.gguf|--ffn sparse --sparsity-mode teal"
    "cats-0.50|$WORK/cats-0.50.gguf|--ffn sparse --sparsity-mode cats"
    "teal-0.50|$WORK/teal-0.50.gguf|--ffn sparse --sparsity-mode teal"
)

declare -A PPL SPARS TG LAYERS
for c in "${CONFIGS[@]}"; do
    IFS='|' read -r name file flags <<<"$c"
    log="$WORK/ppl-$name.log"
    # shellcheck disable=SC2086
    $H perplexity -m "$file" -f "$WORK/held.txt" -c 128 -t "$THREADS" $flags --sparse-prefill >"$log" 2>&1
    PPL[$name]=$(grep -o 'PPL = [0-9.]*' "$log" | awk '{print $3}')
    if grep -q "teal: model sparsity" "$log"; then
        SPARS[$name]=$(grep -o 'teal: model sparsity [0-9.]*' "$log" | awk '{print $4}')
    else
        SPARS[$name]=$(grep -o 'mean density [0-9.]*' "$log" | awk '{printf "%.3f", 1 - $3}')
    fi
done
for r in $(seq "$ROUNDS"); do
    for c in "${CONFIGS[@]}"; do
        IFS='|' read -r name file flags <<<"$c"
        log="$WORK/bench-$name-$r.log"
        # shellcheck disable=SC2086
        $H bench -m "$file" -p 0 -n "$N_GEN" -r 3 -t "$THREADS" $flags >"$log" 2>&1
        TG[$name]="${TG[$name]:-} $(grep "| tg$N_GEN |" "$log" | awk -F'|' '{print $7}' | awk '{print $1}')"
        LAYERS[$name]="${LAYERS[$name]:-} $(grep -o 'layers alone [0-9.]*' "$log" | awk '{print $3}')"
    done
done
mean() { echo "$@" | tr ' ' '\n' | awk 'NF{s+=$1;n++} END{printf "%.3f", s/n}'; }
dense_ppl=${PPL[dense]}
dense_tg=$(mean ${TG[dense]})
dense_layers=$(mean ${LAYERS[dense]})
echo
echo "## Gemma 3 270M: perplexity on held-out text (sparse prefill), decode (tg$N_GEN, dense prefill)"
echo
echo "| mode | achieved sparsity | PPL | PPL vs dense | tg t/s | tg vs dense | layers ms/token | layers speed-up |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for c in "${CONFIGS[@]}"; do
    IFS='|' read -r name _ _ <<<"$c"
    tg=$(mean ${TG[$name]})
    layers=$(mean ${LAYERS[$name]})
    awk -v n="$name" -v s="${SPARS[$name]}" -v p="${PPL[$name]}" -v dp="$dense_ppl" -v t="$tg" \
        -v dt="$dense_tg" -v l="$layers" -v dl="$dense_layers" \
        'BEGIN{printf "| %s | %s | %.4f | %+.1f%% | %.1f | %.2fx | %.3f | %.2fx |\n", n, s, p, 100*(p/dp-1), t, t/dt, l, dl/l}'
done
echo
echo "TEAL 40% (greedy) achieved sparsity per layer on the held-out text:"
grep "^teal layer" "$WORK/ppl-teal-0.40.log" | sed 's/^teal /  /'
echo "TEAL 40% weights read per token: $(grep -o 'input-major weights read per token [0-9.]* MiB' "$WORK/bench-teal-0.40-1.log" | awk '{print $6, $7}') (dense layers: $(grep -o 'dense): [0-9.]* MiB' "$WORK/bench-dense-1.log" | awk '{print $2, $3}'))"

[ "${SKIP_7B:-0}" = 1 ] && exit 0
echo
echo "## Four synthetic layers of Llama-2-7B's shape (Q8_0; ReLU FFN at 5% natural sparsity)"
L7=$WORK/llama2-7b-layers.gguf
[ -f "$L7" ] || $H synth --preset llama2-7b-layers --type q8_0 --sparsity 0.05 -o "$L7" >/dev/null
[ -f "$WORK/l7b-teal-0.50.gguf" ] || $H calibrate -m "$L7" -f "$WORK/cal.txt" --target-sparsity 0.5 \
    --sparsity-mode teal -o "$WORK/l7b-teal-0.50.gguf" -t "$THREADS" -c 64 >/dev/null 2>&1
declare -A L7T
for r in $(seq "$ROUNDS"); do
    $H bench -m "$L7" -p 0 -n 32 -r 3 -t "$THREADS" --ffn dense >"$WORK/l7b-dense-$r.log" 2>&1
    $H bench -m "$WORK/l7b-teal-0.50.gguf" -p 0 -n 32 -r 3 -t "$THREADS" --ffn sparse --sparsity-mode teal >"$WORK/l7b-teal-$r.log" 2>&1
    L7T[dense]="${L7T[dense]:-} $(grep -o 'layers alone [0-9.]*' "$WORK/l7b-dense-$r.log" | awk '{print $3}')"
    L7T[teal]="${L7T[teal]:-} $(grep -o 'layers alone [0-9.]*' "$WORK/l7b-teal-$r.log" | awk '{print $3}')"
done
d=$(mean ${L7T[dense]}); t=$(mean ${L7T[teal]})
db=$(grep -o 'dense): [0-9.]* MiB' "$WORK/l7b-dense-1.log" | awk '{print $2}')
tb=$(grep -o 'input-major weights read per token [0-9.]*' "$WORK/l7b-teal-1.log" | awk '{print $6}')
ts=$(grep -o 'teal: model sparsity [0-9.]*' "$WORK/l7b-teal-1.log" | awk '{print $4}')
awk -v d="$d" -v t="$t" -v db="$db" -v tb="$tb" -v ts="$ts" 'BEGIN{
    printf "| mode | ms per layer | bytes per token per layer | sparsity |\n| --- | ---: | ---: | ---: |\n";
    printf "| dense | %.3f | %.1f MiB | 0 |\n", d/4, db/4;
    printf "| TEAL 50%% | %.3f | %.1f MiB | %s |\n", t/4, tb/4, ts;
    printf "per-layer speed-up %.2fx\n", d/t }'
echo "uptime: $(uptime)"
