#pragma once

// Checkpoints of te::nn modules as safetensors files: every rank writes the pieces of the
// parameters and buffers it owns (a replicated piece once, by the lowest coordinate holding it),
// one index JSON maps each tensor to its global shape, dtype, logical axes and the file, global
// offsets, shape and CRC-32s (one per MiB) of each piece. Loading reshards onto whatever mesh and
// rules the module was built under now: each rank reads only the blocks holding its own elements. A
// checkpoint is written into a temporary directory, fsynced and renamed into place, so a crash
// leaves the previous one intact. On one process the result is a single model.safetensors whose
// tensors are the whole parameters under the names named_parameters() uses (readable by Python's
// safetensors.torch.load_file).
//
// Example:
//   te::nn::save_checkpoint(*model, "ckpt", R"({"step": 100})");   // every rank calls it
//   ...
//   const std::string extra = te::nn::load_checkpoint(*model, "ckpt");

#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace te::nn {

/// Options of load_checkpoint.
struct CheckpointLoadOptions {
  /// Every parameter and buffer of the module must be in the checkpoint and the checkpoint must
  /// hold nothing else (LibTorch's load_state_dict(strict=true)); false skips both kinds.
  bool strict = true;
  /// Restore this thread's dropout stream (te::nn::rng_state) to where it was at the save, so a
  /// resumed run draws the masks the uninterrupted one would.
  bool restore_rng_state = true;
  /// When set, the tensor data bytes this rank read are added here (monitoring; each rank reads
  /// only the 1 MiB checksum blocks holding its own elements).
  int64_t* bytes_read = nullptr;
};

/// Collective over this thread's world (every rank calls it, with the same module structure):
/// writes `module`'s parameters and buffers to directory `dir`, replacing a previous checkpoint
/// there atomically. `extra_json` (a JSON value: model config, vocabulary, step) is stored in the
/// index. te::Error for a directory that cannot be written or an extra that is not JSON.
///
/// With `optimizer` (te::optim::AdamW or torch::optim::AdamW; te::Error for another kind), its
/// state for the module's parameters is saved too ("optimizer.<name>.exp_avg" / "exp_avg_sq",
/// te::optim::AdamW's fp32 ".master", each laid out like the parameter, and ".step"; a parameter
/// that has had no step has no state and none is saved), so a run resumed with load_checkpoint
/// continues bit for bit. The dropout stream's position is recorded
/// as well.
void save_checkpoint(const torch::nn::Module& module, const std::string& dir,
                     const std::string& extra_json = "{}",
                     const torch::optim::Optimizer* optimizer = nullptr);

/// Collective: loads `dir` into `module` (its parameters keep their layout: each rank reads the
/// pieces overlapping its own and verifies their checksums). Returns the extra JSON the
/// checkpoint was saved with. te::Error naming the file and the tensor for a missing, truncated
/// or corrupt file, a shape or dtype that differs from the module's, and (strict) a tensor one
/// side lacks.
///
/// With `optimizer` (built over the module's parameters), its state is loaded as well, onto
/// this layout like the parameters. Moments convert between dtypes (a bf16 run's into an
/// optimizer with fp32 masters); a master weight the checkpoint lacks is the loaded parameter.
std::string load_checkpoint(torch::nn::Module& module, const std::string& dir,
                            const CheckpointLoadOptions& options = {},
                            torch::optim::Optimizer* optimizer = nullptr);

/// What a checkpoint holds, read from its index alone (no tensor data): for building the model
/// to load it into.
struct CheckpointInfo {
  std::string extra_json;            ///< the extra JSON it was saved with
  std::vector<std::string> tensors;  ///< every tensor name, sorted
  int64_t bytes = 0;                 ///< the sizes of its safetensors files, added up
};
/// te::Error naming the path for a missing or damaged index or a missing data file.
CheckpointInfo read_checkpoint_info(const std::string& dir);

}  // namespace te::nn
