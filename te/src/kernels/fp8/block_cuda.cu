// CUDA block-scaled casts: Float8BlockScaling (1x128 blocks, 128x128 tiles), MXFP8 (1x32, E8M0)
// and NVFP4 (E2M1 codes, E4M3 scales per 1x16 block or 16x16 tile, an fp32 tensor scale,
// stochastic rounding, the wgrad Hadamard transform), their inverses and the NaN-skipping amax.
// The device form of the CPU reference in te/src/fp8/{block,mxfp8,nvfp4}.cpp: the scalar rules
// are the same functions (te/kernels/fp8_cast.h, fp4_cast.h, compiled for both), the FP8
// conversions cuda_fp8.h's, which the CPU casts equal bit for bit.
//
// Layout of the work: a 1-D block (1x32, 1x128) is one warp, each lane a strided share of its
// elements, the amax folded by shuffles; a square tile (128x128, 16x16) one thread block (or
// warp), the amax folded through shared memory; NVFP4's 1x16 blocks one thread each.

#include <cfloat>
#include <cstdint>

#include "../random/philox_core.h"
#include "cuda_common.cuh"
#include "te/error.h"
#include "te/kernels/fp4_cast.h"
#include "te/kernels/fp8_cast.h"
#include "te/kernels/fp8_cuda.h"

namespace te::fp8::cuda {

namespace {

using namespace detail;  // cuda_common.cuh

constexpr int kWarp = 32;
constexpr int kThreads = 256;

__device__ inline float warp_max(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// The whole thread block's max (every thread gets it); fmaxf, so a NaN is skipped.
__device__ inline float block_max(float v) {
  __shared__ float partial[kThreads / kWarp];
  __shared__ float result;
  v = warp_max(v);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float m = lane < static_cast<int>(blockDim.x) / kWarp ? partial[lane] : 0.0f;
    m = warp_max(m);
    if (lane == 0) result = m;
  }
  __syncthreads();
  return result;
}

// What a block's amax turns into: the factor its elements are multiplied by before the cast,
// with the scale it stores.
struct Fp8BlockRule {
  float fp8_max;
  bool mx, power_2;
  float epsilon;
  __device__ float factor(float amax, float* scale_inv, uint8_t* e8m0) const {
    if (mx) {
      const uint8_t e = e8m0_round_up(amax * static_cast<float>(1.0 / fp8_max));
      *e8m0 = e;
      return e8m0_reciprocal(e);
    }
    const float scale = scale_from_amax(amax, fp8_max, power_2, epsilon);
    *scale_inv = 1.0f / scale;
    return scale;
  }
};

// 1-D blocks of `width` (32 or 128) along the rows: one warp a block.
__global__ void quantize_rows_kernel(const float* in, uint8_t* codes, float* scale_inv,
                                     uint8_t* e8m0, int64_t rows, int64_t cols, int width,
                                     Fp8BlockRule rule, __nv_fp8_interpretation_t f) {
  const int64_t nb = (cols + width - 1) / width;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  const int lane = threadIdx.x % kWarp;
  for (int64_t blk = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
       blk < rows * nb; blk += warps) {
    const int64_t r = blk / nb, c0 = (blk % nb) * width;
    const int64_t c1 = c0 + width < cols ? c0 + width : cols;
    const float* x = in + r * cols;
    float amax = 0.0f;
    for (int64_t c = c0 + lane; c < c1; c += kWarp) amax = fmaxf(amax, fabsf(x[c]));
    amax = warp_max(amax);
    float s_inv = 0.0f;
    uint8_t e = 0;
    const float factor = rule.factor(amax, &s_inv, &e);
    if (lane == 0) {
      if (rule.mx) {
        e8m0[blk] = e;
      } else {
        scale_inv[blk] = s_inv;
      }
    }
    for (int64_t c = c0 + lane; c < c1; c += kWarp) codes[r * cols + c] = to_fp8(x[c] * factor, f);
  }
}

// 128x128 tiles: one thread block a tile.
__global__ void quantize_tiles_kernel(const float* in, uint8_t* codes, float* scale_inv,
                                      int64_t rows, int64_t cols, int tile, Fp8BlockRule rule,
                                      __nv_fp8_interpretation_t f) {
  const int64_t nb = (cols + tile - 1) / tile;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * tile, c0 = blockIdx.x * int64_t{tile};
  const int64_t r1 = r0 + tile < rows ? r0 + tile : rows, c1 = c0 + tile < cols ? c0 + tile : cols;
  const int64_t w = c1 - c0, n = (r1 - r0) * w;
  float amax = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    amax = fmaxf(amax, fabsf(in[(r0 + i / w) * cols + c0 + i % w]));
  }
  amax = block_max(amax);
  float s_inv = 0.0f;
  uint8_t unused = 0;
  const float factor = rule.factor(amax, &s_inv, &unused);
  if (threadIdx.x == 0) scale_inv[blockIdx.y * nb + blockIdx.x] = s_inv;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t at = (r0 + i / w) * cols + c0 + i % w;
    codes[at] = to_fp8(in[at] * factor, f);
  }
}

__global__ void fold_amax_kernel(const float* in, int64_t n, float* amax) {
  float m = 0.0f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    m = fmaxf(m, fabsf(in[i]));
  }
  m = block_max(m);
  // Non-negative floats order as their bit patterns; *amax is never NaN here either.
  if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned int*>(amax), __float_as_uint(m));
}

// NVFP4's per-tensor factors, from the tensor amax.
struct Nvfp4Rule {
  float s_dec, block_factor;
  __device__ explicit Nvfp4Rule(float amax) {
    const float s_enc = nvfp4_encode_scale(amax);
    s_dec = 1.0f / s_enc;
    block_factor = s_enc * (1.0f / kE2M1Max);
  }
  // A block's E4M3 scale and the factor its elements are multiplied by.
  __device__ float encode(float block_amax, uint8_t* scale) const {
    const float v = fminf(block_amax * block_factor, FLT_MAX);
    const uint8_t code = to_fp8(v, __NV_E4M3);
    *scale = code;
    return fminf(1.0f / (from_fp8(code, __NV_E4M3) * s_dec), FLT_MAX);
  }
};

// Round to nearest even, or stochastically with element g's Philox word (te/kernels/philox.h's
// mapping: lane g % 4 of the block at counter g / 4), each block of 4 words computed once.
struct Rounding {
  bool stochastic;
  uint64_t seed, call;
};

// `len` (even) elements from x times `factor`, packed two a byte into y; x[0] is element g.
__device__ inline void nvfp4_pack(const float* x, uint8_t* y, int len, float factor, uint64_t g,
                                  const Rounding& rounding) {
  uint32_t words[4];
  uint64_t block = ~uint64_t{0};
  const auto code = [&](float v, uint64_t e) -> uint32_t {
    if (!rounding.stochastic) return e2m1_code(v);
    if (e / 4 != block) {
      block = e / 4;
      kernels::philox::block_words(block, rounding.seed, rounding.call, words);
    }
    return e2m1_round_stochastic(v, words[e % 4]);
  };
  for (int c = 0; c < len; c += 2) {
    const uint32_t lo = code(x[c] * factor, g + c);
    const uint32_t hi = code(x[c + 1] * factor, g + c + 1);
    y[c / 2] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

// 1x16 blocks: one thread a block.
__global__ void nvfp4_rows_kernel(const float* in, uint8_t* packed, uint8_t* scales, int64_t rows,
                                  int64_t cols, const float* tensor_amax, Rounding rounding) {
  const Nvfp4Rule rule(*tensor_amax);
  const int64_t nb = (cols + 15) / 16;
  for (int64_t blk = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; blk < rows * nb;
       blk += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = blk / nb, c0 = (blk % nb) * 16;
    const int len = static_cast<int>(c0 + 16 < cols ? 16 : cols - c0);
    const float* x = in + r * cols + c0;
    float amax = 0.0f;
    for (int c = 0; c < len; ++c) amax = fmaxf(amax, fabsf(x[c]));
    const float factor = rule.encode(amax, &scales[blk]);
    nvfp4_pack(x, packed + r * (cols / 2) + c0 / 2, len, factor,
               static_cast<uint64_t>(r * cols + c0), rounding);
  }
}

// 16x16 tiles: one warp a tile, each lane half a row (8 elements).
__global__ void nvfp4_tiles_kernel(const float* in, uint8_t* packed, uint8_t* scales, int64_t rows,
                                   int64_t cols, const float* tensor_amax, Rounding rounding) {
  const Nvfp4Rule rule(*tensor_amax);
  const int64_t nb = (cols + 15) / 16, nt = ((rows + 15) / 16) * nb;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  const int lane = threadIdx.x % kWarp;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
       t < nt; t += warps) {
    const int64_t r = (t / nb) * 16 + lane / 2, c0 = (t % nb) * 16 + (lane % 2) * 8;
    const int len = r < rows && c0 < cols ? static_cast<int>(c0 + 8 < cols ? 8 : cols - c0) : 0;
    const float* x = in + r * cols + c0;
    float amax = 0.0f;
    for (int c = 0; c < len; ++c) amax = fmaxf(amax, fabsf(x[c]));
    amax = warp_max(amax);
    uint8_t scale = 0;
    const float factor = rule.encode(amax, &scale);
    if (lane == 0) scales[t] = scale;
    if (len > 0) {
      nvfp4_pack(x, packed + r * (cols / 2) + c0 / 2, len, factor,
                 static_cast<uint64_t>(r * cols + c0), rounding);
    }
  }
}

__global__ void dequantize_blocks_kernel(const uint8_t* codes, const float* scale_inv,
                                         const uint8_t* e8m0, float* out, int64_t rows,
                                         int64_t cols, int tile_rows, int width,
                                         __nv_fp8_interpretation_t f) {
  const int64_t nb = (cols + width - 1) / width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * cols;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t s = (i / cols / tile_rows) * nb + (i % cols) / width;
    out[i] = from_fp8(codes[i], f) * (e8m0 != nullptr ? e8m0_to_float(e8m0[s]) : scale_inv[s]);
  }
}

__global__ void dequantize_nvfp4_kernel(const uint8_t* packed, const uint8_t* scales,
                                        const float* tensor_amax, float* out, int64_t rows,
                                        int64_t cols, int tile_rows) {
  const float amax = *tensor_amax;
  const int64_t nb = (cols + 15) / 16;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * cols;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const float final_scale =
        from_fp8(scales[(r / tile_rows) * nb + c / 16], __NV_E4M3) * amax * (1.0f / kNvfp4Max);
    const uint8_t byte = packed[r * (cols / 2) + c / 2];
    out[i] = e2m1_to_float(static_cast<uint8_t>(c % 2 ? byte >> 4 : byte & 0xF)) * final_scale;
  }
}

// Each output the CPU reference's sum, in its order, each step rounded (no fused multiply-add).
__global__ void hadamard16_kernel(const float* in, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float* v = in + (i / 16) * 16;
    const int j = static_cast<int>(i % 16);
    float acc = 0.0f;
    for (int k = 0; k < 16; ++k) acc = __fadd_rn(acc, __fmul_rn(v[k], hadamard16_entry(k, j)));
    out[i] = acc;
  }
}

void check_shape(int64_t rows, int64_t cols, const char* what) {
  TE_CHECK(rows >= 0 && cols >= 0, "fp8::cuda::", what, ": a ", rows, " x ", cols, " matrix");
}

}  // namespace

void quantize_blocks(const float* in, uint8_t* codes, float* scale_inv, int64_t rows, int64_t cols,
                     int tile_rows, Format format, bool power_2, float epsilon, void* stream) {
  check_shape(rows, cols, "quantize_blocks");
  TE_CHECK(tile_rows == 1 || tile_rows == 128, "fp8::cuda::quantize_blocks: tile_rows ", tile_rows,
           "; Float8BlockScaling has 1x128 blocks (1) and 128x128 tiles (128)");
  if (rows == 0 || cols == 0) return;
  const Fp8BlockRule rule{format == kE4M3 ? 448.0f : 57344.0f, false, power_2, epsilon};
  if (tile_rows == 1) {
    const int64_t nb = (cols + 127) / 128;
    quantize_rows_kernel<<<blocks_for(rows * nb * kWarp, kThreads), kThreads, 0,
                           as_stream(stream)>>>(in, codes, scale_inv, nullptr, rows, cols, 128,
                                                rule, interpretation(format));
  } else {
    TE_CHECK((rows + 127) / 128 < 65536 && (cols + 127) / 128 < (int64_t{1} << 31),
             "fp8::cuda::quantize_blocks: ", rows, " x ", cols, " is too large for one launch");
    const dim3 grid(static_cast<unsigned>((cols + 127) / 128),
                    static_cast<unsigned>((rows + 127) / 128));
    quantize_tiles_kernel<<<grid, kThreads, 0, as_stream(stream)>>>(
        in, codes, scale_inv, rows, cols, 128, rule, interpretation(format));
  }
  check(cudaGetLastError(), "quantize_blocks");
}

void quantize_mx(const float* in, uint8_t* codes, uint8_t* scales, int64_t rows, int64_t cols,
                 Format format, void* stream) {
  check_shape(rows, cols, "quantize_mx");
  if (rows == 0 || cols == 0) return;
  const Fp8BlockRule rule{format == kE4M3 ? 448.0f : 57344.0f, true, false, 0.0f};
  const int64_t nb = (cols + 31) / 32;
  quantize_rows_kernel<<<blocks_for(rows * nb * kWarp, kThreads), kThreads, 0, as_stream(stream)>>>(
      in, codes, nullptr, scales, rows, cols, 32, rule, interpretation(format));
  check(cudaGetLastError(), "quantize_mx");
}

void fold_amax(const float* in, int64_t n, float* amax, void* stream) {
  if (n == 0) return;
  fold_amax_kernel<<<blocks_for(n, kThreads), kThreads, 0, as_stream(stream)>>>(in, n, amax);
  check(cudaGetLastError(), "fold_amax");
}

void quantize_nvfp4(const float* in, uint8_t* packed, uint8_t* scales, int64_t rows, int64_t cols,
                    int tile_rows, const float* amax, bool stochastic, uint64_t seed, uint64_t call,
                    void* stream) {
  check_shape(rows, cols, "quantize_nvfp4");
  TE_CHECK(tile_rows == 1 || tile_rows == 16, "fp8::cuda::quantize_nvfp4: tile_rows ", tile_rows,
           "; NVFP4 has 1x16 blocks (1) and 16x16 tiles (16)");
  TE_CHECK(cols % 2 == 0, "fp8::cuda::quantize_nvfp4: ", cols,
           " columns; NVFP4 packs two codes a byte along them, so they must be even");
  if (rows == 0 || cols == 0) return;
  const Rounding rounding{stochastic, seed, call};
  const int64_t nb = (cols + 15) / 16;
  if (tile_rows == 1) {
    nvfp4_rows_kernel<<<blocks_for(rows * nb, kThreads), kThreads, 0, as_stream(stream)>>>(
        in, packed, scales, rows, cols, amax, rounding);
  } else {
    const int64_t tiles = ((rows + 15) / 16) * nb;
    nvfp4_tiles_kernel<<<blocks_for(tiles * kWarp, kThreads), kThreads, 0, as_stream(stream)>>>(
        in, packed, scales, rows, cols, amax, rounding);
  }
  check(cudaGetLastError(), "quantize_nvfp4");
}

void dequantize_blocks(const uint8_t* codes, const float* scale_inv, float* out, int64_t rows,
                       int64_t cols, int tile_rows, int width, Format format, void* stream) {
  check_shape(rows, cols, "dequantize_blocks");
  TE_CHECK(tile_rows > 0 && width > 0, "fp8::cuda::dequantize_blocks: blocks of ", tile_rows, " x ",
           width);
  if (rows == 0 || cols == 0) return;
  dequantize_blocks_kernel<<<blocks_for(rows * cols, kThreads), kThreads, 0, as_stream(stream)>>>(
      codes, scale_inv, nullptr, out, rows, cols, tile_rows, width, interpretation(format));
  check(cudaGetLastError(), "dequantize_blocks");
}

void dequantize_mx(const uint8_t* codes, const uint8_t* scales, float* out, int64_t rows,
                   int64_t cols, Format format, void* stream) {
  check_shape(rows, cols, "dequantize_mx");
  if (rows == 0 || cols == 0) return;
  dequantize_blocks_kernel<<<blocks_for(rows * cols, kThreads), kThreads, 0, as_stream(stream)>>>(
      codes, nullptr, scales, out, rows, cols, 1, 32, interpretation(format));
  check(cudaGetLastError(), "dequantize_mx");
}

void dequantize_nvfp4(const uint8_t* packed, const uint8_t* scales, const float* amax, float* out,
                      int64_t rows, int64_t cols, int tile_rows, void* stream) {
  check_shape(rows, cols, "dequantize_nvfp4");
  TE_CHECK((tile_rows == 1 || tile_rows == 16) && cols % 2 == 0,
           "fp8::cuda::dequantize_nvfp4: ", rows, " x ", cols, " in tiles of ", tile_rows,
           " rows; NVFP4 has 1x16 blocks and 16x16 tiles of an even number of columns");
  if (rows == 0 || cols == 0) return;
  dequantize_nvfp4_kernel<<<blocks_for(rows * cols, kThreads), kThreads, 0, as_stream(stream)>>>(
      packed, scales, amax, out, rows, cols, tile_rows);
  check(cudaGetLastError(), "dequantize_nvfp4");
}

void hadamard16(const float* in, float* out, int64_t rows, int64_t cols, void* stream) {
  check_shape(rows, cols, "hadamard16");
  TE_CHECK(cols % 16 == 0, "fp8::cuda::hadamard16: ", cols,
           " columns; the transform takes blocks of 16 (pad the columns first)");
  if (rows == 0 || cols == 0) return;
  hadamard16_kernel<<<blocks_for(rows * cols, kThreads), kThreads, 0, as_stream(stream)>>>(
      in, out, rows * cols);
  check(cudaGetLastError(), "hadamard16");
}

}  // namespace te::fp8::cuda
