#!/usr/bin/env bash
# README command 1: set up, build, and run the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh >/dev/null
"${TE_BUILD_DIR:-build}/tools/te-explain" "$@"
