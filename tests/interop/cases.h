#pragma once

// What the tests/interop/ case writers share: seeded inputs and tensors as JSON (shape and
// values in float64) for the Python checks to rebuild.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

namespace te::interop {

/// Normal values from a generator of their own (the same on every run).
inline at::Tensor randn(std::vector<int64_t> shape, uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  return at::randn(shape, g);
}

/// {"shape": [...], "values": [...]} of t in float64.
inline nlohmann::json as_json(const at::Tensor& t_in) {
  const at::Tensor t = t_in.detach().to(at::kDouble).contiguous();
  nlohmann::json values = nlohmann::json::array();
  const double* p = t.data_ptr<double>();
  for (int64_t i = 0; i < t.numel(); ++i) values.push_back(p[i]);
  return {{"shape", t.sizes().vec()}, {"values", values}};
}

/// Writes `cases` to `path` (making its directory) and says so as `program`.
inline void write_cases(const char* program, const char* path, const nlohmann::json& cases) {
  const std::filesystem::path out(path);
  if (out.has_parent_path()) std::filesystem::create_directories(out.parent_path());
  std::ofstream(out) << cases.dump();
  std::printf("%s: %zu cases written to %s\n", program, cases.size(), path);
}

}  // namespace te::interop
