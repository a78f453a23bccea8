#pragma once

// GroupedLinear's GEMMs on a CUDA device, every group's product of a pass in one cuBLAS call
// (cublasGemmGroupedBatchedEx, cuBLAS 12.5+: one GEMM launch where a loop pays one per group; the
// biases stay per group), on LibTorch's cuBLAS handle and the tensors' device's current stream.
// Built with a CUDA LibTorch (TE_TORCH_CUDA) only; grouped_linear.cpp calls it for CUDA tensors
// of fp32, bf16 or fp16. Groups of no rows are skipped (their rows of the output do not exist,
// their kernel gradients stay as the caller zeroed them). Each call returns false, having done
// nothing, where it cannot take the pass (a matrix not 16-byte aligned, a leading dimension not
// a multiple of 16 bytes, a zero dimension, an older cuBLAS): the caller then loops.

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace te::nn::detail {

/// Whether grouped_*_cuda may take tensors of x's device and dtype.
bool grouped_gemm_on_cuda(const at::Tensor& x);

/// y[rows of g] = x[rows of g] @ kernel[g]: x [M, in], kernel [groups, in, out], y [M, out]
/// (written, not accumulated); all contiguous.
bool grouped_forward_cuda(const at::Tensor& x, const at::Tensor& kernel,
                          const std::vector<int64_t>& splits, const at::Tensor& y);
/// dx[rows of g] = dy[rows of g] @ kernel[g]^T.
bool grouped_dgrad_cuda(const at::Tensor& dy, const at::Tensor& kernel,
                        const std::vector<int64_t>& splits, const at::Tensor& dx);
/// dkernel[g] = x[rows of g]^T @ dy[rows of g] for each group with rows.
bool grouped_wgrad_cuda(const at::Tensor& x, const at::Tensor& dy,
                        const std::vector<int64_t>& splits, const at::Tensor& dkernel);

}  // namespace te::nn::detail
