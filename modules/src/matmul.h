#pragma once

// The GEMM every te::nn op without FP8 runs (functional.cpp).

#include <ATen/Tensor.h>

namespace te::nn::functional::detail {

/// a @ b for any floating dtype: bf16 / fp16 CPU operands (or CPU autocast to them) without a
/// fast LibTorch kernel on this CPU are multiplied in fp32 from their low-precision values and
/// the result rounded once (what a fp32-accumulating GEMM gives).
at::Tensor mm_any(const at::Tensor& a, const at::Tensor& b);

}  // namespace te::nn::functional::detail
