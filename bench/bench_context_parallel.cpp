// Context parallelism's memory and time: one TransformerLayer (causal self attention) training
// step, forward + backward, on a long sequence split over 1, 2 and 4 thread ranks with each
// cp_comm_type. Per rank: the peak bytes allocated during the step (te::AllocationCounter, on
// the rank's thread; the layer's parameters and the input exist before it starts), and the step
// time (the slowest rank's, median of --reps). The rules map both `seqlen` and `seqlen_cp` to
// the cp axis, so every activation of the layer is split, not only attention's. p2p runs twice:
// on contiguous chunks, where the causal ring's last rank has cp times the first's blocks, and
// in TE's load-balanced order (cp_load_balanced), where every rank has the same work; a2a+p2p
// at CP4 as a ring of 2 over a2a groups of 2, load balanced.
//
//   bench_context_parallel [--tokens 16384] [--hidden 64] [--heads 4] [--ffn 256] [--reps 3]
//
// Prints a Markdown table: peak bytes per rank and its ratio to one process's; step ms and its
// ratio to all_gather's at the same cp.
#include <ATen/ATen.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "te/distributed.h"
#include "te/nn.h"
#include "te/runtime.h"
#include "te/runtime/meta.h"
#include "te/sharding.h"

namespace {

struct Args {
  int64_t tokens = 16384, hidden = 64, heads = 4, ffn = 256;
  int reps = 3;
  double attention_dropout = 0.0;  // > 0 (training): p2p and all_gather take the unfused blocks
};

struct Result {
  int64_t peak = 0;
  double ms = 0;
};

te::nn::TransformerLayerOptions layer_options(const Args& a, std::optional<te::nn::CpCommType> cp,
                                              bool balanced = false) {
  auto o = te::nn::TransformerLayerOptions(a.hidden, a.ffn, a.heads)
               .hidden_dropout(0.0)
               .intermediate_dropout(0.0);
  o.self_attention().attention().attention_dropout(a.attention_dropout).attn_mask_type("causal");
  if (cp) o.self_attention().attention().cp_comm_type(*cp).cp_load_balanced(balanced);
  return o;
}

// One rank's step: peak bytes and milliseconds (the last of the reps, after one warm-up).
Result step(const Args& a, te::nn::TransformerLayer& layer,
            const std::function<at::Tensor()>& run) {
  Result r;
  std::vector<double> times;
  for (int i = 0; i <= a.reps; ++i) {
    te::AllocationCounter counter;
    const auto start = std::chrono::steady_clock::now();
    run().backward();
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
    r.peak = std::max(r.peak, counter.peak_bytes());
    layer->zero_grad();
  }
  times.erase(times.begin());  // the warm-up
  std::sort(times.begin(), times.end());
  r.ms = times[times.size() / 2];
  return r;
}

Result one_process(const Args& a) {
  te::nn::TransformerLayer layer(layer_options(a, std::nullopt));
  const at::Tensor x = at::randn({1, a.tokens, a.hidden}).requires_grad_();
  return step(a, layer, [&] { return layer->forward(x).sum(); });
}

Result context_parallel(const Args& a, int64_t cp, te::nn::CpCommType type, bool balanced) {
  std::vector<Result> per_rank(static_cast<std::size_t>(cp));
  // (a2a+p2p: a ring of 2 over a2a groups of cp / 2)
  const bool hierarchical = type == te::nn::CpCommType::kA2AP2P;
  te::run_local_ranks(static_cast<int>(cp), [&](int rank) {
    te::DeviceMesh mesh = hierarchical ? te::DeviceMesh({2, cp / 2}, {"ring", "a2a"})
                                       : te::DeviceMesh({cp}, {"cp"});
    te::MeshScope scope(mesh);
    te::AxisRulesScope rules(te::parse_axis_rules(
        hierarchical ? "seqlen=(ring,a2a),seqlen_cp=(ring,a2a)" : "seqlen=cp,seqlen_cp=cp"));
    te::nn::TransformerLayer layer(layer_options(a, type, balanced));
    // (random tokens: their order, contiguous or load balanced, does not change the work)
    const te::DTensor x = te::DTensor::distribute(
        at::randn({1, a.tokens, a.hidden}), mesh,
        std::vector<te::Placement>(hierarchical ? 2 : 1, te::Shard{1}));
    x.to_local().requires_grad_();
    per_rank[static_cast<std::size_t>(rank)] =
        step(a, layer, [&] { return layer->forward(x).to_local().sum(); });
  });
  Result worst;
  for (const Result& r : per_rank) {
    worst.peak = std::max(worst.peak, r.peak);
    worst.ms = std::max(worst.ms, r.ms);
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app(
      "Context parallelism: peak bytes per rank and step time of one TransformerLayer "
      "forward + backward on a long causal sequence, per cp size and cp_comm_type");
  app.add_option("--tokens", a.tokens, "sequence length (a multiple of 2 x 4)");
  app.add_option("--hidden", a.hidden, "hidden size");
  app.add_option("--heads", a.heads, "attention heads (a2a needs a multiple of cp)");
  app.add_option("--ffn", a.ffn, "MLP hidden size");
  app.add_option("--reps", a.reps, "timed steps after one warm-up (the median is reported)");
  app.add_option("--attention-dropout", a.attention_dropout,
                 "attention dropout in training (p2p and all_gather then run the unfused "
                 "blocks, whose probabilities backward keeps; one process the unfused path)");
  CLI11_PARSE(app, argc, argv);
  at::manual_seed(0);
  const Result base = one_process(a);
  std::printf(
      "| layout | cp_comm_type | peak MiB per rank | vs one process | step ms | vs all_gather |\n");
  std::printf("|---|---|---:|---:|---:|---:|\n");
  std::printf("| one process | - | %.1f | 1.00 | %.0f | - |\n", base.peak / 1048576.0, base.ms);
  for (int64_t cp : {2, 4}) {
    const Result gathered = context_parallel(a, cp, te::nn::CpCommType::kAllGather, false);
    std::vector<std::pair<std::string, Result>> rows = {
        {"all_gather", gathered},
        {"p2p", context_parallel(a, cp, te::nn::CpCommType::kP2P, false)},
        {"p2p, load balanced", context_parallel(a, cp, te::nn::CpCommType::kP2P, true)},
        {"a2a", context_parallel(a, cp, te::nn::CpCommType::kA2A, false)}};
    if (cp == 4) {
      rows.push_back({"a2a+p2p (ring 2 x a2a 2), load balanced",
                      context_parallel(a, cp, te::nn::CpCommType::kA2AP2P, true)});
    }
    for (const auto& [name, r] : rows) {
      std::printf("| CP%lld | %s | %.1f | %.2f | %.0f | %.2f |\n", static_cast<long long>(cp),
                  name.c_str(), r.peak / 1048576.0, static_cast<double>(r.peak) / base.peak, r.ms,
                  r.ms / gathered.ms);
    }
  }
  return 0;
}
