#!/usr/bin/env bash
# The te-serve load test: wrk on loopback, 64 connections, one sentence per request (CoLA dev
# sentences in turn), 30 s per configuration: fp32 and FP8 weights on 1 and 2 workers, batch size
# 1 (--max-batch 1) beside dynamic batching (the defaults: max batch 32, max wait 5 ms). Prints a
# Markdown table; exits 1 on any error.
#   scripts/serve-load.sh CHECKPOINT [SECONDS]     (build first: scripts/build.sh)
#   TE_LOAD_ONLY=name TE_LOAD_ARGS='--workers 2' scripts/serve-load.sh CHECKPOINT   (one row)
set -euo pipefail
cd "$(dirname "$0")/.."
ckpt=${1:?usage: scripts/serve-load.sh CHECKPOINT [SECONDS]}
seconds=${2:-30}
build=${TE_BUILD_DIR:-build}
serve=$build/serve/te-serve
command -v wrk >/dev/null || { echo "te: wrk is missing (scripts/setup.sh installs it)" >&2; exit 1; }

work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
# One JSON body per dev sentence.
/usr/bin/python3 - examples/encoder/data/cola/in_domain_dev.tsv > "$work/bodies" <<'PY'
import json, sys
for line in open(sys.argv[1], encoding="utf-8"):
    cols = line.rstrip("\n").split("\t")
    if len(cols) >= 4:
        print(json.dumps({"sentences": [cols[3]]}))
PY

errors=0
run() {  # name, te-serve options...
  local name=$1; shift
  "$serve" --load "$ckpt" --port 0 "$@" > "$work/serve.log" 2>&1 &
  local pid=$!
  local port=""
  for _ in $(seq 1 100); do
    port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$work/serve.log" | grep -o '[0-9]*$' || true)
    [ -n "$port" ] && break
    sleep 0.1
  done
  [ -n "$port" ] || { cat "$work/serve.log" >&2; exit 1; }
  local out
  out=$(TE_BODIES="$work/bodies" wrk -t1 -c64 -d"${seconds}s" --timeout 10s \
        -s bench/serve/classify.lua "http://127.0.0.1:$port" | grep TE_SUMMARY | sed 's/TE_SUMMARY //')
  local batches
  batches=$(curl -s "http://127.0.0.1:$port/metrics" |
    awk '/^te_serve_batch_size_sum/{s=$2} /^te_serve_batch_size_count/{c=$2} END{printf "%.1f", s/c}')
  local rss model
  rss=$(curl -s "http://127.0.0.1:$port/metrics" | awk '/^te_serve_resident_bytes/{printf "%.0f", $2/1048576}')
  model=$(curl -s "http://127.0.0.1:$port/metrics" |
    awk '/^te_serve_model_seconds_total/{m=$2} /^te_serve_batch_size_count/{c=$2} END{printf "%.2f", 1000*m/c}')
  kill -TERM $pid; wait $pid
  echo "$out" | /usr/bin/python3 -c '
import json, sys
r = json.loads(sys.stdin.read()); e = sum(r["errors"].values())
print("| %s | %.0f | %.1f | %.1f | %s | %s | %s | %d |" % (sys.argv[1], r["rps"], r["p50_ms"], r["p99_ms"], sys.argv[2], sys.argv[4], sys.argv[3], e))
sys.exit(1 if e else 0)' "$name" "$batches" "$rss" "$model" || errors=1
}

echo "| configuration | requests/s | p50 ms | p99 ms | mean batch | ms per model call | resident MiB | errors |"
echo "|---|---|---|---|---|---|---|---|"
[ -n "${TE_LOAD_ONLY:-}" ] && { run "$TE_LOAD_ONLY" ${TE_LOAD_ARGS}; exit $errors; }
run "fp32, 1 worker, batch size 1" --workers 1 --max-batch 1 --max-wait-ms 0
run "fp32, 1 worker, dynamic batching" --workers 1
run "fp32, 2 workers, batch size 1" --workers 2 --max-batch 1 --max-wait-ms 0
run "fp32, 2 workers, dynamic batching" --workers 2
run "fp8 weights, 1 worker, batch size 1" --workers 1 --max-batch 1 --max-wait-ms 0 --fp8-weights
run "fp8 weights, 1 worker, dynamic batching" --workers 1 --fp8-weights
run "fp8 weights, 2 workers, batch size 1" --workers 2 --max-batch 1 --max-wait-ms 0 --fp8-weights
run "fp8 weights, 2 workers, dynamic batching" --workers 2 --fp8-weights
exit $errors
