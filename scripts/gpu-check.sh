#!/usr/bin/env bash
# The GPU check, on a machine with an NVIDIA GPU and the CUDA toolkit (nvcc, nccl.h): builds te-cpp
# against a CUDA LibTorch and runs everything that needs the device:
#   - the CUDA FP8 kernels against the CPU reference (casts bit-exact, GEMM within its tolerance)
#     and the FP8 tensor and module tests on CUDA tensors;
#   - the modules on CUDA against the same modules on the CPU (outputs and every gradient), and
#     fused attention through cuDNN held to the unfused path (it prints which backend ran);
#   - NCCL: every primitive and dtype on one-rank communicators (two of them on one GPU), and the
#     error for two ranks on one GPU;
#   - benchmarks: FP8 vs BF16 GEMM TFLOP/s, and a TransformerLayer forward+backward in BF16 and FP8.
# Everything it prints also goes to one results file: ${TE_GPU_RESULTS:-gpu-check-results.txt}.
#
#   bash scripts/gpu-check.sh                     # LibTorch of the python3 on PATH (torch wheel)
#   TORCH_DIR=/opt/libtorch/share/cmake/Torch bash scripts/gpu-check.sh   # another LibTorch
#
# Without TORCH_DIR it asks `python3 -c 'import torch; print(torch.utils.cmake_prefix_path)'`.
# A LibTorch without Gloo's headers builds without the Gloo backend (CPU tensors stay on one
# rank; NCCL carries the CUDA ones). Build directory: ${TE_GPU_BUILD_DIR:-build-gpu}.
# Exits non-zero if any check fails.
set -uo pipefail
cd "$(dirname "$0")/.."
build_dir=${TE_GPU_BUILD_DIR:-build-gpu}
results=${TE_GPU_RESULTS:-gpu-check-results.txt}
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
exec > >(tee "$results") 2>&1

echo "== te-cpp GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader || true
nvcc --version | tail -1

if [ -z "${TORCH_DIR:-}" ]; then
  prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null) || prefix=
  [ -n "$prefix" ] && TORCH_DIR=$prefix/Torch
fi
args=(-DTE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${TE_CUDA_ARCHS:-90}" -DTE_BUILD_EXAMPLES=OFF)
if [ -n "${TORCH_DIR:-}" ]; then
  args+=(-DTorch_DIR="$TORCH_DIR")
  include=$(cd "$TORCH_DIR/../../../include" 2>/dev/null && pwd) || include=
  if [ -n "$include" ] && [ ! -f "$include/gloo/algorithm.h" ] && [ ! -f /usr/include/gloo/algorithm.h ]; then
    echo "LibTorch at $TORCH_DIR ships no Gloo headers: building without the Gloo backend"
    args+=(-DTE_GLOO=OFF)
  fi
fi
echo "LibTorch: ${TORCH_DIR:-Debian's}"

start=$(date +%s)
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release --log-level=WARNING "${args[@]}" || exit 1
cmake --build "$build_dir" --target te_kernels_tests te_fp8_tests te_nn_tests te_distributed_tests \
  bench_gemm_cuda bench_fp8 bench_layer_gpu || exit 1
echo "== build: $(( $(date +%s) - start )) s on $(nproc) cores"

status=0
check() {
  echo "== $*"
  "$@" || { echo "!! FAILED: $*"; status=1; }
}
check "$build_dir/tests/te_kernels_tests" --gtest_filter='Fp8Cuda.*:Fp8Oracle.*'
check "$build_dir/tests/te_fp8_tests"
check "$build_dir/tests/te_nn_tests" --gtest_filter='ModulesOnCuda.*'
check "$build_dir/tests/te_distributed_tests" --gtest_filter='NcclGpu.*:CommBackendOption.*:NcclSupport.*'
check "$build_dir/bench/bench_gemm_cuda" 4096 8192
check "$build_dir/bench/bench_layer_gpu"
check "$build_dir/bench/bench_fp8" --benchmark_filter='Quantize|Memcpy'
echo "== GPU check done: status $status; results in $results"
exit $status
