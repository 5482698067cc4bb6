#!/usr/bin/env bash
# Continuous batching under load: `hotcold serve` on the synthetic 90%-sparse `small` model and on
# the default Gemma 3 270M, driven by 1, 4, 8 and 16 concurrent streaming clients (python3, stdlib
# only). Prints, per model and client count, the aggregate generated tok/s, the per-client tok/s,
# the mean and worst time to first token, and the aggregate's ratio to a single client.
#   bash benches/serve_clients.sh [THREADS] [TOKENS_PER_CLIENT] [CLIENT_COUNTS]
# HOTCOLD_BIN=PATH runs that binary instead of building this checkout's (to compare two builds);
# MODELS="small gemma" chooses the models (default: both).
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-2}
TOKENS=${2:-64}
COUNTS=${3:-"1 4 8 16"}
MAX_CLIENTS=$(tr ' ' '\n' <<<"$COUNTS" | sort -n | tail -1)
SMALL=${TMPDIR:-/tmp}/hotcold-bench-small-f16.gguf
if [[ -n ${HOTCOLD_BIN:-} ]]; then
  BIN=$HOTCOLD_BIN
else
  cargo build -q --release -p hotcold-native
  BIN=./target/release/hotcold
fi
MODELS=${MODELS:-"small gemma"}
[[ -f $SMALL ]] || $BIN synth --preset small --sparsity 0.9 -o "$SMALL" >/dev/null
GEMMA=$(python3 - <<'PY'
import os
print(os.path.join(os.environ.get("HOTCOLD_CACHE", os.path.expanduser("~/.cache/hotcold")), "gemma-3-270m-q4_k_m.gguf"))
PY
)
[[ -f $GEMMA ]] || { echo "missing $GEMMA (bash scripts/fetch-models.sh)" >&2; exit 1; }

CLIENT=$(mktemp --suffix=.py)
LOG=$(mktemp)
SERVER_PID=
cleanup() {
  [[ -n $SERVER_PID ]] && kill "$SERVER_PID" 2>/dev/null || true
  rm -f "$CLIENT" "$LOG"
}
trap cleanup EXIT

cat >"$CLIENT" <<'PY'
"""N concurrent streaming /v1/completions clients; prints one table row of measurements."""
import http.client, json, sys, threading, time

port, n_clients, tokens = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
results = [None] * n_clients

def client(i, start):
    try:
        run_client(i, start)
    except Exception as e:  # report which client failed and why, then let the row fail clearly
        print(f"client {i}: {type(e).__name__}: {e}", file=sys.stderr)

def run_client(i, start):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = json.dumps({"prompt": f"Client {i} tells a story about the number {i * 7}:",
                       "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
                       "stream": True, "stream_options": {"include_usage": True}})
    start.wait()
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    first, usage = None, None
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            usage = chunk["usage"]
        elif first is None and chunk["choices"] and chunk["choices"][0]["text"]:
            first = time.perf_counter() - t0
    if usage is None:
        raise RuntimeError("the stream ended without a usage chunk")
    results[i] = (t0, time.perf_counter(), first, usage["completion_tokens"])

start = threading.Event()
threads = [threading.Thread(target=client, args=(i, start)) for i in range(n_clients)]
for t in threads:
    t.start()
start.set()
for t in threads:
    t.join()
failed = [i for i, r in enumerate(results) if r is None]
if failed:
    sys.exit(f"{len(failed)} of {n_clients} clients failed (see above)")
begin = min(r[0] for r in results)
end = max(r[1] for r in results)
generated = sum(r[3] for r in results)
ttft = [r[2] if r[2] is not None else r[1] - r[0] for r in results]  # no text at all: the whole stream
per_client = [r[3] / (r[1] - r[0]) for r in results]
agg = generated / (end - begin)
name, single = sys.argv[4], (sys.argv[5] if len(sys.argv) > 5 else "")
base = float(single) if single else agg
each = sum(per_client) / n_clients
# One table row, then the aggregate after a last '|' (the caller keeps it as the baseline).
print(f"| {name:<14} | {n_clients:>7} | {agg:>9.1f} | {each:>10.1f} | {sum(ttft) / n_clients * 1000:>12.0f} "
      f"| {max(ttft) * 1000:>11.0f} | {agg / base:>5.2f}x |{agg}")
PY

run_model() {
  local name=$1 file=$2
  shift 2
  $BIN serve -m "$file" --port 0 -t "$THREADS" -c 512 --parallel "$MAX_CLIENTS" "$@" 2>"$LOG" &
  SERVER_PID=$!
  local port=
  for _ in $(seq 1 600); do
    port=$(sed -n 's/.*http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$LOG")
    [[ -n $port ]] && break
    sleep 0.1
  done
  [[ -n $port ]] || { cat "$LOG" >&2; exit 1; }
  # Warm-up (page in the weights).
  python3 "$CLIENT" "$port" 1 8 warm-up >/dev/null
  local single=
  for n in $COUNTS; do
    row=$(python3 "$CLIENT" "$port" "$n" "$TOKENS" "$name" "$single")
    echo "${row%|*}|"
    [[ -n $single ]] || single=${row##*|}
  done
  grep -E "^hotcold_(ffn_active_density|decode_steps_total|generated_tokens_total) " \
    < <(python3 -c "import urllib.request,sys; print(urllib.request.urlopen(f'http://127.0.0.1:{sys.argv[1]}/metrics').read().decode())" "$port") \
    | sed "s/^/  $name: /"
  kill "$SERVER_PID"
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=
}

echo "hotcold serve, $THREADS threads, $TOKENS tokens per client, --parallel $MAX_CLIENTS; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| model          | clients | agg tok/s | tok/s each | TTFT mean ms | TTFT max ms | vs 1   |"
echo "|----------------|---------|-----------|------------|--------------|-------------|--------|"
[[ " $MODELS " == *" small "* ]] && run_model "small (sparse)" "$SMALL"
[[ " $MODELS " == *" gemma "* ]] && run_model "gemma-3-270m" "$GEMMA"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
