#include "te/nn/block_weights.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include "te/runtime/parallel.h"

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

// f(type, r0, r1) for each run of rows of one type within [begin, end).
template <typename F>
void for_each_run(const BlockMatrix& w, int64_t begin, int64_t end, F f) {
  while (begin < end) {
    const uint32_t type = w.type_of(begin);
    int64_t r = begin + 1;
    if (!w.row_types.empty()) {
      while (r < end && w.row_types[static_cast<std::size_t>(r)] == type) ++r;
    } else {
      r = end;
    }
    f(type, begin, r);
    begin = r;
  }
}

// Rows [begin, end) of w decoded into out (a row every `cols` floats).
void decode_rows(const BlockMatrix& w, const unsigned char* const* rows, int64_t begin, int64_t end,
                 float* out) {
  for_each_run(w, begin, end, [&](uint32_t type, int64_t r0, int64_t r1) {
    ggml::dequantize_rows(type, rows + r0, r1 - r0, w.cols, out + (r0 - begin) * w.cols, w.cols);
  });
}

}  // namespace

std::string BlockMatrix::type_names() const {
  std::vector<uint32_t> seen = {type};
  std::string out = ggml::type_name(type);
  for (const uint32_t t : row_types) {
    if (std::find(seen.begin(), seen.end(), t) != seen.end()) continue;
    seen.push_back(t);
    out += " and " + ggml::type_name(t);
  }
  return out;
}

int64_t BlockMatrix::bytes() const {
  int64_t total = 0;
  for_each_run(*this, 0, rows, [&](uint32_t t, int64_t r0, int64_t r1) {
    const ggml::BlockShape b = ggml::block_shape(t, "a BlockMatrix");
    total += (r1 - r0) * (cols / b.elements) * b.bytes;
  });
  return total;
}

void BlockMatrix::check(const std::string& what) const {
  TE_CHECK(row_types.empty() || static_cast<int64_t>(row_types.size()) == rows, what, ": ",
           row_types.size(), " row types for ", rows, " rows");
  TE_CHECK(static_cast<int64_t>(row_data.size()) == rows, what, ": ", row_data.size(),
           " row pointers for ", rows, " rows");
  std::vector<uint32_t> types = row_types;
  types.push_back(type);
  for (const uint32_t t : types) {
    TE_CHECK(ggml::is_quantized(t), what, ": ggml type ", ggml::type_name(t),
             " is not a quantized block type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K to Q6_K, "
             "IQ4_NL, IQ4_XS, MXFP4)");
    const ggml::BlockShape b = ggml::block_shape(t, what);
    TE_CHECK(rows >= 1 && cols >= 1 && cols % b.elements == 0, what, ": a [", rows, ", ", cols,
             "] matrix of ", ggml::type_name(t), " needs rows of whole blocks of ", b.elements);
  }
}

at::Tensor block_linear(const at::Tensor& x, const BlockMatrix& w, const std::string& what) {
  TE_CHECK(!(at::GradMode::is_enabled() && x.requires_grad()), what, " is held in GGUF ",
           w.type_names(),
           " blocks (inference only) but its input requires grad; run under c10::InferenceMode "
           "or torch::NoGradGuard, or load with te::hf::LoadOptions::dequantize_gguf = true to "
           "train");
  TE_CHECK(x.device().is_cpu(), what,
           " is held in GGUF blocks, which te-cpp multiplies on the "
           "CPU; the input is on ",
           x.device(),
           " (load with te::hf::LoadOptions::dequantize_gguf = true to move the model)");
  TE_CHECK(x.dim() >= 1 && x.size(-1) == w.cols && at::isFloatingType(x.scalar_type()), what,
           ": input ", x.sizes(), " (", x.scalar_type(), ") does not contract with [", w.rows, ", ",
           w.cols, "] weights held in ", w.type_names(),
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
      for_each_run(w, b, e, [&](uint32_t type, int64_t r0, int64_t r1) {
        ggml::dot_rows(type, rows + r0, r1 - r0, w.cols, xp, m, w.cols, yp + r0, w.rows);
      });
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
        decode_rows(w, rows, n0 + b, n0 + e, dp + b * w.cols);
      });
      // part.t() [cols, n]: the decoded rows transposed, a layout te's CPU GEMM reads as it is.
      const at::Tensor part = at::from_blob(dp, {n, w.cols}, x2.options());
      y.narrow(1, n0, n).copy_(functional::dense(x2, part.t()));
    }
  }
  return y.view(out_shape).to(x.scalar_type());
}

at::Tensor grouped_block_linear(const at::Tensor& x, const BlockMatrix& w, int64_t experts,
                                const std::vector<int64_t>& m_splits, int64_t first,
                                const at::Tensor& bias, const std::string& what) {
  TE_CHECK(experts > 0 && w.rows % experts == 0, what, ": ", w.rows, " rows are not ", experts,
           " experts' rows");
  const int64_t out = w.rows / experts;
  TE_CHECK(first >= 0 && first + static_cast<int64_t>(m_splits.size()) <= experts, what,
           ": experts ", first, "..", first + static_cast<int64_t>(m_splits.size()) - 1, " of ",
           experts);
  std::vector<at::Tensor> parts;
  int64_t start = 0;
  for (std::size_t i = 0; i < m_splits.size(); ++i) {
    const int64_t e = first + static_cast<int64_t>(i), m = m_splits[i];
    if (m == 0) continue;
    BlockMatrix one;  // expert e's rows: pointers into the same blocks
    one.type = w.type;
    one.rows = out;
    one.cols = w.cols;
    one.owner = w.owner;
    one.row_data.assign(w.row_data.begin() + e * out, w.row_data.begin() + (e + 1) * out);
    if (!w.row_types.empty()) {
      one.row_types.assign(w.row_types.begin() + e * out, w.row_types.begin() + (e + 1) * out);
    }
    const at::Tensor y =
        block_linear(x.narrow(0, start, m), one, what + " (expert " + std::to_string(e) + ")");
    parts.push_back(bias.defined() ? y + bias[e] : y);
    start += m;
  }
  TE_CHECK(start == x.size(0), what, ": m_splits sum to ", start, " rows of ", x.size(0));
  if (parts.empty()) return at::zeros({0, out}, x.options());
  return at::cat(parts);
}

at::Tensor block_rows(const BlockMatrix& w, const at::Tensor& ids, const std::string& what) {
  TE_CHECK(
      !at::isFloatingType(ids.scalar_type()) && !ids.is_complex() && ids.scalar_type() != at::kBool,
      what, ": ids must be integers, not ", ids.scalar_type());
  TE_CHECK(ids.device().is_cpu(), what,
           " is held in GGUF blocks, which te-cpp reads on the CPU; "
           "the ids are on ",
           ids.device(),
           " (load with te::hf::LoadOptions::dequantize_gguf = true to move the model)");
  const at::Tensor flat = ids.reshape({-1}).to(at::kLong).contiguous();
  const int64_t* idp = flat.data_ptr<int64_t>();
  // The picked rows as a matrix of their own (their types with them).
  BlockMatrix picked;
  picked.type = w.type;
  picked.cols = w.cols;
  picked.row_data.resize(static_cast<std::size_t>(flat.numel()));
  if (!w.row_types.empty()) picked.row_types.resize(picked.row_data.size());
  for (int64_t i = 0; i < flat.numel(); ++i) {
    TE_CHECK(idp[i] >= 0 && idp[i] < w.rows, what, ": id ", idp[i], " is outside the table's ",
             w.rows, " rows");
    const auto at = static_cast<std::size_t>(i);
    picked.row_data[at] = w.row_data[static_cast<std::size_t>(idp[i])];
    if (!w.row_types.empty()) picked.row_types[at] = w.type_of(idp[i]);
  }
  at::Tensor out = at::empty({flat.numel(), w.cols}, at::kFloat);
  float* op = out.data_ptr<float>();
  at::parallel_for(0, flat.numel(), 16, [&](int64_t b, int64_t e) {
    decode_rows(picked, picked.row_data.data(), b, e, op + b * w.cols);
  });
  std::vector<int64_t> shape(ids.sizes().begin(), ids.sizes().end());
  shape.push_back(w.cols);
  return out.view(shape);
}

at::Tensor dequantize(const BlockMatrix& w) {
  at::Tensor out = at::empty({w.rows, w.cols}, at::kFloat);
  float* op = out.data_ptr<float>();
  at::parallel_for(0, w.rows, 16, [&](int64_t b, int64_t e) {
    decode_rows(w, w.row_data.data(), b, e, op + b * w.cols);
  });
  return out;
}

}  // namespace te::nn
