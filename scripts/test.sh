#!/usr/bin/env bash
# README command 2: set up, build, and run the whole test suite (CTest summary at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
ctest --test-dir "${TE_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" "$@"
