// CUDA FP8 kernels: casts (the device form of cuda_fp8.h's conversions, which the CPU reference
// matches bit for bit), amax, cast+transpose, and the cuBLASLt FP8 GEMM.

#include <cublasLt.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <string>

#include "te/error.h"
#include "te/kernels/fp8_cuda.h"

namespace te::fp8::cuda {

namespace {

void check(cudaError_t status, const char* what) {
  TE_CHECK(status == cudaSuccess, "fp8::cuda::", what, ": ", cudaGetErrorString(status));
}

void check(cublasStatus_t status, const char* what) {
  TE_CHECK(status == CUBLAS_STATUS_SUCCESS, "fp8::cuda::gemm: ", what, " returned cuBLAS status ",
           static_cast<int>(status),
           "; FP8 GEMMs need compute capability 8.9+, k a multiple of 16 and not E5M2 x E5M2");
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

__nv_fp8_interpretation_t interpretation(Format f) { return f == kE4M3 ? __NV_E4M3 : __NV_E5M2; }

__device__ inline uint8_t to_fp8(float v, __nv_fp8_interpretation_t f) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, f));
}

__device__ inline float from_fp8(uint8_t c, __nv_fp8_interpretation_t f) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(c), f);
  return __half2float(__half(h));
}

// max |x| as its bit pattern (integer order is float order for |x|; NaN sorts above +inf).
__device__ inline void block_amax(unsigned int mine, float* amax) {
  for (int offset = 16; offset > 0; offset /= 2) {
    mine = max(mine, __shfl_down_sync(0xffffffffu, mine, offset));
  }
  __shared__ unsigned int warp_max[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_max[warp] = mine;
  __syncthreads();
  if (warp == 0) {
    const int warps = (blockDim.x + 31) / 32;
    mine = lane < warps ? warp_max[lane] : 0u;
    for (int offset = 16; offset > 0; offset /= 2) {
      mine = max(mine, __shfl_down_sync(0xffffffffu, mine, offset));
    }
    if (lane == 0 && amax != nullptr) {
      atomicMax(reinterpret_cast<unsigned int*>(amax), mine);
    }
  }
}

__global__ void quantize_kernel(const float* in, uint8_t* out, int64_t n, const float* scale,
                                float* amax, __nv_fp8_interpretation_t f) {
  const float s = *scale;
  unsigned int top = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = in[i];
    top = max(top, __float_as_uint(v) & 0x7FFFFFFFu);
    out[i] = to_fp8(v * s, f);
  }
  block_amax(top, amax);
}

__global__ void dequantize_kernel(const uint8_t* in, float* out, int64_t n, const float* scale_inv,
                                  __nv_fp8_interpretation_t f) {
  const float s = *scale_inv;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = from_fp8(in[i], f) * s;
  }
}

constexpr int kTile = 32;

// One 32x32 tile per block (32 x 8 threads): codes written row-major and, through shared
// memory, transposed, both with coalesced stores.
__global__ void cast_transpose_kernel(const float* in, uint8_t* out, uint8_t* out_t, int64_t rows,
                                      int64_t cols, const float* scale, float* amax,
                                      __nv_fp8_interpretation_t f) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const float s = *scale;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kTile;
  unsigned int top = 0;
  for (int r = threadIdx.y; r < kTile; r += blockDim.y) {
    const int64_t row = row0 + r, col = col0 + threadIdx.x;
    if (row < rows && col < cols) {
      const float v = in[row * cols + col];
      top = max(top, __float_as_uint(v) & 0x7FFFFFFFu);
      const uint8_t c = to_fp8(v * s, f);
      out[row * cols + col] = c;
      tile[r][threadIdx.x] = c;
    }
  }
  __syncthreads();
  for (int c = threadIdx.y; c < kTile; c += blockDim.y) {
    const int64_t col = col0 + c, row = row0 + threadIdx.x;
    if (row < rows && col < cols) out_t[col * rows + row] = tile[threadIdx.x][c];
  }
  // Each warp is one threadIdx.y row of the block.
  for (int offset = 16; offset > 0; offset /= 2) {
    top = max(top, __shfl_down_sync(0xffffffffu, top, offset));
  }
  __shared__ unsigned int warp_max[8];
  const int flat = threadIdx.y * blockDim.x + threadIdx.x;
  if (flat % 32 == 0) warp_max[flat / 32] = top;
  __syncthreads();
  if (flat == 0 && amax != nullptr) {
    unsigned int m = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x * blockDim.y + 31) / 32; ++w) {
      m = max(m, warp_max[w]);
    }
    atomicMax(reinterpret_cast<unsigned int*>(amax), m);
  }
}

int blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 65535 * 8 ? (b > 0 ? b : 1) : 65535 * 8);
}

cudaDataType_t data_type(Format f) { return f == kE4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }

}  // namespace

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

bool fp8_gemm_supported() {
  if (device_count() == 0) return false;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return false;
  return prop.major * 10 + prop.minor >= 89;
}

void quantize(const float* in, uint8_t* out, int64_t n, const float* scale, float* amax,
              Format format, void* stream) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  quantize_kernel<<<blocks_for(n, kThreads), kThreads, 0, as_stream(stream)>>>(
      in, out, n, scale, amax, interpretation(format));
  check(cudaGetLastError(), "quantize");
}

void dequantize(const uint8_t* in, float* out, int64_t n, const float* scale_inv, Format format,
                void* stream) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  dequantize_kernel<<<blocks_for(n, kThreads), kThreads, 0, as_stream(stream)>>>(
      in, out, n, scale_inv, interpretation(format));
  check(cudaGetLastError(), "dequantize");
}

void cast_transpose(const float* in, uint8_t* out, uint8_t* out_t, int64_t rows, int64_t cols,
                    const float* scale, float* amax, Format format, void* stream) {
  if (rows == 0 || cols == 0) return;
  TE_CHECK((cols + kTile - 1) / kTile < (int64_t{1} << 31) && (rows + kTile - 1) / kTile < 65536,
           "fp8::cuda::cast_transpose: ", rows, " x ", cols, " is too large for one launch");
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile),
                  static_cast<unsigned>((rows + kTile - 1) / kTile));
  cast_transpose_kernel<<<grid, dim3(kTile, 8), 0, as_stream(stream)>>>(
      in, out, out_t, rows, cols, scale, amax, interpretation(format));
  check(cudaGetLastError(), "cast_transpose");
}

void gemm(const uint8_t* a, Format a_format, const float* a_scale_inv, const uint8_t* b_t,
          Format b_format, const float* b_scale_inv, float* d, int64_t m, int64_t n, int64_t k,
          void* stream) {
  TE_CHECK(!(a_format == kE5M2 && b_format == kE5M2),
           "fp8::cuda::gemm: E5M2 x E5M2 has no FP8 tensor-core GEMM; cast one operand to E4M3");
  // Row-major D[m, n] = A[m, k] B[k, n] is column-major D^T[n, m] = (B^T)[n, k] A^T[k, m]. FP8
  // cuBLASLt takes only the "TN" form: the first operand transposed, stored [n, k] row-major
  // (b_t, B transposed), the second as is (A's rows are the columns of A^T).
  // One handle per thread and device, kept for the thread's life (creating one costs more than
  // a small GEMM).
  int device = 0;
  check(cudaGetDevice(&device), "gemm (cudaGetDevice)");
  thread_local cublasLtHandle_t handles[64] = {};
  TE_CHECK(device < 64, "fp8::cuda::gemm: device ", device, " is beyond the 64 supported");
  if (handles[device] == nullptr) check(cublasLtCreate(&handles[device]), "cublasLtCreate");
  cublasLtHandle_t handle = handles[device];
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  void* workspace = nullptr;
  constexpr size_t kWorkspace = 32u << 20;
  auto cleanup = [&] {
    if (workspace != nullptr) cudaFreeAsync(workspace, as_stream(stream));
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
    if (lc != nullptr) cublasLtMatrixLayoutDestroy(lc);
    if (lb != nullptr) cublasLtMatrixLayoutDestroy(lb);
    if (la != nullptr) cublasLtMatrixLayoutDestroy(la);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  };
  try {
    check(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
    const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa),
          "TRANSA");
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb),
          "TRANSB");
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale_inv,
                                         sizeof b_scale_inv),
          "A_SCALE_POINTER");
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale_inv,
                                         sizeof a_scale_inv),
          "B_SCALE_POINTER");
    check(cublasLtMatrixLayoutCreate(&la, data_type(b_format), k, n, k), "layout A");
    check(cublasLtMatrixLayoutCreate(&lb, data_type(a_format), k, m, k), "layout B");
    check(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, n, m, n), "layout D");
    check(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
    check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                               &kWorkspace, sizeof kWorkspace),
          "workspace preference");
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    check(cublasLtMatmulAlgoGetHeuristic(handle, op, la, lb, lc, lc, pref, 1, &heuristic, &found),
          "AlgoGetHeuristic");
    TE_CHECK(found > 0, "fp8::cuda::gemm: cuBLASLt has no FP8 algorithm for ", m, " x ", n, " x ",
             k, "; k and n must be multiples of 16 on sm_89+");
    check(cudaMallocAsync(&workspace, kWorkspace, as_stream(stream)), "workspace");
    const float alpha = 1.0f, beta = 0.0f;
    check(cublasLtMatmul(handle, op, &alpha, b_t, la, a, lb, &beta, d, lc, d, lc, &heuristic.algo,
                         workspace, kWorkspace, as_stream(stream)),
          "cublasLtMatmul");
  } catch (...) {
    cleanup();
    throw;
  }
  cleanup();
}

}  // namespace te::fp8::cuda
