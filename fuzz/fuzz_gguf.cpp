// libFuzzer target: te::hf's GGUF header parser (hf/src/gguf_format.cpp), ggml's block
// decoding (te/src/kernels/ggml.cpp) and the tokenizers built from GGUF metadata
// (hf/src/tokenizer_gguf.cpp), no LibTorch. Each input parses as a GGUF file or throws
// te::Error; what parses has every tensor's data inside the input, and each tensor's first row
// dequantizes, and multiplies as a weight row held in its blocks, without reading past it; a
// file with tokenizer metadata builds its tokenizer or throws te::Error, and what builds encodes
// texts to ids inside its vocabulary, which decode. Anything else (another exception, a crash, a
// sanitizer report) is a bug.
//   bash scripts/fuzz.sh [seconds per target]
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "te/error.h"
#include "te/hf/gguf.h"
#include "te/hf/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const auto read = [&](void* out, std::size_t n, int64_t offset) {
    if (offset < 0 || static_cast<uint64_t>(offset) + n > size) __builtin_trap();
    std::memcpy(out, data + offset, n);
  };
  try {
    const te::hf::GgufHeader h =
        te::hf::parse_gguf_header(read, static_cast<int64_t>(size), "fuzz.gguf");
    for (const te::hf::GgufTensor& t : h.tensors) {
      if (t.offset < 0 || t.bytes < 0 || t.offset + t.bytes > static_cast<int64_t>(size)) {
        __builtin_trap();
      }
      const auto [per_block, block_bytes] = te::ggml::block_shape(t.type, t.name);
      const int64_t row = t.shape.back();
      if (row / per_block * block_bytes > t.bytes) __builtin_trap();
      std::vector<float> out(static_cast<std::size_t>(row));
      te::ggml::dequantize(t.type, data + t.offset, row, out.data());
      // The first row as a weight row held in its blocks, times ones.
      const unsigned char* first = data + t.offset;
      const std::vector<float> ones(static_cast<std::size_t>(row), 1.0f);
      float y = 0;
      te::ggml::dot_rows(t.type, &first, 1, row, ones.data(), 1, row, &y, 1);
    }
    if (h.value("tokenizer.ggml.model") != nullptr) {
      const te::hf::Tokenizer tok = te::hf::Tokenizer::from_gguf(h);
      for (const char* text : {"", "Hello, world! 123", "caf\xc3\xa9 \xe6\x88\x91  y'all \t\n"}) {
        const te::hf::Encoding e = tok.encode(text);
        for (int64_t id : e.ids) {
          if (id < 0 || id >= tok.vocab_size()) __builtin_trap();
        }
        tok.decode(e.ids, false);
      }
    }
  } catch (const te::Error&) {
  }
  return 0;
}
