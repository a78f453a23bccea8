#!/usr/bin/env bash
# Builds te-cpp with sanitizers and runs the tests they check:
#
#   bash scripts/test-sanitizers.sh asan   # ASan + UBSan (build-asan/): the sharding, kernels,
#                                          # distributed, FP8 and module suites (CI runs this)
#   bash scripts/test-sanitizers.sh tsan   # TSan (build-tsan/): the tests where threads share
#                                          # state: rule scopes, thread ranks, shared modules and
#                                          # FP8 regions, te-serve under concurrent clients
#
# Third-party noise (LibTorch, OpenMP, OpenBLAS are not built with sanitizers) is suppressed in
# scripts/sanitizers/*.supp, which lists nothing of te-cpp. Any report fails the run
# (-fno-sanitize-recover=all, halt_on_error). Extra arguments go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-asan}
shift || true
supp=$(pwd)/scripts/sanitizers
bash scripts/setup.sh

case "$kind" in
  asan)
    build_dir=${TE_ASAN_BUILD_DIR:-build-asan}
    sanitize=address,undefined
    targets=(te_sharding_tests te_runtime_tests te_kernels_tests te_distributed_tests te_fp8_tests
             te_nn_tests te_hf_tests)
    # The tests of those executables; the GPU ones skip.
    filter='^(sharding|runtime|kernels|distributed|fp8|nn|hf)\.'
    per_case=OFF
    export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:abort_on_error=0
    export LSAN_OPTIONS=suppressions=$supp/lsan.supp:print_suppressions=0
    export UBSAN_OPTIONS=suppressions=$supp/ubsan.supp:print_stacktrace=1:halt_on_error=1
    ;;
  tsan)
    build_dir=${TE_TSAN_BUILD_DIR:-build-tsan}
    sanitize=thread
    targets=(te_sharding_tests te_distributed_tests te_nn_tests te_fp8_tests te-serve te-encoder
             te_serve_tests)
    # Single cases by name: every case its own CTest test.
    per_case=ON
    filter='^(sharding\.Threads|distributed\.|nn\.SharedModule|fp8\.Fp8Autocast\.IsThreadLocal|fp8\.Fp8Modules\.Threads|serve\.)'
    export TSAN_OPTIONS=suppressions=$supp/tsan.supp:halt_on_error=1:second_deadlock_stack=1
    ;;
  *)
    echo "usage: scripts/test-sanitizers.sh asan|tsan [ctest args]" >&2
    exit 2
    ;;
esac

# -O1 -g, as the sanitizers' documentation suggests: a third less compile time than
# RelWithDebInfo's -O2 (37 s -> 26 s for modules/src/attention.cpp under ASan + UBSan), full
# stack traces; the tests' time is LibTorch's, which is not instrumented either way.
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTE_SANITIZE="$sanitize" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g -DNDEBUG" \
  -DTE_CUDA=OFF -DTE_BUILD_BENCH=OFF -DTE_TEST_PER_CASE="$per_case" --log-level=WARNING
cmake --build "$build_dir" --target "${targets[@]}"
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" -R "$filter" "$@"
