// CUDA FP8 kernels: casts (the device form of cuda_fp8.h's conversions, which the CPU reference
// matches bit for bit), amax, cast+transpose, and the cuBLASLt FP8 GEMM.

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_common.cuh"
#include "te/error.h"
#include "te/kernels/fp8_cuda.h"

namespace te::fp8::cuda {

namespace {

using namespace detail;  // cuda_common.cuh
using detail::check;     // beside the cuBLAS overload below

void check(cublasStatus_t status, const char* what) {
  TE_CHECK(status == CUBLAS_STATUS_SUCCESS, "fp8::cuda::gemm: ", what, " returned cuBLAS status ",
           static_cast<int>(status),
           "; FP8 GEMMs need compute capability 8.9+, k a multiple of 16 and not E5M2 x E5M2");
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

// The input element types (Real) as fp32.
__device__ inline float widen(float v) { return v; }
__device__ inline float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline float widen(__half v) { return __half2float(v); }

template <typename T>
__global__ void quantize_kernel(const T* in, uint8_t* out, int64_t n, const float* scale,
                                float* amax, __nv_fp8_interpretation_t f) {
  const float s = *scale;
  unsigned int top = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = widen(in[i]);
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

// cast_transpose: a 64 x 64 tile per block of 256 threads (16 x 16). Each thread casts 4
// consecutive elements of 4 rows (one vector load, one 4-byte store of codes each), keeps the
// codes in shared memory, and writes 4 bytes of the transpose (the codes of 4 consecutive rows in
// one column), so both outputs go out in 64-byte row segments. A tile at a ragged edge, or a
// shape whose rows or cols are not multiples of 4, takes the element-wise path. (A 32 x 32 tile
// of single-byte stores ran at 0.28 TB/s on the H200: 238 us for 4096 x 4096 fp32.)
constexpr int kTile = 64, kSide = 16, kVec = 4;

template <typename T>
struct alignas(sizeof(T) * kVec) Vec {
  T v[kVec];
};

template <typename T>
__global__ void cast_transpose_kernel(const T* in, uint8_t* out, uint8_t* out_t, int64_t rows,
                                      int64_t cols, const float* scale, float* amax,
                                      __nv_fp8_interpretation_t f, bool vectors) {
  __shared__ uint8_t tile[kTile][kTile + 4];  // +4: the transpose's reads spread over banks
  const float s = *scale;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;
  const bool whole = vectors && row0 + kTile <= rows && col0 + kTile <= cols;
  unsigned int top = 0;
  if (whole) {
    for (int r = ty; r < kTile; r += kSide) {
      const int64_t at = (row0 + r) * cols + col0 + tx * kVec;
      const Vec<T> x = *reinterpret_cast<const Vec<T>*>(in + at);
      uint32_t packed = 0;
      for (int j = 0; j < kVec; ++j) {
        const float v = widen(x.v[j]);
        top = max(top, __float_as_uint(v) & 0x7FFFFFFFu);
        const uint8_t c = to_fp8(v * s, f);
        tile[r][tx * kVec + j] = c;
        packed |= static_cast<uint32_t>(c) << (8 * j);
      }
      *reinterpret_cast<uint32_t*>(out + at) = packed;
    }
  } else {
    for (int i = threadIdx.x; i < kTile * kTile; i += blockDim.x) {
      const int r = i / kTile, c = i % kTile;
      const int64_t row = row0 + r, col = col0 + c;
      if (row < rows && col < cols) {
        const float v = widen(in[row * cols + col]);
        top = max(top, __float_as_uint(v) & 0x7FFFFFFFu);
        const uint8_t code = to_fp8(v * s, f);
        out[row * cols + col] = code;
        tile[r][c] = code;
      }
    }
  }
  __syncthreads();
  if (whole) {
    for (int c = ty; c < kTile; c += kSide) {
      uint32_t packed = 0;
      for (int j = 0; j < kVec; ++j) {
        packed |= static_cast<uint32_t>(tile[tx * kVec + j][c]) << (8 * j);
      }
      *reinterpret_cast<uint32_t*>(out_t + (col0 + c) * rows + row0 + tx * kVec) = packed;
    }
  } else {
    for (int i = threadIdx.x; i < kTile * kTile; i += blockDim.x) {
      const int c = i / kTile, r = i % kTile;
      const int64_t row = row0 + r, col = col0 + c;
      if (row < rows && col < cols) out_t[col * rows + row] = tile[r][c];
    }
  }
  block_amax(top, amax);
}

template <typename Launch>
void by_real(Real type, const Launch& launch) {
  switch (type) {
    case kFloat32:
      return launch(float{});
    case kBFloat16:
      return launch(__nv_bfloat16{});
    case kFloat16:
      return launch(__half{});
  }
  TE_FAIL("fp8::cuda: element type ", static_cast<int>(type), " is not fp32, bf16 or fp16");
}

cudaDataType_t data_type(Format f) { return f == kE4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }
cudaDataType_t data_type(Real r) {
  return r == kFloat32 ? CUDA_R_32F : r == kBFloat16 ? CUDA_R_16BF : CUDA_R_16F;
}

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

void quantize(const void* in, Real in_type, uint8_t* out, int64_t n, const float* scale,
              float* amax, Format format, void* stream) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  by_real(in_type, [&](auto zero) {
    using T = decltype(zero);
    quantize_kernel<<<blocks_for(n, kThreads), kThreads, 0, as_stream(stream)>>>(
        static_cast<const T*>(in), out, n, scale, amax, interpretation(format));
  });
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

void cast_transpose(const void* in, Real in_type, uint8_t* out, uint8_t* out_t, int64_t rows,
                    int64_t cols, const float* scale, float* amax, Format format, void* stream) {
  if (rows == 0 || cols == 0) return;
  TE_CHECK((cols + kTile - 1) / kTile < (int64_t{1} << 31) && (rows + kTile - 1) / kTile < 65536,
           "fp8::cuda::cast_transpose: ", rows, " x ", cols, " is too large for one launch");
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile),
                  static_cast<unsigned>((rows + kTile - 1) / kTile));
  const auto aligned = [](const void* p, size_t bytes) {
    return reinterpret_cast<uintptr_t>(p) % bytes == 0;
  };
  by_real(in_type, [&](auto zero) {
    using T = decltype(zero);
    const bool vectors = rows % kVec == 0 && cols % kVec == 0 && aligned(in, sizeof(T) * kVec) &&
                         aligned(out, 4) && aligned(out_t, 4);
    cast_transpose_kernel<<<grid, kSide * kSide, 0, as_stream(stream)>>>(
        static_cast<const T*>(in), out, out_t, rows, cols, scale, amax, interpretation(format),
        vectors);
  });
  check(cudaGetLastError(), "cast_transpose");
}

namespace {

// The alignment cuBLASLt may assume of a pointer: the largest power of two dividing its address,
// up to 256 bytes. Told to the heuristic, so it never picks a kernel for a better alignment.
uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && address % a != 0) a /= 2;
  return a;
}

// One GEMM shape's cuBLASLt plan: its descriptors and the algorithm the heuristic chose, made
// once per (device, shape, formats, accumulation, alignments) and kept for the thread's life.
struct PlanKey {
  int device;
  int64_t m, n, k;
  int a_format, b_format, d_type;
  bool fast_accumulation;
  uint32_t align_a, align_b, align_d;
  bool operator<(const PlanKey& o) const {
    return std::tie(device, m, n, k, a_format, b_format, d_type, fast_accumulation, align_a,
                    align_b, align_d) < std::tie(o.device, o.m, o.n, o.k, o.a_format, o.b_format,
                                                 o.d_type, o.fast_accumulation, o.align_a,
                                                 o.align_b, o.align_d);
  }
};

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  // The heuristic's algorithms, best first. cuBLASLt may still answer NOT_SUPPORTED when one
  // runs (seen on the H200 at 4096^3 with cuBLAS 13); the first call walks down the list and
  // the plan keeps the first that runs.
  std::vector<cublasLtMatmulAlgo_t> algos;
  size_t chosen = 0;
  bool confirmed = false;
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (ld != nullptr) cublasLtMatrixLayoutDestroy(ld);
    if (lb != nullptr) cublasLtMatrixLayoutDestroy(lb);
    if (la != nullptr) cublasLtMatrixLayoutDestroy(la);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

constexpr size_t kWorkspace = 32u << 20;  // what cuBLASLt's Hopper kernels ask for at most

// One thread's handle, plans and workspaces on one device (creating a handle costs more than a
// small GEMM; a workspace per call cost an allocation and a free). One workspace per stream:
// GEMMs queued on two streams must not share one. A thread takes a state from a process-wide
// pool on first use and gives it back when it ends, so threads that come and go (thread ranks,
// server workers) reuse states instead of leaking them; the pool is never destroyed, since at
// exit the CUDA context may be gone before static destructors run (LibTorch's cuBLAS handle pool
// does the same).
struct DeviceState {
  int device = 0;
  cublasLtHandle_t handle = nullptr;
  std::map<cudaStream_t, void*> workspaces;
  std::map<cudaStream_t, float*> scale_slots;  // two 256-byte aligned floats per stream
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
};

struct StatePool {
  std::mutex mutex;
  std::vector<DeviceState*> idle;
};
StatePool& state_pool() {
  static auto* pool = new StatePool();
  return *pool;
}

// This thread's states, one per device, returned to the pool at thread exit.
struct ThreadStates {
  std::map<int, DeviceState*> by_device;
  ~ThreadStates() {
    StatePool& pool = state_pool();
    std::lock_guard<std::mutex> lock(pool.mutex);
    for (auto& [device, st] : by_device) pool.idle.push_back(st);
  }
};

DeviceState& device_state(int device) {
  thread_local ThreadStates mine;
  DeviceState*& st = mine.by_device[device];
  if (st == nullptr) {
    StatePool& pool = state_pool();
    std::lock_guard<std::mutex> lock(pool.mutex);
    const auto it = std::find_if(pool.idle.begin(), pool.idle.end(),
                                 [device](const DeviceState* s) { return s->device == device; });
    if (it != pool.idle.end()) {
      st = *it;
      pool.idle.erase(it);
    } else {
      st = new DeviceState();
      st->device = device;
    }
  }
  if (st->handle == nullptr) check(cublasLtCreate(&st->handle), "cublasLtCreate");
  return *st;
}

void* workspace_for(DeviceState& st, cudaStream_t stream) {
  void*& w = st.workspaces[stream];
  if (w == nullptr) check(cudaMalloc(&w, kWorkspace), "workspace");
  return w;
}

// cuBLASLt's FP8 GEMMs answered NOT_SUPPORTED for every algorithm on the H200 (cuBLAS 13) when
// a scale pointer was only 4-byte aligned (one float of a packed buffer, as bench_gemm_cuda
// passed them). A scale not 16-byte aligned is copied, in stream order, into one of the
// stream's own aligned slots first.
const float* aligned_scale(DeviceState& st, cudaStream_t stream, const float* scale, int slot) {
  if (reinterpret_cast<uintptr_t>(scale) % 16 == 0) return scale;
  float*& slots = st.scale_slots[stream];
  if (slots == nullptr) check(cudaMalloc(&slots, 512), "scale slots");
  float* dst = slots + 64 * slot;
  check(cudaMemcpyAsync(dst, scale, sizeof(float), cudaMemcpyDeviceToDevice, stream),
        "gemm (staging a scale)");
  return dst;
}

void set_scales(Plan& plan, const float* a_scale_inv, const float* b_scale_inv) {
  // cuBLASLt's A is our b_t, its B our a.
  check(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale_inv,
                                       sizeof b_scale_inv),
        "A_SCALE_POINTER");
  check(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale_inv,
                                       sizeof a_scale_inv),
        "B_SCALE_POINTER");
}

// The scale pointers of the first call are set before the heuristic runs, as TE does
// (common/gemm/cublaslt_gemm.cu at d0067d0da): the algorithms it offers are those for scaled
// FP8 operands.
Plan& plan_for(DeviceState& st, const PlanKey& key, const float* a_scale_inv,
               const float* b_scale_inv) {
  auto& slot = st.plans[key];
  if (slot) return *slot;
  auto plan = std::make_unique<Plan>();
  cublasLtMatmulPreference_t pref = nullptr;
  try {
    check(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
    const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &transa,
                                         sizeof transa),
          "TRANSA");
    check(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &transb,
                                         sizeof transb),
          "TRANSB");
    // Fast accumulation keeps the tensor cores' FP8 accumulator over the whole reduction; off,
    // partial sums are promoted to fp32. TE (d0067d0da) turns it on for fprop and off for dgrad
    // and wgrad: pytorch/module/base.py:83-85 (_2X_ACC_FPROP = False, _2X_ACC_DGRAD/WGRAD =
    // True), applied as FAST_ACCUM = !use_split_accumulator in common/gemm/cublaslt_gemm.cu:478.
    const int8_t fast = key.fast_accumulation ? 1 : 0;
    check(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast,
                                         sizeof fast),
          "FAST_ACCUM");
    const auto n = static_cast<uint64_t>(key.n), m = static_cast<uint64_t>(key.m),
               k = static_cast<uint64_t>(key.k);
    set_scales(*plan, a_scale_inv, b_scale_inv);
    check(cublasLtMatrixLayoutCreate(&plan->la, data_type(static_cast<Format>(key.b_format)), k, n,
                                     static_cast<int64_t>(k)),
          "layout A");
    check(cublasLtMatrixLayoutCreate(&plan->lb, data_type(static_cast<Format>(key.a_format)), k, m,
                                     static_cast<int64_t>(k)),
          "layout B");
    check(cublasLtMatrixLayoutCreate(&plan->ld, data_type(static_cast<Real>(key.d_type)), n, m,
                                     static_cast<int64_t>(n)),
          "layout D");
    check(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
    check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                               &kWorkspace, sizeof kWorkspace),
          "workspace preference");
    // cuBLASLt's A is our b_t, its B our a.
    // C is D (beta 0).
    const uint32_t aligns[4] = {key.align_b, key.align_a, key.align_d, key.align_d};
    const cublasLtMatmulPreferenceAttributes_t names[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; ++i) {
      check(cublasLtMatmulPreferenceSetAttribute(pref, names[i], &aligns[i], sizeof aligns[i]),
            "alignment preference");
    }
    constexpr int kAsk = 8;
    cublasLtMatmulHeuristicResult_t heuristic[kAsk] = {};
    int found = 0;
    check(cublasLtMatmulAlgoGetHeuristic(st.handle, plan->op, plan->la, plan->lb, plan->ld,
                                         plan->ld, pref, kAsk, heuristic, &found),
          "AlgoGetHeuristic");
    for (int i = 0; i < found; ++i) {
      if (heuristic[i].state == CUBLAS_STATUS_SUCCESS && heuristic[i].workspaceSize <= kWorkspace) {
        plan->algos.push_back(heuristic[i].algo);
      }
    }
    TE_CHECK(!plan->algos.empty(), "fp8::cuda::gemm: cuBLASLt has no FP8 algorithm for ", key.m,
             " x ", key.n, " x ", key.k, " with operands aligned to ", key.align_a, " and ",
             key.align_b, " bytes; k and n must be multiples of 16 on sm_89+");
  } catch (...) {
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
    throw;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  slot = std::move(plan);
  return *slot;
}

}  // namespace

void gemm(const uint8_t* a, Format a_format, const float* a_scale_inv, const uint8_t* b_t,
          Format b_format, const float* b_scale_inv, void* d, Real d_type, int64_t m, int64_t n,
          int64_t k, bool fast_accumulation, void* stream) {
  TE_CHECK(!(a_format == kE5M2 && b_format == kE5M2),
           "fp8::cuda::gemm: E5M2 x E5M2 has no FP8 tensor-core GEMM; cast one operand to E4M3");
  TE_CHECK(k % 16 == 0 && n % 16 == 0, "fp8::cuda::gemm: ", m, " x ", n, " x ", k,
           ": FP8 cuBLASLt needs k and n to be multiples of 16 (rows of 16 bytes)");
  // Row-major D[m, n] = A[m, k] B[k, n] is column-major D^T[n, m] = (B^T)[n, k] A^T[k, m]. FP8
  // cuBLASLt takes only the "TN" form: the first operand transposed, stored [n, k] row-major
  // (b_t, B transposed), the second as is (A's rows are the columns of A^T).
  int device = 0;
  check(cudaGetDevice(&device), "gemm (cudaGetDevice)");
  DeviceState& st = device_state(device);
  const PlanKey key{device,
                    m,
                    n,
                    k,
                    a_format,
                    b_format,
                    d_type,
                    fast_accumulation,
                    alignment_of(a),
                    alignment_of(b_t),
                    alignment_of(d)};
  a_scale_inv = aligned_scale(st, as_stream(stream), a_scale_inv, 0);
  b_scale_inv = aligned_scale(st, as_stream(stream), b_scale_inv, 1);
  Plan& plan = plan_for(st, key, a_scale_inv, b_scale_inv);
  // The scales are pointers, set per call: the plan is shared by every call of its shape.
  set_scales(plan, a_scale_inv, b_scale_inv);
  const float alpha = 1.0f, beta = 0.0f;
  void* workspace = workspace_for(st, as_stream(stream));
  for (;;) {
    const cublasStatus_t status =
        cublasLtMatmul(st.handle, plan.op, &alpha, b_t, plan.la, a, plan.lb, &beta, d, plan.ld, d,
                       plan.ld, &plan.algos[plan.chosen], workspace, kWorkspace, as_stream(stream));
    // NOT_SUPPORTED launches nothing: the next algorithm may run.
    if (status == CUBLAS_STATUS_NOT_SUPPORTED && !plan.confirmed &&
        plan.chosen + 1 < plan.algos.size()) {
      ++plan.chosen;
      continue;
    }
    if (status != CUBLAS_STATUS_SUCCESS && !plan.confirmed) {
      TE_FAIL("fp8::cuda::gemm: cublasLtMatmul returned cuBLAS status ", static_cast<int>(status),
              " for ", m, " x ", n, " x ", k, " with each of the heuristic's ", plan.algos.size(),
              " algorithms; FP8 GEMMs need compute capability 8.9+, k a multiple of 16 and not "
              "E5M2 x E5M2");
    }
    check(status, "cublasLtMatmul");
    plan.confirmed = true;
    return;
  }
}

}  // namespace te::fp8::cuda
