#pragma once

// The option enums of te/nn/moe.h, without LibTorch (TE's names parse in attention_types.cpp,
// beside the attention options').

#include <iosfwd>

namespace te::nn {

/// TE's score_function: how a router turns a token's logits over the experts into scores.
enum class ScoreFunction {
  kSoftmax,       ///< "softmax" (Mixtral, Qwen-MoE, OLMoE)
  kSigmoid,       ///< "sigmoid" (DeepSeek-V3)
  kSqrtSoftplus,  ///< "sqrtsoftplus": sqrt(softplus(x))
};

/// Which routed tokens an expert past its capacity drops (Megatron's moe_token_drop_policy).
enum class DropPolicy {
  kProbs,  ///< "probs": each expert keeps its `capacity` highest-probability tokens
  /// "position": each expert keeps its first `capacity` routed tokens in token order (Megatron
  /// takes a top-k of the 0/1 map, which leaves the choice among ties to the kernel; this is
  /// the deterministic reading of it)
  kPosition,
};

const char* te_name(ScoreFunction value);
const char* te_name(DropPolicy value);
std::ostream& operator<<(std::ostream& stream, ScoreFunction value);
std::ostream& operator<<(std::ostream& stream, DropPolicy value);

}  // namespace te::nn
