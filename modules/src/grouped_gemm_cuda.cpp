// GroupedLinear's GEMMs through cuBLAS's grouped GEMM (grouped_gemm_cuda.h).
//
// cuBLAS is column-major: a row-major C [m, n] = op(A) [m, k] @ op(B) [k, n] is the column-major
// C^T [n, m] = op(B)^T @ op(A)^T, so each product is handed over as (B, A) with m and n swapped;
// a row-major matrix stored [r, c] is a column-major [c, r] of leading dimension c. Each product
// is its own group of one (the groups' row counts differ); the pointer arrays go to the device
// in one asynchronous copy from pinned memory (LibTorch's host allocator keeps the buffer until
// the copy is done), the shapes stay on the host, as cublasGemmGroupedBatchedEx takes them.

#include "grouped_gemm_cuda.h"

#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublas_v2.h>

#include <cstdint>
#include <limits>
#include <string>

#include "te/error.h"

namespace te::nn::detail {

namespace {

// One row-major product C [m, n] = op(A) @ op(B): A stored [m, k] (trans_a: [k, m]), B stored
// [k, n] (trans_b: [n, k]), C [m, n] contiguous.
struct Product {
  const void* a;
  const void* b;
  void* c;
  int64_t m, n, k;
  bool trans_a, trans_b;
};

cudaDataType_t cuda_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return CUDA_R_32F;
    case at::kBFloat16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_16F;
  }
}

int as_int(int64_t v, const char* what) {
  TE_CHECK(v <= std::numeric_limits<int>::max(), "grouped_dense: ", what, " ", v,
           " is more than cuBLAS's grouped GEMM takes (", std::numeric_limits<int>::max(), ")");
  return static_cast<int>(v);
}

#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120500
constexpr bool kGrouped = true;
#else
constexpr bool kGrouped = false;  // cublasGemmGroupedBatchedEx came with cuBLAS 12.5
#endif

// Whether cuBLAS takes `p` as a matrix of leading dimension `ld`: 16-byte aligned, rows of a
// multiple of 16 bytes (what its tensor-core kernels read in; anything else is looped).
bool aligned(const void* p, int64_t ld, int64_t element) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (ld * element) % 16 == 0;
}

// Every product in one cublasGemmGroupedBatchedEx on the device's current stream; false (nothing
// done) where cuBLAS cannot take them all.
bool run(const std::vector<Product>& products, const at::Tensor& like) {
  if (products.empty()) return true;
  if (!kGrouped) return false;
  const int64_t element = like.element_size();
  for (const Product& g : products) {
    if (g.m == 0 || g.n == 0 || g.k == 0) return false;
    if (!aligned(g.a, g.trans_a ? g.m : g.k, element) ||
        !aligned(g.b, g.trans_b ? g.k : g.n, element) || !aligned(g.c, g.n, element)) {
      return false;
    }
  }
#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120500
  const c10::cuda::CUDAGuard guard(like.device());  // the handle and stream of its device
  const int count = static_cast<int>(products.size());
  std::vector<cublasOperation_t> op_first(count), op_second(count);
  std::vector<int> m(count), n(count), k(count), ld_first(count), ld_second(count), ld_c(count);
  const std::vector<int> one(count, 1);
  const std::vector<float> alpha(count, 1.0f), beta(count, 0.0f);
  at::Tensor pointers = at::empty({3 * static_cast<int64_t>(count)},
                                  at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  int64_t* p = pointers.data_ptr<int64_t>();
  for (int i = 0; i < count; ++i) {
    const Product& g = products[static_cast<std::size_t>(i)];
    // Column-major C^T [n, m] = op(B)^T [n, k] @ op(A)^T [k, m]: B first.
    op_first[i] = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    op_second[i] = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    m[i] = as_int(g.n, "a group's columns");
    n[i] = as_int(g.m, "a group's rows");
    k[i] = as_int(g.k, "a group's inner dimension");
    ld_first[i] = as_int(g.trans_b ? g.k : g.n, "a leading dimension");
    ld_second[i] = as_int(g.trans_a ? g.m : g.k, "a leading dimension");
    ld_c[i] = m[i];
    p[i] = reinterpret_cast<int64_t>(g.b);
    p[count + i] = reinterpret_cast<int64_t>(g.a);
    p[2 * count + i] = reinterpret_cast<int64_t>(g.c);
  }
  const at::Tensor on_device = pointers.to(like.device(), /*non_blocking=*/true);
  const auto* arrays = reinterpret_cast<void* const*>(on_device.data_ptr<int64_t>());
  const cudaDataType_t type = cuda_type(like.scalar_type());
  // fp32 as at::mm computes it: TF32 tensor cores where LibTorch allows them for cuBLAS.
  const cublasComputeType_t compute =
      like.scalar_type() == at::kFloat && at::globalContext().allowTF32CuBLAS()
          ? CUBLAS_COMPUTE_32F_FAST_TF32
          : CUBLAS_COMPUTE_32F;
  const cublasStatus_t status = cublasGemmGroupedBatchedEx(
      at::cuda::getCurrentCUDABlasHandle(), op_first.data(), op_second.data(), m.data(), n.data(),
      k.data(), alpha.data(), arrays, type, ld_first.data(), arrays + count, type, ld_second.data(),
      beta.data(), const_cast<void* const*>(arrays + 2 * count), type, ld_c.data(), count,
      one.data(), compute);
  TE_CHECK(status == CUBLAS_STATUS_SUCCESS, "grouped_dense: cublasGemmGroupedBatchedEx returned ",
           "cuBLAS status ", static_cast<int>(status), " for ", count, " GEMMs of ",
           like.scalar_type());
#endif
  return true;
}

char* bytes(const at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }

}  // namespace

bool grouped_gemm_on_cuda(const at::Tensor& x) {
  const at::ScalarType t = x.scalar_type();
  return x.is_cuda() && (t == at::kFloat || t == at::kBFloat16 || t == at::kHalf);
}

// The product of each group with rows (`make(g, first row, rows)`), run as one.
template <typename Make>
bool run_groups(const std::vector<int64_t>& splits, const at::Tensor& like, Make make) {
  std::vector<Product> products;
  int64_t row = 0;
  for (std::size_t g = 0; g < splits.size(); ++g) {
    if (splits[g] > 0) products.push_back(make(static_cast<int64_t>(g), row, splits[g]));
    row += splits[g];
  }
  return run(products, like);
}

bool grouped_forward_cuda(const at::Tensor& x, const at::Tensor& kernel,
                          const std::vector<int64_t>& splits, const at::Tensor& y) {
  const int64_t in = kernel.size(1), out = kernel.size(2), size = x.element_size();
  return run_groups(splits, x, [&](int64_t g, int64_t row, int64_t rows) {
    return Product{bytes(x) + row * in * size,
                   bytes(kernel) + g * in * out * size,
                   bytes(y) + row * out * size,
                   rows,
                   out,
                   in,
                   false,
                   false};
  });
}

bool grouped_dgrad_cuda(const at::Tensor& dy, const at::Tensor& kernel,
                        const std::vector<int64_t>& splits, const at::Tensor& dx) {
  const int64_t in = kernel.size(1), out = kernel.size(2), size = dy.element_size();
  return run_groups(splits, dy, [&](int64_t g, int64_t row, int64_t rows) {
    // dy_g [rows, out] @ (kernel[g] stored [in, out])^T
    return Product{bytes(dy) + row * out * size,
                   bytes(kernel) + g * in * out * size,
                   bytes(dx) + row * in * size,
                   rows,
                   in,
                   out,
                   false,
                   true};
  });
}

bool grouped_wgrad_cuda(const at::Tensor& x, const at::Tensor& dy,
                        const std::vector<int64_t>& splits, const at::Tensor& dkernel) {
  const int64_t in = x.size(1), out = dy.size(1), size = x.element_size();
  return run_groups(splits, x, [&](int64_t g, int64_t row, int64_t rows) {
    // (x_g stored [rows, in])^T @ dy_g [rows, out]
    return Product{bytes(x) + row * in * size,
                   bytes(dy) + row * out * size,
                   bytes(dkernel) + g * in * out * size,
                   in,
                   out,
                   rows,
                   true,
                   false};
  });
}

}  // namespace te::nn::detail
