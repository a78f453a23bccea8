#!/usr/bin/env bash
# Builds llama.cpp's llama-server (the peer of te-serve's generation benchmarks) from the source
# vendored in PyPI's llama-cpp-python sdist (pinned), once, into ~/.cache/te-cpp/ (or $1), and
# prints the binary's path. CPU only, the machine's own SIMD (as te-cpp's kernels use it).
#   bash scripts/llama-server.sh            # ~10 minutes on 2 cores the first time
set -euo pipefail
version=0.3.36
cache=${1:-$HOME/.cache/te-cpp}
dir="$cache/llama_cpp_python-$version"  # the sdist's own folder name
bin="$dir/build/bin/llama-server"
if [ ! -x "$bin" ]; then
  mkdir -p "$cache"
  py=/usr/bin/python3
  [ -x "$PWD/build/venv-cuda/bin/python" ] && py="$PWD/build/venv-cuda/bin/python"
  if [ ! -d "$dir/vendor/llama.cpp" ]; then
    tmp=$(mktemp -d)
    "$py" -m pip download --quiet --no-deps -d "$tmp" \
      "llama-cpp-python==$version" >&2
    tar xzf "$tmp"/llama_cpp_python-$version.tar.gz -C "$cache"
    rm -rf "$tmp"
  fi
  cmake -S "$dir/vendor/llama.cpp" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_OPENSSL=OFF >&2
  cmake --build "$dir/build" --target llama-server -j "$(nproc)" >&2
fi
echo "$bin"
