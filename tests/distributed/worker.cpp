// A rank program for the process tests, started by te-run (or directly with RANK etc. set).
//   te_dist_worker check   every transition on a {world} mesh (and {2, world/2}), against
//                          one-process math, values and gradients
//   te_dist_worker launch  prints how the rank joined (te::launch_description()), then `check`
//   te_dist_worker die     rank 1 kills itself (SIGKILL) while the others enter an all-reduce
//   te_dist_worker exit N  rank 1 exits with status N, the others wait in a collective
//   te_dist_worker fp8     data-parallel FP8 training steps of a LayerNormMLP against the same
//                          steps on this process alone; prints the final FP8 scales
//   te_dist_worker ckpt_kill DIR   saves a TransformerLayer to DIR (2 ranks), changes it, saves
//                          again, and rank 1 kills itself (SIGKILL) once its file of that second
//                          save is written; prints the first checkpoint's parameter sum
//   te_dist_worker ckpt_save4 DIR  trains a TransformerLayer 2 steps on DP2xTP2 (4 ranks), saves it
//                          and prints the fingerprint of its whole weights
//   te_dist_worker ckpt_sum DIR    loads DIR into the same layer on this process's world and prints
//                          the fingerprint of its weights (gathered when sharded)
//   te_dist_worker nccl_id each rank takes the NCCL unique id rank 0 made through the world's TCP
//                          store; the ranks all-gather what they got and rank 0 compares
//   te_dist_worker early_exit  every rank but the last returns at once; the last waits 1.5 s,
//                          then uses the world's store (hosted by rank 0) for a second
//   te_dist_worker layer   a TransformerLayer in training (dropout 0.1-0.3) on a DP2xTP2 mesh of
//                          4 processes: output and every gradient against the same layer run on
//                          this process alone
//   te_dist_worker ckpt_write DIR SEED  saves a TransformerLayer made with SEED on a TP mesh of
//                          every rank (each rank writes a file) and prints its fingerprint
//   te_dist_worker fault forward|backward|mesh|skip   faults for the survivors to name (2 ranks):
//                          rank 1 is killed (SIGKILL) inside a TP2 model's forward, or inside its
//                          backward; the ranks build different meshes; rank 1 skips a
//                          constraint that gathers the batch (run with TE_CHECK_COLLECTIVES=1)

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/optim/adamw.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "../../te/src/distributed/nccl_seams.h"
#include "dist_test_util.h"
#include "te/distributed.h"
#include "te/distributed/backend.h"
#include "te/fp8.h"
#include "te/nn.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

namespace {

namespace fp8 = te::fp8;

int check() {
  const int rank = te::world_rank();
  const int world = te::world_size();
  te::DeviceMesh flat({world}, {"x"});
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{8, 4}, {5, 3}, {3, 2}}) {
    const at::Tensor global = te::test::seeded_integers(shape, 7);
    const at::Tensor grad = te::test::seeded_integers(shape, 8);
    for (const te::Placement& src : {te::Placement{te::Shard{0}}, te::Placement{te::Shard{1}},
                                     te::Placement{te::Replicate{}}}) {
      for (const te::Placement& dst : {te::Placement{te::Shard{0}}, te::Placement{te::Shard{1}},
                                       te::Placement{te::Replicate{}}}) {
        at::Tensor local =
            te::test::piece_of(global, flat, {src}, rank).clone().requires_grad_(true);
        te::DTensor x = te::DTensor::from_local(local, flat, {src}, shape);
        te::DTensor y = x.redistribute({dst});
        TE_CHECK(at::equal(y.to_local(), te::test::piece_of(global, flat, {dst}, rank)),
                 "value mismatch ", te::to_string(src), " -> ", te::to_string(dst));
        torch::autograd::backward({y.to_local()}, {te::test::piece_of(grad, flat, {dst}, rank)});
        TE_CHECK(at::equal(local.grad(), te::test::piece_of(grad, flat, {src}, rank)),
                 "gradient mismatch ", te::to_string(src), " -> ", te::to_string(dst));
      }
    }
    // Partial sum -> Shard / Replicate.
    at::Tensor part = global * (rank == 0 ? static_cast<double>(world) : 0.0) -
                      global * (rank == 0 ? static_cast<double>(world - 1) : -1.0);
    te::DTensor p = te::DTensor::from_local(part, flat, {te::Partial{}});
    TE_CHECK(at::equal(p.full_tensor(), global * world), "partial sum mismatch");
  }
  if (world % 2 == 0 && world > 2) {
    te::DeviceMesh grid({2, world / 2}, {"data", "model"});
    const at::Tensor global = te::test::seeded_integers({6, 4}, 9);
    te::DTensor x = te::DTensor::distribute(global, grid, {te::Shard{0}, te::Shard{1}});
    TE_CHECK(at::equal(x.redistribute({te::Shard{1}, te::Shard{0}}).full_tensor(), global),
             "2-D mesh round trip mismatch");
  }
  std::cout << "rank " << rank << " of " << world << " ok" << std::endl;
  return 0;
}

int die_or_exit(bool die, int status) {
  const int rank = te::world_rank();
  te::DeviceMesh mesh({te::world_size()}, {"x"});
  at::Tensor one = at::ones({1024});
  // Everybody is connected and has run one collective before the failure.
  te::DTensor::from_local(one, mesh, {te::Partial{}}).full_tensor();
  if (rank == 1) {
    std::cout << "rank 1 leaving" << std::endl;
    if (die) std::raise(SIGKILL);
    std::exit(status);
  }
  try {
    te::DTensor::from_local(one, mesh, {te::Partial{}}).full_tensor();
  } catch (const te::Error& e) {
    std::cout << "rank " << rank << " error: " << e.what() << std::endl;
    return 3;
  }
  std::cout << "rank " << rank << " finished without noticing" << std::endl;
  return 0;
}

// Three SGD steps under DelayedScaling, data parallel over every rank, checked against the same
// steps on this process alone; the scales are printed so the caller can compare ranks.
int fp8_steps() {
  const int rank = te::world_rank();
  const int world = te::world_size();
  const std::vector<int64_t> shape = {2 * world, 4, 32};
  fp8::DelayedScaling recipe;
  recipe.amax_history_len = 4;
  auto make = [] {
    te::nn::manual_seed(5);
    return te::nn::LayerNormMLP(
        te::nn::LayerNormMLPOptions(32, 64).activations({"gelu"}).intermediate_dropout_rate(0));
  };
  auto sgd = [](torch::nn::Module& m) {
    at::NoGradGuard no_grad;
    for (auto& p : m.parameters()) {
      p.sub_(p.grad() * 0.05);
      p.mutable_grad() = at::Tensor();
    }
  };
  auto x_at = [&](int step) {
    return te::test::seeded_integers(shape, 70 + step).to(at::kFloat) / 7.0;
  };
  auto w_at = [&](int step) {
    return te::test::seeded_integers(shape, 80 + step).to(at::kFloat) / 50.0;
  };
  // This process alone (no mesh in scope), whole batches.
  te::nn::LayerNormMLP alone = make();
  std::vector<at::Tensor> want;
  for (int step = 0; step < 3; ++step) {
    {
      te::Fp8Autocast fp8(true, recipe);
      const at::Tensor y = alone(x_at(step));
      (y * w_at(step)).sum().backward();
      want.push_back(y.detach());
    }
    sgd(*alone);
  }
  // Every rank, a slice of each batch.
  te::DeviceMesh mesh({world}, {"data"});
  te::MeshScope on_mesh(mesh);
  const te::MeshResource resource = te::parse_mesh_resource("dp=data");
  te::nn::LayerNormMLP ranked = make();
  const std::vector<te::Placement> batch = {te::Shard{0}};
  for (int step = 0; step < 3; ++step) {
    {
      te::Fp8Autocast fp8(true, recipe, resource);
      te::DTensor y = ranked(te::DTensor::from_local(
          te::test::piece_of(x_at(step), mesh, batch, rank), mesh, batch, shape));
      const at::Tensor y_full = y.full_tensor();
      TE_CHECK(at::allclose(y_full, want[step], 1e-5, 1e-5), "FP8 step ", step,
               " output differs by ", (y_full - want[step]).abs().max().item<double>());
      (y_full * w_at(step)).sum().backward();
    }
    sgd(*ranked);
  }
  std::ostringstream scales;
  scales << std::hexfloat;  // exact, so equal text means equal bits
  for (const auto& b : ranked->named_buffers()) {
    const at::Tensor mine = b.value(), one = alone->named_buffers()[b.key()];
    TE_CHECK(at::allclose(mine, one, 1e-5, 0), "FP8 buffer ", b.key(), " differs from one process");
    if (b.key().find("_scale") != std::string::npos && b.key().find("inv") == std::string::npos) {
      scales << ' ' << b.key() << '=';
      for (int64_t i = 0; i < mine.numel(); ++i) scales << (i ? "," : "") << mine[i].item<float>();
    }
  }
  std::cout << "rank " << rank << " fp8 ok scales" << scales.str() << std::endl;
  return 0;
}

}  // namespace

// The module equivalence matrix's DP2xTP2 TransformerLayer case, with dropout, across processes.
int layer_step() {
  const int rank = te::world_rank();
  TE_CHECK(te::world_size() == 4, "layer mode runs on 4 ranks");
  const auto options = [&] {
    auto made = te::nn::TransformerLayerOptions(16, 32, 4)
                    .mlp_activations({"gelu", "linear"})
                    .hidden_dropout(0.1)
                    .intermediate_dropout(0.2);
    made.self_attention().attention().attn_mask_type("padding").attention_dropout(0.3);
    return made;
  }();
  const at::Tensor x_global = te::test::seeded_integers({4, 6, 16}, 31).to(at::kFloat) / 7.0;
  const at::Tensor dy = te::test::seeded_integers({4, 6, 16}, 32).to(at::kFloat) / 5.0;
  const at::Tensor len = at::tensor(std::vector<int64_t>{6, 4, 5, 3}).view({-1, 1, 1, 1});
  const at::Tensor mask = at::arange(6).view({1, 1, 1, 6}).ge(len).expand({4, 1, 6, 6});
  // One process (this one, alone).
  te::nn::manual_seed(5);
  te::nn::TransformerLayer single(options);
  at::Tensor xr = x_global.clone().requires_grad_(true);
  at::Tensor yr = single(xr, mask);
  yr.backward(dy);
  // The mesh.
  te::DeviceMesh mesh({2, 2}, {"data", "model"});
  te::MeshScope on_mesh(mesh);
  te::MeshResourceScope resource(te::parse_mesh_resource("dp=data,tp=model"));
  te::nn::manual_seed(5);
  te::nn::TransformerLayer layer(options);
  const auto in =
      te::placements_for(*te::resolve_logical_axes({"batch", "seqlen", "hidden"}), mesh);
  at::Tensor x_local = te::test::piece_of(x_global, mesh, in, rank).clone().requires_grad_(true);
  const te::DTensor y =
      layer(te::DTensor::from_local(x_local, mesh, in, std::vector<int64_t>{4, 6, 16}), mask);
  const at::Tensor y_full = y.full_tensor();
  TE_CHECK(at::allclose(y_full, yr, 1e-5, 1e-5), "rank ", rank, ": output differs by ",
           (y_full - yr).abs().max().item<double>());
  {
    te::GradientBuckets buckets;
    y_full.backward(dy);
    buckets.finish();
  }
  TE_CHECK(at::allclose(x_local.grad(), te::test::piece_of(xr.grad(), mesh, in, rank), 1e-5, 1e-5),
           "rank ", rank, ": input gradient differs");
  const auto layouts = te::nn::named_parameter_layouts(*layer);
  auto reference = single->named_parameters();
  int checked = 0;
  for (const auto& p : layer->named_parameters()) {
    const auto& pl = layouts.at(p.key());
    const at::Tensor want =
        pl.mesh ? te::test::piece_of(reference[p.key()].grad(), mesh, pl.placements, rank)
                : reference[p.key()].grad();
    TE_CHECK(p.value().grad().defined() && at::allclose(p.value().grad(), want, 1e-5, 1e-5),
             "rank ", rank, ": gradient of ", p.key(), " differs");
    ++checked;
  }
  std::cout << "rank " << rank << " layer ok (" << checked << " gradients)" << std::endl;
  return 0;
}

// A fingerprint of every parameter and buffer, bit for bit: FNV-1a over names and bytes.
std::string fingerprint(torch::nn::Module& m) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  };
  std::map<std::string, at::Tensor> all;
  for (const auto& p : m.named_parameters()) all[p.key()] = p.value();
  for (const auto& b : m.named_buffers()) all[b.key()] = b.value();
  for (const auto& [name, t] : all) {
    const at::Tensor c = t.detach().contiguous();
    mix(name.data(), name.size());
    mix(c.data_ptr(), static_cast<std::size_t>(c.numel()) * c.element_size());
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

te::nn::TransformerLayerOptions checkpoint_layer() {
  return te::nn::TransformerLayerOptions(64, 256, 4);
}

int checkpoint_kill(const std::string& dir) {
  const int rank = te::world_rank();
  te::DeviceMesh mesh({te::world_size()}, {"data"});
  te::MeshScope on_mesh(mesh);
  te::MeshResourceScope roles(te::parse_mesh_resource("dp=data"));
  te::nn::manual_seed(1);
  te::nn::TransformerLayer layer(checkpoint_layer());
  te::nn::save_checkpoint(*layer, dir);
  if (rank == 0) std::cout << "first checkpoint sum " << fingerprint(*layer) << std::endl;
  {
    torch::NoGradGuard no_grad;
    for (auto& p : layer->parameters()) p.add_(1.0);
  }
  std::thread killer;
  if (rank == 1) {
    // Dies in the middle of the save: its own file is written, the others' may not be, the
    // index and the rename are not done.
    const std::string mine = dir + ".saving/model-00002-of-00002.safetensors";
    killer = std::thread([mine] {
      while (!std::ifstream(mine).good())
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      std::raise(SIGKILL);
    });
  }
  te::nn::save_checkpoint(*layer, dir);
  if (killer.joinable()) killer.join();
  std::cout << "rank " << rank << " second save returned" << std::endl;
  return 0;
}

// DP2xTP2 on 4 processes: two AdamW steps, save, then the whole weights' fingerprint.
int checkpoint_save4(const std::string& dir) {
  const int rank = te::world_rank();
  TE_CHECK(te::world_size() == 4, "ckpt_save4 runs on 4 ranks");
  te::DeviceMesh mesh({2, 2}, {"data", "model"});
  te::MeshScope on_mesh(mesh);
  te::MeshResourceScope roles(te::parse_mesh_resource("dp=data,tp=model"));
  te::nn::manual_seed(2);
  te::nn::TransformerLayer layer(checkpoint_layer());
  torch::optim::AdamW opt(layer->parameters(), torch::optim::AdamWOptions(1e-2));
  const at::Tensor x = te::test::seeded_integers({4, 6, 64}, 3).to(at::kFloat) / 9.0;
  for (int step = 0; step < 2; ++step) {
    opt.zero_grad();
    te::GradientBuckets buckets;
    layer(te::DTensor::distribute(x, mesh, {te::Shard{0}, te::Replicate{}}))
        .full_tensor()
        .pow(2)
        .mean()
        .backward();
    buckets.finish();
    opt.step();
  }
  te::nn::save_checkpoint(*layer, dir);
  te::nn::gather_module(*layer);
  if (rank == 0) std::cout << "saved checkpoint sum " << fingerprint(*layer) << std::endl;
  return 0;
}

int checkpoint_sum(const std::string& dir) {
  std::optional<te::DeviceMesh> mesh;
  std::optional<te::MeshScope> on_mesh;
  std::optional<te::MeshResourceScope> roles;
  if (te::world_size() > 1) {
    mesh.emplace(std::vector<int64_t>{te::world_size()}, std::vector<std::string>{"x"});
    on_mesh.emplace(*mesh);
    roles.emplace(te::parse_mesh_resource(
        std::getenv("TE_CKPT_ROLES") ? std::getenv("TE_CKPT_ROLES") : "tp=x"));
  }
  te::nn::manual_seed(77);
  te::nn::TransformerLayer layer(checkpoint_layer());
  te::nn::load_checkpoint(*layer, dir);
  if (mesh) te::nn::gather_module(*layer);
  if (te::world_rank() == 0) {
    std::cout << "loaded checkpoint sum " << fingerprint(*layer) << std::endl;
  }
  return 0;
}

int checkpoint_write(const std::string& dir, int seed) {
  te::DeviceMesh mesh({te::world_size()}, {"x"});
  te::MeshScope on_mesh(mesh);
  te::MeshResourceScope roles(te::parse_mesh_resource("tp=x"));
  te::nn::manual_seed(static_cast<uint64_t>(seed));
  te::nn::TransformerLayer layer(checkpoint_layer());
  te::nn::save_checkpoint(*layer, dir);
  te::nn::gather_module(*layer);
  if (te::world_rank() == 0)
    std::cout << "saved checkpoint sum " << fingerprint(*layer) << std::endl;
  return 0;
}

// Faults inside real work, for the survivors to name. Each prints "reached" lines so the test
// can tell the fault happened where it should.
int fault(const std::string& kind) {
  const int rank = te::world_rank();
  TE_CHECK(te::world_size() == 2, "fault mode runs on 2 ranks");
  if (kind == "mesh") {
    // Rank 1 names its axis differently: its rows would never meet rank 0's.
    te::DeviceMesh mesh({2}, {rank == 0 ? "data" : "model"});
    std::cout << "rank " << rank << " built its mesh" << std::endl;
    return 0;
  }
  const at::Tensor x_global = te::test::seeded_integers({4, 6, 16}, 41).to(at::kFloat) / 7.0;
  if (kind == "skip") {
    // Data parallel: the batch is sharded; rank 0 gathers the output for its loss through a
    // constraint, rank 1 skips that line and goes on to the gradient all-reduce.
    te::DeviceMesh mesh({2}, {"data"});
    te::MeshScope on_mesh(mesh);
    te::MeshResourceScope roles(te::parse_mesh_resource("dp=data"));
    te::nn::manual_seed(3);
    te::nn::TransformerLayer layer(te::nn::TransformerLayerOptions(16, 32, 4));
    te::DTensor y = layer(te::DTensor::distribute(x_global, mesh, {te::Shard{0}}));
    if (rank == 0) y = te::with_sharding_constraint(y, {std::nullopt, "seqlen", "hidden"});
    te::GradientBuckets buckets;
    y.to_local().pow(2).mean().backward();
    buckets.finish();
    std::cout << "rank " << rank << " finished the step" << std::endl;
    return 0;
  }
  TE_CHECK(kind == "forward" || kind == "backward", "unknown fault ", kind);
  // Two TransformerLayers, tensor parallel over both ranks: every layer all-reduces forward and
  // backward, so the survivor is inside a collective when its peer dies.
  te::DeviceMesh mesh({2}, {"model"});
  te::MeshScope on_mesh(mesh);
  te::MeshResourceScope roles(te::parse_mesh_resource("tp=model"));
  te::nn::manual_seed(4);
  te::nn::TransformerLayer first(te::nn::TransformerLayerOptions(16, 32, 4));
  te::nn::TransformerLayer second(te::nn::TransformerLayerOptions(16, 32, 4));
  const te::DTensor x = te::DTensor::distribute(x_global, mesh, {te::Replicate{}});
  const te::DTensor h = first(x);
  std::cout << "rank " << rank << " ran the first layer" << std::endl;
  if (kind == "forward" && rank == 1) std::raise(SIGKILL);
  if (kind == "backward" && rank == 1) {
    // Fires once the second layer's backward has run: the first layer's is next.
    h.to_local().register_hook([](const at::Tensor& g) {
      std::cout << "rank 1 dies in backward" << std::endl;
      std::raise(SIGKILL);
      return g;
    });
  }
  const te::DTensor y = second(h);
  std::cout << "rank " << rank << " ran the second layer" << std::endl;
  y.to_local().pow(2).mean().backward();
  std::cout << "rank " << rank << " finished the step" << std::endl;
  return 0;
}

int nccl_id() {
  if (te::comm::nccl_built()) {
    const int rank = te::world_rank();
    auto store = c10::make_intrusive<c10d::PrefixStore>("nccl-id-test", te::comm::world_store());
    const std::vector<uint8_t> id =
        te::comm::nccl_share_unique_id(*store, rank, std::chrono::seconds(30));
    at::Tensor mine = at::empty({static_cast<int64_t>(id.size())}, at::kByte);
    std::memcpy(mine.data_ptr(), id.data(), id.size());
    te::DeviceMesh mesh({te::world_size()}, {"x"});
    const at::Tensor all =
        te::DTensor::from_local(mine.unsqueeze(0), mesh, {te::Shard{0}}).full_tensor();
    for (int r = 0; r < te::world_size(); ++r) {
      TE_CHECK(at::equal(all[r], all[0]), "rank ", r, " got another NCCL id than rank 0");
    }
    std::cout << "rank " << rank << " nccl id shared by " << te::world_size() << " ranks"
              << std::endl;
  } else {
    std::cout << "rank " << te::world_rank() << " nccl not built" << std::endl;
  }
  return 0;
}

// Ranks that finish early must not cut off one still using rank 0's store.
int early_exit() {
  const int rank = te::world_rank();
  if (rank + 1 < te::world_size()) return 0;
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const auto store = te::comm::world_store();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  int64_t calls = 0;
  while (std::chrono::steady_clock::now() < until) {
    store->set("early-exit/probe", std::vector<uint8_t>{1});
    store->get("early-exit/probe");
    ++calls;
  }
  std::cout << "rank " << rank << " used the store "
            << (calls > 0 ? "after its peers finished" : "") << std::endl;
  return 0;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "check";
  try {
    te::init_distributed();
    if (mode == "check") return check();
    if (mode == "launch") {
      std::cout << "rank " << te::world_rank() << " joined: " << te::launch_description()
                << std::endl;
      return check();
    }
    if (mode == "die") return die_or_exit(true, 0);
    if (mode == "exit") return die_or_exit(false, argc > 2 ? std::atoi(argv[2]) : 1);
    if (mode == "fp8") return fp8_steps();
    if (mode == "layer") return layer_step();
    if (mode == "nccl_id") return nccl_id();
    if (mode == "early_exit") return early_exit();
    if (mode == "ckpt_kill" && argc > 2) return checkpoint_kill(argv[2]);
    if (mode == "ckpt_sum" && argc > 2) return checkpoint_sum(argv[2]);
    if (mode == "ckpt_save4" && argc > 2) return checkpoint_save4(argv[2]);
    if (mode == "ckpt_write" && argc > 3) return checkpoint_write(argv[2], std::atoi(argv[3]));
    if (mode == "fault" && argc > 2) return fault(argv[2]);
    std::cerr << "unknown mode " << mode << "\n";
    return 2;
  } catch (const te::Error& e) {
    std::cout << "rank " << te::world_rank() << " error: " << e.what() << std::endl;
    return 4;
  }
}
