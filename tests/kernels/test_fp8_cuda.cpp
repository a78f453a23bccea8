// CUDA FP8 kernels against the CPU reference: casts and amax bit-exact, cast+transpose exact,
// the cuBLASLt FP8 GEMM within a stated tolerance. Needs a GPU (sm_89+ for the GEMM); without
// one the device tests skip, and only the argument checks run.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "te/error.h"
#include "te/kernels/fp8_cast.h"
#include "te/kernels/fp8_cuda.h"

#include "float_bits.h"

namespace te::fp8 {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device visible"

template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  explicit DeviceBuffer(std::size_t n) {
    EXPECT_EQ(cudaMalloc(&ptr, std::max<std::size_t>(n, 1) * sizeof(T)), cudaSuccess);
  }
  DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  std::vector<T> get(std::size_t n) const {
    std::vector<T> out(n);
    cudaDeviceSynchronize();
    cudaMemcpy(out.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost);
    return out;
  }
};

using test::bits_of;
using test::from_bits;

cuda::Format fmt(DType t) { return t == DType::kE4M3 ? cuda::kE4M3 : cuda::kE5M2; }

std::vector<float> awkward_values() {
  std::vector<float> v;
  std::mt19937 gen(3);
  std::uniform_int_distribution<uint32_t> any_bits;
  std::normal_distribution<float> near(0.0f, 100.0f);
  for (int i = 0; i < 500000; ++i) {
    v.push_back(from_bits(any_bits(gen)));
    v.push_back(near(gen));
  }
  for (int c = 0; c < 256; ++c) {
    for (DType t : {DType::kE4M3, DType::kE5M2}) {
      const float x = cast_from_fp8(static_cast<uint8_t>(c), t);
      v.push_back(x);
      v.push_back(std::nextafter(x, INFINITY));
      v.push_back(std::nextafter(x, -INFINITY));
      v.push_back(x * 1.0625f);  // between neighbours
    }
  }
  for (float x :
       {0.0f, -0.0f, INFINITY, -INFINITY, std::nanf(""), 448.0f, 464.0f, 57344.0f, 61440.0f}) {
    v.push_back(x);
  }
  return v;
}

TEST(Fp8Cuda, QuantizeAndAmaxAreBitExactWithTheCpuReference) {
  SKIP_WITHOUT_GPU();
  std::vector<float> in = awkward_values();
  in.erase(std::remove_if(in.begin(), in.end(), [](float x) { return std::isnan(x); }), in.end());
  const int64_t n = static_cast<int64_t>(in.size());
  DeviceBuffer<float> d_in(in);
  for (DType t : {DType::kE4M3, DType::kE5M2}) {
    for (float scale : {1.0f, 0.37f, 1024.0f}) {
      std::vector<uint8_t> want(in.size());
      const float want_amax = quantize(in.data(), want.data(), n, scale, t);
      DeviceBuffer<uint8_t> d_out(in.size());
      DeviceBuffer<float> d_scale(std::vector<float>{scale});
      DeviceBuffer<float> d_amax(std::vector<float>{0.0f});
      cuda::quantize(d_in.ptr, d_out.ptr, n, d_scale.ptr, d_amax.ptr, fmt(t), nullptr);
      const std::vector<uint8_t> got = d_out.get(in.size());
      int bad = 0;
      for (std::size_t i = 0; i < in.size(); ++i) {
        if (got[i] != want[i] && bad++ < 5) {
          ADD_FAILURE() << "x = " << in[i] << " (0x" << std::hex << bits_of(in[i]) << ") scale "
                        << scale << ": GPU 0x" << int(got[i]) << ", CPU 0x" << int(want[i]);
        }
      }
      EXPECT_EQ(bad, 0);
      EXPECT_EQ(bits_of(d_amax.get(1)[0]), bits_of(want_amax));
    }
  }
}

TEST(Fp8Cuda, DequantizeAndCastTransposeMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  std::vector<uint8_t> codes(256);
  for (int c = 0; c < 256; ++c) codes[c] = static_cast<uint8_t>(c);
  DeviceBuffer<uint8_t> d_codes(codes);
  DeviceBuffer<float> d_scale_inv(std::vector<float>{0.5f});
  for (DType t : {DType::kE4M3, DType::kE5M2}) {
    std::vector<float> want(256);
    dequantize(codes.data(), want.data(), 256, 0.5f, t);
    DeviceBuffer<float> d_out(256);
    cuda::dequantize(d_codes.ptr, d_out.ptr, 256, d_scale_inv.ptr, fmt(t), nullptr);
    const auto got = d_out.get(256);
    for (int c = 0; c < 256; ++c) {
      if (std::isnan(want[c])) {
        EXPECT_TRUE(std::isnan(got[c])) << c;
      } else {
        EXPECT_EQ(got[c], want[c]) << "code " << c;
      }
    }
  }
  // Odd sizes: partial tiles on both edges.
  const int64_t rows = 67, cols = 45;
  std::mt19937 gen(5);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> x(rows * cols);
  for (float& v : x) v = dist(gen);
  std::vector<uint8_t> want(x.size());
  const float want_amax = quantize(x.data(), want.data(), rows * cols, 8.0f, DType::kE4M3);
  DeviceBuffer<float> d_x(x), d_scale(std::vector<float>{8.0f}), d_amax(std::vector<float>{0});
  DeviceBuffer<uint8_t> d_a(x.size()), d_t(x.size());
  cuda::cast_transpose(d_x.ptr, d_a.ptr, d_t.ptr, rows, cols, d_scale.ptr, d_amax.ptr, cuda::kE4M3,
                       nullptr);
  const auto a = d_a.get(x.size()), tr = d_t.get(x.size());
  EXPECT_EQ(a, want);
  int bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) bad += tr[c * rows + r] != want[r * cols + c];
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(d_amax.get(1)[0], want_amax);
}

// cast_transpose reads fp32, bf16 and fp16 as they are: codes, transposed codes and amax equal
// the CPU reference's cast of the exact (widened) values, on whole 64 x 64 tiles (vector loads),
// ragged edge tiles, and shapes whose rows or cols are not multiples of 4 (element-wise).
TEST(Fp8Cuda, CastTransposeOfEveryInputTypeAndShapeIsBitExact) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    int64_t rows, cols;
  };
  std::mt19937 gen(9);
  std::normal_distribution<float> dist(0.0f, 60.0f);
  for (const Shape& s : {Shape{256, 4096}, Shape{132, 200}, Shape{130, 200}, Shape{64, 66}}) {
    const int64_t n = s.rows * s.cols;
    std::vector<float> x(n);
    for (float& v : x) v = dist(gen);
    x[0] = 0.0f;
    x[n - 1] = -3000.0f;  // saturates E4M3 at scale 4
    for (cuda::Real type : {cuda::kFloat32, cuda::kBFloat16, cuda::kFloat16}) {
      // The input in its type, and the exact fp32 values it holds.
      std::vector<uint16_t> narrow(n);
      std::vector<float> exact(x);
      for (int64_t i = 0; i < n; ++i) {
        if (type == cuda::kBFloat16) {
          const __nv_bfloat16 b = __float2bfloat16_rn(x[i]);
          std::memcpy(&narrow[i], &b, 2);
          exact[i] = __bfloat162float(b);
        } else if (type == cuda::kFloat16) {
          const __half h = __float2half_rn(x[i]);
          std::memcpy(&narrow[i], &h, 2);
          exact[i] = __half2float(h);
        }
      }
      std::vector<uint8_t> want(n);
      const float want_amax = quantize(exact.data(), want.data(), n, 4.0f, DType::kE4M3);
      DeviceBuffer<float> d_x32(x);
      DeviceBuffer<uint16_t> d_x16(narrow);
      DeviceBuffer<float> d_scale(std::vector<float>{4.0f}), d_amax(std::vector<float>{0});
      DeviceBuffer<uint8_t> d_a(n), d_t(n), d_q(n);
      const void* in = type == cuda::kFloat32 ? static_cast<const void*>(d_x32.ptr)
                                              : static_cast<const void*>(d_x16.ptr);
      cuda::cast_transpose(in, type, d_a.ptr, d_t.ptr, s.rows, s.cols, d_scale.ptr, d_amax.ptr,
                           cuda::kE4M3, nullptr);
      cuda::quantize(in, type, d_q.ptr, n, d_scale.ptr, nullptr, cuda::kE4M3, nullptr);
      const auto a = d_a.get(n), tr = d_t.get(n), q = d_q.get(n);
      const std::string what = std::to_string(s.rows) + " x " + std::to_string(s.cols) +
                               " of type " + std::to_string(type);
      EXPECT_EQ(a, want) << what;
      EXPECT_EQ(q, want) << what << " (quantize)";
      int64_t bad = 0;
      for (int64_t r = 0; r < s.rows; ++r) {
        for (int64_t c = 0; c < s.cols; ++c) bad += tr[c * s.rows + r] != want[r * s.cols + c];
      }
      EXPECT_EQ(bad, 0) << what << " (transpose)";
      EXPECT_EQ(d_amax.get(1)[0], want_amax) << what;
    }
  }
}

// A bf16 or fp16 D is the fp32 result rounded once (within the accumulator's bound, since another
// D type may run another kernel): sampled entries against the exact sums.
TEST(Fp8Cuda, GemmWritesBf16AndFp16Outputs) {
  SKIP_WITHOUT_GPU();
  if (!cuda::fp8_gemm_supported()) GTEST_SKIP() << "FP8 GEMM needs compute capability 8.9+";
  const int64_t m = 512, n = 768, k = 1024;
  std::mt19937 gen(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> af(m * k), btf(n * k);
  for (float& v : af) v = dist(gen);
  for (float& v : btf) v = dist(gen);
  std::vector<uint8_t> a(af.size()), bt(btf.size());
  quantize(af.data(), a.data(), m * k, 8.0f, DType::kE4M3);
  quantize(btf.data(), bt.data(), n * k, 8.0f, DType::kE4M3);
  DeviceBuffer<uint8_t> d_a(a), d_bt(bt);
  DeviceBuffer<float> d_sa(std::vector<float>{1.0f / 8}), d_sb(std::vector<float>{1.0f / 8});
  DeviceBuffer<uint16_t> d_d(m * n);
  for (cuda::Real type : {cuda::kBFloat16, cuda::kFloat16}) {
    cuda::gemm(d_a.ptr, cuda::kE4M3, d_sa.ptr, d_bt.ptr, cuda::kE4M3, d_sb.ptr, d_d.ptr, type, m, n,
               k, false, nullptr);
    const auto got = d_d.get(m * n);
    std::uniform_int_distribution<int64_t> row(0, m - 1), col(0, n - 1);
    for (int sample = 0; sample < 256; ++sample) {
      const int64_t i = row(gen), j = col(gen);
      double sum = 0, abs_sum = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double prod = double(cast_from_fp8(a[i * k + p], DType::kE4M3)) *
                            cast_from_fp8(bt[j * k + p], DType::kE4M3);
        sum += prod;
        abs_sum += std::abs(prod);
      }
      const double want = sum / 64;
      float value;
      if (type == cuda::kBFloat16) {
        __nv_bfloat16 b;
        std::memcpy(&b, &got[i * n + j], 2);
        value = __bfloat162float(b);
      } else {
        __half h;
        std::memcpy(&h, &got[i * n + j], 2);
        value = __half2float(h);
      }
      // One rounding to 8 (bf16) or 11 (fp16) significant bits on top of the accumulator's.
      const double ulp = std::ldexp(std::abs(want), type == cuda::kBFloat16 ? -8 : -11);
      ASSERT_NEAR(value, want, test::fp8_tensor_core_gemm_bound(k, abs_sum / 64) + ulp)
          << "d[" << i << "][" << j << "] of type " << type;
    }
  }
}

TEST(Fp8Cuda, GemmMatchesTheCpuReferenceWithinTolerance) {
  SKIP_WITHOUT_GPU();
  if (!cuda::fp8_gemm_supported()) GTEST_SKIP() << "FP8 GEMM needs compute capability 8.9+";
  const int64_t m = 64, n = 48, k = 96;
  std::mt19937 gen(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> af(m * k), bf(k * n);
  for (float& v : af) v = dist(gen);
  for (float& v : bf) v = dist(gen);
  for (DType bt : {DType::kE4M3, DType::kE5M2}) {
    std::vector<uint8_t> a(af.size()), b(bf.size()), b_t(bf.size());
    quantize(af.data(), a.data(), m * k, 16.0f, DType::kE4M3);
    quantize(bf.data(), b.data(), k * n, 32.0f, bt);
    for (int64_t r = 0; r < k; ++r) {
      for (int64_t c = 0; c < n; ++c) b_t[c * k + r] = b[r * n + c];
    }
    DeviceBuffer<uint8_t> d_a(a), d_bt(b_t);
    DeviceBuffer<float> d_sa(std::vector<float>{1.0f / 16}), d_sb(std::vector<float>{1.0f / 32});
    DeviceBuffer<float> d_d(m * n);
    for (bool fast : {false, true}) {
      cuda::gemm(d_a.ptr, cuda::kE4M3, d_sa.ptr, d_bt.ptr, fmt(bt), d_sb.ptr, d_d.ptr, m, n, k,
                 fast, nullptr);
      const auto got = d_d.get(m * n);
      // The reference: exact products summed in double, then both scales; the tensor cores'
      // accumulator is narrower than fp32 (fp8_tensor_core_gemm_bound says how much).
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double sum = 0, abs_sum = 0;
          for (int64_t p = 0; p < k; ++p) {
            const double prod =
                double(cast_from_fp8(a[i * k + p], DType::kE4M3)) * cast_from_fp8(b[p * n + j], bt);
            sum += prod;
            abs_sum += std::abs(prod);
          }
          const double want = sum / 16 / 32;
          EXPECT_NEAR(got[i * n + j], want, test::fp8_tensor_core_gemm_bound(k, abs_sum / 16 / 32))
              << "d[" << i << "][" << j << "] fast accumulation " << fast;
        }
      }
    }
  }
}

// Square and layer-sized shapes, with scale pointers in their own allocations and at 4- and
// 12-byte offsets into one buffer (a float of a packed tensor): bench_gemm_cuda's 4096^3 with
// packed scales was refused by every algorithm cuBLASLt offered on the H200 before te staged
// such scales. 64 sampled entries of each product against the exact sum.
TEST(Fp8Cuda, GemmAtLargeShapesTakesScalesAtAnyOffset) {
  SKIP_WITHOUT_GPU();
  if (!cuda::fp8_gemm_supported()) GTEST_SKIP() << "FP8 GEMM needs compute capability 8.9+";
  struct Shape {
    int64_t m, n, k;
  };
  for (const Shape& s :
       {Shape{4096, 4096, 4096}, Shape{4096, 12288, 4096}, Shape{256, 4096, 16384}}) {
    std::mt19937 gen(static_cast<unsigned>(s.m + s.n + s.k));
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> af(s.m * s.k), btf(s.n * s.k);
    for (float& v : af) v = dist(gen);
    for (float& v : btf) v = dist(gen);
    std::vector<uint8_t> a(af.size()), bt(btf.size());
    quantize(af.data(), a.data(), s.m * s.k, 8.0f, DType::kE4M3);
    quantize(btf.data(), bt.data(), s.n * s.k, 4.0f, DType::kE4M3);
    DeviceBuffer<uint8_t> d_a(a), d_bt(bt);
    DeviceBuffer<float> d_d(s.m * s.n);
    DeviceBuffer<float> own_a(std::vector<float>{1.0f / 8}), own_b(std::vector<float>{1.0f / 4});
    DeviceBuffer<float> packed(std::vector<float>{0.0f, 1.0f / 8, 0.0f, 1.0f / 4});
    const std::pair<const float*, const float*> scales[] = {{own_a.ptr, own_b.ptr},
                                                            {packed.ptr + 1, packed.ptr + 3}};
    for (const auto& [sa, sb] : scales) {
      cudaMemset(d_d.ptr, 0, s.m * s.n * sizeof(float));
      cuda::gemm(d_a.ptr, cuda::kE4M3, sa, d_bt.ptr, cuda::kE4M3, sb, d_d.ptr, s.m, s.n, s.k, true,
                 nullptr);
      const auto got = d_d.get(s.m * s.n);
      std::uniform_int_distribution<int64_t> row(0, s.m - 1), col(0, s.n - 1);
      for (int sample = 0; sample < 64; ++sample) {
        const int64_t i = row(gen), j = col(gen);
        double sum = 0, abs_sum = 0;
        for (int64_t p = 0; p < s.k; ++p) {
          const double prod = double(cast_from_fp8(a[i * s.k + p], DType::kE4M3)) *
                              cast_from_fp8(bt[j * s.k + p], DType::kE4M3);
          sum += prod;
          abs_sum += std::abs(prod);
        }
        ASSERT_NEAR(got[i * s.n + j], sum / 32, test::fp8_tensor_core_gemm_bound(s.k, abs_sum / 32))
            << s.m << " x " << s.n << " x " << s.k << " d[" << i << "][" << j << "], scales at "
            << sa << " and " << sb;
      }
    }
  }
}

TEST(Fp8Cuda, GemmRefusesE5M2TimesE5M2WithoutTouchingTheDevice) {
  try {
    cuda::gemm(nullptr, cuda::kE5M2, nullptr, nullptr, cuda::kE5M2, nullptr, nullptr, 16, 16, 16,
               false, nullptr);
    FAIL() << "accepted";
  } catch (const te::Error& e) {
    EXPECT_NE(std::string(e.what()).find("E5M2 x E5M2"), std::string::npos) << e.what();
  }
}

// The block casts check their arguments before any launch (bit-exactness with the CPU is
// tests/fp8/test_block_cuda.cpp's, through the tensor layer).
TEST(Fp8Cuda, BlockCastsRefuseBadArgumentsWithoutTouchingTheDevice) {
  const auto expect_error = [](auto&& call, const std::string& want) {
    try {
      call();
      ADD_FAILURE() << "accepted; wanted " << want;
    } catch (const te::Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  expect_error(
      [] {
        cuda::quantize_blocks(nullptr, nullptr, nullptr, 4, 4, 64, cuda::kE4M3, true, 0.0f,
                              nullptr);
      },
      "fp8::cuda::quantize_blocks: tile_rows 64; Float8BlockScaling has 1x128 blocks (1) and "
      "128x128 tiles (128)");
  expect_error(
      [] {
        cuda::quantize_nvfp4(nullptr, nullptr, nullptr, 4, 5, 1, nullptr, false, 0, 0, nullptr);
      },
      "fp8::cuda::quantize_nvfp4: 5 columns; NVFP4 packs two codes a byte");
  expect_error(
      [] {
        cuda::quantize_nvfp4(nullptr, nullptr, nullptr, 4, 4, 8, nullptr, false, 0, 0, nullptr);
      },
      "fp8::cuda::quantize_nvfp4: tile_rows 8; NVFP4 has 1x16 blocks (1) and 16x16 tiles (16)");
  expect_error([] { cuda::hadamard16(nullptr, nullptr, 2, 20, nullptr); },
               "fp8::cuda::hadamard16: 20 columns; the transform takes blocks of 16");
}

TEST(Fp8Cuda, DeviceCountIsZeroNotAnErrorWithoutAGpu) {
  const int count = cuda::device_count();
  EXPECT_GE(count, 0);
  if (count == 0) EXPECT_FALSE(cuda::fp8_gemm_supported());
}

}  // namespace
}  // namespace te::fp8
