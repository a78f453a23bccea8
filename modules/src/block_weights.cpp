#include "te/nn/block_weights.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <memory>

#include "te/error.h"
#include "te/kernels/ggml.h"
#include "te/nn/functional.h"

namespace te::nn {

namespace {

// Rows of x that multiply each weight row from its blocks directly (te::ggml::dot_rows, 8 at a
// time); more take the panel GEMM, whose float32 kernel beats those dot products once a decoded
// row serves more inputs (bench/bench_block_weights.cpp).
constexpr int64_t kDirectRows = 8;
// The panel GEMM decodes this many bytes of float32 weights at a time.
constexpr int64_t kPanelBytes = int64_t{2} << 20;

}  // namespace

int64_t BlockMatrix::bytes() const {
  const ggml::BlockShape b = ggml::block_shape(type, "a BlockMatrix");
  return rows * (cols / b.elements) * b.bytes;
}

void BlockMatrix::check(const std::string& what) const {
  TE_CHECK(ggml::is_quantized(type), what, ": ggml type ", ggml::type_name(type),
           " is not a quantized block type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K to Q6_K, IQ4_NL, "
           "IQ4_XS)");
  const ggml::BlockShape b = ggml::block_shape(type, what);
  TE_CHECK(rows >= 1 && cols >= 1 && cols % b.elements == 0, what, ": a [", rows, ", ", cols,
           "] matrix of ", ggml::type_name(type), " needs rows of whole blocks of ", b.elements);
  TE_CHECK(static_cast<int64_t>(row_data.size()) == rows, what, ": ", row_data.size(),
           " row pointers for ", rows, " rows");
}

at::Tensor block_linear(const at::Tensor& x, const BlockMatrix& w, const std::string& what) {
  TE_CHECK(!(at::GradMode::is_enabled() && x.requires_grad()), what,
           " is held in GGUF ", ggml::type_name(w.type),
           " blocks (inference only) but its input requires grad; run under c10::InferenceMode "
           "or torch::NoGradGuard, or load with te::hf::LoadOptions::dequantize_gguf = true to "
           "train");
  TE_CHECK(x.device().is_cpu(), what, " is held in GGUF blocks, which te-cpp multiplies on the "
           "CPU; the input is on ", x.device(),
           " (load with te::hf::LoadOptions::dequantize_gguf = true to move the model)");
  TE_CHECK(x.dim() >= 1 && x.size(-1) == w.cols && at::isFloatingType(x.scalar_type()), what,
           ": input ", x.sizes(), " (", x.scalar_type(), ") does not contract with [", w.rows,
           ", ", w.cols, "] weights held in ", ggml::type_name(w.type),
           " blocks (a floating input whose last dim is ", w.cols, ")");
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end() - 1);
  out_shape.push_back(w.rows);
  const at::Tensor x2 = x.reshape({-1, w.cols}).to(at::kFloat).contiguous();
  const int64_t m = x2.size(0);
  at::Tensor y = at::empty({m, w.rows}, x2.options());
  if (m == 0) return y.view(out_shape).to(x.scalar_type());
  const unsigned char* const* rows = w.row_data.data();
  if (m <= kDirectRows) {
    const float* xp = x2.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / w.cols);
    at::parallel_for(0, w.rows, grain, [&](int64_t b, int64_t e) {
      ggml::dot_rows(w.type, rows + b, e - b, w.cols, xp, m, w.cols, yp + b, w.rows);
    });
  } else {
    // Panels of rows decoded into float32 (all threads), each multiplied by te's CPU GEMM (all
    // threads) as x @ W_panel^T (bench_block_weights: faster than W_panel @ x^T here).
    const int64_t panel = std::min(std::max<int64_t>(kPanelBytes / (4 * w.cols), 16), w.rows);
    // The calling thread's panel, kept between calls: a fresh one each call would fault its pages
    // in again (scratch: it holds nothing from one call to the next).
    struct Scratch {
      std::unique_ptr<float[]> data;
      int64_t size = 0;
    };
    thread_local Scratch scratch;
    if (scratch.size < panel * w.cols) {
      scratch.data.reset(new float[static_cast<std::size_t>(panel * w.cols)]);
      scratch.size = panel * w.cols;
    }
    float* dp = scratch.data.get();
    for (int64_t n0 = 0; n0 < w.rows; n0 += panel) {
      const int64_t n = std::min(panel, w.rows - n0);
      at::parallel_for(0, n, 8, [&](int64_t b, int64_t e) {
        ggml::dequantize_rows(w.type, rows + n0 + b, e - b, w.cols, dp + b * w.cols, w.cols);
      });
      // part.t() [cols, n]: the decoded rows transposed, a layout te's CPU GEMM reads as it is.
      const at::Tensor part = at::from_blob(dp, {n, w.cols}, x2.options());
      y.narrow(1, n0, n).copy_(functional::dense(x2, part.t()));
    }
  }
  return y.view(out_shape).to(x.scalar_type());
}

at::Tensor block_rows(const BlockMatrix& w, const at::Tensor& ids, const std::string& what) {
  TE_CHECK(!at::isFloatingType(ids.scalar_type()) && !ids.is_complex() &&
               ids.scalar_type() != at::kBool,
           what, ": ids must be integers, not ", ids.scalar_type());
  TE_CHECK(ids.device().is_cpu(), what, " is held in GGUF blocks, which te-cpp reads on the CPU; "
           "the ids are on ", ids.device(),
           " (load with te::hf::LoadOptions::dequantize_gguf = true to move the model)");
  const at::Tensor flat = ids.reshape({-1}).to(at::kLong).contiguous();
  const int64_t* idp = flat.data_ptr<int64_t>();
  std::vector<const unsigned char*> picked(static_cast<std::size_t>(flat.numel()));
  for (int64_t i = 0; i < flat.numel(); ++i) {
    TE_CHECK(idp[i] >= 0 && idp[i] < w.rows, what, ": id ", idp[i], " is outside the table's ",
             w.rows, " rows");
    picked[static_cast<std::size_t>(i)] = w.row_data[static_cast<std::size_t>(idp[i])];
  }
  at::Tensor out = at::empty({flat.numel(), w.cols}, at::kFloat);
  float* op = out.data_ptr<float>();
  at::parallel_for(0, flat.numel(), 16, [&](int64_t b, int64_t e) {
    ggml::dequantize_rows(w.type, picked.data() + b, e - b, w.cols, op + b * w.cols, w.cols);
  });
  std::vector<int64_t> shape(ids.sizes().begin(), ids.sizes().end());
  shape.push_back(w.cols);
  return out.view(shape);
}

at::Tensor dequantize(const BlockMatrix& w) {
  at::Tensor out = at::empty({w.rows, w.cols}, at::kFloat);
  float* op = out.data_ptr<float>();
  at::parallel_for(0, w.rows, 16, [&](int64_t b, int64_t e) {
    ggml::dequantize_rows(w.type, w.row_data.data() + b, e - b, w.cols, op + b * w.cols, w.cols);
  });
  return out;
}

}  // namespace te::nn
