#pragma once

// FP8 weights in training (TE's quantized_model_init with fp32 master weights).
//
//   te::nn::quantize_fp8_weights(*model, te::fp8::CurrentScaling{});  // collective
//   for (...) {
//     { te::Fp8Autocast fp8(true, te::fp8::CurrentScaling{}, resource); loss(model(x)).backward();
//     } optimizer.step();                          // AdamW steps the fp32 masters
//     te::nn::requantize_fp8_weights(*model);    // collective: the codes follow the masters
//   }
//
// Every FP8-capable GEMM kernel (Dense, LayerNormMLP, MultiHeadAttention; not Embedding tables)
// is held as E4M3 codes, this rank's piece of it, with one scale from the whole kernel's amax
// (reduced (MAX) over the ranks holding pieces: TE's cast_master_weights_to_fp8 reduces over the
// data-parallel group, pytorch/tensor/utils.py at d0067d0da). Inside an enabled Fp8Autocast the
// GEMMs multiply those codes instead of casting their kernels each step, and under FSDP the
// kernels' all-gathers move the codes, a quarter of fp32's bytes (TE's Float8Tensor
// fsdp_pre_all_gather gathers its uint8 data and passes scale_inv as metadata,
// pytorch/tensor/float8_tensor.py). The fp32 kernel parameters stay registered: they are the
// master copies the optimizer steps, the gradients reach, and checkpoints save. A GEMM whose
// master changed since its codes were cast (a step, a load) throws te::Error until
// requantize_fp8_weights runs, so stale codes are never used. Per-tensor recipes (delayed,
// current); block recipes are refused. Outside an FP8 region the GEMMs use the masters.

#include <torch/nn/module.h>

#include <cstdint>

#include "te/fp8.h"

namespace te::nn {

/// Collective over the ranks holding pieces of `module`'s kernels: holds every FP8-capable GEMM
/// kernel of `module` (and its children) in FP8 as `recipe` casts weights. Returns how many.
/// te::Error (nothing changed) for a block recipe, or a GEMM holding frozen inference weights.
int64_t quantize_fp8_weights(torch::nn::Module& module, const fp8::Recipe& recipe);

/// Collective: casts every held kernel again from its master (call after optimizer.step() and
/// after loading a checkpoint): one all-reduce of the kernels' amaxes per mesh layout. Returns
/// how many.
int64_t requantize_fp8_weights(torch::nn::Module& module);

/// Drops the held codes: the GEMMs cast their fp32 kernels again. Returns how many.
int64_t release_fp8_weights(torch::nn::Module& module);

/// Bytes of the FP8 codes and scales `module`'s GEMMs hold for training (this rank's).
int64_t held_fp8_weight_bytes(const torch::nn::Module& module);

}  // namespace te::nn
