#pragma once

// Serving te::nn modules: FP8 weights, and the rules for calling one module from many threads.
//
// Threads. Every te::nn module's forward may be called from many threads at once on one shared
// module in eval mode (module->eval()): a forward changes nothing in the module, except
//   - FP8 GEMMs, which record amaxes and move their DelayedScaling scales only in training
//     (te::fp8::records): in eval mode or under c10::InferenceMode they cast with the stored
//     scales, so an answer never depends on other calls or their order;
//   - the FP8 kernel cache, which is guarded by its GemmMeta's mutex.
// Rules, MeshResource, mesh and FP8 autocast scopes are thread-local: open them in each worker
// thread (see docs/embedding.md).
//
// FP8 weights. freeze_fp8_weights(model) holds every Dense / LayerNormMLP / MultiHeadAttention
// kernel as E4M3 codes and a scale (a quarter of fp32's bytes) and drops the fp32 kernel; the
// module's at::Tensor forward then runs those GEMMs in FP8 (inputs cast with the stored input
// scales) with no autocast needed. Every te::nn::Embedding table is held the same way, with one
// scale per row (Embedding::freeze_fp8), its lookups decoding the rows they gather. save_checkpoint
// writes the codes; prepare_fp8_weights lays out a fresh model to load such a checkpoint.

#include <torch/nn/module.h>

#include <cstdint>
#include <string>

namespace te::nn {

/// Holds every FP8-capable GEMM kernel and every Embedding table of `module` (and its children)
/// as FP8 codes and releases the fp32 parameters. The model must be whole on this process and
/// its GEMMs' input scales set (trained with FP8 DelayedScaling, or calibrated: see
/// te::Fp8Autocast's `calibrating`); te::Error names the first GEMM without them. Returns the
/// number of kernels and tables frozen.
int64_t freeze_fp8_weights(torch::nn::Module& module);

/// Lays out a freshly built `module` as freeze_fp8_weights would, with empty FP8 kernels, so
/// load_checkpoint can fill it from a checkpoint saved after freezing.
int64_t prepare_fp8_weights(torch::nn::Module& module);

/// True when some GEMM or Embedding of `module` holds FP8 weights.
bool has_fp8_weights(const torch::nn::Module& module);

/// True when some parameter of `module` is held in GGUF blocks (ShardedModule::hold_blocks, as
/// te::hf loads a GGUF file on one process).
bool has_block_weights(const torch::nn::Module& module);

/// Bytes of `module`'s parameters and buffers as held now (FP8 codes, scales and FP8 state
/// included) and of the weights it holds in GGUF blocks: what a server keeps resident for its
/// weights.
int64_t resident_bytes(const torch::nn::Module& module);

/// The library te::nn's float32 CPU GEMMs without an autograd graph (inference: generation,
/// serving, embeddings, evaluation) run on: "onednn" (its AVX-512 matmul, ~2x LibTorch's
/// OpenBLAS here: docs/results.md) where te-cpp was built with oneDNN (CMake TE_ONEDNN, Debian's
/// libdnnl-dev) and TE_CPU_GEMM is unset or "onednn"; "libtorch" where it was not or
/// TE_CPU_GEMM=libtorch. GEMMs that record autograd, run under CPU autocast, in bf16 / fp16 or
/// FP8 always take LibTorch's or te's own, as do attention's batched products. A TE_CPU_GEMM of
/// another value is a te::Error naming it, here and at every float32 CPU GEMM without a graph.
std::string cpu_gemm_library();

/// cpu_gemm_library()'s answer and how to change it, in one line for a program's --help or
/// start-up log, e.g. "float32 CPU GEMMs without autograd: onednn (TE_CPU_GEMM=libtorch: LibTorch's
/// BLAS)"; for a bad TE_CPU_GEMM, the te::Error's text instead of a throw.
std::string cpu_gemm_summary();

/// How many GEMMs this thread has run on oneDNN (a diagnostic for tests and benchmarks).
int64_t onednn_gemm_count();

}  // namespace te::nn
