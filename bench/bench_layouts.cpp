// One TransformerLayer training step (forward + backward + gradient reduction) per layout, on
// thread ranks (default) or on processes (under te-run), against:
//   - the one-process step on the whole batch: scaling efficiency t1 / (N * tN), and t1 / tN
//     (the N ranks share this machine's cores, so t1 / tN is the figure that can reach 1);
//   - the analytic minimum of bytes the layout must move (logical payloads as CommTrace counts
//     them: an all-gather its gathered tensor, an all-reduce its tensor, a reduce-scatter its
//     full input), from rank 0's CommTrace of one step;
//   - for DP2, plain LibTorch + c10d: the same math in plain ops on the local half batch, local
//     backward, then one c10d all-reduce per bucket of flattened gradients (the same bytes),
//     alternated step by step with te's.
//
//   bench_layouts [--layouts dp2,fsdp2,tp2,tp2sp,dp2tp2] [--steps 7] [--tokens 2048 ...]
//   te-run --nproc 2 -- bench_layouts --layouts dp2,fsdp2,tp2,tp2sp
//   te-run --nproc 4 -- bench_layouts --layouts dp2tp2
//
// Prints one Markdown table row per layout (rank 0), after a header line.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "plain_layer.h"
#include "te/distributed.h"
#include "te/distributed/backend.h"
#include "te/nn.h"
#include "te/runtime.h"
#include "te/sharding.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  int64_t tokens = 2048, hidden = 256, ffn = 1024, heads = 4, seq = 128;
  int steps = 7, warmup = 2;
  std::vector<std::string> layouts = {"dp2", "fsdp2", "tp2", "tp2sp", "dp2tp2"};
};

struct Layout {
  std::string name, label;
  std::vector<int64_t> mesh_shape;
  std::vector<std::string> mesh_names;
  te::MeshResource resource;
  bool sequence_parallel = false;
  int size() const {
    int n = 1;
    for (int64_t s : mesh_shape) n *= static_cast<int>(s);
    return n;
  }
};

Layout layout_of(const std::string& name) {
  auto roles = [](const char* text) { return te::parse_mesh_resource(text); };
  const std::vector<Layout> known = {
      {"dp2", "DP2", {2}, {"data"}, roles("dp=data"), false},
      {"fsdp2", "FSDP2", {2}, {"data"}, roles("fsdp=data"), false},
      {"tp2", "TP2", {2}, {"model"}, roles("tp=model"), false},
      {"tp2sp", "TP2+SP", {2}, {"model"}, roles("tpsp=model"), true},
      {"dp2tp2", "DP2×TP2", {2, 2}, {"data", "model"}, roles("dp=data,tp=model"), false},
  };
  for (const Layout& l : known) {
    if (l.name == name) return l;
  }
  throw std::runtime_error("bench_layouts: unknown layout '" + name +
                           "'; choose from dp2, fsdp2, tp2, tp2sp, dp2tp2");
}

// The bytes a layout must move in one step, fp32 (see the header comment for how each
// collective counts). act: one activation [tokens, hidden]; kernels: the four GEMM kernels;
// norms: the two norms' scales and biases.
int64_t analytic_bytes(const Layout& l, const Args& a) {
  const int64_t e = 4;
  const int64_t act = a.tokens * a.hidden * e;
  const int64_t kernels = (4 * a.hidden * a.hidden + 2 * a.hidden * a.ffn) * e;
  const int64_t norms = 4 * a.hidden * e;
  if (l.name == "dp2") return kernels + norms;  // all-reduce every gradient
  // FSDP keeps only its shard between forward and backward (the memory it exists to save; ZeRO-3,
  // PyTorch FSDP's reshard_after_forward): each kernel is gathered forward and again backward,
  // its gradient reduce-scattered; the norms' gradients all-reduced.
  if (l.name == "fsdp2") return 3 * kernels + norms;
  // Megatron: an all-reduce after attention and after the MLP forward, and of each block's
  // input gradient backward; replicated norms need nothing.
  if (l.name == "tp2") return 4 * act;
  // The all-reduces become an all-gather before each block and a reduce-scatter after it, and
  // their reverses backward; the norms see a sequence shard: their gradients all-reduced.
  if (l.name == "tp2sp") return 8 * act + norms;
  // TP2 on each half batch, then DP over each rank's half of the kernels and the norms.
  return 4 * act / 2 + kernels / 2 + norms;
}

te::nn::TransformerLayerOptions layer_options(const Args& a, bool sequence_parallel) {
  return [&] {
    auto made = te::nn::TransformerLayerOptions(a.hidden, a.ffn, a.heads)
                    .hidden_dropout(0.0)
                    .intermediate_dropout(0.0)
                    .mlp_activations({"gelu"});
    made.self_attention().enable_sequence_parallel(sequence_parallel);
    made.self_attention().attention().attention_dropout(0.0);
    return made;
  }();
}

at::Tensor global_input(const Args& a) {
  at::manual_seed(1);
  return at::randn({a.tokens / a.seq, a.seq, a.hidden});
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The whole batch on one process.
double one_process_step(const Args& a) {
  te::nn::manual_seed(0);
  te::nn::TransformerLayer layer(layer_options(a, false));
  const at::Tensor x = global_input(a);
  std::vector<double> t;
  for (int i = 0; i < a.warmup + a.steps; ++i) {
    const auto start = Clock::now();
    layer->zero_grad();
    layer->forward(x).sum().backward();
    if (i >= a.warmup) t.push_back(seconds_since(start));
  }
  return median(t);
}

struct RankResult {
  double te_seconds = 0, plain_seconds = 0;
  int64_t bytes = 0;
  std::string breakdown;
};

// Plain LibTorch + c10d data parallel: the same math, a Gloo group of its own over the world's
// store, one all-reduce per bucket of flattened gradients.
class PlainDataParallel {
 public:
  PlainDataParallel(const te::bench::Params& params, int rank, int size) : params_(params) {
    auto opts = c10d::ProcessGroupGloo::Options::create();
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(
        c10::make_intrusive<c10d::PrefixStore>("bench-plain-dp", te::comm::world_store()), rank,
        size, opts);
  }

  void step(const at::Tensor& local_x, int64_t heads, int64_t bucket_bytes) {
    for (auto& [name, p] : params_) p.mutable_grad().reset();
    te::bench::plain_layer(local_x, params_, heads).sum().backward();
    std::vector<at::Tensor> bucket;
    int64_t bytes = 0;
    auto flush = [&] {
      if (bucket.empty()) return;
      std::vector<at::Tensor> flat;
      for (const at::Tensor& p : bucket) flat.push_back(p.grad().reshape({-1}));
      std::vector<at::Tensor> buffer = {at::cat(flat)};
      pg_->allreduce(buffer)->wait();
      int64_t offset = 0;
      for (const at::Tensor& p : bucket) {
        p.mutable_grad().copy_(buffer[0].narrow(0, offset, p.numel()).view_as(p));
        offset += p.numel();
      }
      bucket.clear();
      bytes = 0;
    };
    for (auto& [name, p] : params_) {
      bucket.push_back(p);
      bytes += p.numel() * p.element_size();
      if (bytes >= bucket_bytes) flush();
    }
    flush();
  }

 private:
  te::bench::Params params_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
};

RankResult run_rank(const Layout& l, const Args& a) {
  const te::DeviceMesh mesh(l.mesh_shape, l.mesh_names);
  te::MeshScope mesh_scope(mesh);
  te::MeshResourceScope resource_scope(l.resource);
  te::nn::manual_seed(0);
  te::nn::TransformerLayer layer(layer_options(a, l.sequence_parallel));
  const at::Tensor x = global_input(a);
  const te::DTensor dx =
      te::DTensor::from_local(x, mesh, std::vector<te::Placement>(mesh.ndim(), te::Replicate{}));
  auto te_step = [&] {
    const auto start = Clock::now();
    layer->zero_grad();
    te::GradientBuckets buckets;
    layer->forward(dx).to_local().sum().backward();
    buckets.finish();
    return seconds_since(start);
  };
  RankResult r;
  {
    te::CommTrace trace;
    te_step();
    for (const te::CommRecord& c : trace.records()) r.bytes += c.bytes;
    std::map<std::string, std::pair<int, int64_t>> by_kind;
    for (const te::CommRecord& c : trace.records()) {
      auto& k = by_kind[te::to_string(c.kind) + "@" + c.mesh_axis];
      ++k.first;
      k.second += c.bytes;
    }
    std::ostringstream os;
    for (const auto& [kind, v] : by_kind) {
      os << (os.tellp() > 0 ? ", " : "") << v.first << "× " << kind << " " << v.second / 1024
         << " KiB";
    }
    r.breakdown = os.str();
  }
  std::optional<PlainDataParallel> plain;
  at::Tensor local_x;
  const bool compare_plain = l.name == "dp2";
  if (compare_plain) {
    te::nn::manual_seed(0);
    te::nn::TransformerLayer reference(layer_options(a, false));
    const te::bench::Params params = te::bench::copy_parameters(*reference);
    const int64_t half = x.size(0) / 2;
    local_x = x.narrow(0, mesh.rank() * half, half);
    plain.emplace(params, static_cast<int>(mesh.rank()), 2);
  }
  std::vector<double> te_t, plain_t;
  for (int i = 0; i < a.warmup + a.steps; ++i) {
    const bool keep = i >= a.warmup;
    auto run_plain = [&] {
      if (!plain) return;
      const auto start = Clock::now();
      plain->step(local_x, a.heads, 25 * 1024 * 1024);
      if (keep) plain_t.push_back(seconds_since(start));
    };
    if (i % 2 == 1) run_plain();
    const double t = te_step();
    if (keep) te_t.push_back(t);
    if (i % 2 == 0) run_plain();
  }
  r.te_seconds = median(te_t);
  if (!plain_t.empty()) r.plain_seconds = median(plain_t);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  std::string layouts;
  CLI::App app{
      "One TransformerLayer training step per layout: time against the one-process step, bytes "
      "moved against the layout's analytic minimum, and DP2 against plain LibTorch + c10d. Runs "
      "thread ranks, or processes under te-run (the layouts of the world's size)."};
  app.add_option("--layouts", layouts, "comma-separated: dp2, fsdp2, tp2, tp2sp, dp2tp2");
  app.add_option("--steps", a.steps, "timed steps (median)")->check(CLI::PositiveNumber);
  app.add_option("--warmup", a.warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--tokens", a.tokens, "batch x 128 tokens")->check(CLI::PositiveNumber);
  app.add_option("--hidden", a.hidden)->check(CLI::PositiveNumber);
  app.add_option("--ffn", a.ffn)->check(CLI::PositiveNumber);
  app.add_option("--heads", a.heads)->check(CLI::PositiveNumber);
  bool info = false;
  app.add_flag("--build-info", info,
               "print te-cpp's build facts (versions, threads, BLAS) and exit");
  CLI11_PARSE(app, argc, argv);
  if (info) {
    te::configure_threads();
    std::cout << te::build_info();
    return 0;
  }
  if (!layouts.empty()) {
    a.layouts.clear();
    std::stringstream ss(layouts);
    for (std::string item; std::getline(ss, item, ',');) a.layouts.push_back(item);
  }
  te::configure_threads();
  const bool processes = std::getenv("WORLD_SIZE") != nullptr;
  std::vector<Layout> chosen;
  try {
    for (const std::string& name : a.layouts) chosen.push_back(layout_of(name));
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }

  double t1 = 0;
  int rank = 0;
  if (processes) {
    te::init_distributed();
    rank = te::world_rank();
    const te::DeviceMesh all({te::world_size()}, {"all"});
    if (rank == 0) {  // on the whole machine, as one process would run; the others wait below
      const int mine = at::get_num_threads();
      at::set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
      t1 = one_process_step(a);
      at::set_num_threads(mine);
    }
    all.all_reduce(at::zeros({1}), te::ReduceOp::kSum, {0});
  } else {
    t1 = one_process_step(a);
  }
  if (rank == 0) {
    std::printf(
        "| layout | ranks | mode | one process ms | step ms | t1/(N·tN) | t1/tN | "
        "bytes moved | analytic minimum | ratio | plain c10d ms | te/plain | "
        "collectives (rank 0) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  }
  for (const Layout& l : chosen) {
    RankResult r0;
    if (processes) {
      if (l.size() != te::world_size()) continue;
      r0 = run_rank(l, a);
    } else {
      std::vector<RankResult> results(static_cast<std::size_t>(l.size()));
      te::run_local_ranks(l.size(),
                          [&](int r) { results[static_cast<std::size_t>(r)] = run_rank(l, a); });
      r0 = results[0];
    }
    if (rank != 0) continue;
    const int64_t minimum = analytic_bytes(l, a);
    const double n = l.size();
    char plain[64] = "", vs[64] = "";
    if (r0.plain_seconds > 0) {
      std::snprintf(plain, sizeof plain, "%.1f", r0.plain_seconds * 1e3);
      std::snprintf(vs, sizeof vs, "%.2f", r0.te_seconds / r0.plain_seconds);
    }
    std::printf(
        "| %s | %d | %s | %.1f | %.1f | %.2f | %.2f | %lld | %lld | %.2f | %s | %s | %s |\n",
        l.label.c_str(), l.size(), processes ? "processes" : "threads", t1 * 1e3,
        r0.te_seconds * 1e3, t1 / (n * r0.te_seconds), t1 / r0.te_seconds,
        static_cast<long long>(r0.bytes), static_cast<long long>(minimum),
        static_cast<double>(r0.bytes) / static_cast<double>(minimum), plain, vs,
        r0.breakdown.c_str());
    std::fflush(stdout);
  }
  if (processes) te::shutdown_distributed();
  return 0;
}
