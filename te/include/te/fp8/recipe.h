#pragma once

// FP8 scaling recipes (docs/ARCHITECTURE.md §5): what a user picks for an Fp8Autocast region.
//
//   te::Fp8Autocast fp8(true, te::fp8::Float8BlockScaling{});
//   te::Fp8Autocast fp8(true, te::fp8::recipe_named("current"));   // the names te-encoder takes
//
// A recipe is a plain settings struct; te::fp8::Recipe holds any of them (a std::variant of the
// structs, RecipeSettings). Each recipe's behaviour (how it casts a GEMM's operands, what state it
// keeps) lives in its own file under te/src/fp8/ behind one internal interface
// (te/src/fp8/recipe_impl.h), registered by name in te/src/fp8/recipe.cpp: adding a recipe touches
// its struct and its RecipeSettings entry here, its file, that registration and its tests.

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "te/kernels/fp8_cast.h"

namespace te::fp8 {

/// E4M3 everywhere, or HYBRID: E4M3 forward (activations, weights), E5M2 gradients.
enum class Format { kE4M3, kHybrid };

DType forward_dtype(Format format);
DType backward_dtype(Format format);

/// Scales from a history of amaxes (TE's DelayedScaling). Per update: the new amax is in
/// history[0]; amax = max(history) ("max") or history[0] ("most_recent");
/// scale = (fp8_max / amax) / 2^margin, keeping the old scale when amax <= 0 or is not finite;
/// then the history rolls by -1 and history[0] is zeroed for the next step's amax.
struct DelayedScaling {
  int margin = 0;
  Format fp8_format = Format::kHybrid;
  int amax_history_len = 1024;
  std::string amax_compute_algo = "max";
};

/// Scales from each tensor's own amax, computed as it is cast (TE's Float8CurrentScaling):
/// scale_from_amax(amax, fp8_max, use_power_2_scales, amax_epsilon). Under a mesh each cast's
/// amax is reduced (MAX) over every mesh axis but pp, so a rank holding a piece casts with the
/// whole tensor's amax, as one process would (one small all-reduce per cast).
struct CurrentScaling {
  Format fp8_format = Format::kHybrid;
  bool use_power_2_scales = false;  ///< TE: NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES, default off
  float amax_epsilon = 0.0f;        ///< a floor for the amax (TE's QParams.amax_epsilon)
};

/// Block scaling (TE's Float8BlockScaling, DeepSeek-V3's recipe): one FP32 scale per 1x128 block
/// of activations and gradients (along the GEMM's reduction dim; the transposed copy a backward
/// GEMM takes is cast from the high-precision tensor with its own blocks) and per 128x128 tile of
/// weights; scale_from_amax per block. No amax history, no amax reduction: a block's scale comes
/// from that block alone. Blocks at a ragged edge are shorter (TE pads them with zeros, which
/// change no amax).
struct Float8BlockScaling {
  Format fp8_format = Format::kE4M3;
  bool power_2_scales = true;  ///< TE's default (NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1 turns it off)
  float amax_epsilon = 0.0f;
};

/// MXFP8 (TE's MXFP8BlockScaling, the OCP Microscaling format; Blackwell's default): one E8M0
/// power-of-two scale per 32 consecutive elements along the GEMM's reduction dim, for every
/// operand (x, weights and gradients alike; the transposed copy a backward GEMM takes is cast from
/// the high-precision tensor with its own blocks); the scale is amax / fp8_max rounded up to a
/// power of two (quantize_mx, te/fp8.h). No amax history, no amax reduction. TE's
/// enable_2d_quantization (32x32 weight blocks) is not built.
struct MXFP8BlockScaling {
  Format fp8_format = Format::kE4M3;
};

/// NVFP4 (TE's NVFP4BlockScaling): E2M1 codes with two levels of scaling, an E4M3 scale per 16
/// consecutive elements along the GEMM's reduction dim and an FP32 scale from the whole tensor's
/// amax (quantize_nvfp4, te/fp8.h). Weights take one scale per 16x16 tile; the wgrad GEMM's
/// operands (x^T and the gradient's transpose, both along the tokens) pass TE's random Hadamard
/// transform first (hadamard16); gradients round stochastically. Every cast comes from the
/// high-precision tensor; under a mesh each cast's amax is reduced over every mesh axis but pp,
/// so a rank holding a piece casts as one process would (stochastic rounding aside: its draws
/// are a rank's own). No amax history.
struct NVFP4BlockScaling {
  bool disable_rht = false;                  ///< TE: NVTE_NVFP4_DISABLE_RHT
  bool disable_stochastic_rounding = false;  ///< TE: NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING
  bool disable_2d_quantization = false;  ///< TE: NVTE_NVFP4_DISABLE_2D_QUANTIZATION (1x16 weights)
  uint64_t seed = 0;  ///< the stochastic rounding draws: Philox (seed, the recipe's cast count)
};

/// Every recipe's settings: one alternative per recipe struct.
using RecipeSettings = std::variant<DelayedScaling, CurrentScaling, Float8BlockScaling,
                                    MXFP8BlockScaling, NVFP4BlockScaling>;

/// The internal behaviour of a recipe (te/src/fp8/recipe_impl.h).
class RecipeImpl;

/// Any recipe, checked when made (a bad setting throws te::Error naming it).
class Recipe {
 public:
  Recipe() : Recipe(DelayedScaling{}) {}
  /// From any recipe struct (implicit, so each converts where a Recipe is taken).
  template <class R, class = std::enable_if_t<std::is_constructible_v<RecipeSettings, R>>>
  Recipe(R recipe)  // NOLINT: implicit
      : Recipe(RecipeSettings(std::move(recipe)), nullptr) {}

  /// The settings.
  const RecipeSettings& settings() const { return settings_; }
  /// The settings, when this recipe is an R.
  template <class R>
  const R* get_if() const {
    return std::get_if<R>(&settings_);
  }
  template <class R>
  bool is() const {
    return get_if<R>() != nullptr;
  }

  /// The name recipe_named takes: "delayed", "current", "block", "mxfp8", "nvfp4".
  std::string name() const;
  Format format() const;
  /// "DelayedScaling(margin=0, format=HYBRID, amax_history_len=1024, amax_compute_algo=max)".
  std::string to_string() const;
  const RecipeImpl& impl() const { return *impl_; }  ///< internal

 private:
  Recipe(RecipeSettings settings, std::nullptr_t);  // checks them and builds the behaviour
  RecipeSettings settings_;
  std::shared_ptr<const RecipeImpl> impl_;
};

inline std::string to_string(const Recipe& recipe) { return recipe.to_string(); }

/// The recipe a name stands for, with its default settings: te::Error listing the names for any
/// other. The one list of names (te-encoder's and te-explain's --fp8 take them).
Recipe recipe_named(const std::string& name);
/// "delayed", "current", "block", "mxfp8", "nvfp4".
std::vector<std::string> recipe_names();
/// Each name with what it is, for a --help: "delayed (DelayedScaling: ...), current (...), ...".
std::string recipe_summary();

}  // namespace te::fp8
