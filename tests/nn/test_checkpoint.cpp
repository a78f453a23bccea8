// Checkpoints: the one-process file is safetensors by the specification (checked byte by byte);
// a model trained on DP2xTP2 loads bit for bit on one process, on TP2 and on FSDP2; bad files
// (missing, truncated, a flipped byte, a wrong shape, names one side lacks) are named.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>

#include "../distributed/dist_test_util.h"
#include "../expect_error.h"
#include "../temp_dir.h"
#include "nn_test_util.h"
#include "te/compat.h"
#include "te/nn.h"
#include "te/optim/adamw.h"

namespace te::nn {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using te::test::TempDir;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TransformerLayerOptions layer_options() {
  return [&] {
    auto made = TransformerLayerOptions(16, 32, 4).hidden_dropout(0).intermediate_dropout(0);
    made.self_attention().attention().attn_mask_type("padding").attention_dropout(0);
    return made;
  }();
}

std::map<std::string, at::Tensor> state_of(const torch::nn::Module& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m.named_parameters()) out[p.key()] = p.value().detach().clone();
  for (const auto& b : m.named_buffers()) out[b.key()] = b.value().detach().clone();
  return out;
}

TEST(Checkpoint, OneProcessWritesOneSafetensorsFileByTheSpecification) {
  TempDir dir;
  manual_seed(1);
  TransformerLayer layer(layer_options());
  save_checkpoint(*layer, dir / "ckpt", R"({"step": 7, "vocab": ["a", "b"]})");
  const fs::path file = dir / "ckpt/model.safetensors";
  ASSERT_TRUE(fs::exists(file));
  EXPECT_FALSE(fs::exists(dir / "ckpt.saving"));
  // The specification: 8 bytes little-endian N, N bytes of JSON header, then the data; each
  // tensor's data_offsets are relative to the data and together cover it without gaps.
  const std::string bytes = read_file(file);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  ASSERT_LE(8 + n, bytes.size());
  const json header = json::parse(bytes.substr(8, n));
  ASSERT_TRUE(header.contains("__metadata__"));
  for (const auto& [k, v] : header["__metadata__"].items()) EXPECT_TRUE(v.is_string()) << k;
  const std::string data = bytes.substr(8 + n);
  std::vector<std::pair<int64_t, int64_t>> ranges;
  const auto state = state_of(*layer);
  for (const auto& [name, t] : state) {
    ASSERT_TRUE(header.contains(name)) << name;
    const json& h = header[name];
    EXPECT_EQ(h["dtype"], "F32") << name;
    EXPECT_EQ(h["shape"].get<std::vector<int64_t>>(), t.sizes().vec()) << name;
    const auto r = h["data_offsets"].get<std::vector<int64_t>>();
    ranges.emplace_back(r[0], r[1]);
    ASSERT_EQ(r[1] - r[0], t.numel() * 4) << name;
    // Raw little-endian fp32, the parameter's own bits.
    EXPECT_EQ(std::memcmp(data.data() + r[0], t.contiguous().data_ptr(), t.numel() * 4), 0) << name;
  }
  EXPECT_EQ(header.size(), state.size() + 1);  // the tensors and __metadata__, nothing else
  std::sort(ranges.begin(), ranges.end());
  int64_t at = 0;
  for (const auto& [b, e] : ranges) {
    EXPECT_EQ(b, at);
    at = e;
  }
  EXPECT_EQ(at, static_cast<int64_t>(data.size()));
  // The index: Hugging Face's weight_map, plus te-cpp's layout and the caller's extra.
  const json index = json::parse(read_file(dir / "ckpt/model.safetensors.index.json"));
  EXPECT_EQ(index["weight_map"]["mlp.wi_kernel"], "model.safetensors");
  EXPECT_EQ(index["te"]["tensors"]["mlp.wi_kernel"]["axes"],
            json::parse(R"(["w_fsdp", "w_joined", "w_tp"])"));
  EXPECT_EQ(index["extra"]["step"], 7);

  manual_seed(2);
  TransformerLayer other(layer_options());
  EXPECT_EQ(json::parse(load_checkpoint(*other, dir / "ckpt")), index["extra"]);
  for (const auto& [name, t] : state_of(*other)) {
    EXPECT_TRUE(at::equal(t, state.at(name))) << name;
  }
}

// Trained on DP2xTP2, saved; loaded on one process, TP2 and FSDP2: every tensor bit for bit.
TEST(Checkpoint, ReshardsOntoAnyMesh) {
  TempDir dir;
  set_warning_handler([](std::string_view) {});
  const at::Tensor x = test::randn({4, 6, 16}, 3);
  const at::Tensor mask = at::zeros({4, 1, 6, 6}, at::kBool);
  std::map<std::string, at::Tensor> saved;
  at::Tensor mesh_output;
  std::mutex mu;
  run_local_ranks(4, [&](int rank) {
    DeviceMesh mesh({2, 2}, {"data", "model"});
    MeshScope on_mesh(mesh);
    MeshResourceScope roles(parse_mesh_resource("dp=data,tp=model"));
    manual_seed(4);
    TransformerLayer layer(layer_options());
    torch::optim::AdamW opt(layer->parameters(), torch::optim::AdamWOptions(1e-2));
    for (int step = 0; step < 2; ++step) {
      opt.zero_grad();
      GradientBuckets buckets;
      layer(DTensor::distribute(x, mesh, {Replicate{}, Replicate{}}), mask)
          .full_tensor()
          .pow(2)
          .mean()
          .backward();
      buckets.finish();
      opt.step();
    }
    save_checkpoint(*layer, dir / "ckpt", "{}");
    const at::Tensor y =
        layer(DTensor::distribute(x, mesh, {Replicate{}, Replicate{}}), mask).full_tensor();
    gather_module(*layer);
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(mu);
      saved = state_of(*layer);
      mesh_output = y.detach();
    }
  });
  // Each rank wrote its own file; the index lists the pieces.
  const json index = json::parse(read_file(dir / "ckpt/model.safetensors.index.json"));
  EXPECT_EQ(index["te"]["world_size"], 4);
  EXPECT_EQ(index["te"]["tensors"]["mlp.wi_kernel"]["pieces"].size(), 2u);  // split on model
  EXPECT_FALSE(index.contains("weight_map"));

  // One process.
  manual_seed(9);
  TransformerLayer single(layer_options());
  load_checkpoint(*single, dir / "ckpt");
  for (const auto& [name, t] : state_of(*single)) {
    EXPECT_TRUE(at::equal(t, saved.at(name))) << name;
  }
  EXPECT_TRUE(test::Close(single(x, mask), mesh_output, 1e-5));
  // TP2 and FSDP2 (thread ranks): each rank holds exactly its piece of the saved tensors.
  for (const char* roles : {"tp=x", "fsdp=x"}) {
    run_local_ranks(2, [&](int rank) {
      DeviceMesh mesh({2}, {"x"});
      MeshScope on_mesh(mesh);
      MeshResourceScope resource(parse_mesh_resource(roles));
      manual_seed(10);
      TransformerLayer layer(layer_options());
      load_checkpoint(*layer, dir / "ckpt");
      const auto layouts = named_parameter_layouts(*layer);
      bool any_sharded = false;
      for (const auto& [name, t] : state_of(*layer)) {
        const auto it = layouts.find(name);
        const at::Tensor want =
            it != layouts.end() && it->second.mesh
                ? te::test::piece_of(saved.at(name), mesh, it->second.placements, rank)
                : saved.at(name);
        any_sharded = any_sharded || t.sizes() != saved.at(name).sizes();
        EXPECT_TRUE(at::equal(t, want)) << roles << " " << name << " on rank " << rank;
      }
      EXPECT_TRUE(any_sharded) << roles;
    });
  }
  set_warning_handler(nullptr);
}

// Save after step 3 with the optimizer (and the dropout stream), load in a new process group
// into a model built from another seed, continue: steps 4-13 lose exactly what an uninterrupted
// run loses. DP2xTP2 thread ranks, dropout on.
TEST(Checkpoint, AResumedRunContinuesBitForBit) {
  TempDir dir;
  set_warning_handler([](std::string_view) {});
  auto options = [&] {
    auto made = layer_options().hidden_dropout(0.1).intermediate_dropout(0.1);
    made.self_attention().attention().attention_dropout(0.2);
    return made;
  }();
  const at::Tensor mask = at::zeros({4, 1, 6, 6}, at::kBool);
  auto step = [&](TransformerLayer& layer, torch::optim::AdamW& opt, const DeviceMesh& mesh,
                  int i) {
    const at::Tensor x = test::randn({4, 6, 16}, 100 + i);
    opt.zero_grad();
    GradientBuckets buckets;
    at::Tensor loss = layer(DTensor::distribute(x, mesh, {Shard{0}, Replicate{}}), mask)
                          .full_tensor()
                          .pow(2)
                          .mean();
    loss.backward();
    buckets.finish();
    opt.step();
    return loss.item<double>();
  };
  std::vector<double> uninterrupted(10), resumed(10);
  run_local_ranks(4, [&](int rank) {
    DeviceMesh mesh({2, 2}, {"data", "model"});
    MeshScope on_mesh(mesh);
    MeshResourceScope roles(parse_mesh_resource("dp=data,tp=model"));
    manual_seed(4);
    TransformerLayer layer(options);
    torch::optim::AdamW opt(layer->parameters(), torch::optim::AdamWOptions(1e-2));
    for (int i = 0; i < 3; ++i) step(layer, opt, mesh, i);
    save_checkpoint(*layer, dir / "ckpt", "{}", &opt);
    for (int i = 3; i < 13; ++i) {
      const double l = step(layer, opt, mesh, i);
      if (rank == 0) uninterrupted[static_cast<std::size_t>(i - 3)] = l;
    }
  });
  run_local_ranks(4, [&](int rank) {
    DeviceMesh mesh({2, 2}, {"data", "model"});
    MeshScope on_mesh(mesh);
    MeshResourceScope roles(parse_mesh_resource("dp=data,tp=model"));
    manual_seed(99);
    TransformerLayer layer(options);
    torch::optim::AdamW opt(layer->parameters(), torch::optim::AdamWOptions(1e-2));
    load_checkpoint(*layer, dir / "ckpt", {}, &opt);
    for (int i = 3; i < 13; ++i) {
      const double l = step(layer, opt, mesh, i);
      if (rank == 0) resumed[static_cast<std::size_t>(i - 3)] = l;
    }
  });
  for (std::size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(resumed[i], uninterrupted[i]) << "step " << i + 4;
  }
  EXPECT_NE(uninterrupted.front(), uninterrupted.back());
  // The optimizer state is in the files, laid out like the parameters; a load without an
  // optimizer (inference) leaves it.
  const json index = json::parse(read_file(dir / "ckpt/model.safetensors.index.json"));
  EXPECT_EQ(index["te"]["tensors"]["optimizer.mlp.wi_kernel.exp_avg"]["pieces"].size(), 2u);
  EXPECT_EQ(index["te"]["tensors"]["optimizer.mlp.wi_kernel.step"]["shape"], json::array({1}));
  TransformerLayer single(options);
  EXPECT_NO_THROW(load_checkpoint(*single, dir / "ckpt"));
  set_warning_handler(nullptr);
}

// te::optim::AdamW over a bf16 layer on DP2xTP2: its fp32 masters and moments are saved laid out
// like the parameters, and a resumed run continues bit for bit.
TEST(Checkpoint, Bf16MastersResumeBitForBit) {
  TempDir dir;
  set_warning_handler([](std::string_view) {});
  const at::Tensor mask = at::zeros({4, 1, 6, 6}, at::kBool);
  auto run = [&](int seed, bool save_at_3, bool load, std::vector<double>& losses) {
    run_local_ranks(4, [&](int rank) {
      DeviceMesh mesh({2, 2}, {"data", "model"});
      MeshScope on_mesh(mesh);
      MeshResourceScope roles(parse_mesh_resource("dp=data,tp=model"));
      manual_seed(seed);
      TransformerLayer layer(layer_options());
      layer->to(at::kBFloat16);
      te::optim::AdamW opt(*layer, te::optim::AdamWOptions(1e-2).weight_decay(0.1));
      if (load) load_checkpoint(*layer, dir / "ckpt", {}, &opt);
      for (int i = load ? 3 : 0; i < 8; ++i) {
        if (save_at_3 && i == 3) save_checkpoint(*layer, dir / "ckpt", "{}", &opt);
        const at::Tensor x = test::randn({4, 6, 16}, 100 + i).to(at::kBFloat16);
        opt.zero_grad();
        GradientBuckets buckets;
        at::Tensor loss = layer(DTensor::distribute(x, mesh, {Shard{0}, Replicate{}}), mask)
                              .full_tensor()
                              .to(at::kFloat)
                              .pow(2)
                              .mean();
        loss.backward();
        buckets.finish();
        opt.step();
        if (rank == 0 && i >= 3) losses.push_back(loss.item<double>());
      }
    });
  };
  std::vector<double> uninterrupted, resumed;
  run(4, /*save_at_3=*/true, /*load=*/false, uninterrupted);
  run(99, false, /*load=*/true, resumed);
  ASSERT_EQ(resumed.size(), uninterrupted.size());
  for (std::size_t i = 0; i < resumed.size(); ++i) {
    EXPECT_EQ(resumed[i], uninterrupted[i]) << "step " << i + 4;
  }
  const json index = json::parse(read_file(dir / "ckpt/model.safetensors.index.json"));
  const json& master = index["te"]["tensors"]["optimizer.mlp.wi_kernel.master"];
  EXPECT_EQ(master["dtype"], "F32");
  EXPECT_EQ(master["pieces"].size(), 2u);  // laid out like wi_kernel: split over "model"
  EXPECT_EQ(index["te"]["tensors"]["mlp.wi_kernel"]["dtype"], "BF16");
  EXPECT_EQ(index["te"]["tensors"]["optimizer.mlp.wi_kernel.exp_avg"]["dtype"], "F32");
  set_warning_handler(nullptr);
}

// A bf16 run of torch::optim::AdamW (bf16 moments, no masters) resumed with te::optim::AdamW: the
// moments widen to fp32, each master is the loaded parameter, the steps carry on.
TEST(Checkpoint, TorchAdamWStateLoadsIntoTeAdamW) {
  TempDir dir;
  manual_seed(4);
  TransformerLayer layer(layer_options());
  layer->to(at::kBFloat16);
  const at::Tensor mask = at::zeros({4, 1, 6, 6}, at::kBool);
  torch::optim::AdamW torch_opt(layer->parameters(), torch::optim::AdamWOptions(1e-2));
  for (int i = 0; i < 2; ++i) {
    torch_opt.zero_grad();
    layer(test::randn({4, 6, 16}, 100 + i).to(at::kBFloat16), mask)
        .to(at::kFloat)
        .pow(2)
        .mean()
        .backward();
    torch_opt.step();
  }
  save_checkpoint(*layer, dir / "ckpt", "{}", &torch_opt);
  manual_seed(5);
  TransformerLayer resumed(layer_options());
  resumed->to(at::kBFloat16);
  te::optim::AdamW opt(*resumed, te::optim::AdamWOptions(1e-2));
  load_checkpoint(*resumed, dir / "ckpt", {}, &opt);
  for (const auto& p : resumed->named_parameters()) {
    const te::optim::AdamWParamState* st = opt.state_of(p.value(), /*create=*/false);
    ASSERT_NE(st, nullptr) << p.key();
    EXPECT_EQ(st->step(), 2) << p.key();
    EXPECT_TRUE(at::equal(st->master(), p.value().to(at::kFloat))) << p.key();
    EXPECT_EQ(st->exp_avg_sq().scalar_type(), at::kFloat);
  }
  const at::Tensor wi = resumed->mlp->named_parameters()["wi_kernel"];
  const auto* torch_state = static_cast<torch::optim::AdamWParamState*>(
      torch_opt.state()
          .at(compat::optimizer_state_key<std::decay_t<decltype(torch_opt.state())>::key_type>(
              layer->mlp->named_parameters()["wi_kernel"].unsafeGetTensorImpl()))
          .get());
  EXPECT_TRUE(at::equal(opt.state_of(wi, false)->exp_avg(), torch_state->exp_avg().to(at::kFloat)));
}

// A one-process checkpoint loaded on TP2: no rank reads the whole model. The row-split kernel
// (wo, split on its first dim) is read half by each rank; the column-split one (wi) lies in every
// 1 MiB checksum block, so it is read whole.
TEST(Checkpoint, EachRankReadsOnlyTheBlocksItNeeds) {
  TempDir dir;
  manual_seed(1);
  LayerNormMLP whole(LayerNormMLPOptions(256, 4096));  // wi and wo: 4 MiB each
  save_checkpoint(*whole, dir / "ckpt");
  int64_t total = 0;
  for (const auto& [name, t] : state_of(*whole)) total += t.numel() * 4;
  std::vector<int64_t> read(2, 0);
  set_warning_handler([](std::string_view) {});
  run_local_ranks(2, [&](int rank) {
    DeviceMesh mesh({2}, {"tp"});
    MeshScope on_mesh(mesh);
    MeshResourceScope roles(parse_mesh_resource("tp=tp"));
    LayerNormMLP mlp(LayerNormMLPOptions(256, 4096));
    CheckpointLoadOptions options;
    options.bytes_read = &read[static_cast<std::size_t>(rank)];
    load_checkpoint(*mlp, dir / "ckpt", options);
    EXPECT_TRUE(at::equal(mlp->wo_kernel, whole->wo_kernel.narrow(0, 2048 * rank, 2048)));
    EXPECT_TRUE(at::equal(mlp->wi_kernel, whole->wi_kernel.narrow(2, 2048 * rank, 2048)));
  });
  set_warning_handler(nullptr);
  const int64_t wo = 4096 * 256 * 4;
  for (int64_t r : read) {
    EXPECT_LT(r, total);
    EXPECT_EQ(r, total - wo / 2) << "every byte but the other half of wo";
  }
}

TEST(Checkpoint, BadFilesAndMismatchesAreNamed) {
  TempDir dir;
  manual_seed(1);
  TransformerLayer layer(layer_options());
  save_checkpoint(*layer, dir / "ckpt");
  const std::string file = dir / "ckpt/model.safetensors";
  const std::string good = read_file(file);
  auto write = [&](const std::string& bytes) { std::ofstream(file, std::ios::binary) << bytes; };
  TransformerLayer target(layer_options());

  EXPECT_ERROR(load_checkpoint(*target, dir / "nothing"), "no checkpoint at");
  // A flipped byte in the data of the last tensor.
  std::string flipped = good;
  flipped[flipped.size() - 3] ^= 0x10;
  write(flipped);
  EXPECT_ERROR(load_checkpoint(*target, dir / "ckpt"), "fails its checksum");
  // Truncated: the data, then the header.
  write(good.substr(0, good.size() - 100));
  EXPECT_ERROR(load_checkpoint(*target, dir / "ckpt"), "model.safetensors");
  write(good.substr(0, 20));
  EXPECT_ERROR(load_checkpoint(*target, dir / "ckpt"), "is truncated or not safetensors");
  fs::remove(file);
  EXPECT_ERROR(load_checkpoint(*target, dir / "ckpt"), "missing a file its index names");
  write(good);
  EXPECT_NO_THROW(load_checkpoint(*target, dir / "ckpt"));

  // A module of another size: both shapes named.
  TransformerLayer wider(TransformerLayerOptions(16, 48, 4));
  EXPECT_ERROR(load_checkpoint(*wider, dir / "ckpt"),
               "'mlp.wi_kernel' is [16, 1, 32] in the checkpoint at");
  EXPECT_ERROR(load_checkpoint(*wider, dir / "ckpt"), "but [16, 1, 48] in the module");
  // Names one side lacks: strict by default, skipped on request.
  TransformerLayer decoder(layer_options().layer_type("decoder"));
  EXPECT_ERROR(load_checkpoint(*decoder, dir / "ckpt"), "lacks 'cross_attention.");
  EXPECT_ERROR(load_checkpoint(*decoder, dir / "ckpt"), "which the module has");
  save_checkpoint(*decoder, dir / "decoder");
  EXPECT_ERROR(load_checkpoint(*target, dir / "decoder"), "holds 'cross_attention.");
  EXPECT_ERROR(load_checkpoint(*target, dir / "decoder"), "which the module lacks");
  EXPECT_NO_THROW(load_checkpoint(*decoder, dir / "ckpt", CheckpointLoadOptions{false}));
  EXPECT_TRUE(at::equal(decoder->mlp->wi_kernel, layer->mlp->wi_kernel));
  // dtype.
  TransformerLayer bf16(layer_options());
  bf16->to(at::kBFloat16);
  EXPECT_ERROR(load_checkpoint(*bf16, dir / "ckpt"), "is F32 in the checkpoint");
  EXPECT_ERROR(save_checkpoint(*layer, dir / "ckpt", "{not json"), "extra is not JSON");
}

// The index is checked field by field before a byte of data is read: each damage is named by
// its field, never a crash or a read outside the files (fuzz/fuzz_checkpoint.cpp goes further).
TEST(Checkpoint, ADamagedIndexIsNamedByItsField) {
  TempDir dir;
  manual_seed(1);
  TransformerLayer layer(layer_options());
  save_checkpoint(*layer, dir / "ckpt");
  const fs::path index_path = dir / "ckpt/model.safetensors.index.json";
  const json good = json::parse(read_file(index_path));
  TransformerLayer target(layer_options());
  auto damaged = [&](const std::function<void(json&)>& edit) {
    json index = good;
    edit(index);
    std::ofstream(index_path) << index.dump(1);
  };
  auto piece = [](json& index) -> json& {
    return index["te"]["tensors"]["mlp.wi_kernel"]["pieces"][0];
  };
  damaged([&](json& i) { piece(i)["offsets"][0] = 3; });
  EXPECT_ERROR(load_checkpoint(*target, dir / "ckpt"),
               "is damaged at te.tensors.'mlp.wi_kernel'.pieces[0]: it reaches element 19 of "
               "dim 0, which has 16");
  damaged([&](json& i) { piece(i)["offsets"] = {0, 0}; });
  EXPECT_ERROR(load_checkpoint(*target, dir / "ckpt"),
               "te.tensors.'mlp.wi_kernel'.pieces[0].offsets: expected 3 entries");
  damaged([&](json& i) { piece(i)["shape"][2] = "32"; });
  EXPECT_ERROR(load_checkpoint(*target, dir / "ckpt"),
               "te.tensors.'mlp.wi_kernel'.pieces[0].shape[2]: expected an integer, got \"32\"");
  damaged([&](json& i) { piece(i)["file"] = "../model.safetensors"; });
  EXPECT_ERROR(load_checkpoint(*target, dir / "ckpt"),
               "'../model.safetensors' is not a file name inside the checkpoint");
  damaged([&](json& i) { piece(i)["crc32_blocks"] = json::array(); });
  EXPECT_ERROR(load_checkpoint(*target, dir / "ckpt"), "crc32_blocks: expected 1 checksums");
  damaged([&](json& i) { piece(i).erase("file"); });
  EXPECT_ERROR(load_checkpoint(*target, dir / "ckpt"), "pieces[0]: 'file' is missing");
  damaged([&](json& i) {  // the same piece twice: overlapping, and too many elements
    auto& pieces = i["te"]["tensors"]["mlp.wi_kernel"]["pieces"];
    pieces.push_back(pieces[0]);
  });
  EXPECT_ERROR(load_checkpoint(*target, dir / "ckpt"), "pieces 0 and 1 overlap");
  damaged([&](json& i) { i["te"]["tensors"]["mlp.wi_kernel"]["pieces"] = json::array(); });
  EXPECT_ERROR(load_checkpoint(*target, dir / "ckpt"), "they hold 0 of the tensor's 512 elements");
  damaged([&](json& i) { i["te"]["tensors"]["mlp.wi_kernel"]["dtype"] = "F31"; });
  EXPECT_ERROR(load_checkpoint(*target, dir / "ckpt"), "'F31' is not a safetensors dtype");
  damaged([&](json& i) { i["te"]["rng"]["seed"] = -1; });
  EXPECT_ERROR(load_checkpoint(*target, dir / "ckpt"), "te.rng.seed: expected an unsigned");
  damaged([](json&) {});
  EXPECT_NO_THROW(load_checkpoint(*target, dir / "ckpt"));
  // The safetensors header: offsets past the data.
  const fs::path file = dir / "ckpt/model.safetensors";
  const std::string bytes = read_file(file);
  const std::string text = bytes.substr(8, bytes.find('}', 8));
  std::string bad = bytes;
  const auto at = bad.find("\"data_offsets\":[0,");
  ASSERT_NE(at, std::string::npos) << text;
  bad[at + 16] = '9';  // [0,N] -> [9,N]: the size no longer matches
  std::ofstream(file, std::ios::binary) << bad;
  EXPECT_ERROR(load_checkpoint(*target, dir / "ckpt"), "has data offsets [9,");
}

TEST(Checkpoint, ASaveReplacesThePreviousOneAtomically) {
  TempDir dir;
  manual_seed(1);
  TransformerLayer first(layer_options());
  save_checkpoint(*first, dir / "ckpt", R"({"n": 1})");
  // What a save that died leaves behind does not disturb the next one.
  fs::create_directories(dir / "ckpt.saving");
  std::ofstream(dir / "ckpt.saving/model.safetensors") << "torn";
  manual_seed(2);
  TransformerLayer second(layer_options());
  save_checkpoint(*second, dir / "ckpt/", R"({"n": 2})");  // a trailing slash names the same
  EXPECT_FALSE(fs::exists(dir / "ckpt.saving"));
  EXPECT_FALSE(fs::exists(dir / "ckpt.old"));
  TransformerLayer loaded(layer_options());
  EXPECT_EQ(json::parse(load_checkpoint(*loaded, dir / "ckpt"))["n"], 2);
  EXPECT_TRUE(at::equal(loaded->mlp->wi_kernel, second->mlp->wi_kernel));
}

// On a file system that cannot swap two directories in one step, a save moves the previous
// checkpoint to "<dir>.old" before putting the new one in place: a save killed between the two
// leaves "<dir>" missing. Loading reads "<dir>.old" then, and the next save puts it back first.
TEST(Checkpoint, ASaveKilledWhileThePreviousWasMovedAsideLosesNothing) {
  TempDir dir;
  manual_seed(1);
  TransformerLayer first(layer_options());
  save_checkpoint(*first, dir / "ckpt", R"({"n": 1})");
  fs::rename(dir / "ckpt", dir / "ckpt.old");
  fs::create_directories(dir / "ckpt.saving");
  std::ofstream(dir / "ckpt.saving/model.safetensors") << "torn";
  EXPECT_EQ(json::parse(read_checkpoint_info((dir / "ckpt").string()).extra_json)["n"], 1);
  TransformerLayer loaded(layer_options());
  EXPECT_EQ(json::parse(load_checkpoint(*loaded, dir / "ckpt"))["n"], 1);
  EXPECT_TRUE(at::equal(loaded->mlp->wi_kernel, first->mlp->wi_kernel));
  // A save that fails before its new checkpoint is complete leaves the old one loadable.
  TransformerLayer second(layer_options());
  EXPECT_ERROR(save_checkpoint(*second, dir / "ckpt", "not json"), "extra is not JSON");
  EXPECT_EQ(json::parse(load_checkpoint(*loaded, dir / "ckpt"))["n"], 1);
  save_checkpoint(*second, dir / "ckpt", R"({"n": 2})");
  EXPECT_FALSE(fs::exists(dir / "ckpt.old"));
  EXPECT_FALSE(fs::exists(dir / "ckpt.saving"));
  EXPECT_EQ(json::parse(load_checkpoint(*loaded, dir / "ckpt"))["n"], 2);
}

}  // namespace
}  // namespace te::nn
