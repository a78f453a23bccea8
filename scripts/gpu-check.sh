#!/usr/bin/env bash
# The GPU check: everything in te-cpp that needs a device, against a CUDA LibTorch, each check
# under a timeout with its GoogleTest XML and log, and a table of check, result and seconds.
#   - the CUDA FP8 kernels against the CPU reference (casts bit-exact, GEMM within the bound of
#     the tensor cores' accumulator) and the FP8 tensor and module tests on CUDA tensors;
#   - the modules on CUDA against the same modules on the CPU (outputs and every gradient),
#     fused attention through cuDNN held to the unfused path, and which SDPA backend each of the
#     module's calls gets;
#   - NCCL: every primitive and dtype on one-rank communicators (two of them on one GPU), the
#     errors for two ranks on one GPU and for a rank without a GPU (named at once, not after a
#     timeout);
#   - benchmarks: FP8 vs BF16 GEMM TFLOP/s (4096^3, 8192^3), a TransformerLayer forward+backward
#     in BF16 and FP8 against the same layer in plain LibTorch BF16;
#   - the main job: te-encoder's 3 epochs of CoLA on the GPU against the CPU (fp32), and in bf16
#     with FP8 GEMMs.
#
#   bash scripts/gpu-check.sh --rehearse   # here (no GPU): every step that needs none
#   bash scripts/gpu-check.sh              # on the GPU machine, with what --rehearse left in .gpu/
#   bash scripts/gpu-check.sh --build      # on a GPU machine that has the -dev packages: build there
#   options: --out DIR (results; default build-gpu/check)
#
# Why prebuilt binaries: the GPU machines have the CUDA LibTorch (python3's torch 2.11.0+cu130),
# nvcc and CMake, but none of the Debian -dev packages the tests and benchmarks build with
# (GoogleTest, Google Benchmark, CLI11, nlohmann-json, zlib headers), and building there would
# spend minutes of a 15-minute lease. --rehearse builds against the same LibTorch here (the PyPI
# wheel, scripts/cuda-libtorch.sh, TORCH_CUDA_ARCH_LIST=9.0), runs every check (their GPU parts
# skip), and leaves the stripped binaries and the few shared libraries they need beyond LibTorch,
# CUDA and glibc in .gpu/ (ignored by git, carried by the device tool: `carry: [".gpu"]`). On the
# GPU machine the script runs them with LibTorch's and pip's CUDA libraries on LD_LIBRARY_PATH,
# after checking that python3's torch sees the device; a test that skips there fails its check.
# Exits non-zero when any check fails, times out, or NCCL/cuDNN are missing. docs/gpu.md has more.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=device
out=build-gpu/check
while [ $# -gt 0 ]; do
  case "$1" in
    --rehearse) mode=rehearse ;;
    --build) mode=build ;;
    --out) out=$2; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
build_dir=${TE_GPU_BUILD_DIR:-build-gpu}
carry=.gpu
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -f "$out"/*.xml "$out"/*.log "$out"/summary.txt
exec > >(tee "$out/gpu-check.log") 2>&1
tee_pid=$!
# Every exit closes the pipe and waits for tee, so the log and the summary are whole on return.
finish() {
  exec 1>&- 2>&-
  wait "$tee_pid" 2>/dev/null
  exit "$1"
}
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH

echo "== te-cpp GPU check ($mode), $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
  echo "no GPU here (nvidia-smi: none)"
nvcc --version 2>/dev/null | tail -1

# The targets the checks run, and the checks: name, timeout (s), command (relative to the bin dir).
targets=(te_kernels_tests te_fp8_tests te_nn_tests te_distributed_tests bench_gemm_cuda bench_fp8
         bench_layer_gpu te-encoder)
# The timeouts add up to 8.5 minutes and the encoder's (encoder_check) to 4.5 more: bounds for a
# hung run. On the H200 the whole check ran in about 100 s.
checks=(
  "kernels|45|te_kernels_tests --gtest_filter=Fp8Cuda.*:Fp8Oracle.*:Philox.*"
  "fp8|90|te_fp8_tests --gtest_filter=-*Fp8Parallel.*"
  "modules_cuda|90|te_nn_tests --gtest_filter=ModulesOnCuda.*"
  "nccl|90|te_distributed_tests --gtest_filter=NcclGpu.*:CommBackendOption.*:NcclSupport.*:PeerStatus.*"
  "bench_gemm|60|bench_gemm_cuda 4096 8192"
  "bench_layer|75|bench_layer_gpu 2048 2"
  "bench_grouped|30|bench_layer_gpu --grouped 64 64"
  "bench_fp8|30|bench_fp8 --benchmark_filter=Quantize|Memcpy --benchmark_min_time=0.05"
)

configure_and_build() {  # $1: CMake prefix path of the CUDA LibTorch
  local start args
  start=$(date +%s)
  args=(-DTE_CUDA=ON -DTE_REQUIRE_NCCL=ON -DTE_REQUIRE_CUDNN=ON "-DCMAKE_PREFIX_PATH=$1")
  # Every case its own CTest test: the CPU suite below selects and excludes cases by name.
  args+=(-DTE_TEST_PER_CASE=ON)
  [ -n "${NCCL_ROOT:-}" ] && args+=("-DNCCL_ROOT=$NCCL_ROOT")
  # Torch's CMake takes the architectures from TORCH_CUDA_ARCH_LIST (9.0: H100/H200) and ignores
  # CMAKE_CUDA_ARCHITECTURES; te's own .cu files get the same.
  export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    "${args[@]}" >"$out/configure.log" 2>&1 || { cat "$out/configure.log"; return 1; }
  # What CMake found, for the record.
  grep -E "^-- (te:|Found (NCCL|CUDNN|CUDAToolkit|Torch))|Added CUDA NVCC flags" "$out/configure.log"
  cmake --build "$build_dir" "${@:2}" >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; return 1; }
  # Translation units: CUDA (.cu), and C++ compiled with the CUDA LibTorch's branches on.
  local cu torch_cuda all
  cu=$(grep -c '"file": "[^"]*\.cu"' "$build_dir/compile_commands.json" || true)
  torch_cuda=$(grep -c 'DTE_TORCH_CUDA' "$build_dir/compile_commands.json" || true)
  all=$(grep -c '"file":' "$build_dir/compile_commands.json" || true)
  echo "== build: $(( $(date +%s) - start )) s on $(nproc) cores; $all translation units against" \
    "the CUDA LibTorch: $cu CUDA (.cu), $torch_cuda with TE_TORCH_CUDA"
}

results=()
status=0
allowed_skips=GlooByOptionAndByEnvironmentMovesCpuTensors
run_checks() {  # $1: the folder of the binaries
  local entry name limit cmd start rc secs result
  for entry in "${checks[@]}"; do
    IFS='|' read -r name limit cmd <<<"$entry"
    # bench_fp8's filter holds a '|': the rest of the entry is the command.
    cmd=${entry#*|*|}
    echo "== $name: $cmd (timeout ${limit} s)"
    local exe=${cmd%% *} rest=${cmd#* }
    [ "$rest" = "$cmd" ] && rest=
    local xml=()
    [[ $exe == te_*_tests ]] && xml=("--gtest_output=xml:$out/$name.xml")
    start=$(date +%s)
    # shellcheck disable=SC2086
    timeout --kill-after=10 "$limit" "$1/$exe" $rest "${xml[@]}" >"$out/$name.log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    cat "$out/$name.log"
    # 77: every case the filter selects skipped (tests/gtest_main.cpp); the count below says so.
    case $rc in
      0|77) result=passed ;;
      124|137) result="TIMED OUT"; status=1 ;;
      *) result="FAILED ($rc)"; status=1 ;;
    esac
    if { [ $rc -eq 0 ] || [ $rc -eq 77 ]; } && [ ${#xml[@]} -gt 0 ]; then
      # Skipped tests, less those this build skips by design (it has no Gloo).
      local skipped unexpected
      skipped=$(grep -B1 '<skipped' "$out/$name.xml" 2>/dev/null | grep -o ' name="[^"]*"' |
                sed 's/ name="//; s/"$//' | sort -u | grep -v "^$allowed_skips\$" || true)
      unexpected=$(printf '%s' "$skipped" | grep -c . || true)
      if [ "$unexpected" -gt 0 ]; then
        if [ "$mode" = device ]; then
          # On a GPU nothing may skip: a skip there means the check did not test the device.
          result="SKIPPED $unexpected"
          status=1
          echo "!! skipped on the GPU machine: $(echo $skipped)"
        else
          result="passed ($unexpected skipped)"
        fi
      fi
    fi
    results+=("$(printf '%-14s %-22s %5s s' "$name" "$result" "$secs")")
  done
}

# The main job on the GPU: te-encoder's 3 epochs of CoLA on the CPU and on the GPU in fp32 (the
# same seed, so the same weights, shuffles and dropout masks: the losses and dev accuracy agree
# within summation order), and on the GPU in bf16 with FP8 GEMMs (DelayedScaling), whose dev
# accuracy stays within 0.03 of fp32's. Here (no GPU) only the CPU run, and of one epoch: on
# this 2-core machine the wheel's LibTorch takes ~130 s for three (~15 s on the GPU machine's
# 16), and the rehearsal checks that the carried binary runs the job and writes its metrics.
encoder_check() {  # $1: the folder of the binaries
  local start rc=0 result=passed runs=(cpu) epochs=3
  start=$(date +%s)
  [ "$mode" = device ] && runs+=(gpu gpu_fp8)
  [ "$mode" = device ] || epochs=1
  echo "== encoder: te-encoder, $epochs epoch(s) on ${runs[*]} (timeout 90 s each)"
  : >"$out/encoder.log"
  for run in "${runs[@]}"; do
    local extra=()
    case $run in
      gpu) extra=(--device cuda) ;;
      gpu_fp8) extra=(--device cuda --dtype bf16 --fp8 delayed) ;;
    esac
    timeout --kill-after=10 90 "$1/te-encoder" --data examples/encoder/data/cola --quiet \
      --epochs "$epochs" \
      --metrics-json "$out/encoder_$run.json" "${extra[@]}" >>"$out/encoder.log" 2>&1 ||
      { rc=$?; echo "!! te-encoder ($run) exited $rc"; }
  done
  cat "$out/encoder.log"
  if [ $rc -eq 0 ]; then
    python3 - "$out" "${runs[@]}" <<'PY' || rc=1
import json, sys
out, runs = sys.argv[1], sys.argv[2:]
m = {r: json.load(open(f"{out}/encoder_{r}.json")) for r in runs}
for r in runs:
    print(f"   {r:8} train_loss {m[r]['train_loss']:.4f} dev_loss {m[r]['dev_loss']:.4f} "
          f"dev_accuracy {m[r]['dev_accuracy']:.4f} {m[r]['samples_per_second']:8.0f} samples/s")
bad = []
if "gpu" in m:
    c, g = m["cpu"], m["gpu"]
    for key in ("train_loss", "dev_loss"):
        if abs(g[key] - c[key]) > 0.02 * c[key]:
            bad.append(f"gpu {key} {g[key]:.4f} vs cpu {c[key]:.4f} (more than 2% apart)")
    if abs(g["dev_accuracy"] - c["dev_accuracy"]) > 0.02:
        bad.append(f"gpu dev_accuracy {g['dev_accuracy']:.4f} vs cpu {c['dev_accuracy']:.4f}")
if "gpu_fp8" in m and m["gpu_fp8"]["dev_accuracy"] < m["cpu"]["dev_accuracy"] - 0.03:
    bad.append(f"FP8 dev_accuracy {m['gpu_fp8']['dev_accuracy']:.4f} is more than 0.03 below fp32's")
for b in bad:
    print("!!", b)
sys.exit(1 if bad else 0)
PY
  fi
  [ $rc -eq 0 ] || { result="FAILED"; status=1; }
  results+=("$(printf '%-14s %-22s %5s s' encoder "$result" "$(( $(date +%s) - start ))")")
}

summary() {
  local passed failed
  passed=$(printf '%s\n' "${results[@]}" | grep -c ' passed') || true
  failed=$(( ${#results[@]} - passed ))
  {
    echo "== summary ($mode): check, result, seconds"
    printf '%s\n' "${results[@]}"
    echo "gpu-check: $passed passed, $failed failed"
  } | tee "$out/summary.txt"
}

# The CUDA LibTorch: the wheel's here (scripts/cuda-libtorch.sh's pinned venv), the python3's
# on a GPU machine.
if [ "$mode" = rehearse ]; then
  prefix=$(bash scripts/cuda-libtorch.sh) || finish 1
  torch_dir=${prefix#*;}
  echo "LibTorch: $torch_dir (PyPI wheel torch 2.11.0, CUDA 13.0)"
else
  torch_dir=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))') || {
    echo "!! python3 has no torch: its CUDA LibTorch runs the checks"; finish 1; }
  echo "LibTorch: $torch_dir ($(python3 -c 'import torch; print(torch.__version__)'))"
  python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' || {
    echo "!! python3's torch sees no CUDA device: nothing here would test the GPU"; finish 1; }
  prefix="$torch_dir/share/cmake;$torch_dir"
fi
site=$(dirname "$torch_dir")
case $mode in
  rehearse)
    # The library (its CUDA code included), the checks' binaries and the tests of the CPU suite
    # below. The rest of the tree (te::hf, the examples, the interop programs, the other
    # benchmarks) holds no CUDA code and is compiled and linked against LibTorch 1.13 and 2.6
    # by CI's stages before this one.
    configure_and_build "$prefix" --target "${targets[@]}" te_sharding_tests te_runtime_tests ||
      { echo "!! configure or build failed"; finish 1; }
    ;;
  build)
    [ -d "$site/nvidia/nccl" ] && export NCCL_ROOT=$site/nvidia/nccl
    configure_and_build "$prefix" --target "${targets[@]}" || finish 1
    ;;
esac

if [ "$mode" != device ]; then
  # The binaries the checks run, stripped, and what they need beyond LibTorch, CUDA and glibc.
  rm -rf "$carry" && mkdir -p "$carry/bin" "$carry/lib"
  for t in "${targets[@]}"; do
    f=$(find "$build_dir" -name "$t" -type f -perm -u+x | head -1)
    [ -n "$f" ] || { echo "!! $t was not built"; finish 1; }
    strip -o "$carry/bin/$t" "$f"
    ldd "$f" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
      case "$lib" in
        */torch/lib/*|*/nvidia/*|*/cuda*|*/libc.so*|*/libm.so*|*/libstdc++*|*/libgcc_s*|\
        */libpthread*|*/libdl.so*|*/librt.so*|*/libutil.so*|*/ld-linux*|*/libz.so*) ;;
        *) cp -L "$lib" "$carry/lib/" ;;
      esac
    done
  done
  git rev-parse HEAD >"$carry/commit" 2>/dev/null || true
  size=$(du -sm "$carry" | cut -f1)
  echo "== carried: $carry, ${size} MiB ($(ls "$carry/bin" | wc -l) binaries; libs: $(ls "$carry/lib" | tr '\n' ' '))"
  [ "$size" -lt 64 ] || { echo "!! $carry is ${size} MiB: over the device tool's 64 MiB"; status=1; }
elif [ ! -d "$carry/bin" ]; then
  echo "!! no $carry/bin: run --rehearse here first and carry $carry, or use --build"
  finish 1
elif [ "$(cat "$carry/commit" 2>/dev/null)" != "$(git rev-parse HEAD 2>/dev/null)" ]; then
  echo "note: $carry was built from $(cat "$carry/commit" 2>/dev/null || echo '?'), not HEAD"
fi

# The checks run the carried binaries as the GPU machine does: LibTorch's and pip's CUDA
# libraries first on the path (here the GPU parts skip).
libs=$(pwd)/$carry/lib:$torch_dir/lib
for d in "$site"/nvidia/*/lib "$site"/nvidia/*/*/lib; do [ -d "$d" ] && libs=$libs:$d; done
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
missing=$(for b in "$carry"/bin/*; do ldd "$b" | grep 'not found'; done | sort -u)
[ -z "$missing" ] || { echo "!! libraries not found:"; echo "$missing"; finish 1; }
run_checks "$carry/bin"
encoder_check "$carry/bin"
if [ "$mode" = rehearse ]; then
  # The CPU suite on the wheel's LibTorch as well, as far as a build without Gloo can run it:
  # every test that needs no second rank (thread ranks move CPU tensors on Gloo only). The name
  # list below only saves time; a test it misses that fails with the library's own "built
  # without Gloo" / "no backend of this build moves cpu tensors" error is counted as not
  # runnable here, and any other failure fails the check.
  echo "== cpu_suite: ctest on $build_dir, the tests that need no Gloo"
  start=$(date +%s)
  ctest --test-dir "$build_dir" -j "$(nproc)" --timeout 300 --output-on-failure \
    -R '^(sharding|runtime|kernels|fp8|nn)\.' \
    -E 'Fp8Parallel|Matrix/|Parallel|Plan|Checkpoint|Random|ShardedModules|Layouts|GqaHeadsMustSplit|EveryPlacementDraws' \
    >"$out/cpu_suite.log" 2>&1
  rc=$?
  tail -3 "$out/cpu_suite.log"
  result=passed
  if [ $rc -ne 0 ]; then
    real=0 gloo=0
    while IFS= read -r name; do
      [ -n "$name" ] || continue
      # The output whole before grep: grep -q stopping at the first match would end ctest by
      # SIGPIPE, and under pipefail the pipeline (and so this test) would count as failed.
      output=$(ctest --test-dir "$build_dir" --timeout 300 --output-on-failure \
        -R "^${name//[\/\[\]().*+?^$|]/.}( |\$)" 2>&1 || true)
      if grep -q -E 'built without Gloo|no backend of this build moves cpu tensors' <<<"$output"; then
        gloo=$((gloo + 1)); echo "   needs Gloo (not runnable here): $name"
      else
        real=$((real + 1)); echo "!! FAILED: $name"
      fi
    done < <(sed 's/^[0-9]*://; s/  # .*//' "$build_dir/Testing/Temporary/LastTestsFailed.log" 2>/dev/null)
    if [ $real -gt 0 ] || [ $gloo -eq 0 ]; then
      result="FAILED ($real)"; status=1; grep -A3 'tests FAILED' "$out/cpu_suite.log"
    else
      result="passed ($gloo need Gloo)"
    fi
  fi
  results+=("$(printf '%-14s %-22s %5s s' cpu_suite "$result" "$(( $(date +%s) - start ))")")
fi
summary
finish $status
