#!/usr/bin/env bash
# Training-free sparsity (issue 6), one command. For the default model (Gemma 3 270M) and Qwen2.5-
# Coder 0.5B (llama-like SwiGLU): perplexity on a held-out public-domain text and decode speed,
# dense vs CATS vs TEAL at 25/40/50% target (TEAL with each allocation of a block's target: "teal"
# the greedy steps scored by the histogram estimate, "teal-measured" TEAL's greedy steps scored by
# running the block, "teal-uniform"; "wina-greedy" and "wina-measured" the same allocations with
# WINA's criterion, `--teal-criterion wina`), side by side, with the achieved sparsity per layer and the
# time of the layers alone (decode minus the LM head). Then, on four synthetic dense SwiGLU layers
# of Llama-2-7B's shape (`synth --activation silu`, F16 and Q4_0), per-layer decode time dense vs
# TEAL 50% and the bytes of weights read per token.
#
# Calibration: tests/data/text/declaration.txt (the Declaration of Independence and the Gettysburg
# Address); perplexity: tests/data/text/origin.txt (the Introduction of Darwin's "On the Origin of
# Species", 1859), a text the models have not memorised, with sparsity on every token as TEAL
# measures it (`--sparse-prefill`: a perplexity chunk is one prompt batch, so the default dense
# prefill would score the dense model). Decode runs are interleaved (dense, cats, teal per target)
# and repeated ROUNDS times; the table shows the mean. Note `uptime`: other jobs on the machine
# skew the figures.
#
# Environment: THREADS (default: all cores), ROUNDS (default 2), N_GEN (default 64), WORK (scratch
# directory, default /tmp/hotcold-teal-bench), MODELS (default "gemma qwen"), SKIP_7B=1 to skip
# the 7B layers, SKIP_DECODE=1 to measure perplexity only.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${THREADS:-$(nproc)}
ROUNDS=${ROUNDS:-2}
N_GEN=${N_GEN:-64}
WORK=${WORK:-/tmp/hotcold-teal-bench}
MODELS=${MODELS:-gemma qwen}
mkdir -p "$WORK"
cargo build --release -q -p hotcold-native
H=target/release/hotcold
bash scripts/fetch-models.sh >/dev/null
CAL=tests/data/text/declaration.txt
HELD=tests/data/text/origin.txt
echo "uptime: $(uptime)"
echo "threads: $THREADS, rounds: $ROUNDS, decode tokens: $N_GEN"
mean() { echo "$@" | tr ' ' '\n' | awk 'NF{s+=$1;n++} END{printf "%.3f", s/n}'; }

# bench_model TAG FILE: calibrates CATS and TEAL at each target, then the table
bench_model() {
    local tag=$1 model=$2 S MODE out c name file flags log
    for S in 0.25 0.40 0.50; do
        for MODE in cats teal; do
            out="$WORK/$tag-$MODE-$S.gguf"
            [ -f "$out" ] || $H calibrate -m "$model" -f "$CAL" --target-sparsity "$S" \
                --sparsity-mode "$MODE" -o "$out" -t "$THREADS" >"$WORK/cal-$tag-$MODE-$S.log" 2>&1
        done
    done
    # TEAL's other allocations of a block's target: measured greedy (TEAL's own: each step scored
    # by running the block) and uniform; "teal" is the greedy with the histogram estimate
    for S in 0.25 0.40 0.50; do
        for A in measured uniform; do
            out="$WORK/$tag-teal-$A-$S.gguf"
            [ -f "$out" ] || $H calibrate -m "$model" -f "$CAL" --target-sparsity "$S" \
                --sparsity-mode teal --teal-allocation "$A" -o "$out" -t "$THREADS" \
                >"$WORK/cal-$tag-teal-$A-$S.log" 2>&1
        done
        # WINA's criterion (|x_i| times its weight column's norm) with both greedy allocations
        for A in greedy measured; do
            out="$WORK/$tag-wina-$A-$S.gguf"
            [ -f "$out" ] || $H calibrate -m "$model" -f "$CAL" --target-sparsity "$S" \
                --sparsity-mode teal --teal-allocation "$A" --teal-criterion wina -o "$out" \
                -t "$THREADS" >"$WORK/cal-$tag-wina-$A-$S.log" 2>&1
        done
    done
    local configs=("dense|$model|--ffn dense")
    for S in 0.25 0.40 0.50; do
        configs+=("cats-$S|$WORK/$tag-cats-$S.gguf|--ffn sparse --sparsity-mode cats")
        configs+=("teal-$S|$WORK/$tag-teal-$S.gguf|--ffn sparse --sparsity-mode teal")
        for A in measured uniform; do
            configs+=("teal-$A-$S|$WORK/$tag-teal-$A-$S.gguf|--ffn sparse --sparsity-mode teal")
        done
        for A in greedy measured; do
            configs+=("wina-$A-$S|$WORK/$tag-wina-$A-$S.gguf|--ffn sparse --sparsity-mode teal")
        done
    done
    declare -A PPL SPARS TG LAYERS
    for c in "${configs[@]}"; do
        IFS='|' read -r name file flags <<<"$c"
        log="$WORK/ppl-$tag-$name.log"
        # shellcheck disable=SC2086
        $H perplexity -m "$file" -f "$HELD" -c 128 -t "$THREADS" $flags --sparse-prefill >"$log" 2>&1
        PPL[$name]=$(grep -o 'PPL = [0-9.]*' "$log" | awk '{print $3}')
        if grep -q "teal: model sparsity" "$log"; then
            SPARS[$name]=$(grep -o 'teal: model sparsity [0-9.]*' "$log" | awk '{print $4}')
        else
            SPARS[$name]=$(grep -o 'mean density [0-9.]*' "$log" | awk '{printf "%.3f", 1 - $3}')
        fi
        TG[$name]=""
        LAYERS[$name]=""
    done
    if [ "${SKIP_DECODE:-0}" != 1 ]; then
        for r in $(seq "$ROUNDS"); do
            for c in "${configs[@]}"; do
                IFS='|' read -r name file flags <<<"$c"
                log="$WORK/bench-$tag-$name-$r.log"
                # shellcheck disable=SC2086
                $H bench -m "$file" -p 0 -n "$N_GEN" -r 3 -t "$THREADS" $flags >"$log" 2>&1
                TG[$name]="${TG[$name]} $(grep "| tg$N_GEN |" "$log" | awk -F'|' '{print $7}' | awk '{print $1}')"
                LAYERS[$name]="${LAYERS[$name]} $(grep -o 'layers alone [0-9.]*' "$log" | awk '{print $3}')"
            done
        done
    fi
    local dense_ppl=${PPL[dense]} dense_tg dense_layers tg layers
    dense_tg=$(mean "${TG[dense]:-0}")
    dense_layers=$(mean "${LAYERS[dense]:-0}")
    echo
    echo "## $tag ($(basename "$model")): perplexity on $HELD (sparse prefill), decode (tg$N_GEN, dense prefill)"
    echo
    echo "| mode | achieved sparsity | PPL | PPL vs dense | tg t/s | tg vs dense | layers ms/token | layers speed-up |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    for c in "${configs[@]}"; do
        IFS='|' read -r name _ _ <<<"$c"
        tg=$(mean "${TG[$name]:-0}")
        layers=$(mean "${LAYERS[$name]:-0}")
        awk -v n="$name" -v s="${SPARS[$name]}" -v p="${PPL[$name]}" -v dp="$dense_ppl" -v t="$tg" \
            -v dt="$dense_tg" -v l="$layers" -v dl="$dense_layers" \
            'BEGIN{printf "| %s | %s | %.4f | %+.1f%% | %.1f | %.2fx | %.3f | %.2fx |\n", n, s, p, 100*(p/dp-1), t, (dt>0?t/dt:0), l, (l>0?dl/l:0)}'
    done
    echo
    for A in teal teal-measured; do
        echo "TEAL 40% ($A) allocation (calibration) and achieved sparsity per layer on the held-out text:"
        grep "^layer.*sparsity@" "$WORK/cal-$tag-$A-0.40.log" | sed 's/^/  /'
        grep "^teal layer" "$WORK/ppl-$tag-$A-0.40.log" | sed 's/^teal /  /'
    done
    if [ "${SKIP_DECODE:-0}" != 1 ]; then
        echo "TEAL 40% weights read per token: $(grep -o 'input-major weights read per token [0-9.]* MiB' "$WORK/bench-$tag-teal-0.40-1.log" | awk '{print $6, $7}') (dense layers: $(grep -o 'dense): [0-9.]* MiB' "$WORK/bench-$tag-dense-1.log" | awk '{print $2, $3}'))"
    fi
}

for m in $MODELS; do
    case $m in
        gemma) bench_model gemma "$(ls ~/.cache/hotcold/gemma-3-270m*.gguf | head -1)" ;;
        qwen) bench_model qwen "$(ls ~/.cache/hotcold/qwen2.5-coder-0.5b*.gguf | head -1)" ;;
        *) echo "unknown model $m (expected gemma or qwen)" >&2; exit 1 ;;
    esac
done

[ "${SKIP_7B:-0}" = 1 ] && exit 0
echo
echo "## Four synthetic dense SwiGLU layers of Llama-2-7B's shape (synth --activation silu)"
echo
# calibration on the first 3,000 characters (~700 tokens): enough samples for random weights
head -c 3000 "$CAL" >"$WORK/cal-7b.txt"
echo "| type | mode | ms per layer | MiB read per token per layer | sparsity | per-layer speed-up |"
echo "| --- | --- | ---: | ---: | ---: | ---: |"
for TY in f16 q4_0; do
    L7=$WORK/llama2-7b-silu-$TY.gguf
    [ -f "$L7" ] || $H synth --preset llama2-7b-layers --activation silu --type "$TY" -o "$L7" >/dev/null
    [ -f "$WORK/l7b-$TY-teal-0.50.gguf" ] || $H calibrate -m "$L7" -f "$WORK/cal-7b.txt" --target-sparsity 0.5 \
        --sparsity-mode teal -o "$WORK/l7b-$TY-teal-0.50.gguf" -t "$THREADS" -c 64 >/dev/null 2>&1
    declare -A L7T=([dense]="" [teal]="")
    for r in $(seq "$ROUNDS"); do
        $H bench -m "$L7" -p 0 -n 32 -r 3 -t "$THREADS" --ffn dense >"$WORK/l7b-$TY-dense-$r.log" 2>&1
        $H bench -m "$WORK/l7b-$TY-teal-0.50.gguf" -p 0 -n 32 -r 3 -t "$THREADS" --ffn sparse \
            --sparsity-mode teal >"$WORK/l7b-$TY-teal-$r.log" 2>&1
        L7T[dense]="${L7T[dense]} $(grep -o 'layers alone [0-9.]*' "$WORK/l7b-$TY-dense-$r.log" | awk '{print $3}')"
        L7T[teal]="${L7T[teal]} $(grep -o 'layers alone [0-9.]*' "$WORK/l7b-$TY-teal-$r.log" | awk '{print $3}')"
    done
    d=$(mean "${L7T[dense]}")
    t=$(mean "${L7T[teal]}")
    db=$(grep -o 'dense): [0-9.]* MiB' "$WORK/l7b-$TY-dense-1.log" | awk '{print $2}')
    tb=$(grep -o 'input-major weights read per token [0-9.]*' "$WORK/l7b-$TY-teal-1.log" | awk '{print $6}')
    ts=$(grep -o 'teal: model sparsity [0-9.]*' "$WORK/l7b-$TY-teal-1.log" | awk '{print $4}')
    awk -v ty="$TY" -v d="$d" -v t="$t" -v db="$db" -v tb="$tb" -v ts="$ts" 'BEGIN{
        printf "| %s | dense | %.3f | %.1f | 0 | |\n", ty, d/4, db/4;
        printf "| %s | TEAL 50%% | %.3f | %.1f | %s | %.2fx |\n", ty, t/4, tb/4, ts, d/t }'
done
echo "uptime: $(uptime)"
