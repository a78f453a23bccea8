#!/usr/bin/env bash
# The full encoder runs of the README against TE's accuracy bars (TE's examples/jax/encoder at
# d0067d0da, the commit te-encoder mirrors), one after another, each writing metrics and per-step
# losses under ${1:-encoder-runs}/, then one table of the results, each row against its bar
# ("met" / "MISSED"), and the loss curves in losses.png. About two hours on a 2-core machine.
#
#   bash scripts/encoder-runs.sh [OUT_DIR] [RUN ...]   # RUN: one bf16 seeds fp8-delayed
#                                                      #   fp8-current fp8-seeds fp8-layouts
#                                                      #   fp8-block fp8-block-layouts
#                                                      #   fp8-mxfp8 fp8-mxfp8-layouts
#                                                      #   fp8-nvfp4 fp8-nvfp4-layouts dp2
#                                                      #   fsdp2 fsdp2-quantized tp4 tp4-sp
#                                                      #   mp4 dp2-b256 tp4-b128 (default: all)
#
# TE's bars are for bf16 (and its FP8 recipes): every run but `one` (fp32) computes in bf16.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-encoder-runs}
shift || true
runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=(one bf16 seeds fp8-delayed fp8-current fp8-seeds fp8-layouts
  fp8-block fp8-block-layouts fp8-mxfp8 fp8-mxfp8-layouts fp8-nvfp4 fp8-nvfp4-layouts dp2 fsdp2
  fsdp2-quantized tp4 tp4-sp mp4 dp2-b256
  tp4-b128)
bash scripts/setup.sh
bash scripts/build.sh >/dev/null
enc=${TE_BUILD_DIR:-build}/examples/encoder/te-encoder
mkdir -p "$out"

run() {  # NAME BAR_LOSS BAR_ACC ARGS...: TE's bar is train loss < BAR_LOSS, accuracy > BAR_ACC
  local name=$1
  echo "$2 $3" > "$out/$name.bar"
  shift 3
  echo "== $name: te-encoder $*"
  local start=$SECONDS
  "$enc" --metrics-json "$out/$name.json" --log-steps "$out/$name.csv" "$@" | grep -v '  epoch' || return 1
  echo "$name wall $((SECONDS - start)) s" | tee "$out/$name.wall"
}

bf=(--dtype bf16)
dp2=(--nproc 2 --mesh data=2 --mesh-resource dp=data --batch-size 512 --epochs 5)
tp4=(--nproc 4 --mesh data=2,model=2 --mesh-resource dp=data,tpsp=model --batch-size 256
  --max-seq-len 64 --epochs 5)
for r in "${runs[@]}"; do
  case $r in
    # Bars: DESIGN.md section 7 (TE's tests under examples/jax/encoder at d0067d0da).
    one) run one 0.452 0.788 ;;
    bf16) run bf16 0.452 0.788 "${bf[@]}" ;;
    seeds) for s in 1 2 3; do run "bf16-seed$s" 0.452 0.788 "${bf[@]}" --seed "$s"; done ;;
    fp8-delayed) run fp8-delayed 0.457 0.784 "${bf[@]}" --fp8 delayed ;;
    fp8-current) run fp8-current 0.461 0.784 "${bf[@]}" --fp8 current ;;
    fp8-seeds) for s in 1 2 3; do
                 run "fp8-delayed-seed$s" 0.457 0.784 "${bf[@]}" --fp8 delayed --seed "$s"
                 run "fp8-current-seed$s" 0.461 0.784 "${bf[@]}" --fp8 current --seed "$s"
               done ;;
    # TE's FP8 bars of the other tests (model parallel has no current-scaling bar).
    fp8-layouts)
      run dp2-fp8-delayed 0.51 0.75 "${bf[@]}" "${dp2[@]}" --fp8 delayed
      run dp2-fp8-current 0.51 0.749 "${bf[@]}" "${dp2[@]}" --fp8 current
      run tp4-fp8-delayed 0.362 0.84 "${bf[@]}" "${tp4[@]}" --fp8 delayed
      run tp4-sp-fp8-delayed 0.362 0.84 "${bf[@]}" "${tp4[@]}" --sequence-parallel --fp8 delayed
      run mp4-fp8-delayed 0.43 0.80 "${bf[@]}" "${tp4[@]}" --mlp-activations gelu --fp8 delayed
      run mp4-fp8-current 0.432 0.80 "${bf[@]}" "${tp4[@]}" --mlp-activations gelu --fp8 current
      ;;
    # Float8BlockScaling: TE has no encoder bar for it; the issue's is the bf16 bar + 0.005.
    fp8-block) run fp8-block 0.457 0.783 "${bf[@]}" --fp8 block ;;
    fp8-block-layouts)
      run dp2-fp8-block 0.515 0.745 "${bf[@]}" "${dp2[@]}" --fp8 block
      run tp4-fp8-block 0.365 0.835 "${bf[@]}" "${tp4[@]}" --fp8 block
      run tp4-sp-fp8-block 0.365 0.835 "${bf[@]}" "${tp4[@]}" --sequence-parallel --fp8 block
      ;;
    fp8-mxfp8) run fp8-mxfp8 0.457 0.784 "${bf[@]}" --fp8 mxfp8 ;;  # TE's MXFP8 bars
    fp8-mxfp8-layouts)
      run dp2-fp8-mxfp8 0.51 0.75 "${bf[@]}" "${dp2[@]}" --fp8 mxfp8
      run tp4-fp8-mxfp8 0.36 0.84 "${bf[@]}" "${tp4[@]}" --fp8 mxfp8
      run tp4-sp-fp8-mxfp8 0.36 0.84 "${bf[@]}" "${tp4[@]}" --sequence-parallel --fp8 mxfp8
      ;;
    fp8-nvfp4) run fp8-nvfp4 0.477 0.769 "${bf[@]}" --fp8 nvfp4 ;;  # TE's NVFP4 bars
    fp8-nvfp4-layouts)
      run dp2-fp8-nvfp4 0.52 0.74 "${bf[@]}" "${dp2[@]}" --fp8 nvfp4
      run tp4-fp8-nvfp4 0.40 0.82 "${bf[@]}" "${tp4[@]}" --fp8 nvfp4
      run tp4-sp-fp8-nvfp4 0.40 0.82 "${bf[@]}" "${tp4[@]}" --sequence-parallel --fp8 nvfp4
      run mp4-fp8-nvfp4 0.451 0.787 "${bf[@]}" "${tp4[@]}" --mlp-activations gelu --fp8 nvfp4
      ;;
    dp2) run dp2 0.51 0.75 "${bf[@]}" --nproc 2 --mesh data=2 --mesh-resource dp=data \
           --batch-size 512 --epochs 5 ;;
    fsdp2) run fsdp2 0.51 0.75 "${bf[@]}" --nproc 2 --mesh data=2 --mesh-resource fsdp=data \
             --batch-size 512 --epochs 5 ;;
    # FP8 weights in training (--quantized-weights, current scaling) under FSDP2 against bf16
    # FSDP2, 300 steps each: the issue's bar is the train loss within 2% of bf16's (accuracy
    # within 2 points); te-cpp's own, TE has no encoder test of it. bf16's run has no bar.
    fsdp2-quantized)
      fsdp=(--nproc 2 --mesh data=2 --mesh-resource fsdp=data --max-steps 300)
      run fsdp2-bf16-300 - - "${bf[@]}" "${fsdp[@]}"
      read -r l a < <(python3 -c 'import json,sys; m=json.load(open(sys.argv[1]))
print(1.02 * m["train_loss"], m["train_accuracy"] - 0.02)' "$out/fsdp2-bf16-300.json")
      run fsdp2-quantized-300 "$l" "$a" "${bf[@]}" "${fsdp[@]}" --fp8 current --quantized-weights
      ;;
    tp4) run tp4 0.36 0.84 "${bf[@]}" "${tp4[@]}" ;;
    tp4-sp) run tp4-sp 0.36 0.84 "${bf[@]}" "${tp4[@]}" --sequence-parallel ;;
    # TE's multiprocessing example (test_multiprocessing_encoder.py): one process per device on
    # a dp x tp mesh (tp 2), global batch 256, seq 64, 5 epochs, TransformerLayer's default gelu.
    mp4) run mp4 0.43 0.80 "${bf[@]}" "${tp4[@]}" --mlp-activations gelu ;;
    # The batch sizes of other versions of TE's examples (their bars: < 0.52 / > 0.74 and
    # < 0.43 / > 0.80).
    dp2-b256) run dp2-b256 0.52 0.74 "${bf[@]}" --nproc 2 --mesh data=2 --mesh-resource dp=data \
                --batch-size 256 --epochs 5 ;;
    tp4-b128) run tp4-b128 0.43 0.80 "${bf[@]}" --nproc 4 --mesh data=2,model=2 \
                --mesh-resource dp=data,tpsp=model --batch-size 128 --max-seq-len 64 --epochs 5 ;;
    *) echo "encoder-runs: unknown run '$r'" >&2; exit 2 ;;
  esac
done

python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
rows = []
for name in sorted(f[:-5] for f in os.listdir(out) if f.endswith(".json")):
    m = json.load(open(os.path.join(out, name + ".json")))
    wall = open(os.path.join(out, name + ".wall")).read().split()[2] if os.path.exists(os.path.join(out, name + ".wall")) else "?"
    bar = os.path.join(out, name + ".bar")
    bars = open(bar).read().split() if os.path.exists(bar) else ["0", "1"]
    if bars == ["-", "-"]:
        verdict = "none (a baseline)"
    else:
        loss_bar, acc_bar = map(float, bars)
        met = "met" if m["train_loss"] < loss_bar and m["train_accuracy"] > acc_bar else "MISSED"
        verdict = "< %.4g / > %.4g %s" % (loss_bar, acc_bar, met)
    fp8 = m["fp8"] + (" (quantized weights)" if m.get("quantized_weights") else "")
    rows.append((name, m["world_size"], m["mesh"] or "-", m["dtype"], fp8, m["epochs"],
                 m["train_loss"], m["train_accuracy"], verdict,
                 m["dev_accuracy"], m["dev_mcc"], wall, m["samples_per_second"]))
print("| run | ranks | mesh | dtype | fp8 | epochs | train loss | train acc | TE's bar | dev acc | dev MCC | wall s | samples/s |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print("| %s | %d | %s | %s | %s | %d | %.4f | %.4f | %s | %.4f | %.4f | %s | %.1f |" % r)
PY
if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  csvs=()
  for f in "$out"/*.csv; do csvs+=("$f:$(basename "$f" .csv)"); done
  examples/program/plot_losses -o "$out/losses.png" --title "te-encoder on CoLA: training loss" \
    "${csvs[@]}"
fi
