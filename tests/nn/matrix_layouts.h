#pragma once

// The layouts of the equivalence matrix (tests/nn/test_parallel.cpp), shared by the tests that
// hold something else to every one of them (tests/nn/test_planner.cpp).

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace te::test {

struct MatrixLayout {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<std::string> axes;
  std::string mesh_resource;
  bool sequence_parallel = false;
};

// GoogleTest prints a parameter by its name.
inline void PrintTo(const MatrixLayout& l, std::ostream* os) { *os << l.name; }

inline const std::vector<MatrixLayout>& matrix_layouts() {
  static const std::vector<MatrixLayout> all = {
      {"DP2", {2}, {"data"}, "dp=data"},
      {"FSDP2", {2}, {"fsdp"}, "fsdp=fsdp"},
      {"TP2", {2}, {"tp"}, "tp=tp"},
      {"TP2SP", {2}, {"tp"}, "tpsp=tp", true},
      {"DP2xTP2", {2, 2}, {"data", "tp"}, "dp=data,tp=tp"},
      {"TP4", {4}, {"tp"}, "tp=tp"},
      {"FSDP2xTP2", {2, 2}, {"fsdp", "tp"}, "fsdp=fsdp,tp=tp"},
      // batch over the tuple (data, fsdp): TE's table maps it to both.
      {"DP2xFSDP2", {2, 2}, {"data", "fsdp"}, "dp=data,fsdp=fsdp"},
  };
  return all;
}

}  // namespace te::test
