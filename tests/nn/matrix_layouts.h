#pragma once

// The layouts of the equivalence matrix (tests/nn/test_parallel.cpp), shared by the tests that
// hold something else to every one of them (tests/nn/test_planner.cpp).

#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace te::test {

struct MatrixLayout {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<std::string> axes;
  std::string mesh_resource;
  bool sequence_parallel = false;
  std::string cp_comm_type;       // context parallelism over MeshResource cp (empty: none)
  bool cp_load_balanced = false;  // the tokens in TE's load-balanced order (rank order)
  std::string rules;              // rules beside the MeshResource (a2a+p2p's two cp axes)
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

// Context parallelism: CP2, DP2xCP2, TP2xCP2 and CP4 with p2p, all_gather and a2a (the sequence
// split over MeshResource cp, which TE's table maps seqlen_cp to), and CP4 (and DP2xCP2 with p2p)
// with the sequence in TE's load-balanced order; a2a+p2p over 2 x 2 ranks, in both orders.
inline const std::vector<MatrixLayout>& cp_matrix_layouts() {
  static const std::vector<MatrixLayout> all = [] {
    std::vector<MatrixLayout> made;
    // (names without '_': tests/cmake/test_groups.cmake reads <kind>_<layout>_<rules>)
    for (const auto& [type, name] : std::vector<std::pair<std::string, std::string>>{
             {"p2p", "P2P"}, {"all_gather", "AllGather"}, {"a2a", "A2A"}}) {
      made.push_back({"CP2" + name, {2}, {"cp"}, "cp=cp", false, type});
      made.push_back({"DP2xCP2" + name, {2, 2}, {"data", "cp"}, "dp=data,cp=cp", false, type});
      made.push_back({"TP2xCP2" + name, {2, 2}, {"tp", "cp"}, "tp=tp,cp=cp", false, type});
      made.push_back({"CP4" + name, {4}, {"cp"}, "cp=cp", false, type});
      // The load-balanced order (attention kinds: a layer's hidden dropout draws at a token's
      // place in the tensor it is given, here the rank order).
      made.push_back({"CP4" + name + "Balanced", {4}, {"cp"}, "cp=cp", false, type, true});
    }
    made.push_back(
        {"DP2xCP2P2PBalanced", {2, 2}, {"data", "cp"}, "dp=data,cp=cp", false, "p2p", true});
    // a2a+p2p: the sequence over a ring axis and an a2a axis (TE's table has one cp axis, so a
    // rule names both), contiguous and load balanced.
    for (const bool balanced : {false, true}) {
      made.push_back({std::string("CP2x2A2AP2P") + (balanced ? "Balanced" : ""),
                      {2, 2},
                      {"ring", "a2a"},
                      "",
                      false,
                      "a2a+p2p",
                      balanced,
                      "seqlen_cp=(ring,a2a)"});
    }
    return made;
  }();
  return all;
}

// Expert parallelism (the mixture-of-experts kinds): EP2 sharing the data axis (tokens to the
// experts by all-to-all), DP2xEP2 (experts over their own axis, every token on both of its
// ranks), EP2xTP2 (each expert's mlp dim split too).
inline const std::vector<MatrixLayout>& ep_matrix_layouts() {
  static const std::vector<MatrixLayout> all = {
      {"EP2", {2}, {"data"}, "dp=data,ep=data"},
      {"DP2xEP2", {2, 2}, {"data", "expert"}, "dp=data,ep=expert"},
      {"EP2xTP2", {2, 2}, {"data", "tp"}, "dp=data,ep=data,tp=tp"},
  };
  return all;
}

}  // namespace te::test
