#!/usr/bin/env bash
# The CUDA LibTorch that the GPU machines run (PyTorch 2.11.0 for CUDA 13.0, the wheel on PyPI),
# in a virtual environment under build/ with pinned versions, for compiling and linking te-cpp's
# CUDA code here, where there is no GPU. Only what compiling, linking and loading needs: the torch
# wheel without its Python dependencies, and the three CUDA libraries its libtorch_cuda.so needs
# that this machine's CUDA 13 toolkit lacks (cuSPARSELt, NVSHMEM, cuFile); the toolkit provides
# the rest (cudart, cuBLAS, cuDNN, NCCL, ...). pip's cache keeps the wheels (~760 MB) between runs.
# The same venv is the PyTorch and Hugging Face reference tests/interop/ holds te-cpp to (on the
# CPU): torch's pure Python dependencies and transformers with its own are pinned here too.
# Idempotent and quiet; prints the CMake prefix path of that LibTorch on stdout, or with --python
# the venv's Python (build/venv-cuda, a link to the shared cache; see below).
#   bash scripts/cuda-libtorch.sh            # -> .../torch/share/cmake;.../torch
#   bash scripts/cuda-libtorch.sh --python   # -> .../build/venv-cuda/bin/python
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${TE_CUDA_VENV:-build/venv-cuda}
pins="torch==2.11.0 nvidia-cusparselt-cu13==0.8.0 nvidia-nvshmem-cu13==3.4.5 nvidia-cufile==1.15.1.6"
# torch 2.11.0's own requirements (its METADATA), for `import torch` in tests/interop/.
pins+=" typing_extensions==4.15.0 filelock==3.20.0 sympy==1.14.0 mpmath==1.3.0 networkx==3.5"
pins+=" jinja2==3.1.6 MarkupSafe==3.0.3 fsspec==2025.9.0"
# Hugging Face transformers 5.23.0 and what it and huggingface_hub require (their METADATA), for
# the tests/interop/ checks against Llama's and GPT-J's rotations (and, later, whole models).
pins+=" transformers==5.23.0 huggingface_hub==2.4.0 tokenizers==0.23.3 safetensors==0.8.0"
pins+=" numpy==2.4.6 packaging==26.4 PyYAML==6.0.4 regex==2026.11.19 tqdm==4.70.1 hf-xet==1.8.0"
pins+=" httpx2==2.16.2 httpcore2==2.16.2 h11==0.16.0 anyio==4.16.0 idna==3.20 truststore==0.10.5"
pins+=" typer==0.29.2 click==8.5.1 rich==15.0.0 shellingham==1.5.4 markdown-it-py==4.3.0"
pins+=" mdurl==0.1.2 Pygments==2.21.0 annotated-doc==0.0.7 pydantic==2.14.4 pydantic_core==2.50.5"
pins+=" annotated-types==0.8.0 typing-inspection==0.4.5"
# gguf-py (ggml's GGUF reader and writer, its reference dequantization), for the GGUF checks of
# tests/interop/ and for transformers' gguf_file= loading; numpy, PyYAML and tqdm are above
# (requests, which it imports only to download, is not needed).
pins+=" gguf==0.19.0"
# sentencepiece, which llama.cpp's convert_hf_to_gguf.py (llama-cpp-python 0.3.36's vendored
# tree, scripts/llama-cpp.sh --source) imports for every Llama, Mistral and Qwen conversion (its
# TextModel._create_vocab_sentencepiece; requirements/requirements-convert_legacy_llama.txt asks
# for sentencepiece>=0.1.98,<0.3.0), for tests/interop/check_gguf_mixes.py. No dependencies.
pins+=" sentencepiece==0.2.3"
# sentence-transformers 6.2.0 (the reference for te::hf's sentence embeddings: all-MiniLM-L6-v2)
# and what it imports (scipy, scikit-learn and theirs), at versions with wheels for Debian 12's
# Python 3.11.
pins+=" sentence-transformers==6.2.0 scipy==1.16.3 scikit-learn==1.7.2 joblib==1.5.2"
pins+=" threadpoolctl==3.6.0"
# The official OpenAI Python client (its API's reference client) and what it needs beyond the
# above, for te-serve's /v1/embeddings.
pins+=" openai==3.51.0 jiter==0.19.0 sniffio==1.3.1"
# The environment itself is kept once per set of pins in a shared cache
# (${TE_VENV_CACHE:-~/.cache/te-cpp}/venv-cuda-<hash of the pins>) and build/venv-cuda links to
# it: every fresh clone (CI makes one per run) then finds it made instead of spending ~100 s
# installing 800 MB of wheels again. A venv is not relocatable, so it is made in place there.
cache=${TE_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/te-cpp}
made="$cache/venv-cuda-$(echo "$pins" | sha256sum | cut -c1-16)"
if [ ! -f "$made/.te-pins" ] || [ "$(cat "$made/.te-pins")" != "$pins" ]; then
  if ! /usr/bin/python3 -c 'import ensurepip' 2>/dev/null; then
    echo "te: installing python3-venv (apt-get, once)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
  fi
  mkdir -p "$cache"
  # One maker at a time (two CI runs, or a build and a test, may start together).
  exec 9>"$made.lock"
  flock 9
  if [ ! -f "$made/.te-pins" ] || [ "$(cat "$made/.te-pins")" != "$pins" ]; then
    echo "te: making $made with $pins (pip, once)" >&2
    rm -rf "$made"
    /usr/bin/python3 -m venv "$made"
    # shellcheck disable=SC2086
    "$made/bin/pip" install -q --disable-pip-version-check --no-deps $pins >&2
    echo "$pins" >"$made/.te-pins"
  fi
  flock -u 9
fi
if [ "$(readlink "$venv" 2>/dev/null)" != "$made" ]; then
  mkdir -p "$(dirname "$venv")"
  rm -rf "$venv"
  ln -s "$made" "$venv"
fi
torch=$(cd "$venv" && echo "$PWD"/lib/python3*/site-packages/torch)
[ -f "$torch/share/cmake/Torch/TorchConfig.cmake" ] || {
  echo "te: $venv has no LibTorch at $torch; remove $venv and run again" >&2
  exit 1
}
if [ "${1:-}" = --python ]; then
  echo "$(cd "$venv" && pwd)/bin/python"
else
  echo "$torch/share/cmake;$torch"
fi
