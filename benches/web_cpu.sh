#!/usr/bin/env bash
# Decode speed of the browser demo's wasm CPU path in headless Chromium, scalar vs simd128
# kernels side by side, on the tiny synthetic model and the default Gemma 3 270M
# (web/tests/web_cpu_bench.rs), then the native single-thread figures for orientation (`hotcold
# bench -t 1`, scalar and the detected SIMD path). The page runs on one thread, so compare with the
# native -t 1 lines. Builds the page first; don't run it while something else builds.
#   bash benches/web_cpu.sh [N_GEN]      (N_GEN: tokens per run; default 64 tiny, 24 Gemma)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/fetch-models.sh >/dev/null
bash web/build.sh >&2
if [ -n "${1:-}" ]; then export HOTCOLD_WEB_BENCH_TOKENS=$1; fi
cargo test -p hotcold-web --test web_cpu_bench --locked --quiet -- --ignored --nocapture 2>&1 \
    | grep '^wasm cpu'
CACHE=${HOTCOLD_CACHE:-$HOME/.cache/hotcold}
# the test profile (optimised) that web/build.sh built the model generator with
for model in web/www/models/tiny.gguf "$CACHE/gemma-3-270m-q4_k_m.gguf"; do
    for simd in scalar native; do
        line=$( (if [ "$simd" = scalar ]; then export HOTCOLD_SIMD=scalar; fi
            cargo run -p hotcold-native --profile test --locked --quiet -- \
                bench -m "$model" -t 1 -p 16 -n "${1:-32}" -r 2) | grep -E '^\|.*\| tg[0-9]+ ')
        echo "native -t 1 $(basename "$model") $simd: $line"
    done
done
