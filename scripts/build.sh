#!/usr/bin/env bash
# Configures (once) and builds te-cpp into ${TE_BUILD_DIR:-build}. Extra args go to CMake's
# configure step, e.g. scripts/build.sh -DTE_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${TE_BUILD_DIR:-build}

if [ ! -f "$build_dir/build.ninja" ] || [ $# -gt 0 ]; then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release --log-level=WARNING "$@"
fi
cmake --build "$build_dir"
