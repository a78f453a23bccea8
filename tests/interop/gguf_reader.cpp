// Reads every tensor of a GGUF file with te::hf::GgufFile, whole and as one box (rows [1, 3) and
// the columns of the second and third blocks, or the middle of a 1-D tensor), and writes them
// as JSON, with every metadata value, for tests/interop/check_gguf.py to hold to gguf-py's
// dequantization.
//
//   te_interop_gguf FILE.gguf OUT.json

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cases.h"
#include "te/hf/gguf.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: te_interop_gguf FILE.gguf OUT.json\n");
    return 2;
  }
  try {
    te::hf::GgufFile file(argv[1]);
    nlohmann::json out = nlohmann::json::object();
    for (const te::hf::GgufTensor& t : file.header().tensors) {
      const std::vector<int64_t> zero(t.shape.size(), 0);
      nlohmann::json j = {{"whole", te::interop::as_json(file.read(t.name, zero, t.shape))}};
      std::vector<int64_t> lo = zero, hi = t.shape;
      const int64_t per_block = te::ggml::block_shape(t.type, t.name).elements;
      const int64_t last = static_cast<int64_t>(t.shape.size()) - 1;
      if (last > 0) {
        lo[0] = std::min<int64_t>(1, t.shape[0]);
        hi[0] = std::min<int64_t>(3, t.shape[0]);
      }
      // Inside a block at both ends (quantized), or all but the first and last element.
      const int64_t n = t.shape[last];
      lo[last] = std::min(n, per_block > 1 ? per_block + 3 : 1);
      hi[last] = std::max(lo[last], std::min(n, per_block > 1 ? 3 * per_block - 5 : n - 1));
      j["lo"] = lo;
      j["hi"] = hi;
      j["box"] = te::interop::as_json(file.read(t.name, lo, hi));
      j["type"] = t.type;
      out[t.name] = j;
    }
    nlohmann::json meta = nlohmann::json::object();
    for (const auto& [key, v] : file.header().metadata) {
      if (v.type == 9) {
        meta[key] = v.element_type == 8                           ? nlohmann::json(v.strings)
                    : v.element_type == 6 || v.element_type == 12 ? nlohmann::json(v.numbers)
                                                                  : nlohmann::json(v.integers);
      } else {
        meta[key] = v.type == 8                   ? nlohmann::json(v.string)
                    : v.type == 6 || v.type == 12 ? nlohmann::json(v.number)
                                                  : nlohmann::json(v.integer);
      }
    }
    std::ofstream(argv[2]) << nlohmann::json{{"tensors", out}, {"metadata", meta}}.dump();
    std::printf("te_interop_gguf: %zu tensors of %s written to %s\n", out.size(), argv[1], argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "te_interop_gguf: %s\n", e.what());
    return 1;
  }
  return 0;
}
