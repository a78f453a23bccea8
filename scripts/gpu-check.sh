#!/usr/bin/env bash
# On a GPU machine (sm_89+, CUDA toolkit with nvcc): builds te-cpp with CUDA and runs the GPU
# checks: the CUDA FP8 kernels against the CPU reference (casts bit-exact, GEMM within its
# tolerance), the FP8 tensor and module tests (CUDA tensors when LibTorch has CUDA), and the
# FP8/BF16 GEMM benchmark at 4096^3 and 8192^3.
#
#   bash scripts/gpu-check.sh                          # Debian's LibTorch (CPU): raw CUDA checks
#   TORCH_DIR=/opt/libtorch/share/cmake/Torch bash scripts/gpu-check.sh   # a CUDA LibTorch 2.x
#
# Build directory: ${TE_GPU_BUILD_DIR:-build-gpu}. Exits non-zero if any check fails.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${TE_GPU_BUILD_DIR:-build-gpu}
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader || true

args=(-DTE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${TE_CUDA_ARCHS:-90}")
[ -n "${TORCH_DIR:-}" ] && args+=(-DTorch_DIR="$TORCH_DIR")
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release --log-level=WARNING "${args[@]}"
cmake --build "$build_dir" --target te_kernels_tests te_fp8_tests bench_gemm_cuda bench_fp8

status=0
"$build_dir/tests/te_kernels_tests" --gtest_filter='Fp8Cuda.*:Fp8Oracle.*' || status=1
"$build_dir/tests/te_fp8_tests" || status=1
"$build_dir/bench/bench_gemm_cuda" 4096 8192 || status=1
"$build_dir/bench/bench_fp8" --benchmark_filter='Quantize|Memcpy' || status=1
exit $status
