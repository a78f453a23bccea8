#pragma once

// LayerNormMoE's routed experts (internal; modules/src/moe_experts.cpp): on one process, and on
// a mesh by how the experts' placements and the tokens' meet on each mesh dim (data parallel,
// FSDP, tensor parallel within each expert, expert parallel by all-to-all or on whole tokens).

#include <ATen/Tensor.h>

#include <utility>

#include "te/distributed/dtensor.h"
#include "te/nn/moe_layer.h"

namespace te::nn::detail {

/// The routed experts' output for x [..., hidden] (the norm's output) routed by logits
/// [..., experts], and the auxiliary loss (a zero scalar when off): plain tensors on one process;
/// DTensors on a mesh (the output Partial where each rank's is a partial sum, the loss Partial
/// over the mesh dims that split the tokens).
std::pair<at::Tensor, at::Tensor> moe_experts(LayerNormMoEImpl& self, const at::Tensor& x,
                                              const at::Tensor& logits);
std::pair<DTensor, DTensor> moe_experts(LayerNormMoEImpl& self, const DTensor& x,
                                        const DTensor& logits);

}  // namespace te::nn::detail
