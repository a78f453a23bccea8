#!/usr/bin/env bash
# Where a TransformerLayer step spends its GPU time: Nsight Compute's per-kernel summary of te's
# BF16 and FP8 steps (bench_layer_gpu under TE_BENCH_PROFILE: a warm-up step and the step), each
# kernel's count and mean duration, on the GPU machine with what `gpu-check.sh --rehearse` left in
# .gpu/ (clocks left alone: --clock-control none).
#   bash scripts/gpu-profile.sh OUT_DIR [seq=2048] [batch=2]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: gpu-profile.sh OUT_DIR [seq] [batch]}
seq=${2:-2048}
batch=${3:-2}
mkdir -p "$out"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "gpu-profile: no ncu here"; exit 1; }
torch_dir=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))') || exit 1
site=$(dirname "$torch_dir")
libs=$(pwd)/.gpu/lib:$torch_dir/lib
for d in "$site"/nvidia/*/lib "$site"/nvidia/*/*/lib; do [ -d "$d" ] && libs=$libs:$d; done
export LD_LIBRARY_PATH=$libs
status=0
for variant in bf16 fp8; do
  TE_BENCH_PROFILE=$variant timeout 150 "$ncu" --clock-control none --metrics gpu__time_duration.sum \
    --print-summary per-kernel --launch-count 2000 .gpu/bin/bench_layer_gpu "$seq" "$batch" \
    >"$out/ncu_$variant.txt" 2>&1 || status=1
  echo "== $variant: $(grep -c 'gpu__time_duration.sum' "$out/ncu_$variant.txt") kernels" \
    "(rc so far $status); $(tail -1 "$out/ncu_$variant.txt")"
done
exit $status
