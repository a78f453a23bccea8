// Runs te::nn::RotaryPositionEmbedding and functional::apply_rotary_pos_emb over both rotations
// (halves and interleaved pairs), partial rotary, the three formats, start positions, packed
// sequences and linear position interpolation, and writes each case's input, output and
// gradient as JSON for tests/interop/check_rope.py, which holds them to Hugging Face
// transformers' Llama (half rotation, rope_type "linear") and GPT-J (interleaved) rotations.
//
//   te_interop_rope OUT.json

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cases.h"
#include "te/nn.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: te_interop_rope OUT.json\n");
    return 2;
  }
  using te::interop::as_json;
  using te::interop::randn;
  namespace F = te::nn::functional;
  struct Case {
    std::string format;
    bool interleaved;
    int64_t d, d2;
    double base;
    std::optional<double> factor;  // linear interpolation (with pretrained positions 64)
    bool start;
  };
  std::vector<Case> all;
  for (const std::string format : {"bshd", "sbhd", "thd"}) {
    for (const bool interleaved : {false, true}) {
      // GPT-J's table has base 10000; Llama's takes any.
      const double base = interleaved ? 10000.0 : 500.0;
      all.push_back({format, interleaved, 8, 8, base, std::nullopt, false});
      all.push_back({format, interleaved, 12, 8, base, std::nullopt, true});  // partial rotary
      if (!interleaved) all.push_back({format, false, 8, 8, base, 4.0, format != "thd"});
    }
  }
  nlohmann::json cases = nlohmann::json::array();
  uint64_t seed = 500;
  const std::vector<int64_t> lengths = {5, 2, 7};  // thd: the three sequences
  const std::vector<int64_t> starts = {3, 0, 9};
  for (const Case& c : all) {
    const int64_t b = 3, s = 7, h = 2;
    const bool thd = c.format == "thd";
    const std::vector<int64_t> shape = thd                  ? std::vector<int64_t>{14, h, c.d}
                                       : c.format == "bshd" ? std::vector<int64_t>{b, s, h, c.d}
                                                            : std::vector<int64_t>{s, b, h, c.d};
    const at::Tensor t0 = randn(shape, ++seed), dy = randn(shape, ++seed);
    auto options =
        te::nn::RotaryPositionEmbeddingOptions(c.d2).rotary_base(c.base).interleaved(c.interleaved);
    if (c.factor)
      options.seq_len_interpolation_factor(*c.factor).pretrained_max_position_embeddings(64);
    te::nn::RotaryPositionEmbedding rope(options);
    const at::Tensor freqs = rope->forward(20);
    const at::Tensor cu = thd ? at::tensor(std::vector<int32_t>{0, 5, 7, 14}) : at::Tensor();
    const at::Tensor start = c.start ? at::tensor(starts) : at::Tensor();
    const at::Tensor t = t0.clone().requires_grad_(true);
    const at::Tensor y = F::apply_rotary_pos_emb(t, freqs, c.format, c.interleaved, cu, start);
    torch::autograd::backward({y}, {dy});
    nlohmann::json j = {{"format", c.format}, {"interleaved", c.interleaved},
                        {"d2", c.d2},         {"base", c.base},
                        {"t", as_json(t0)},   {"dy", as_json(dy)},
                        {"y", as_json(y)},    {"dt", as_json(t.grad())}};
    if (c.factor) j["factor"] = *c.factor;
    if (c.start) j["start_positions"] = starts;
    if (thd) j["lengths"] = lengths;
    cases.push_back(j);
  }
  te::interop::write_cases("te_interop_rope", argv[1], cases);
  return 0;
}
