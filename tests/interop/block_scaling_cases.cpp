// Casts inputs with the block recipes' quantizers and writes inputs, codes, scales (and NVFP4's
// amaxes, dequantized values and Hadamard transforms) as JSON for
// tests/interop/check_block_scaling.py, which holds them to Transformer Engine's Python references
// (their rules computed with PyTorch's float8 casts):
// - te::fp8::quantize_blocks (Float8BlockScaling: 1x128 blocks, 128x128 tiles; E4M3 and E5M2;
//   power-of-two and fp32 scales; amax_epsilon; ragged edges);
// - te::fp8::quantize_mx (MXFP8: 1x32 blocks, E8M0 scales; E4M3 and E5M2; a ragged edge);
// - te::fp8::quantize_nvfp4 and hadamard16 (NVFP4: 1x16 blocks and 16x16 tiles, awkward
//   magnitudes, an outlier, subnormals, a ragged row count, an amax given from outside).
//
//   te_interop_block_scaling OUT.json

#include <ATen/ATen.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cases.h"
#include "te/fp8.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: te_interop_block_scaling OUT.json\n");
    return 2;
  }
  using te::interop::as_json;
  using te::interop::randn;
  namespace fp8 = te::fp8;
  nlohmann::json cases = nlohmann::json::array();
  uint64_t seed = 900;
  auto add = [&](const std::string& name, const at::Tensor& x, fp8::ScalingMode mode,
                 std::optional<float> amax) {
    fp8::Nvfp4Cast how;
    how.scaling = mode;
    how.amax = amax;
    const fp8::Fp8Tensor q = fp8::quantize_nvfp4(x, how);
    nlohmann::json c = {{"recipe", "nvfp4"},
                        {"name", name},
                        {"tiles", mode == fp8::ScalingMode::kBlock16x16},
                        {"x", as_json(x)},
                        {"codes", as_json(q.data)},
                        {"scales", as_json(q.scale_inv)},
                        {"amax", q.amax.item<double>()},
                        {"values", as_json(q.dequantize())}};
    if (amax) c["given_amax"] = *amax;
    cases.push_back(c);
  };
  for (const auto mode : {fp8::ScalingMode::kBlock1x16, fp8::ScalingMode::kBlock16x16}) {
    const std::string m = fp8::to_string(mode);
    add("normal " + m, randn({32, 64}, ++seed), mode, std::nullopt);
    // Rows from 1e-4 to 1e4: many block scales far below the tensor's (E4M3 subnormals, zeros).
    add("magnitudes " + m,
        randn({48, 32}, ++seed) *
            at::pow(10.0, at::linspace(-4, 4, 48)).to(at::kFloat).unsqueeze(1),
        mode, std::nullopt);
    at::Tensor outlier = randn({20, 48}, ++seed) * 0.01;  // 20 rows: a ragged tile row
    outlier[3][7] = 50.0f;
    outlier[17][40] = -1e-39f;  // a subnormal input
    add("outlier, ragged rows " + m, outlier, mode, std::nullopt);
    add("amax given " + m, randn({16, 32}, ++seed), mode, 11.0f);
  }
  nlohmann::json transforms = nlohmann::json::array();
  for (const int64_t cols : {16, 64, 40}) {
    const at::Tensor x = randn({8, cols}, ++seed);
    transforms.push_back({{"x", as_json(x)}, {"y", as_json(fp8::hadamard16(x))}});
  }
  cases.push_back({{"recipe", "nvfp4"}, {"name", "hadamard"}, {"transforms", transforms}});

  // Rows of magnitudes 1e-3..1e3, ragged in both dims (200 x 300: 128-blocks of 72 and 44).
  const at::Tensor wide = randn({200, 300}, ++seed) *
                          at::pow(10.0, at::linspace(-3, 3, 200)).to(at::kFloat).unsqueeze(1);
  for (const auto mode : {fp8::ScalingMode::kBlock1x128, fp8::ScalingMode::kBlock128x128}) {
    for (const auto dtype : {fp8::DType::kE4M3, fp8::DType::kE5M2}) {
      for (const bool power_2 : {true, false}) {
        for (const float epsilon : {0.0f, 0.5f}) {
          const fp8::Fp8Tensor q = fp8::quantize_blocks(wide, mode, dtype, power_2, epsilon);
          cases.push_back(
              {{"recipe", "block"},
               {"name", std::string(fp8::to_string(mode)) +
                            (dtype == fp8::DType::kE4M3 ? " e4m3" : " e5m2") +
                            (power_2 ? " pow2" : " fp32") + (epsilon > 0 ? " eps 0.5" : "")},
               {"tiles", mode == fp8::ScalingMode::kBlock128x128},
               {"e4m3", dtype == fp8::DType::kE4M3},
               {"power_2", power_2},
               {"epsilon", epsilon},
               {"x", as_json(wide)},
               {"codes", as_json(q.data)},
               {"scale_inv", as_json(q.scale_inv)}});
        }
      }
    }
  }
  const at::Tensor mx_in = randn({40, 100}, ++seed) *
                           at::pow(10.0, at::linspace(-20, 20, 40)).to(at::kFloat).unsqueeze(1);
  for (const auto dtype : {fp8::DType::kE4M3, fp8::DType::kE5M2}) {
    const fp8::Fp8Tensor q = fp8::quantize_mx(mx_in, dtype);
    cases.push_back({{"recipe", "mxfp8"},
                     {"name", dtype == fp8::DType::kE4M3 ? "1x32 e4m3" : "1x32 e5m2"},
                     {"e4m3", dtype == fp8::DType::kE4M3},
                     {"x", as_json(mx_in)},
                     {"codes", as_json(q.data)},
                     {"scales", as_json(q.scale_inv)}});
  }
  te::interop::write_cases("te_interop_block_scaling", argv[1], cases);
  return 0;
}
