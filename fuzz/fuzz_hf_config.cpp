// libFuzzer target: te::hf's config.json reader (hf/src/config.cpp, no LibTorch). Each input
// parses into a CausalLMConfig or throws te::Error; what parses is consistent (positive sizes,
// heads a multiple of the key/value heads, one window per layer, each positive). Anything else
// (another exception, a crash, a sanitizer report) is a bug.
//   bash scripts/fuzz.sh [seconds per target]
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "te/error.h"
#include "te/hf/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const te::hf::CausalLMConfig c = te::hf::parse_causal_lm_config(text, "fuzz/config.json");
    const bool sane = c.vocab_size > 0 && c.hidden_size > 0 && c.head_dim > 0 &&
                      c.num_key_value_heads > 0 &&
                      c.num_attention_heads % c.num_key_value_heads == 0 &&
                      static_cast<int64_t>(c.layer_windows.size()) == c.num_hidden_layers;
    if (!sane) __builtin_trap();
    for (const auto& w : c.layer_windows) {
      if (w && *w <= 0) __builtin_trap();
    }
  } catch (const te::Error&) {
  }
  return 0;
}
