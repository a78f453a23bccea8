#!/usr/bin/env bash
# llama.cpp as te-cpp's checks and benchmarks use it: the source vendored in PyPI's
# llama-cpp-python 0.3.36 sdist (its sha256 pinned in scripts/fetch_models.py, the one home of
# the pin), unpacked once into ${TE_LLAMA_CPP_CACHE:-~/.cache/te-cpp}/llama_cpp_python-0.3.36/,
# and its programs built there once, CPU only, for the machine's own SIMD (as te-cpp's kernels use
# it). Prints one path per line on stdout; progress goes to stderr. Idempotent, and safe to run
# several at once (ctest -j): one flock on that folder's lock file serialises unpacking and
# building, and a second caller finds the binaries made.
#   bash scripts/llama-cpp.sh                  # llama-server's path (~10 minutes on 2 cores once)
#   bash scripts/llama-cpp.sh llama-quantize   # the binaries of the named CMake targets
#   bash scripts/llama-cpp.sh --source         # the vendored llama.cpp folder, unbuilt
#                                              # (convert_hf_to_gguf.py, gguf-py/)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=0.3.36
cache=${TE_LLAMA_CPP_CACHE:-$HOME/.cache/te-cpp}
dir="$cache/llama_cpp_python-$version"  # the sdist's own folder name
src="$dir/vendor/llama.cpp"
source_only=0
targets=()
for a in "$@"; do
  case "$a" in
    --source) source_only=1 ;;
    -*) echo "te: llama-cpp.sh: unknown option $a" >&2; exit 2 ;;
    *) targets+=("$a") ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || [ $source_only = 1 ] || targets=(llama-server)

missing() {  # succeeds when the source or a named binary is not there yet
  [ -f "$dir/.te-unpacked" ] || return 0
  local t
  for t in "${targets[@]}"; do [ -x "$dir/build/bin/$t" ] || return 0; done
  return 1
}

if missing; then
  mkdir -p "$cache"
  exec 9>"$dir.lock"
  flock 9
  if [ ! -f "$dir/.te-unpacked" ]; then
    echo "te: fetching llama-cpp-python $version's sdist (pip, once)" >&2
    py=/usr/bin/python3
    [ -x "$here/../build/venv-cuda/bin/python" ] && py="$here/../build/venv-cuda/bin/python"
    sha=$(cd "$here" && /usr/bin/python3 -c \
      "import fetch_models; print(fetch_models.MODELS['llama-vocab'].wheel_sha256)")
    tmp=$(mktemp -d "$cache/.llama-cpp.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    echo "llama-cpp-python==$version --hash=sha256:$sha" >"$tmp/requirement.txt"
    "$py" -m pip download --quiet --no-deps --no-cache-dir --disable-pip-version-check \
      --require-hashes -r "$tmp/requirement.txt" -d "$tmp" >&2
    tar xzf "$tmp/llama_cpp_python-$version.tar.gz" -C "$tmp"
    rm -rf "$dir"
    mv "$tmp/llama_cpp_python-$version" "$dir"
    touch "$dir/.te-unpacked"
  fi
  todo=()
  for t in "${targets[@]}"; do [ -x "$dir/build/bin/$t" ] || todo+=("$t"); done
  if [ ${#todo[@]} -gt 0 ]; then
    echo "te: building llama.cpp's ${todo[*]} in $dir/build (once; ~10 minutes on 2 cores)" >&2
    # LLAMA_BUILD_SERVER brings tools/server in; tools/quantize and the rest come with
    # LLAMA_BUILD_TOOLS (on by default for a top-level build). One configuration for all targets.
    cmake -S "$src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release \
      -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_OPENSSL=OFF >&2
    cmake --build "$dir/build" --target "${todo[@]}" -j "$(nproc)" >&2
  fi
  flock -u 9
fi
if [ $source_only = 1 ]; then
  echo "$src"
fi
for t in "${targets[@]}"; do echo "$dir/build/bin/$t"; done
