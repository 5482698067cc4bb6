#!/usr/bin/env bash
# Builds the browser demo into web/www: the wasm engine (web/www/pkg, by wasm-bindgen) and the tiny
# synthetic ReLU model (web/www/models/tiny.gguf, by `hotcold synth`), then prints the wasm size.
#   bash web/build.sh            build
#   bash web/build.sh --serve    build, then serve web/www on http://127.0.0.1:8080 (PORT=… to change)
#   bash web/build.sh --tools    only install the wasm-bindgen CLI (.ci/run does it early, beside
#                                the apt installs)
# Installs the wasm-bindgen CLI at the exact version in Cargo.lock when it is missing (cached in
# ~/.cargo/bin). wasm-pack and wasm-opt are not needed.
set -euo pipefail
cd "$(dirname "$0")/.."
www=web/www

version=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' Cargo.lock)
if [ "$(wasm-bindgen --version 2>/dev/null | awk '{ print $2 }')" != "$version" ]; then
    echo "installing wasm-bindgen-cli $version" >&2
    cargo install wasm-bindgen-cli --version "$version"
fi
if [ "${1:-}" = "--tools" ]; then
    exit 0
fi

# No debug line tables in the shipped module (the native release profile keeps them). simd128 (in
# every current browser; wasm has no run-time feature detection) compiles in hotcold-core's
# simd128 kernels (core/src/cpu/simd128.rs), the CPU path's default: greedy decode 2-2.5x (tiny)
# and 2.6-4x (Gemma 3 270M) the scalar kernels' speed (bash benches/web_cpu.sh; the page's
# ?simd=scalar runs the scalar kernels).
CARGO_PROFILE_RELEASE_DEBUG=false \
CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS="-C target-feature=+simd128" \
    cargo build -p hotcold-web --target wasm32-unknown-unknown --release --locked
wasm-bindgen --target web --no-typescript --out-dir "$www/pkg" \
    "${CARGO_TARGET_DIR:-target}/wasm32-unknown-unknown/release/hotcold_web.wasm"

# The test profile shares its build with `cargo test` (scripts/test.sh runs both).
mkdir -p "$www/models"
cargo run -p hotcold-native --profile test --locked --quiet -- \
    synth --preset tiny -o "$www/models/tiny.gguf" >&2

wasm_bytes=$(stat -c %s "$www/pkg/hotcold_web_bg.wasm")
echo "wasm: $www/pkg/hotcold_web_bg.wasm, $((wasm_bytes / 1024)) KiB"
echo "model: $www/models/tiny.gguf, $(($(stat -c %s "$www/models/tiny.gguf") / 1024)) KiB"

if [ "${1:-}" = "--serve" ]; then
    port=${PORT:-8080}
    echo "serving http://127.0.0.1:$port/"
    exec python3 -m http.server "$port" --bind 127.0.0.1 --directory "$www"
fi
