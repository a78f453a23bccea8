// Casts inputs to NVFP4 with te::fp8::quantize_nvfp4 (1x16 blocks and 16x16 tiles, awkward
// magnitudes, an outlier, subnormals, a ragged row count, an amax given from outside) and
// transforms some with te::fp8::hadamard16, and writes inputs, packed codes, E4M3 scales,
// amaxes, dequantized values and transforms as JSON for tests/interop/check_nvfp4.py, which
// holds them to TE's NVFP4 reference quantizer (reference_nvfp4.py's rules, computed with
// PyTorch's float8_e4m3fn casts).
//
//   te_interop_nvfp4 OUT.json

#include <ATen/ATen.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cases.h"
#include "te/fp8.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: te_interop_nvfp4 OUT.json\n");
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
    nlohmann::json c = {{"name", name},
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
  cases.push_back({{"name", "hadamard"}, {"transforms", transforms}});
  te::interop::write_cases("te_interop_nvfp4", argv[1], cases);
  return 0;
}
