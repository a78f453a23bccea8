#!/usr/bin/env bash
# Runs one interop check with the pinned reference Python (scripts/cuda-libtorch.sh's venv):
#   tests/interop/run.sh PYTHON CHECK.py ARGS...
# Exits 77 (CTest: skipped) where that Python cannot import torch and transformers, unless
# TE_REQUIRE_INTEROP=1 (scripts/test.sh sets it after making the venv): then that is a failure.
set -uo pipefail
python=$1
shift
if ! "$python" -c 'import torch, transformers' >/dev/null 2>&1; then
  if [ "${TE_REQUIRE_INTEROP:-0}" = 1 ]; then
    echo "interop: $python cannot import torch and transformers; run bash scripts/cuda-libtorch.sh" >&2
    exit 1
  fi
  echo "interop: skipped: $python cannot import torch and transformers (bash scripts/cuda-libtorch.sh makes it)"
  exit 77
fi
exec "$python" "$@"
