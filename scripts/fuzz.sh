#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ with clang (ASan + UBSan; the code under test is compiled
# with coverage instrumentation, not linked from the GCC build) and runs each for a fixed time,
# starting from its seed corpus in fuzz/corpus/<target>/. Any crash or sanitizer report fails
# the run; libFuzzer writes the input that caused it as crash-* in build-fuzz/.
#
#   bash scripts/fuzz.sh          # 30 s per target (CI: 10 s)
#   bash scripts/fuzz.sh 600      # longer
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
bash scripts/setup.sh
out=${TE_FUZZ_BUILD_DIR:-build-fuzz}
mkdir -p "$out"
flags=(-std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
       -Ite/include)

# Each target: its sources (the code under test compiled here, instrumented) and include dirs.
# fuzz_sharding: the rule and MeshResource parsers and resolution (te_core + te_sharding).
# fuzz_cola: te-encoder's CoLA TSV reader, tokenizer and vocabulary (encoder/src/text.cpp).
# fuzz_request: te-serve's request decoders, te's own and OpenAI's (serve/src/request.cpp,
#   openai_requests.cpp, json_body.cpp; nlohmann-json).
# fuzz_checkpoint: the checkpoint index and safetensors header reader
#   (modules/src/checkpoint_format.cpp, no LibTorch).
# fuzz_hf_config: te::hf's config.json reader (hf/src/config.cpp, nlohmann-json).
# fuzz_gguf: te::hf's GGUF header parser (hf/src/gguf_format.cpp), ggml's block decoding and
#   row products (te/src/kernels/ggml.cpp), and the tokenizers GGUF metadata builds
#   (hf/src/tokenizer_gguf.cpp and the tokenizer pipeline).
# fuzz_tokenizer: te::hf's tokenizer.json reader, WordPiece and byte-level BPE pipelines
#   (hf/src/tokenizer*.cpp, bpe.cpp; ICU, PCRE2; LibTorch headers only).
tokenizer_sources="hf/src/tokenizer.cpp hf/src/tokenizer_json.cpp hf/src/tokenizer_pieces.cpp
                   hf/src/tokenizer_steps.cpp hf/src/bpe.cpp hf/src/unicode.cpp
                   te/src/core/error.cpp"
declare -A sources=(
  [fuzz_sharding]="fuzz/fuzz_sharding.cpp te/src/core/error.cpp te/src/sharding/axis_rules.cpp
                   te/src/sharding/context.cpp te/src/sharding/mesh_shape.cpp"
  [fuzz_cola]="fuzz/fuzz_cola.cpp encoder/src/text.cpp"
  [fuzz_request]="fuzz/fuzz_request.cpp serve/src/request.cpp serve/src/openai_requests.cpp
                  serve/src/json_body.cpp encoder/src/text.cpp"
  [fuzz_checkpoint]="fuzz/fuzz_checkpoint.cpp modules/src/checkpoint_format.cpp
                     te/src/core/error.cpp"
  [fuzz_hf_config]="fuzz/fuzz_hf_config.cpp hf/src/config.cpp $(echo hf/src/families/*.cpp)
                    te/src/core/error.cpp"
  [fuzz_gguf]="fuzz/fuzz_gguf.cpp hf/src/gguf_format.cpp te/src/kernels/ggml.cpp
               $tokenizer_sources hf/src/tokenizer_gguf.cpp"
  [fuzz_tokenizer]="fuzz/fuzz_tokenizer.cpp $tokenizer_sources"
)
# What a target links beyond the sanitizer runtime.
declare -A libs=([fuzz_tokenizer]="-licuuc -lpcre2-8" [fuzz_gguf]="-licuuc -lpcre2-8")
targets=(fuzz_sharding fuzz_cola fuzz_request fuzz_checkpoint fuzz_hf_config fuzz_gguf
         fuzz_tokenizer)
headers=(te/include encoder/include serve/include gen/include serve/src/json_body.h
         modules/src/checkpoint_format.h hf/include hf/src/families/family.h
         hf/src/families/list.h hf/src/families/rope_decoder.h hf/src/json_fields.h
         hf/src/gguf_io.h modules/include/te/nn/attention_types.h)  # a change rebuilds all
for target in "${targets[@]}"; do
  read -r -a src <<<"$(echo ${sources[$target]})"
  if [ ! -x "$out/$target" ] || [ -n "$(find "${src[@]}" "${headers[@]}" -newer "$out/$target" \
       2>/dev/null | head -1)" ]; then
    read -r -a link <<<"${libs[$target]:-}"
    clang++ "${flags[@]}" -Iencoder/include -Iserve/include -Imodules/include -Imodules/src \
      -Igen/include -Ihf/include -isystem /usr/include/torch/csrc/api/include "${src[@]}" \
      "${link[@]}" -o "$out/$target"
  fi
done

for target in "${targets[@]}"; do
  corpus="$out/corpus-$target"
  mkdir -p "$corpus"
  log="$out/$target.log"
  if ! (cd "$out" && "./$target" -max_total_time="$seconds" -print_final_stats=1 \
        "corpus-$target" "../fuzz/corpus/${target#fuzz_}") >"$log" 2>&1; then
    tail -40 "$log" >&2
    echo "fuzz: $target failed; the input is in $out/crash-* (make it a regression test)" >&2
    exit 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  echo "fuzz: $target: $runs executions in ${seconds}s, no crash"
done
