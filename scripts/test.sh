#!/usr/bin/env bash
# README command 2: set up, build, and run the whole test suite (CTest summary at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The PyTorch reference of tests/interop/ (a pinned venv under build/, pip's cache keeps it).
bash scripts/cuda-libtorch.sh --python >/dev/null
export TE_REQUIRE_INTEROP=1
bash scripts/build.sh
ctest --test-dir "${TE_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" "$@"
