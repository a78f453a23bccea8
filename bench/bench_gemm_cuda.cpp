// GPU GEMM throughput: te::fp8::cuda::gemm (cuBLASLt FP8, E4M3 x E4M3, fp32 out, fast
// accumulation as TE's forward GEMM) against a BF16 cuBLAS GEMM (fp32 accumulate) at 4096^3 and
// 8192^3, in TFLOP/s; ratio = FP8 / BF16 throughput. Both on the same random normal matrices
// (FP8: their E4M3 casts), since tensor cores draw less power, and so clock higher, on zeros.
// Then the block-scaled recipes as te runs their GEMMs on CUDA (docs/gpu.md): both operands'
// codes decoded on the device with their block scales (Float8BlockScaling 1x128 by 128x128,
// MXFP8 1x32, NVFP4 1x16 by 16x16), then one fp32 cuBLAS GEMM; TFLOP/s of decode + GEMM against
// the same BF16 GEMM (cuBLASLt's block-scaled GEMMs are not wired yet).
// Needs a GPU with compute capability 8.9+; prints why and exits 0 without one.
// Run: build/bench/bench_gemm_cuda [sizes...]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <vector>

#include "te/kernels/fp8_cast.h"
#include "te/kernels/fp8_cuda.h"

namespace {

void check(cudaError_t s, const char* what) {
  if (s != cudaSuccess) {
    std::fprintf(stderr, "bench_gemm_cuda: %s: %s\n", what, cudaGetErrorString(s));
    std::exit(1);
  }
}

// Milliseconds per call, the median-free best of `reps` after a warm-up.
template <typename Fn>
float time_ms(Fn&& fn, int reps) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  fn();
  check(cudaDeviceSynchronize(), "warm-up");
  float best = 1e30f;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(start);
    fn();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    best = ms < best ? ms : best;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

namespace cuda = te::fp8::cuda;

// Decode + fp32 GEMM per block recipe at n^3 (operands N(0, 1), cast on the device first).
void block_recipes(cublasHandle_t blas, long n, double bf16_tflops) {
  const size_t elems = static_cast<size_t>(n) * n;
  float *x, *xa, *xb, *d, *amax;
  uint8_t *ca, *cb, *sa8, *sb8;
  float *sa, *sb;
  for (float** p : {&x, &xa, &xb, &d}) check(cudaMalloc(p, elems * 4), "malloc");
  for (uint8_t** p : {&ca, &cb, &sa8, &sb8}) check(cudaMalloc(p, elems), "malloc");
  for (float** p : {&sa, &sb}) check(cudaMalloc(p, elems / 16 * 4 + 64), "malloc");
  check(cudaMalloc(&amax, sizeof(float)), "malloc");
  {
    std::mt19937 gen(static_cast<unsigned>(n) + 1);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> values(elems);
    for (float& v : values) v = dist(gen);
    check(cudaMemcpy(x, values.data(), elems * 4, cudaMemcpyHostToDevice), "copy");
  }
  check(cudaMemset(amax, 0, sizeof(float)), "memset");
  cuda::fold_amax(x, static_cast<int64_t>(elems), amax, nullptr);
  const float alpha = 1.0f, beta = 0.0f;
  // d = decode(a) @ decode(b_t)^T: the layer's forward GEMM, both blocked along k.
  const auto gemm = [&] {
    cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, xb, n, xa, n, &beta, d, n);
  };
  struct Row {
    const char* name;
    std::function<void()> cast, decode;
  };
  const Row rows[] = {
      {"block 1x128 x 128x128",
       [&] {
         cuda::quantize_blocks(x, ca, sa, n, n, 1, cuda::kE4M3, true, 0.0f, nullptr);
         cuda::quantize_blocks(x, cb, sb, n, n, 128, cuda::kE4M3, true, 0.0f, nullptr);
       },
       [&] {
         cuda::dequantize_blocks(ca, sa, xa, n, n, 1, 128, cuda::kE4M3, nullptr);
         cuda::dequantize_blocks(cb, sb, xb, n, n, 128, 128, cuda::kE4M3, nullptr);
       }},
      {"mxfp8 1x32",
       [&] {
         cuda::quantize_mx(x, ca, sa8, n, n, cuda::kE4M3, nullptr);
         cuda::quantize_mx(x, cb, sb8, n, n, cuda::kE4M3, nullptr);
       },
       [&] {
         cuda::dequantize_mx(ca, sa8, xa, n, n, cuda::kE4M3, nullptr);
         cuda::dequantize_mx(cb, sb8, xb, n, n, cuda::kE4M3, nullptr);
       }},
      {"nvfp4 1x16 x 16x16",
       [&] {
         cuda::quantize_nvfp4(x, ca, sa8, n, n, 1, amax, false, 0, 0, nullptr);
         cuda::quantize_nvfp4(x, cb, sb8, n, n, 16, amax, false, 0, 0, nullptr);
       },
       [&] {
         cuda::dequantize_nvfp4(ca, sa8, amax, xa, n, n, 1, nullptr);
         cuda::dequantize_nvfp4(cb, sb8, amax, xb, n, n, 16, nullptr);
       }},
  };
  const double flops = 2.0 * n * n * n;
  for (const Row& r : rows) {
    r.cast();
    const float ms = time_ms(
        [&] {
          r.decode();
          gemm();
        },
        10);
    const double tflops = flops / (ms * 1e-3) / 1e12;
    std::printf("%8ld %-22s decode + fp32 GEMM %8.1f TFLOP/s, %5.2f of BF16\n", n, r.name, tflops,
                tflops / bf16_tflops);
  }
  for (void* p : {static_cast<void*>(x), static_cast<void*>(xa), static_cast<void*>(xb),
                  static_cast<void*>(d), static_cast<void*>(amax), static_cast<void*>(ca),
                  static_cast<void*>(cb), static_cast<void*>(sa8), static_cast<void*>(sb8),
                  static_cast<void*>(sa), static_cast<void*>(sb)}) {
    cudaFree(p);
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Whole lines reach a log even if the process dies.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (te::fp8::cuda::device_count() == 0) {
    std::printf("bench_gemm_cuda: no CUDA device; nothing to measure\n");
    return 0;
  }
  if (!te::fp8::cuda::fp8_gemm_supported()) {
    std::printf("bench_gemm_cuda: device 0 is older than sm_89; no FP8 GEMM\n");
    return 0;
  }
  bool failed = false;
  std::vector<long> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(std::atol(argv[i]));
  if (sizes.empty()) sizes = {4096, 8192};
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
  cublasHandle_t blas;
  cublasCreate(&blas);
  std::printf("%8s %12s %12s %10s\n", "n", "FP8 TFLOP/s", "BF16 TFLOP/s", "FP8/BF16");
  for (long n : sizes) {
    const size_t elems = static_cast<size_t>(n) * n;
    uint8_t *a8, *b8;
    __nv_bfloat16 *a16, *b16;
    float *d, *scales;
    check(cudaMalloc(&a8, elems), "malloc");
    check(cudaMalloc(&b8, elems), "malloc");
    check(cudaMalloc(&a16, elems * 2), "malloc");
    check(cudaMalloc(&b16, elems * 2), "malloc");
    check(cudaMalloc(&d, elems * 4), "malloc");
    check(cudaMalloc(&scales, 2 * sizeof(float)), "malloc");
    {
      // N(0, 1) values; E4M3 codes of them (scale 1) and their bf16 roundings.
      std::mt19937 gen(static_cast<unsigned>(n));
      std::normal_distribution<float> dist(0.0f, 1.0f);
      std::vector<float> values(elems);
      for (float& v : values) v = dist(gen);
      std::vector<uint8_t> codes(elems);
      te::fp8::quantize(values.data(), codes.data(), static_cast<int64_t>(elems), 1.0f,
                        te::fp8::DType::kE4M3);
      std::vector<uint16_t> halves(elems);
      for (size_t i = 0; i < elems; ++i) {
        uint32_t bits;
        std::memcpy(&bits, &values[i], sizeof bits);
        halves[i] = static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);  // RNE
      }
      for (void* dst : {static_cast<void*>(a8), static_cast<void*>(b8)}) {
        check(cudaMemcpy(dst, codes.data(), elems, cudaMemcpyHostToDevice), "copy");
      }
      for (void* dst : {static_cast<void*>(a16), static_cast<void*>(b16)}) {
        check(cudaMemcpy(dst, halves.data(), elems * 2, cudaMemcpyHostToDevice), "copy");
      }
    }
    const float ones[2] = {1.0f, 1.0f};
    cudaMemcpy(scales, ones, sizeof ones, cudaMemcpyHostToDevice);
    // A refused FP8 GEMM is reported, and the BF16 and block rows are still measured.
    float fp8_ms = 0.0f;
    try {
      fp8_ms = time_ms(
          [&] {
            te::fp8::cuda::gemm(a8, te::fp8::cuda::kE4M3, scales, b8, te::fp8::cuda::kE4M3,
                                scales + 1, d, n, n, n, /*fast_accumulation=*/true, nullptr);
          },
          10);
    } catch (const std::exception& e) {
      std::printf("%8ld FP8 GEMM failed: %s\n", n, e.what());
      failed = true;
    }
    const float alpha = 1.0f, beta = 0.0f;
    const float bf16_ms = time_ms(
        [&] {
          cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, b16, CUDA_R_16BF, n, a16,
                       CUDA_R_16BF, n, &beta, d, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT);
        },
        10);
    const double flops = 2.0 * n * n * n;
    const double fp8 = fp8_ms > 0 ? flops / (fp8_ms * 1e-3) / 1e12 : 0.0,
                 bf16 = flops / (bf16_ms * 1e-3) / 1e12;
    std::printf("%8ld %12.1f %12.1f %10.2f\n", n, fp8, bf16, fp8 / bf16);
    block_recipes(blas, n, bf16);
    cudaFree(a8);
    cudaFree(b8);
    cudaFree(a16);
    cudaFree(b16);
    cudaFree(d);
    cudaFree(scales);
  }
  cublasDestroy(blas);
  return failed ? 1 : 0;
}
