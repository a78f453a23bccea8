#!/usr/bin/env bash
# README command 1: set up, build, and run the main job: te-encoder, TE's encoder example on the
# vendored CoLA (one process, 3 epochs, batch 64, seq 32). Extra arguments go to te-encoder
# (e.g. --fp8 delayed, or --nproc 2 --mesh data=2 --mesh-resource dp=data --batch-size 512).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh >/dev/null
build_dir=${TE_BUILD_DIR:-build}
exec "$build_dir/examples/encoder/te-encoder" --metrics-json "$build_dir/encoder-metrics.json" \
  --log-steps "$build_dir/encoder-steps.csv" "$@"
