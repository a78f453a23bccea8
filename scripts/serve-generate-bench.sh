#!/usr/bin/env bash
# te-serve's generation figures on SmolLM2-135M-Instruct (Q4_1 GGUF), measured by
# bench/bench_serve_load.cpp (streaming clients on loopback), beside llama.cpp's llama-server on
# the same file and threads (scripts/llama-cpp.sh builds it), in the same run:
#   - prefill tokens/s (one request of ~400 prompt tokens), one stream's tokens/s, and the
#     aggregate tokens/s of 32 streams, for both servers, and the ratios;
#   - te-serve's 32-stream aggregate over its one stream (continuous batching), over the whole
#     run and while decoding (bench_serve_load's decode_tokens_per_s: prefill waits left out);
#   - the load test: 64 streams for 60 s on te-serve: errors, TTFT and ITL p50/p99, tokens/s;
#   - admission at a fixed --kv-cache-mib: the most sequences running at once, paged against
#     contiguous, on a mixed-length workload;
#   - slow and idle clients: one stream's TTFT alone and with 200 slowloris and 500 idle
#     keep-alive connections held open (deadlines raised past the run, so none is shed early).
# Prints a Markdown table per part; exits 1 on any request error.
#   scripts/serve-generate-bench.sh [GGUF] [SECONDS]       (build first: scripts/build.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-$(bash scripts/fetch-models.sh smollm2 2>/dev/null)}
seconds=${2:-30}
build=${TE_BUILD_DIR:-build}
serve=$build/serve/te-serve
load=$build/bench/bench_serve_load
threads=$(nproc)
[ -f "$model" ] || { echo "te: no $model (tests/interop/check_smollm2.py fetches it)" >&2; exit 1; }
llama=$(bash scripts/llama-cpp.sh llama-server)

work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
port=$((20000 + RANDOM % 20000))

up() {  # waits for the server on $port to answer
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
    curl -sf "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "te: the server did not start:" >&2; cat "$work/server.log" >&2; exit 1
}
down() { kill "$1"; wait "$1" 2>/dev/null || true; }
field() { /usr/bin/python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
measure() {  # name -> prefill, one stream, 32 streams (JSON lines in $work/name.*)
  "$load" --port "$port" --streams 1 --seconds 3 --max-tokens 16 >/dev/null  # warm up
  "$load" --port "$port" --prefill 400 --json > "$work/$1.prefill"
  "$load" --port "$port" --streams 1 --seconds "$seconds" --max-tokens 64 --json > "$work/$1.one"
  "$load" --port "$port" --streams 32 --seconds "$seconds" --max-tokens 64 --json > "$work/$1.many"
}

# te-serve: the paged cache, up to 64 sequences, context 1024.
"$serve" --model "$model" --port "$port" --max-sequence-length 1024 --max-num-seqs 64 \
  > "$work/server.log" 2>&1 &
pid=$!; up; measure te
"$load" --port "$port" --streams 64 --seconds 60 --max-tokens 64 --json > "$work/te.load"
down $pid
# llama-server: 32 slots of 1024 tokens (its context is shared among the slots), all threads.
"$llama" -m "$model" --port "$port" -t "$threads" -tb "$threads" --parallel 32 -c $((32 * 1024)) \
  -b 512 -ub 512 --log-disable > "$work/server.log" 2>&1 &
pid=$!; up; measure llama
down $pid
# Admission: 360 MiB of KV cache (SmolLM2: 45 KiB per token, so 4 contiguous slots of 2048
# tokens), 32 streams of mixed prompts (8-200 words) and 64 tokens each.
for layout in paged contiguous; do
  flag=(); [ $layout = contiguous ] && flag=(--contiguous)
  "$serve" --model "$model" --port "$port" --max-sequence-length 2048 --max-num-seqs 64 \
    --kv-cache-mib 360 "${flag[@]}" > "$work/server.log" 2>&1 &
  pid=$!; up
  "$load" --port "$port" --streams 32 --seconds 20 --max-tokens 64 --mixed 200 --metrics --json \
    > "$work/admit.$layout"
  down $pid
done

# Connections: one stream of 8 tokens at a time for 15 s, alone and beside the crowd.
"$serve" --model "$model" --port "$port" --max-sequence-length 1024 --header-timeout 120 \
  --keep-alive-timeout 120 > "$work/server.log" 2>&1 &
pid=$!; up
"$load" --port "$port" --streams 1 --seconds 3 --max-tokens 8 >/dev/null  # warm up
"$load" --port "$port" --streams 1 --seconds 15 --max-tokens 8 --json > "$work/crowd.none"
"$load" --port "$port" --streams 1 --seconds 15 --max-tokens 8 --crowd 200,500 --json \
  > "$work/crowd.held"
down $pid

/usr/bin/python3 - "$work" <<'PY'
import json, os, sys
w = sys.argv[1]
r = lambda n: json.load(open(os.path.join(w, n)))
te, ll = {k: r("te." + k) for k in ("prefill", "one", "many")}, {k: r("llama." + k) for k in ("prefill", "one", "many")}
rows = [("prefill tokens/s (~%d-token prompt)" % te["prefill"]["prompt_tokens"], te["prefill"]["prefill_tokens_per_s"], ll["prefill"]["prefill_tokens_per_s"]),
        ("1 stream: tokens/s", te["one"]["tokens_per_s"], ll["one"]["tokens_per_s"]),
        ("32 streams: aggregate tokens/s", te["many"]["tokens_per_s"], ll["many"]["tokens_per_s"]),
        ("1 stream: decode tokens/s", te["one"]["decode_tokens_per_s"], ll["one"]["decode_tokens_per_s"]),
        ("32 streams: aggregate decode tokens/s", te["many"]["decode_tokens_per_s"],
         ll["many"]["decode_tokens_per_s"])]
print("| SmolLM2-135M Q4_1, %d threads | te-serve | llama-server | te / llama.cpp |" % os.cpu_count())
print("|---|---|---|---|")
for name, a, b in rows:
    print("| %s | %.1f | %.1f | %.2fx |" % (name, a, b, a / b))
for name, d in (("te-serve", te), ("llama-server", ll)):
    print("\n%s: 32 streams / 1 stream = %.2fx (decoding: %.2fx); 32 streams: TTFT p50 %.3f s, "
          "ITL p50 %.1f ms p99 %.1f ms"
          % (name, d["many"]["tokens_per_s"] / d["one"]["tokens_per_s"],
             d["many"]["decode_tokens_per_s"] / d["one"]["decode_tokens_per_s"],
             d["many"]["ttft_p50_s"], 1e3 * d["many"]["itl_p50_s"], 1e3 * d["many"]["itl_p99_s"]))
l = r("te.load")
print("\nLoad test, te-serve, 64 streams x %.0f s (64 tokens each): %d requests, %d errors, %.1f tokens/s; "
      "TTFT p50 %.3f s p99 %.3f s; ITL p50 %.1f ms p99 %.1f ms"
      % (l["seconds"], l["requests"], l["errors"], l["tokens_per_s"], l["ttft_p50_s"], l["ttft_p99_s"],
         1e3 * l["itl_p50_s"], 1e3 * l["itl_p99_s"]))
p, c = r("admit.paged"), r("admit.contiguous")
print("\nAdmission at --kv-cache-mib 360 (32 streams, mixed prompts): paged ran at most %d sequences "
      "at once (%.1f tokens/s), contiguous %d (%.1f tokens/s): %.1fx"
      % (p["most_running"], p["tokens_per_s"], c["most_running"], c["tokens_per_s"],
         p["most_running"] / max(c["most_running"], 1)))
n, h = r("crowd.none"), r("crowd.held")
print("\nOne stream's TTFT p50/p99: alone %.3f/%.3f s; with 200 slowloris and 500 idle keep-alive "
      "connections open %.3f/%.3f s (%+.3f s at p99)"
      % (n["ttft_p50_s"], n["ttft_p99_s"], h["ttft_p50_s"], h["ttft_p99_s"],
         h["ttft_p99_s"] - n["ttft_p99_s"]))
errors = sum(x["errors"] for x in (te["one"], te["many"], ll["one"], ll["many"], l, p, c, n, h))
sys.exit(1 if errors else 0)
PY
