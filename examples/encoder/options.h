#pragma once

// te-encoder's command line: its options (Args), the layout they describe (mesh, MeshResource,
// rules) and the checks made before any rank starts.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "te/encoder/text.h"
#include "te/fp8.h"
#include "te/sharding.h"

namespace encoder {

struct Args {
  std::string data_dir;
  std::string eval_data;
  int64_t epochs = 3;
  int64_t batch_size = 64;
  int64_t max_seq_len = 32;
  double lr = 1e-4;
  uint64_t seed = 0;
  std::optional<double> dropout;
  double intermediate_dropout = 0.0;
  std::string fp8 = "none";
  bool quantized_weights = false;
  std::string mesh;
  std::string mesh_resource;
  std::string rules;
  bool extend_te_rules = false;
  bool sequence_parallel = false;
  int nproc = 1;
  std::string metrics_json;
  std::string log_steps;
  int threads = 0;
  int64_t max_steps = 0;
  int64_t hidden_size = 256;
  int64_t mlp_hidden_size = 1024;
  int64_t heads = 8;
  std::string mlp_activations = "auto";
  std::string save_dir;
  std::string load_dir;
  bool eval_only = false;
  std::string dtype = "fp32";
  std::string device = "cpu";
  bool quiet = false;
};

/// Reads the command line into `args`. Returns -1 to go on, or the exit status (--help: 0; a
/// malformed command line: 2, after saying why on stderr).
int parse_args(int argc, char** argv, Args& args);

/// A library message for the command line: one line (a parse error's caret picture dropped,
/// its explanation kept), without the [file:line] tag.
std::string one_line(const std::string& message);

using MeshSpec = te::MeshShape;

/// The layout of a run: the mesh (none on one process), MeshResource and rules.
struct Layout {
  std::optional<MeshSpec> mesh;
  std::optional<te::MeshResource> resource;
  std::optional<te::AxisRules> rules;
  std::string description;
  int64_t data_parallel = 1;     // ranks the batch is split over
  bool tensor_parallel = false;  // heads split over some mesh axis
};

/// The layout --mesh, --mesh-resource and --rules describe for `world_size` ranks, checked
/// (InputError naming the option).
Layout make_layout(const Args& args, int world_size);

/// The checks of `args` that need no data and no ranks, make_layout's among them, in the order
/// a user meets them (InputError naming the option); returns the layout for `world_size` ranks.
Layout check_args(const Args& args, int world_size);

/// The FP8 recipe of --fp8 (none: nullopt).
std::optional<te::fp8::Recipe> recipe_of(const std::string& name);
/// The MLP's activations of --mlp-activations (auto: by the layout), checked.
std::vector<std::string> activations_of(const std::string& text, bool tensor_parallel);

/// The commit of TE's examples/jax/encoder this program mirrors (defaults and bars).
inline constexpr const char* kTeCommit = "d0067d0da";

}  // namespace encoder
