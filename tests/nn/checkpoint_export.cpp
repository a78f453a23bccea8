// Writes a one-process checkpoint of a small TransformerLayer to argv[1] and the expected values
// of each tensor as JSON to argv[2], for scripts/check-safetensors.py (Python's safetensors).

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "te/nn.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: te_checkpoint_export CHECKPOINT_DIR EXPECTED_JSON\n");
    return 2;
  }
  te::nn::manual_seed(3);
  te::nn::TransformerLayer layer(te::nn::TransformerLayerOptions(16, 32, 4));
  te::nn::save_checkpoint(*layer, argv[1]);
  nlohmann::json expected = nlohmann::json::object();
  auto add = [&](const std::string& name, const at::Tensor& t) {
    const at::Tensor c = t.detach().contiguous();
    std::vector<std::string> values;
    const float* p = c.data_ptr<float>();
    nlohmann::json list = nlohmann::json::array();
    for (int64_t i = 0; i < c.numel(); ++i) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.9g", p[i]);
      list.push_back(nlohmann::json::parse(buf));
    }
    expected[name] = {{"shape", c.sizes().vec()}, {"values", list}};
  };
  for (const auto& p : layer->named_parameters()) add(p.key(), p.value());
  for (const auto& b : layer->named_buffers()) add(b.key(), b.value());
  std::ofstream(argv[2]) << expected.dump();
  return 0;
}
