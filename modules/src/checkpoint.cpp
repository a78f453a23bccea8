#include "te/nn/checkpoint.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE
#include <sys/stat.h>
#include <torch/optim/adamw.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "checkpoint_format.h"
#include "checkpoint_io.h"
#include "te/compat.h"
#include "te/distributed.h"
#include "te/error.h"
#include "te/nn/random.h"
#include "te/nn/safetensors.h"
#include "te/nn/sharded.h"
#include "te/optim/adamw.h"

namespace te::nn {

namespace {

namespace fs = std::filesystem;
using format::kBlockBytes;

// ---- the module's tensors ----------------------------------------------------------------

// One tensor of the module on this rank: its local piece and where it sits globally.
struct Entry {
  at::Tensor local;
  std::vector<int64_t> global_shape, offsets;
  LogicalAxes axes;
  bool owner = true;  // this rank writes the piece (replicas: the lowest coordinate)
};

// One parameter's optimizer state as a checkpoint holds it: tensors laid out like the parameter
// ("exp_avg", "exp_avg_sq", and te::optim::AdamW's fp32 "master"), and the step, which lives in
// the state as an integer and travels as a one-element int64 tensor.
struct OptimizerSlots {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  int64_t step = 0;
  std::function<void(int64_t)> set_step;
  /// Set when `tensors` are whole copies of state split over ranks (te AdamW's ZeroSharding):
  /// puts what a load wrote into them back into this rank's chunks.
  std::function<void()> scatter;
};

// The optimizer's state for `p`, created empty (as its first step would) when it has none yet and
// `create` is set (a load fills it); nullopt when it has none. te::Error for an optimizer kind
// whose state a checkpoint does not know.
std::optional<OptimizerSlots> optimizer_slots(torch::optim::Optimizer& opt, const at::Tensor& p,
                                              bool create) {
  OptimizerSlots slots;
  if (auto* te_adamw = dynamic_cast<te::optim::AdamW*>(&opt)) {
    te::optim::AdamWParamState* st = te_adamw->state_of(p, create);
    if (st == nullptr) return std::nullopt;
    std::vector<at::Tensor> state = {st->exp_avg(), st->exp_avg_sq()};
    if (st->master().defined()) state.push_back(st->master());
    if (te_adamw->state_piece(p)) {
      // ZeRO chunks: saved and loaded whole, laid out as the parameter (collective over the
      // ZeRO axis, in named_parameters order on every rank), so a checkpoint reshards freely.
      std::vector<at::Tensor> whole;
      for (const at::Tensor& chunk : state) whole.push_back(te_adamw->gather_state(p, chunk));
      slots.scatter = [state, whole, piece = *te_adamw->state_piece(p)]() {
        for (std::size_t i = 0; i < state.size(); ++i) {
          state[i].copy_(whole[i].reshape(-1).narrow(0, piece.offset, piece.length));
        }
      };
      state = whole;
    }
    slots.tensors = {{"exp_avg", state[0]}, {"exp_avg_sq", state[1]}};
    if (state.size() > 2) slots.tensors.emplace_back("master", state[2]);
    slots.step = st->step();
    slots.set_step = [st](int64_t step) { st->step(step); };
    return slots;
  }
  auto* adamw = dynamic_cast<torch::optim::AdamW*>(&opt);
  TE_CHECK(adamw != nullptr,
           "checkpoint: the optimizer is neither te::optim::AdamW nor "
           "torch::optim::AdamW, whose state a checkpoint holds");
  auto& states = adamw->state();
  using Key = typename std::decay_t<decltype(states)>::key_type;
  const Key key = compat::optimizer_state_key<Key>(p.unsafeGetTensorImpl());
  auto it = states.find(key);
  if (it == states.end()) {
    if (!create) return std::nullopt;
    auto st = std::make_unique<torch::optim::AdamWParamState>();
    st->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
    st->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
    it = states.emplace(key, std::move(st)).first;
  }
  auto* st = static_cast<torch::optim::AdamWParamState*>(it->second.get());
  slots.tensors = {{"exp_avg", st->exp_avg()}, {"exp_avg_sq", st->exp_avg_sq()}};
  slots.step = st->step();
  slots.set_step = [st](int64_t step) { st->step(step); };
  return slots;
}

using StepSlots = std::map<std::string, std::function<void(int64_t)>>;
using Scatters = std::vector<std::function<void()>>;

std::map<std::string, Entry> entries_of(const torch::nn::Module& module,
                                        const torch::optim::Optimizer* optimizer = nullptr,
                                        bool create_state = false, StepSlots* steps = nullptr,
                                        Scatters* scatters = nullptr) {
  const auto layouts = named_parameter_layouts(module);
  std::map<std::string, Entry> out;
  auto add = [&](const std::string& name, const at::Tensor& t) {
    Entry e;
    e.local = t;
    e.global_shape.assign(t.sizes().begin(), t.sizes().end());
    e.offsets.assign(static_cast<std::size_t>(t.dim()), 0);
    e.owner = world_rank() == 0;
    const auto it = layouts.find(name);
    if (it != layouts.end()) {
      e.axes = it->second.axes;
      e.global_shape = it->second.global_shape;
      if (it->second.mesh) {
        const DeviceMesh& mesh = *it->second.mesh;
        const auto& placements = it->second.placements;
        const auto chunks = local_chunks(e.global_shape, mesh, placements, mesh.rank());
        for (std::size_t d = 0; d < chunks.size(); ++d) e.offsets[d] = chunks[d].offset;
        e.owner = true;
        for (int64_t m = 0; m < mesh.ndim(); ++m) {
          if (!is_shard(placements[static_cast<std::size_t>(m)]) && mesh.coordinate(m) != 0) {
            e.owner = false;
          }
        }
      }
    }
    out.emplace(name, std::move(e));
  };
  for (const auto& p : module.named_parameters(/*recurse=*/true)) add(p.key(), p.value());
  for (const auto& b : module.named_buffers(/*recurse=*/true)) add(b.key(), b.value());
  if (optimizer != nullptr) {
    auto& opt = const_cast<torch::optim::Optimizer&>(*optimizer);
    std::set<const void*> owned;
    for (const auto& group : opt.param_groups()) {
      for (const auto& p : group.params()) owned.insert(p.unsafeGetTensorImpl());
    }
    for (const auto& p : module.named_parameters(/*recurse=*/true)) {
      if (!owned.count(p.value().unsafeGetTensorImpl())) continue;
      std::optional<OptimizerSlots> slots = optimizer_slots(opt, p.value(), create_state);
      if (!slots) continue;  // no gradient yet: no state to save (a load starts it afresh)
      // The state is laid out like its parameter.
      const std::string prefix = "optimizer." + p.key() + ".";
      for (const auto& [suffix, tensor] : slots->tensors) {
        Entry e = out.at(p.key());
        e.local = tensor;
        out.emplace(prefix + suffix, std::move(e));
      }
      Entry step;
      step.local = at::full({1}, slots->step, at::kLong);
      step.global_shape = {1};
      step.offsets = {0};
      step.owner = world_rank() == 0;
      out.emplace(prefix + "step", std::move(step));
      if (steps != nullptr) (*steps)[prefix + "step"] = slots->set_step;
      if (scatters != nullptr && slots->scatter) scatters->push_back(slots->scatter);
    }
  }
  return out;
}

// A mesh over every rank of the world, for the checkpoint's own collectives (DeviceMesh::all_gather
// and barrier): the one the module's sharded parameters live on when it spans the world (its
// groups exist already), else a new one-dimensional mesh, which every rank makes here alike
// (saving and loading are collective).
std::optional<DeviceMesh> world_mesh(const torch::nn::Module& module) {
  if (world_size() <= 1) return std::nullopt;
  for (const auto& [name, layout] : named_parameter_layouts(module)) {
    if (layout.mesh && layout.mesh->size() == world_size()) return *layout.mesh;
  }
  return DeviceMesh({world_size()}, {"checkpoint"});
}

std::string file_name(int rank, int world) {
  if (world == 1) return "model.safetensors";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05d-of-%05d.safetensors", rank + 1, world);
  return buf;
}

}  // namespace

namespace {

// Weights held in GGUF blocks are no parameters or buffers: a checkpoint saved without them would
// load as a model missing them, and one loaded into them (strict = false) would leave the
// blocks serving in place of the checkpoint's values.
void refuse_held_blocks(const torch::nn::Module& module, const char* what) {
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {
    const auto* sharded = dynamic_cast<const ShardedModule*>(item.value().get());
    if (sharded == nullptr || sharded->all_held_blocks().empty()) continue;
    const std::string& name = sharded->all_held_blocks().begin()->first;
    TE_FAIL(what, ": '", item.key().empty() ? name : item.key() + "." + name,
            "' is held in GGUF blocks, which a checkpoint does not store; load the model with "
            "te::hf::LoadOptions::dequantize_gguf = true to save or load checkpoints");
  }
}

// Where a save that was killed between the two renames of publish()'s fallback left the last
// good checkpoint: `<dir>.old`, with `<dir>` gone. Loading and saving look there.
fs::path previous_of(const fs::path& target) { return target.string() + ".old"; }

// Puts the complete checkpoint `tmp` at `target`, so that at every instant `target` is either
// the previous checkpoint or this one, whenever the process is killed. Linux swaps the two
// directories in one step (renameat2 RENAME_EXCHANGE; ext4, xfs, btrfs, tmpfs); on a file system
// without it, `target` moves to `<target>.old` first and loading looks there while `target` is
// missing (checkpoint_root).
void publish(const fs::path& tmp, const fs::path& target) {
  const fs::path old = previous_of(target);
  std::error_code ec;
  if (fs::exists(target)) {
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
      io::fsync_path(target.parent_path(), true);
      fs::remove_all(tmp, ec);  // now the previous checkpoint
      fs::remove_all(old, ec);
      return;
    }
    const int err = errno;
    TE_CHECK(err == EINVAL || err == ENOSYS || err == EOPNOTSUPP, "save_checkpoint: cannot put '",
             tmp.string(), "' in place of '", target.string(), "': ", std::strerror(err),
             "; the previous checkpoint is left as it was");
    fs::remove_all(old, ec);
    fs::rename(target, old);
  }
  fs::rename(tmp, target);
  io::fsync_path(target.parent_path(), true);
  fs::remove_all(old, ec);
}

// The directory a checkpoint named `dir` is read from: `dir`, or `<dir>.old` when a save was
// killed while `dir` was moved aside (publish()'s fallback).
fs::path checkpoint_root(const std::string& dir) {
  fs::path root = fs::absolute(dir).lexically_normal();
  if (root.filename().empty()) root = root.parent_path();
  const fs::path old = previous_of(root);
  if (!fs::exists(root / format::kIndexName) && fs::exists(old / format::kIndexName)) return old;
  return root;
}

}  // namespace

void save_checkpoint(const torch::nn::Module& module, const std::string& dir,
                     const std::string& extra_json, const torch::optim::Optimizer* optimizer) {
  refuse_held_blocks(module, "save_checkpoint");
  format::Index index;
  try {
    index.extra_json = nlohmann::json::parse(extra_json).dump();
  } catch (const nlohmann::json::exception& e) {
    TE_FAIL("save_checkpoint: extra is not JSON (", e.what(), "): ", extra_json);
  }
  const std::optional<DeviceMesh> world = world_mesh(module);
  const int rank = world_rank(), n = world_size();
  fs::path target = fs::absolute(dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();  // "ckpt/" names "ckpt"
  const fs::path tmp = target.string() + ".saving";
  if (rank == 0) {
    std::error_code ec;
    // A save killed between publish()'s two renames: the last good checkpoint goes back first.
    if (!fs::exists(target) && fs::exists(previous_of(target) / format::kIndexName)) {
      fs::rename(previous_of(target), target, ec);
      TE_CHECK(!ec, "save_checkpoint: cannot move the previous checkpoint '",
               previous_of(target).string(), "' back to '", target.string(), "': ", ec.message());
    }
    fs::remove_all(tmp, ec);  // what a save that died left behind
    fs::create_directories(tmp, ec);
    TE_CHECK(!ec, "save_checkpoint: cannot create '", tmp.string(), "': ", ec.message());
  }
  if (world) world->barrier();
  const auto entries = entries_of(module, optimizer);
  std::vector<io::OwnedPiece> owned;
  for (const auto& [name, e] : entries) {
    if (e.owner) owned.push_back({name, e.local.detach().contiguous().cpu(), e.offsets});
  }
  const auto mine = io::write_safetensors(owned, tmp / file_name(rank, n));
  const std::string mine_text = format::pieces_text(mine);
  const std::vector<std::string> all =
      world ? world->all_gather(mine_text) : std::vector<std::string>{mine_text};
  if (rank == 0) {
    index.world_size = n;
    index.with_optimizer = optimizer != nullptr;
    for (const auto& [name, e] : entries) {
      format::TensorRecord& t = index.tensors[name];
      t.shape = e.global_shape;
      t.dtype = safetensors_dtype_name(e.local.scalar_type());
      t.axes.assign(e.axes.begin(), e.axes.end());
    }
    for (std::size_t r = 0; r < all.size(); ++r) {
      for (auto& [name, record] : format::parse_pieces(all[r], "rank " + std::to_string(r))) {
        index.tensors.at(name).pieces.push_back(std::move(record.piece));
      }
    }
    const RngState rng = rng_state();
    index.rng.emplace(rng.seed, rng.calls);
    const fs::path index_path = tmp / format::kIndexName;
    io::write_file(index_path, format::index_text(index), "save_checkpoint");
  }
  if (world) world->barrier();  // every rank's file is written and synced
  if (rank == 0) {
    io::fsync_path(tmp, true);
    publish(tmp, target);
  }
  if (world) world->barrier();
}

namespace {

format::Index read_index(const fs::path& root, const char* what) {
  const fs::path index_path = root / format::kIndexName;
  std::ifstream in(index_path, std::ios::binary);
  TE_CHECK(in.good(), what, ": no checkpoint at '", root.string(), "' (cannot read '",
           index_path.string(), "')");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return format::parse_index(text, index_path.string(), what);
}

}  // namespace

CheckpointInfo read_checkpoint_info(const std::string& dir) {
  const fs::path root = checkpoint_root(dir);
  const format::Index index = read_index(root, "read_checkpoint_info");
  CheckpointInfo info;
  info.extra_json = index.extra_json;
  std::set<std::string> files;
  for (const auto& [name, t] : index.tensors) {
    info.tensors.push_back(name);
    for (const format::Piece& piece : t.pieces) files.insert(piece.file);
  }
  for (const std::string& f : files) {
    std::error_code ec;
    const auto size = fs::file_size(root / f, ec);
    TE_CHECK(!ec, "read_checkpoint_info: the checkpoint at '", root.string(), "' lacks its file '",
             f, "'; the checkpoint is incomplete");
    info.bytes += static_cast<int64_t>(size);
  }
  return info;
}

namespace {

// An optimizer's fp32 master weight: a checkpoint saved without one (by an fp32 run, or with
// torch::optim::AdamW) loads with the master taken from the loaded parameter.
bool is_master(const std::string& name) {
  const std::string suffix = ".master";
  return name.rfind("optimizer.", 0) == 0 && name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A strict load: the checkpoint and the module hold the same tensors (optimizer state aside
// when no optimizer is loaded).
void check_same_tensors(const format::Index& index, const std::map<std::string, Entry>& entries,
                        const fs::path& root, bool with_optimizer) {
  bool has_optimizer_state = false;
  for (const auto& [name, t] : index.tensors) {
    has_optimizer_state = has_optimizer_state || name.rfind("optimizer.", 0) == 0;
  }
  // Saved with an optimizer that had no state yet (every step so far skipped, e.g. fp16 overflow):
  // it starts afresh.
  TE_CHECK(!with_optimizer || has_optimizer_state || index.with_optimizer,
           "load_checkpoint: the checkpoint at '", root.string(),
           "' holds no optimizer state (it was saved without the optimizer); ",
           "load it without one");
  for (const auto& [name, e] : entries) {
    // A parameter that had no step when it was saved has no state: it starts afresh.
    const bool optional = with_optimizer && name.rfind("optimizer.", 0) == 0;
    TE_CHECK(index.tensors.count(name) || optional, "load_checkpoint: the checkpoint at '",
             root.string(), "' lacks '", name,
             "', which the module has (load with strict = false to skip it)");
  }
  for (const auto& [name, t] : index.tensors) {
    // Optimizer state is there for resuming; a load without an optimizer leaves it.
    if (!with_optimizer && name.rfind("optimizer.", 0) == 0) continue;
    TE_CHECK(entries.count(name) || !is_master(name), "load_checkpoint: the checkpoint at '",
             root.string(), "' holds the fp32 master weight '", name,
             "', which this optimizer does not keep (torch::optim::AdamW, or te::optim::AdamW "
             "without master_weights or over fp32 parameters); load with strict = false to drop "
             "it");
    TE_CHECK(entries.count(name), "load_checkpoint: the checkpoint at '", root.string(),
             "' holds '", name, "', which the module lacks (load with strict = false to skip it)");
  }
}

// Reads this rank's box of `name` into e.local; returns what was read (on the CPU).
at::Tensor load_entry(const std::string& name, const Entry& e, const format::TensorRecord& t,
                      const fs::path& root,
                      std::map<std::string, std::unique_ptr<SafetensorsReader>>& files,
                      int64_t* bytes_read) {
  TE_CHECK(t.shape == e.global_shape, "load_checkpoint: '", name, "' is ", te::shape_text(t.shape),
           " in the checkpoint at '", root.string(), "' but ", te::shape_text(e.global_shape),
           " in the module; build the module with the checkpoint's sizes");
  const at::ScalarType dtype = e.local.scalar_type();
  // Optimizer moments convert (bf16 ones of a run without masters, fp32 ones beside masters).
  const bool converts = name.rfind("optimizer.", 0) == 0 && at::isFloatingType(dtype);
  at::ScalarType saved = dtype;
  if (converts) saved = safetensors_scalar_type(t.dtype, root.string() + ": " + name);
  TE_CHECK(t.dtype == safetensors_dtype_name(saved) && (!converts || at::isFloatingType(saved)),
           "load_checkpoint: '", name, "' is ", t.dtype, " in the checkpoint at '", root.string(),
           "' but ", safetensors_dtype_name(dtype),
           " in the module; convert the module (module->to(...)) first");
  at::Tensor filled = at::empty(e.local.sizes(), e.local.options().device(at::kCPU).dtype(saved));
  const int64_t covered = io::read_box(name, t, e.offsets, root, filled, files, bytes_read);
  TE_CHECK(covered == e.local.numel(), "internal: load_checkpoint: the pieces of '", name,
           "' in the checkpoint at '", root.string(), "' cover ", covered, " of the ",
           e.local.numel(), " elements this rank needs");
  e.local.copy_(filled);
  return filled;
}

}  // namespace

std::string load_checkpoint(torch::nn::Module& module, const std::string& dir,
                            const CheckpointLoadOptions& options,
                            torch::optim::Optimizer* optimizer) {
  refuse_held_blocks(module, "load_checkpoint");
  const fs::path root = checkpoint_root(dir);
  const format::Index index = read_index(root, "load_checkpoint");
  StepSlots steps;
  Scatters scatters;
  const auto entries = entries_of(module, optimizer, /*create_state=*/true, &steps, &scatters);
  if (options.strict) check_same_tensors(index, entries, root, optimizer != nullptr);
  std::map<std::string, std::unique_ptr<SafetensorsReader>> files;
  int64_t bytes_read = 0;
  std::vector<std::string> masters_from_params;
  torch::NoGradGuard no_grad;
  for (const auto& [name, e] : entries) {
    const auto found = index.tensors.find(name);
    if (found == index.tensors.end()) {
      if (is_master(name)) masters_from_params.push_back(name);
      continue;
    }
    const at::Tensor filled = load_entry(name, e, found->second, root, files, &bytes_read);
    const auto slot = steps.find(name);
    if (slot != steps.end()) slot->second(filled.item<int64_t>());
  }
  for (const std::string& name : masters_from_params) {
    const std::string param = name.substr(10, name.size() - 10 - 7);  // optimizer.<param>.master
    entries.at(name).local.copy_(entries.at(param).local);
  }
  for (const auto& scatter : scatters) scatter();
  if (options.bytes_read != nullptr) *options.bytes_read += bytes_read;
  if (options.restore_rng_state && index.rng) {
    set_rng_state({index.rng->first, index.rng->second});
  }
  return index.extra_json;
}

}  // namespace te::nn
