#pragma once

// te-train's model FLOPs utilization: tokens/s as the model's FLOP/s (PaLM's appendix B, as
// Megatron and nanoGPT count them) over the peak of the hardware the run uses, measured at the
// start or given by --peak-tflops.

#include <cstdint>
#include <string>

#include "args.h"
#include "te/hf/causal_lm.h"

namespace train {

struct Mfu {
  /// N: the parameters that multiply in a GEMM, whole (every rank's pieces): all but the lookup-
  /// only embedding tables (learned positions; the token table where the head is untied).
  int64_t gemm_params = 0;
  /// 6 N (forward and both backward GEMMs) + 12 L H T (attention's scores and values: L layers,
  /// H heads x head dim, T --seq-len; causal masking not discounted).
  double flops_per_token = 0;
  /// The run's peak FLOP/s (all ranks).
  double peak_flops = 0;
  /// How the peak was found, for the header line.
  std::string peak_source;

  /// The share of the peak that `tokens_per_second` uses.
  double of(double tokens_per_second) const {
    return tokens_per_second * flops_per_token / peak_flops;
  }
};

/// Under the run's mesh: --peak-tflops, or collectively the best rate of a few dense GEMMs
/// (1024^3 and 2048^3 at::matmul in --dtype, and in fp32 where that is faster: te computes a
/// bf16 GEMM in fp32 where the CPU has no fast bf16 one) on each rank's threads, all ranks at
/// once, summed over the ranks.
Mfu make_mfu(const Args& args, const te::hf::CausalLMImpl& model);

}  // namespace train
