#!/usr/bin/env bash
# README command 2: set up, build, and run the whole test suite (CTest summary at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The PyTorch and transformers reference of tests/interop/ (build/venv-cuda: a pinned venv, made
# once per set of pins in ~/.cache/te-cpp and linked).
bash scripts/cuda-libtorch.sh --python >/dev/null
export TE_REQUIRE_INTEROP=1
bash scripts/build.sh
ctest --test-dir "${TE_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" "$@"
