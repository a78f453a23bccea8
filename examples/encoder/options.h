#pragma once

// te-encoder's command line: its options (Args), the layout they describe (mesh, MeshResource,
// rules: te::program's layout options, with the encoder's Dense axes mapped) and the checks made
// before any rank starts.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "te/encoder/text.h"
#include "te/program/launch.h"
#include "te/program/layout.h"
#include "te/program/precision.h"

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
  te::program::LayoutArgs layout;  // --mesh, --mesh-resource, --rules, --extend-te-rules
  bool sequence_parallel = false;
  std::string cp_comm_type;  // --cp-comm-type (empty: none)
  te::program::LaunchArgs launch;  // --nproc, --threads
  std::string metrics_json;
  std::string log_steps;
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

using te::program::Layout;
using te::program::recipe_of;

/// The layout --mesh, --mesh-resource and --rules describe for `world_size` ranks, checked
/// (InputError naming the option): te::program::make_layout with the example's Dense axes
/// (my_tp_axis on the heads' mesh axis, my_broadcast_axis replicated) as the default rules, and
/// --batch-size divisible by the data-parallel size.
Layout make_layout(const Args& args, int world_size);

/// The checks of `args` that need no data and no ranks, make_layout's among them, in the order
/// a user meets them (InputError naming the option); returns the layout for `world_size` ranks.
Layout check_args(const Args& args, int world_size);

/// The MLP's activations of --mlp-activations (auto: by the layout), checked.
std::vector<std::string> activations_of(const std::string& text, bool tensor_parallel);

/// The commit of TE's examples/jax/encoder this program mirrors (defaults and bars).
inline constexpr const char* kTeCommit = "d0067d0da";

}  // namespace encoder
