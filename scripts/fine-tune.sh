#!/usr/bin/env bash
# The README's "Train a model": fine-tunes SmolLM2-135M-Instruct (models/, scripts/fetch-models.sh)
# on Debian's fortunes (package `fortunes`: the computers, science, wisdom, work, education and
# linux files, one JSON line per fortune) with te-train in bf16 (fp32 master weights), evaluates
# perplexity on 5% held out before and after, and exports the model as a GGUF file like its source
# (Q8_0), which te-serve, te-generate and llama.cpp load:
#   bash scripts/fine-tune.sh              # then: te-serve --model models/SmolLM2-135M-fortunes.gguf
#   bash scripts/fine-tune.sh --steps 20   # extra arguments go to te-train
# Writes build/fine-tune/ (data, token file, checkpoint, steps CSV, metrics JSON). A second run
# without arguments finds the GGUF file made and trains nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh >/dev/null
bash scripts/fetch-models.sh smollm2
if [ ! -d /usr/share/games/fortunes ]; then
  echo "te: installing fortunes (apt-get, once: the text to fine-tune on)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq fortunes >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq fortunes >/dev/null; }
fi
build_dir=${TE_BUILD_DIR:-build}
out="$build_dir/fine-tune"
if [ -s models/SmolLM2-135M-fortunes.gguf ] && [ $# -eq 0 ]; then
  echo "te: models/SmolLM2-135M-fortunes.gguf is there (delete it to fine-tune again)" >&2
  exit 0
fi
mkdir -p "$out"
[ -s "$out/fortunes.jsonl" ] || /usr/bin/python3 - "$out/fortunes.jsonl" <<'PY'
import json, sys
texts = []
for name in ["computers", "science", "wisdom", "work", "education", "linux"]:
    raw = open("/usr/share/games/fortunes/" + name, encoding="utf-8", errors="replace").read()
    texts += [t.strip() for t in raw.split("\n%\n") if t.strip()]
with open(sys.argv[1] + ".tmp", "w") as f:
    for t in texts:
        f.write(json.dumps({"text": t}) + "\n")
import os; os.replace(sys.argv[1] + ".tmp", sys.argv[1])
PY
exec "$build_dir/examples/train/te-train" --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
  --data "$out/fortunes.jsonl" --eval-fraction 0.05 --eval-every 20 --eval-batches 8 \
  --steps 40 --seq-len 256 --micro-batch 4 --dtype bf16 \
  --lr 1e-4 --warmup 4 --schedule cosine --save "$out/ckpt" --save-every 20 \
  --log-steps "$out/steps.csv" --metrics-json "$out/metrics.json" \
  --export-gguf models/SmolLM2-135M-fortunes.gguf --export-gguf-type q8_0 "$@"
