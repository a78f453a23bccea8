// DotProductAttention, MultiHeadAttention and TransformerLayer on one process against references
// written with plain LibTorch ops on the same weights (forward and every gradient).

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/serialize.h>

#include <limits>
#include <sstream>

#include "../expect_error.h"
#include "nn_test_util.h"
#include "te/compat.h"
#include "te/nn.h"

namespace te::nn {
namespace {

using test::Close;
using test::leaf;
using test::randn;

// TE's encoder padding mask, [batch, 1, sq, sk]: a key at or beyond its row's length is masked,
// and so is every key of a query at or beyond it (a padded query row attends to nothing).
at::Tensor padding_mask(const std::vector<int64_t>& lengths, int64_t sq, int64_t sk) {
  at::Tensor len = at::tensor(lengths).view({-1, 1, 1, 1});
  return at::arange(sk)
      .view({1, 1, 1, sk})
      .ge(len)
      .logical_or(at::arange(sq).view({1, 1, sq, 1}).ge(len));
}

// The query rows of a [batch, 1, sq, sk] mask with no key left: [batch, sq] bool.
at::Tensor dead_queries(const at::Tensor& mask) { return mask.all(-1).squeeze(1); }

// softmax(q k^T * scale + mask) v with einsum, GQA by repeating key/value heads.
at::Tensor reference_attention(const at::Tensor& q, at::Tensor k, at::Tensor v,
                               const at::Tensor& mask, bool causal, double scale) {
  const int64_t rep = q.size(2) / k.size(2);
  k = k.repeat_interleave(rep, 2);
  v = v.repeat_interleave(rep, 2);
  at::Tensor logits = at::einsum("bqhd,bkhd->bhqk", {q, k}) * scale;
  const int64_t sq = q.size(1), sk = k.size(1);
  at::Tensor masked = at::zeros({1, 1, sq, sk}, at::kBool);
  if (causal) masked = at::ones({sq, sk}, at::kBool).triu(1).view({1, 1, sq, sk});
  if (mask.defined()) masked = masked.logical_or(mask);
  // softmax over the unmasked keys only (jax.nn.softmax(..., where=) as TE's JAX fallback
  // takes it): a row with no key left sums to 0 and gets zero probabilities.
  const at::Tensor row_max = logits.masked_fill(masked, -1e30).amax(-1, /*keepdim=*/true).detach();
  const at::Tensor e =
      (logits.masked_fill(masked, -std::numeric_limits<double>::infinity()) - row_max).exp();
  const at::Tensor probs = e / e.sum(-1, /*keepdim=*/true).clamp_min(1e-30);
  return at::einsum("bhqk,bkhd->bqhd", {probs, v});
}

struct MaskCase {
  std::string type;
  int64_t gqa;
};

class DotProductAttentionCases : public ::testing::TestWithParam<MaskCase> {};

TEST_P(DotProductAttentionCases, EqualsSoftmaxAttention) {
  const auto& c = GetParam();
  DotProductAttention dpa(
      DotProductAttentionOptions(4, 8).attn_mask_type(c.type).num_gqa_groups(c.gqa));
  at::Tensor q = randn({3, 5, 4, 8}, 1).requires_grad_(true);
  at::Tensor k = randn({3, 5, c.gqa, 8}, 2).requires_grad_(true);
  at::Tensor v = randn({3, 5, c.gqa, 8}, 3).requires_grad_(true);
  const at::Tensor mask = padding_mask({5, 3, 1}, 5, 5);
  at::Tensor y = dpa(q, k, v, mask);
  at::Tensor qr = leaf(q), kr = leaf(k), vr = leaf(v);
  const bool padding = c.type == "padding" || c.type == "padding_causal";
  const bool causal = c.type == "causal" || c.type == "padding_causal";
  at::Tensor yr =
      reference_attention(qr, kr, vr, padding ? mask : at::Tensor(), causal, 1.0 / std::sqrt(8.0));
  EXPECT_TRUE(Close(y, yr, 1e-5));
  at::Tensor g = randn(y.sizes().vec(), 4);
  torch::autograd::backward({y}, {g});
  torch::autograd::backward({yr}, {g});
  EXPECT_TRUE(Close(q.grad(), qr.grad(), 1e-5));
  EXPECT_TRUE(Close(k.grad(), kr.grad(), 1e-5));
  EXPECT_TRUE(Close(v.grad(), vr.grad(), 1e-5));
}

INSTANTIATE_TEST_SUITE_P(Masks, DotProductAttentionCases,
                         ::testing::Values(MaskCase{"no_mask", 4}, MaskCase{"padding", 4},
                                           MaskCase{"causal", 4}, MaskCase{"padding_causal", 4},
                                           MaskCase{"padding_causal", 2}, MaskCase{"causal", 1}),
                         [](const auto& info) {
                           return info.param.type + "_gqa" + std::to_string(info.param.gqa);
                         });

TEST(DotProductAttention, FusedAndUnfusedPathsAgree) {
  // Values and gradients, GQA, and fewer queries than keys (causal is top-left aligned on both
  // paths). No mask and causal take te's CPU kernel on every LibTorch; the padding types take
  // SDPA where this LibTorch has it (2.0+; causal with a mask as a bias), else the unfused path.
  for (const std::string type : {"no_mask", "padding", "causal", "padding_causal"}) {
    for (int64_t sq : {5, 3}) {
      DotProductAttention fused(
          DotProductAttentionOptions(4, 8).attn_mask_type(type).num_gqa_groups(2).fused(true));
      DotProductAttention unfused(
          DotProductAttentionOptions(4, 8).attn_mask_type(type).num_gqa_groups(2).fused(false));
      fused->eval();
      unfused->eval();
      const at::Tensor q0 = randn({3, sq, 4, 8}, 21), k0 = randn({3, 5, 2, 8}, 22),
                       v0 = randn({3, 5, 2, 8}, 23);
      const at::Tensor mask = padding_mask({5, 3, 1}, sq, 5);
      const std::string backend = fused->fused_backend(q0, k0, v0, mask);
      if (type.rfind("padding", 0) == 0) {
        EXPECT_EQ(backend == "unfused", !TE_HAS_SDPA) << type << ": " << backend;
      } else {
        EXPECT_EQ(backend, "te_flash_cpu") << type;
      }
      EXPECT_EQ(unfused->fused_backend(q0, k0, v0, mask), "unfused") << type;
      std::vector<at::Tensor> grads[2];
      at::Tensor out[2];
      for (int i = 0; i < 2; ++i) {
        at::Tensor q = q0.clone().requires_grad_(), k = k0.clone().requires_grad_(),
                   v = v0.clone().requires_grad_();
        out[i] = (i == 0 ? fused : unfused)(q, k, v, mask);
        (out[i] * randn(out[i].sizes().vec(), 24)).sum().backward();
        grads[i] = {q.grad(), k.grad(), v.grad()};
      }
      EXPECT_TRUE(Close(out[0], out[1], 1e-5)) << type << " sq " << sq;
      for (int g = 0; g < 3; ++g) {
        EXPECT_TRUE(Close(grads[0][g], grads[1][g], 1e-5)) << type << " sq " << sq << " grad " << g;
      }
    }
  }
  // Dropout in training is drawn by te::nn's layout-invariant stream: never through SDPA.
  DotProductAttention train(DotProductAttentionOptions(4, 8).attention_dropout(0.1).fused(true));
  const at::Tensor x = randn({2, 5, 4, 8}, 25);
  EXPECT_EQ(train->fused_backend(x, x, x), "unfused");
}

// A padded query row (every key masked) has zero probabilities, as every TE backend gives it:
// a zero output row, no gradient into its query, and no share in the keys' and values'
// gradients, on the fused and unfused paths, with GQA, dropout, and in bf16.
TEST(DotProductAttention, PaddedQueryRowsAttendToNothing) {
  const at::Tensor mask = padding_mask({5, 3, 1}, 5, 5);
  const at::Tensor dead = dead_queries(mask);  // [3, 5]
  ASSERT_EQ(dead.sum().item<int64_t>(), 6);
  struct Path {
    const char* name;
    bool fused;
    double dropout;
    at::ScalarType dtype;
  };
  for (const Path& p :
       {Path{"fused", true, 0.0, at::kFloat}, Path{"unfused", false, 0.0, at::kFloat},
        Path{"dropout", true, 0.3, at::kFloat}, Path{"bf16", true, 0.0, at::kBFloat16},
        Path{"bf16 unfused", false, 0.0, at::kBFloat16}}) {
    for (const std::string type : {"padding", "padding_causal"}) {
      DotProductAttention dpa(DotProductAttentionOptions(4, 8)
                                  .attn_mask_type(type)
                                  .num_gqa_groups(2)
                                  .attention_dropout(p.dropout)
                                  .fused(p.fused));
      if (p.dropout == 0.0) dpa->eval();
      const at::Tensor k0 = randn({3, 5, 2, 8}, 42).to(p.dtype),
                       v0 = randn({3, 5, 2, 8}, 43).to(p.dtype);
      // Two queries that differ only in the padded rows: nothing else may see the difference.
      const at::Tensor q0 = randn({3, 5, 4, 8}, 41).to(p.dtype);
      const at::Tensor q1 =
          q0.where(dead.view({3, 5, 1, 1}).logical_not(), randn({3, 5, 4, 8}, 44).to(p.dtype) * 7);
      at::Tensor out[2], grads[2][3];
      for (int i = 0; i < 2; ++i) {
        manual_seed(5);  // the same dropout mask for both
        at::Tensor q = (i == 0 ? q0 : q1).clone().requires_grad_(), k = k0.clone().requires_grad_(),
                   v = v0.clone().requires_grad_();
        out[i] = dpa(q, k, v, mask);
        (out[i].to(at::kFloat) * randn({3, 5, 4, 8}, 45)).sum().backward();
        grads[i][0] = q.grad();
        grads[i][1] = k.grad();
        grads[i][2] = v.grad();
      }
      const std::string what = std::string(p.name) + " " + type;
      const at::Tensor rows = dead.view({3, 5, 1, 1}).expand({3, 5, 4, 8});
      EXPECT_EQ(out[0].masked_select(rows).abs().max().item<double>(), 0.0) << what;
      EXPECT_EQ(grads[0][0].masked_select(rows).abs().max().item<double>(), 0.0) << what;
      EXPECT_GT(out[0].masked_select(rows.logical_not()).abs().max().item<double>(), 0.0) << what;
      EXPECT_TRUE(out[0].equal(out[1])) << what;
      for (int g = 0; g < 3; ++g) {
        EXPECT_TRUE(grads[0][g].equal(grads[1][g])) << what << " grad " << g;
      }
    }
  }
}

// TE-PyTorch's self-attention padding mask, keys only ([batch, 1, 1, s]), masks the padded
// queries too (get_full_mask ORs it with its transpose): the same as the full mask, per-sequence
// bottom-right diagonals included.
TEST(DotProductAttention, AKeyOnlyPaddingMaskAlsoHidesThePaddedQueries) {
  const std::vector<int64_t> lengths = {5, 3, 1};
  const at::Tensor full = padding_mask(lengths, 5, 5);
  const at::Tensor keys = full.narrow(2, 0, 1).contiguous();  // row 0 sees exactly the valid keys
  ASSERT_EQ(keys.sizes(), (std::vector<int64_t>{3, 1, 1, 5}));
  for (const std::string type : {"padding", "padding_causal", "padding_causal_bottom_right"}) {
    for (bool fused : {true, false}) {
      DotProductAttention dpa(DotProductAttentionOptions(4, 8)
                                  .attn_mask_type(type)
                                  .window_size(WindowSize{2, 0})
                                  .fused(fused));
      const at::Tensor q = randn({3, 5, 4, 8}, 62), kv = randn({3, 5, 4, 8}, 63);
      const at::Tensor y = dpa(q, kv, kv, keys);
      EXPECT_TRUE(y.equal(dpa(q, kv, kv, full))) << type << fused;
      EXPECT_EQ(y.select(0, 2).narrow(0, 1, 4).abs().max().item<double>(), 0.0) << type;
    }
  }
}

// The same rows under FP8 (MultiHeadAttention's projections run as FP8 GEMMs): the attention
// output of a padded position is zero, so is its projection, and no gradient reaches its input.
TEST(DotProductAttention, PaddedRowsStayZeroUnderFp8) {
  manual_seed(3);
  MultiHeadAttention mha([&] {
    auto made = MultiHeadAttentionOptions(32, 4);
    made.attention().attn_mask_type("padding");
    return made;
  }());
  const at::Tensor mask = padding_mask({5, 3, 1}, 5, 5);
  const at::Tensor rows = dead_queries(mask).view({3, 5, 1}).expand({3, 5, 32});
  at::Tensor x = randn({3, 5, 32}, 46).requires_grad_();
  at::Tensor y;
  {
    Fp8Autocast fp8(true, fp8::DelayedScaling{});
    y = mha(x, {}, mask);
    (y * randn({3, 5, 32}, 47)).sum().backward();
  }
  EXPECT_EQ(y.masked_select(rows).abs().max().item<double>(), 0.0);
  EXPECT_EQ(x.grad().masked_select(rows).abs().max().item<double>(), 0.0);
  EXPECT_GT(x.grad().masked_select(rows.logical_not()).abs().max().item<double>(), 0.0);
}

// What attention() hands to SDPA: causal alone as its is_causal flag (no mask tensor, so flash
// and cuDNN stay eligible on a GPU), a padding mask as an additive tensor with causal folded in,
// and key/value heads repeated on the CPU (enable_gqa is taken only by CUDA's half/bf16 kernels).
TEST(DotProductAttention, TheSdpaCallCarriesCausalAsAFlag) {
#if TE_HAS_SDPA
  // float64: te's fused CPU kernel takes float32, bf16 and fp16 only, so these calls go to SDPA
  // (with the flags a CUDA tensor's call carries).
  const at::Tensor q = randn({2, 5, 4, 8}, 48).to(at::kDouble),
                   kv = randn({2, 5, 2, 8}, 49).to(at::kDouble);
  const at::Tensor mask = padding_mask({5, 3}, 5, 5);
  using functional::mask_spec;
  const auto attention_plan = [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& mask, const functional::MaskSpec& spec,
                                 double scale, bool fused) {
    functional::AttentionCall call;
    call.mask = mask;
    call.spec = spec;
    call.scale = scale;
    call.fused = fused;
    return functional::attention_plan(q, k, v, call);
  };
  const auto causal = attention_plan(q, kv, kv, {}, mask_spec("causal"), 0.35, true);
  EXPECT_NE(causal.backend, "unfused");
  EXPECT_TRUE(causal.is_causal);
  EXPECT_FALSE(causal.mask_tensor);
  EXPECT_FALSE(causal.enable_gqa);
  // Bottom-right is the same diagonal when there are as many queries as keys.
  EXPECT_TRUE(
      attention_plan(q, kv, kv, {}, mask_spec("causal_bottom_right"), 0.35, true).is_causal);
  const auto padded = attention_plan(q, kv, kv, mask, mask_spec("padding_causal"), 0.35, true);
  EXPECT_FALSE(padded.is_causal);
  EXPECT_TRUE(padded.mask_tensor);
  // A window, or a bottom-right diagonal with fewer queries, is a mask tensor.
  const auto windowed =
      attention_plan(q, kv, kv, {}, mask_spec("causal", WindowSize{2, 0}), 0.35, true);
  EXPECT_FALSE(windowed.is_causal);
  EXPECT_TRUE(windowed.mask_tensor);
  const auto lower_right =
      attention_plan(q.narrow(1, 0, 3), kv, kv, {}, mask_spec("causal_bottom_right"), 0.35, true);
  EXPECT_FALSE(lower_right.is_causal);
  EXPECT_TRUE(lower_right.mask_tensor);
  const auto unfused = attention_plan(q, kv, kv, {}, mask_spec("causal"), 0.35, false);
  EXPECT_EQ(unfused.backend, "unfused");
  EXPECT_FALSE(unfused.is_causal);
#else
  GTEST_SKIP() << "this LibTorch has no at::scaled_dot_product_attention";
#endif
}

// TE's documented window semantics written out element by element (window_size in
// dot_product_attention.py, get_full_mask's alignments in utils.py, at d0067d0da): query i of
// sequence b sees key j when i + off - left <= j <= i + off + right (-1: no bound) and, under a
// padding type, both are within the sequence's length. [batch, 1, sq, sk], true = hidden.
struct TeMaskCase {
  std::string type;
  std::optional<WindowSize> window;
  std::optional<bool> bottom_right_diagonal;
  int64_t sq, sk;
};

at::Tensor te_full_mask(const TeMaskCase& c, const std::vector<int64_t>& lengths) {
  const bool causal = c.type.find("causal") != std::string::npos;
  const bool padding = c.type.rfind("padding", 0) == 0;
  const bool bottom_right =
      c.type.find("bottom_right") != std::string::npos ||
      (c.type != "causal" && c.type != "padding_causal" && c.bottom_right_diagonal.value_or(true));
  const int64_t left = c.window ? c.window->first : -1;  // -1: unbounded
  const int64_t right = causal ? 0 : (c.window ? c.window->second : -1);
  const auto b = static_cast<int64_t>(lengths.size());
  at::Tensor hidden = at::zeros({b, 1, c.sq, c.sk}, at::kBool);
  auto h = hidden.accessor<bool, 4>();
  for (int64_t n = 0; n < b; ++n) {
    const int64_t lq = std::min(lengths[n], c.sq), lk = std::min(lengths[n], c.sk);
    const int64_t off = !bottom_right ? 0 : (padding ? lk - lq : c.sk - c.sq);
    for (int64_t i = 0; i < c.sq; ++i) {
      for (int64_t j = 0; j < c.sk; ++j) {
        const bool in_window =
            (left < 0 || j >= i + off - left) && (right < 0 || j <= i + off + right);
        const bool valid = !padding || (i < lq && j < lk);
        h[n][0][i][j] = !(in_window && valid);
      }
    }
  }
  return hidden;
}

// Every mask type, with and without sliding windows, both diagonals, and more or fewer queries
// than keys: values and gradients against softmax attention under TE's full mask, on the fused
// and unfused paths, with GQA.
TEST(DotProductAttention, EveryMaskTypeAndWindowIsTesFullMask) {
  std::vector<TeMaskCase> cases;
  for (const std::string type : {"no_mask", "padding", "causal", "padding_causal",
                                 "causal_bottom_right", "padding_causal_bottom_right"}) {
    const bool causal = type.find("causal") != std::string::npos;
    for (const auto& [sq, sk] : std::vector<std::pair<int64_t, int64_t>>{{5, 5}, {3, 6}, {6, 3}}) {
      for (const std::optional<WindowSize>& w :
           {std::optional<WindowSize>{}, std::optional<WindowSize>{WindowSize{2, causal ? 0 : 1}},
            std::optional<WindowSize>{WindowSize{0, 0}}}) {
        for (const std::optional<bool>& br : {std::optional<bool>{}, std::optional<bool>{false}}) {
          cases.push_back({type, w, br, sq, sk});
        }
      }
    }
  }
  const std::vector<int64_t> lengths = {6, 3, 1};
  int64_t dead_rows_seen = 0;
  for (const TeMaskCase& c : cases) {
    std::ostringstream what;
    what << c.type << " sq " << c.sq << " sk " << c.sk << " window "
         << (c.window ? std::to_string(c.window->first) + "," + std::to_string(c.window->second)
                      : "unset")
         << " bottom_right_diagonal "
         << (c.bottom_right_diagonal ? std::to_string(*c.bottom_right_diagonal) : "unset");
    const at::Tensor full = te_full_mask(c, lengths);
    dead_rows_seen += full.all(-1).sum().item<int64_t>();
    const at::Tensor given = padding_mask(lengths, c.sq, c.sk);
    const at::Tensor q0 = randn({3, c.sq, 4, 8}, 51), k0 = randn({3, c.sk, 2, 8}, 52),
                     v0 = randn({3, c.sk, 2, 8}, 53), g = randn({3, c.sq, 4, 8}, 54);
    at::Tensor qr = leaf(q0), kr = leaf(k0), vr = leaf(v0);
    const at::Tensor yr = reference_attention(qr, kr, vr, full, false, 0.3);
    torch::autograd::backward({yr}, {g});
    for (bool fused : {true, false}) {
      set_warning_handler([](std::string_view) {});
      DotProductAttention dpa(DotProductAttentionOptions(4, 8)
                                  .attn_mask_type(c.type)
                                  .window_size(c.window)
                                  .bottom_right_diagonal(c.bottom_right_diagonal)
                                  .num_gqa_groups(2)
                                  .scale_factor(0.3)
                                  .fused(fused));
      set_warning_handler(nullptr);
      dpa->eval();
      at::Tensor q = leaf(q0), k = leaf(k0), v = leaf(v0);
      const at::Tensor y = dpa(q, k, v, given);
      torch::autograd::backward({y}, {g});
      EXPECT_TRUE(Close(y, yr, 1e-5)) << what.str() << (fused ? " fused" : " unfused");
      EXPECT_TRUE(Close(q.grad(), qr.grad(), 1e-5)) << what.str() << " dq";
      EXPECT_TRUE(Close(k.grad(), kr.grad(), 1e-5)) << what.str() << " dk";
      EXPECT_TRUE(Close(v.grad(), vr.grad(), 1e-5)) << what.str() << " dv";
    }
  }
  EXPECT_GT(dead_rows_seen, 0);  // the cases include queries that see no key
}

// "arbitrary": the caller's mask of any broadcastable shape, per head, rows left without a key
// included; with a window it combines (bottom-right by default).
TEST(DotProductAttention, ArbitraryMaskOfAnyBroadcastableShape) {
  at::Generator gen = at::detail::createCPUGenerator(55);
  at::Tensor per_head = at::rand({3, 4, 5, 6}, gen).lt(0.3);
  per_head.select(0, 1).select(0, 2).select(0, 3).fill_(true);  // a row with no key
  for (const at::Tensor& mask :
       {per_head, per_head.narrow(1, 0, 1).contiguous(), per_head.narrow(0, 0, 1).contiguous()}) {
    for (bool fused : {true, false}) {
      DotProductAttention dpa(DotProductAttentionOptions(4, 8)
                                  .attn_mask_type("arbitrary")
                                  .num_gqa_groups(2)
                                  .fused(fused));
      const at::Tensor q0 = randn({3, 5, 4, 8}, 56), k0 = randn({3, 6, 2, 8}, 57),
                       v0 = randn({3, 6, 2, 8}, 58);
      at::Tensor q = leaf(q0), k = leaf(k0), v = leaf(v0), qr = leaf(q0), kr = leaf(k0),
                 vr = leaf(v0);
      const at::Tensor y = dpa(q, k, v, mask);
      const at::Tensor yr = reference_attention(qr, kr, vr, mask, false, 1.0 / std::sqrt(8.0));
      EXPECT_TRUE(Close(y, yr, 1e-5)) << mask.sizes() << fused;
      const at::Tensor g = randn(y.sizes().vec(), 59);
      torch::autograd::backward({y}, {g});
      torch::autograd::backward({yr}, {g});
      EXPECT_TRUE(Close(q.grad(), qr.grad(), 1e-5)) << mask.sizes();
      EXPECT_TRUE(Close(k.grad(), kr.grad(), 1e-5)) << mask.sizes();
    }
  }
  // With a window (3, 0), bottom-right: offset sk - sq = 1.
  DotProductAttention windowed(
      DotProductAttentionOptions(4, 8).attn_mask_type("arbitrary").window_size(WindowSize{3, 0}));
  const at::Tensor q = randn({3, 5, 4, 8}, 60), kv = randn({3, 6, 4, 8}, 61);
  const at::Tensor full =
      per_head.logical_or(te_full_mask({"no_mask", WindowSize{3, 0}, {}, 5, 6}, {6, 6, 6}));
  EXPECT_TRUE(Close(windowed(q, kv, kv, per_head),
                    reference_attention(q, kv, kv, full, false, 1.0 / std::sqrt(8.0)), 1e-5));
}

// TE's check_set_window_size: a window a mask type contradicts is corrected with a warning, as
// TE warns; one with no meaning is refused, naming it.
TEST(DotProductAttention, WindowSizesTeCorrectsWarnAndTheOthersAreRefused) {
  std::vector<std::string> warnings;
  set_warning_handler([&](std::string_view m) { warnings.emplace_back(m); });
  const auto causal = functional::mask_spec("causal", WindowSize{4, 2});
  EXPECT_EQ(causal.window_left, 4);
  EXPECT_EQ(causal.window_right, 0);
  const auto open = functional::mask_spec("padding", WindowSize{-1, 0});
  EXPECT_EQ(open.window_left, -1);
  EXPECT_EQ(open.window_right, -1);
  set_warning_handler(nullptr);
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find("window_size (4, 2) should be (-1, 0) or (>=0, 0)"), std::string::npos)
      << warnings[0];
  EXPECT_NE(warnings[1].find("window_size (-1, 0) should be (-1, -1) or (>=0, >=0)"),
            std::string::npos)
      << warnings[1];
  EXPECT_ERROR(functional::mask_spec("causal_bottom_right", WindowSize{-1, 3}),
               "window_size (-1, 3) is not valid for attn_mask_type 'causal_bottom_right'");
  EXPECT_ERROR(functional::mask_spec("no_mask", WindowSize{2, -1}),
               "window_size (2, -1) is not valid for attn_mask_type 'no_mask'");
  EXPECT_ERROR(
      DotProductAttention(
          DotProductAttentionOptions(4, 8).attn_mask_type("causal").window_size(WindowSize{-3, 0})),
      "window_size (-3, 0) is not valid");
  // The alignment: causal and padding_causal are always top-left.
  EXPECT_FALSE(functional::mask_spec("causal", std::nullopt, true).bottom_right);
  EXPECT_TRUE(functional::mask_spec("causal_bottom_right", std::nullopt, false).bottom_right);
  EXPECT_TRUE(functional::mask_spec("padding").bottom_right);
  EXPECT_FALSE(functional::mask_spec("padding", std::nullopt, false).bottom_right);
}

TEST(DotProductAttention, ReportsBadInput) {
  EXPECT_ERROR(DotProductAttention(DotProductAttentionOptions(4, 8).attn_mask_type("sliding")),
               "attn_mask_type 'sliding' is not one of");
  EXPECT_ERROR(DotProductAttention(DotProductAttentionOptions(4, 8).num_gqa_groups(3)),
               "4 heads are not a multiple of num_gqa_groups 3");
  DotProductAttention dpa(DotProductAttentionOptions(4, 8).attn_mask_type("padding"));
  at::Tensor q = at::randn({1, 2, 4, 8});
  try {
    dpa(q, q, q);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs a mask"), std::string::npos) << e.what();
  }
  // A mask that does not broadcast to the logits, a per-head padding mask, a non-bool mask.
  EXPECT_ERROR(dpa(q, q, q, at::zeros({1, 1, 3, 2}, at::kBool)),
               "attention mask [1, 1, 3, 2] does not broadcast to the logits [batch 1, heads 4, "
               "seqlen_q 2, seqlen_kv 2]");
  EXPECT_ERROR(dpa(q, q, q, at::zeros({1, 4, 2, 2}, at::kBool)),
               "the padding mask of attn_mask_type 'padding' has 4 heads");
  EXPECT_ERROR(dpa(q, q, q, at::zeros({1, 1, 2, 2})),
               "attention mask is Float: give a bool tensor, true where a key is masked out");
  // Keys only is self attention's form: with fewer queries it cannot say which are padding.
  const at::Tensor kv3 = at::randn({1, 3, 4, 8});
  EXPECT_ERROR(dpa(q, kv3, kv3, at::zeros({1, 1, 1, 3}, at::kBool)),
               "says which keys are padding but not which of the 2 queries are (3 keys)");
  DotProductAttention arbitrary(DotProductAttentionOptions(4, 8).attn_mask_type("arbitrary"));
  EXPECT_ERROR(arbitrary(q, q, q), "needs a mask: a bool tensor broadcastable to [batch, heads,");
  EXPECT_ERROR(arbitrary(q, q, q, at::zeros({2, 4, 2, 2}, at::kBool)),
               "attention mask [2, 4, 2, 2] does not broadcast");
}

// softcap (Gemma 2's attn_logit_softcapping, transformers 5.23.0 models/gemma2/modeling_gemma2.py
// eager_attention_forward): cap * tanh(q k^T * scale / cap), then the mask and the softmax;
// forward and every gradient, on the unfused path whether or not `fused` is asked for.
TEST(DotProductAttention, SoftcapCapsTheScaledLogitsBeforeTheMask) {
  const double cap = 1.5, scale = 0.9;
  const at::Tensor q = randn({2, 6, 4, 8}, 41) * 2, k = randn({2, 6, 2, 8}, 42) * 2,
                   v = randn({2, 6, 2, 8}, 43);
  const at::Tensor mask = padding_mask({6, 4}, 6, 6);
  // The reference: eager_attention_forward's steps, GQA by repeating the key/value heads.
  const auto reference = [&](const at::Tensor& qr, const at::Tensor& kr, const at::Tensor& vr) {
    const at::Tensor kk = kr.repeat_interleave(2, 2), vv = vr.repeat_interleave(2, 2);
    at::Tensor logits = at::einsum("bqhd,bkhd->bhqk", {qr, kk}) * scale;
    logits = at::tanh(logits / cap) * cap;
    const at::Tensor causal = at::ones({6, 6}, at::kBool).triu(1).view({1, 1, 6, 6});
    const at::Tensor masked = causal.logical_or(mask);
    const at::Tensor probs = at::softmax(logits.masked_fill(masked, -1e30), -1);
    // Padded query rows (a whole row masked) give zeros, as every TE backend.
    return at::einsum("bhqk,bkhd->bqhd", {probs, vv})
        .masked_fill(masked.all(-1).squeeze(1).unsqueeze(-1).unsqueeze(-1), 0);
  };
  for (const bool fused : {true, false}) {
    DotProductAttention dpa(DotProductAttentionOptions(4, 8)
                                .num_gqa_groups(2)
                                .attn_mask_type("padding_causal")
                                .scale_factor(scale)
                                .softcap(cap)
                                .fused(fused));
    const at::Tensor ql = leaf(q), kl = leaf(k), vl = leaf(v);
    const at::Tensor qr = leaf(q), kr = leaf(k), vr = leaf(v);
    const at::Tensor y = dpa(ql, kl, vl, mask), want = reference(qr, kr, vr);
    EXPECT_TRUE(Close(y, want, 1e-5)) << "fused " << fused;
    const at::Tensor g = randn(y.sizes().vec(), 44);
    torch::autograd::backward({y}, {g});
    torch::autograd::backward({want}, {g});
    EXPECT_TRUE(Close(ql.grad(), qr.grad(), 1e-5));
    EXPECT_TRUE(Close(kl.grad(), kr.grad(), 1e-5));
    EXPECT_TRUE(Close(vl.grad(), vr.grad(), 1e-5));
    EXPECT_EQ(dpa->fused_backend(q, k, v, mask), "unfused");
    // The cap changes the result (these logits reach past it).
    DotProductAttention uncapped(DotProductAttentionOptions(4, 8)
                                     .num_gqa_groups(2)
                                     .attn_mask_type("padding_causal")
                                     .scale_factor(scale));
    EXPECT_FALSE(Close(uncapped(q, k, v, mask), y, 1e-3));
  }
  std::ostringstream printed;
  printed << *DotProductAttention(DotProductAttentionOptions(4, 8).softcap(cap));
  EXPECT_NE(printed.str().find("softcap=1.5"), std::string::npos) << printed.str();
  EXPECT_ERROR(DotProductAttention(DotProductAttentionOptions(4, 8).softcap(-1)),
               "DotProductAttention: softcap -1 is not a finite cap >= 0");
  DotProductAttention biased(
      DotProductAttentionOptions(4, 8).attn_mask_type("causal").softcap(cap));
  const at::Tensor q4 = randn({1, 3, 4, 8}, 45);
  EXPECT_ERROR(biased(q4, q4, q4, {},
                      AttentionArgs()
                          .core_attention_bias_type("post_scale_bias")
                          .core_attention_bias(at::zeros({1, 4, 3, 3}))),
               "softcap takes no core_attention_bias_type beside it (got 'post_scale_bias')");
}

// The typed options: each enum value has TE's name and back, a name is parsed where it is given
// (a misspelling names the option and every valid value), and the nested options reach the
// modules they name.
TEST(AttentionOptions, TypedValuesTakeTesNamesAndNameMisspellings) {
  for (int i = 0; i < 7; ++i) {
    const auto t = static_cast<AttnMaskType>(i);
    EXPECT_EQ(parse_te_name<AttnMaskType>(te_name(t)), t);
  }
  for (int i = 0; i < 4; ++i) {
    const auto t = static_cast<AttnBiasType>(i);
    EXPECT_EQ(parse_te_name<AttnBiasType>(te_name(t)), t);
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(parse_te_name<SoftmaxType>(te_name(static_cast<SoftmaxType>(i))),
              static_cast<SoftmaxType>(i));
    EXPECT_EQ(parse_te_name<QkvFormat>(te_name(static_cast<QkvFormat>(i))),
              static_cast<QkvFormat>(i));
  }
  EXPECT_STREQ(te_name(AttnMaskType::kPaddingCausalBottomRight), "padding_causal_bottom_right");
  EXPECT_STREQ(te_name(SoftmaxType::kOffByOne), "off-by-one");
  EXPECT_EQ(parse_te_name<QkNormType>("L2Normalization"), QkNormType::kL2Normalization);
  // Given by name or by value, the same option.
  const auto by_name = DotProductAttentionOptions(4, 8).attn_mask_type("padding_causal");
  EXPECT_EQ(by_name.attn_mask_type(), AttnMaskType::kPaddingCausal);
  EXPECT_EQ(by_name.attn_mask_type().name(), std::string("padding_causal"));
  // Misspelt where it is written, before any module exists.
  EXPECT_ERROR(DotProductAttentionOptions(4, 8).attn_mask_type("Causal"),
               "attn_mask_type 'Causal' is not one of no_mask, padding, causal, padding_causal, "
               "causal_bottom_right, padding_causal_bottom_right, arbitrary");
  EXPECT_ERROR(AttentionArgs().core_attention_bias_type("alibi "),
               "core_attention_bias_type 'alibi ' is not one of");
  EXPECT_ERROR(parse_te_name<QkvFormat>("BSHD"), "qkv_format 'BSHD' is not one of bshd, sbhd, thd");
  // The nested options reach the modules: TransformerLayer -> MultiHeadAttention -> attention.
  auto o = TransformerLayerOptions(16, 32, 4).layer_type("decoder");
  o.self_attention().attention().attn_mask_type(AttnMaskType::kPaddingCausal).num_gqa_groups(2);
  o.self_attention().layernorm().layernorm_type("rmsnorm");
  TransformerLayer layer(o);
  EXPECT_EQ(layer->self_attention->attention->options.attn_mask_type(),
            AttnMaskType::kPaddingCausal);
  EXPECT_EQ(layer->self_attention->attention->options.num_gqa_groups(), 2);
  EXPECT_EQ(layer->self_attention->attention->options.head_dim(), 4);
  EXPECT_DOUBLE_EQ(layer->self_attention->attention->options.attention_dropout(), 0.1);
  EXPECT_EQ(layer->mlp->options.layernorm().layernorm_type(), "rmsnorm");
  // The cross attention: the self attention's options with a padding mask.
  EXPECT_EQ(layer->cross_attention->attention->options.attn_mask_type(), AttnMaskType::kPadding);
  EXPECT_FALSE(layer->cross_attention->options.self_attention());
  std::ostringstream printed;
  printed << *layer->self_attention->attention;
  EXPECT_NE(printed.str().find("mask=padding_causal"), std::string::npos) << printed.str();
  // What the layer sets itself is refused when given in the nested options.
  auto no_norm = TransformerLayerOptions(16, 32, 4);
  no_norm.self_attention().input_layernorm(false);
  EXPECT_ERROR(TransformerLayer{no_norm}, "self_attention().input_layernorm() is false");
  auto other_hidden =
      TransformerLayerOptions(16, 32, 4).self_attention(MultiHeadAttentionOptions(8, 4));
  EXPECT_ERROR(TransformerLayer{other_hidden},
               "self_attention's hidden_size 8 differs from the layer's 16");
  auto value_dim = MultiHeadAttentionOptions(16, 4);
  value_dim.attention().head_dim_v(2);
  EXPECT_ERROR(MultiHeadAttention{value_dim}, "attention().head_dim_v 2 is DotProductAttention's");
}

TEST(DotProductAttention, TheSeedsRepeatedSeqlenConstraintIsImpossible) {
  // TE's seed constrained the attention weights (batch, heads, seqlen, seqlen); a repeated name
  // now throws wherever it is used, with or without rules, on one device or many.
  AxisRulesScope rules(parse_axis_rules("batch=data,heads=model"));
  const at::Tensor weights = at::zeros({2, 4, 5, 5});
  try {
    with_sharding_constraint(weights, {"batch", "heads", "seqlen", "seqlen"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'seqlen' occurs more than once"), std::string::npos);
  }
  // The module's own constraint names each dim once, so it runs.
  DotProductAttention dpa(DotProductAttentionOptions(4, 8).attn_mask_type("causal"));
  EXPECT_NO_THROW(dpa(at::randn({2, 5, 4, 8}), at::randn({2, 5, 4, 8}), at::randn({2, 5, 4, 8})));
}

// ---- MultiHeadAttention ----------------------------------------------------------------------

// The same computation from the module's weights, with plain ops.
at::Tensor reference_mha(MultiHeadAttentionImpl& m, const at::Tensor& x, const at::Tensor& memory,
                         const at::Tensor& mask, std::map<std::string, at::Tensor>& leaves) {
  for (const auto& p : m.named_parameters()) leaves[p.key()] = leaf(p.value());
  const int64_t b = x.size(0), s = x.size(1), h = m.options.attention().num_attention_heads();
  const int64_t d = m.head_dim(), g = m.kv_heads();
  at::Tensor ln =
      at::layer_norm(x, {x.size(2)}, leaves["layernorm.scale"], leaves["layernorm.ln_bias"], 1e-6);
  at::Tensor q, k, v;
  if (leaves.count("qkv_kernel")) {
    at::Tensor qkv = at::einsum("bsh,hjn->bsjn", {ln, leaves["qkv_kernel"]});
    qkv = qkv.view({b, s, 3, h, d});
    q = qkv.select(2, 0);
    k = qkv.select(2, 1);
    v = qkv.select(2, 2);
  } else {
    const at::Tensor& src = memory.defined() ? memory : ln;
    q = at::matmul(ln, leaves["q_kernel"]).view({b, s, h, d});
    at::Tensor kv =
        at::einsum("bsh,hjn->bsjn", {src, leaves["kv_kernel"]}).view({b, src.size(1), 2, g, d});
    k = kv.select(2, 0);
    v = kv.select(2, 1);
  }
  const std::string type = m.options.attention().attn_mask_type().name();
  const bool padding = type == "padding" || type == "padding_causal";
  const bool causal = type == "causal" || type == "padding_causal";
  at::Tensor out = reference_attention(q, k, v, padding ? mask : at::Tensor(), causal, 1.0);
  return at::matmul(out.reshape({b, s, h * d}), leaves["out_kernel"]);
}

struct MhaCase {
  std::string name;
  MultiHeadAttentionOptions options;
  bool cross;
};

class MultiHeadAttentionCases : public ::testing::TestWithParam<MhaCase> {};

TEST_P(MultiHeadAttentionCases, EqualsTheComposition) {
  const MhaCase& c = GetParam();
  manual_seed(7);
  MultiHeadAttention mha(c.options);
  at::Tensor x = randn({3, 5, 16}, 8).requires_grad_(true);
  at::Tensor memory = c.cross ? randn({3, 7, 16}, 9).requires_grad_(true) : at::Tensor();
  const at::Tensor mask = padding_mask({5, 2, 4}, 5, c.cross ? 7 : 5);
  at::Tensor y = mha(x, memory, mask);
  std::map<std::string, at::Tensor> leaves;
  at::Tensor xr = leaf(x);
  at::Tensor mr = c.cross ? leaf(memory) : at::Tensor();
  at::Tensor yr = reference_mha(*mha, xr, mr, mask, leaves);
  EXPECT_TRUE(Close(y, yr, 1e-5));
  at::Tensor g = randn(y.sizes().vec(), 10);
  torch::autograd::backward({y}, {g});
  torch::autograd::backward({yr}, {g});
  EXPECT_TRUE(Close(x.grad(), xr.grad(), 1e-5));
  if (c.cross) EXPECT_TRUE(Close(memory.grad(), mr.grad(), 1e-5));
  for (const auto& p : mha->named_parameters()) {
    EXPECT_TRUE(Close(p.value().grad(), leaves[p.key()].grad(), 1e-5)) << p.key();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, MultiHeadAttentionCases,
    ::testing::Values(MhaCase{"FusedQkvCausal", MultiHeadAttentionOptions(16, 4), false},
                      MhaCase{"FusedQkvPaddingCausal",
                              [&] {
                                auto made = MultiHeadAttentionOptions(16, 4);
                                made.attention().attn_mask_type("padding_causal");
                                return made;
                              }(),
                              false},
                      MhaCase{"GqaPadding",
                              [&] {
                                auto made = MultiHeadAttentionOptions(16, 4);
                                made.attention().num_gqa_groups(2).attn_mask_type("padding");
                                return made;
                              }(),
                              false},
                      MhaCase{"SeparateQkv", MultiHeadAttentionOptions(16, 4).fuse_qkv(false),
                              false},
                      MhaCase{"CrossPadding",
                              [&] {
                                auto made = MultiHeadAttentionOptions(16, 4).self_attention(false);
                                made.attention().attn_mask_type("padding");
                                return made;
                              }(),
                              true}),
    [](const auto& info) { return info.param.name; });

TEST(MultiHeadAttention, ScaledQueryInitAndNames) {
  manual_seed(11);
  MultiHeadAttention mha(MultiHeadAttentionOptions(64, 4));
  // Query kernel ~ N(0, 1/64) / sqrt(16); key kernel ~ N(0, 1/64).
  const double q_std = mha->qkv_kernel.select(1, 0).std().item<double>();
  const double k_std = mha->qkv_kernel.select(1, 1).std().item<double>();
  EXPECT_NEAR(q_std * std::sqrt(16.0), 1.0 / 8.0, 0.01);
  EXPECT_NEAR(k_std, 1.0 / 8.0, 0.01);
  std::vector<std::string> names;
  for (const auto& p : mha->named_parameters()) names.push_back(p.key());
  // LibTorch lists a module's own parameters before its children's.
  EXPECT_EQ(names, (std::vector<std::string>{"qkv_kernel", "out_kernel", "layernorm.scale",
                                             "layernorm.ln_bias"}));
  std::ostringstream os;
  mha->pretty_print(os);
  EXPECT_EQ(os.str(),
            "te::nn::MultiHeadAttention(hidden_size=64, heads=4, head_dim=16, mask=causal, self, "
            "fused_qkv)");
  EXPECT_ERROR(MultiHeadAttention(MultiHeadAttentionOptions(10, 4)),
               "hidden_size 10 is not a multiple of num_attention_heads 4");
  EXPECT_ERROR(mha(at::randn({2, 3, 64}), at::randn({2, 3, 64})),
               "self attention takes no memory");  // self + memory
}

// ---- TransformerLayer ------------------------------------------------------------------------

// The MLP block from the module's weights with plain ops: layer norm, [h, A, f] kernel, one
// activation per slot multiplied together, [f, h] kernel.
at::Tensor reference_mlp(LayerNormMLPImpl& m, const at::Tensor& x,
                         std::map<std::string, at::Tensor>& leaves) {
  for (const auto& p : m.named_parameters()) leaves[p.key()] = leaf(p.value());
  at::Tensor ln =
      at::layer_norm(x, {x.size(-1)}, leaves["layernorm.scale"], leaves["layernorm.ln_bias"], 1e-6);
  at::Tensor inner = at::einsum("bsh,haf->bsaf", {ln, leaves["wi_kernel"]});
  at::Tensor act;
  const auto& names = m.options.activations();
  for (std::size_t i = 0; i < names.size(); ++i) {
    at::Tensor slot = inner.select(-2, static_cast<int64_t>(i));
    at::Tensor a = names[i] == "gelu"   ? at::gelu(slot, "tanh")
                   : names[i] == "relu" ? at::relu(slot)
                                        : slot;  // "linear"
    act = act.defined() ? act * a : a;
  }
  return at::matmul(act, leaves["wo_kernel"]);
}

// Every gradient of `layer` against the reference leaves, prefixed as named_parameters() names
// them ("self_attention.", "cross_attention.", "mlp.").
void expect_every_gradient(TransformerLayerImpl& layer,
                           const std::map<std::string, std::map<std::string, at::Tensor>>& refs) {
  int64_t checked = 0;
  for (const auto& p : layer.named_parameters()) {
    const std::string& name = p.key();
    const auto dot = name.find('.');
    const auto& leaves = refs.at(name.substr(0, dot));
    const at::Tensor& want = leaves.at(name.substr(dot + 1)).grad();
    ASSERT_TRUE(p.value().grad().defined()) << name;
    ASSERT_TRUE(want.defined()) << name;
    EXPECT_TRUE(Close(p.value().grad(), want, 1e-5)) << name;
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int64_t>(layer.parameters().size()));
}

TEST(TransformerLayer, EncoderEqualsResidualComposition) {
  for (const std::vector<std::string>& acts :
       {std::vector<std::string>{"relu"}, std::vector<std::string>{"gelu", "linear"}}) {
    manual_seed(12);
    TransformerLayer layer([&] {
      auto made = TransformerLayerOptions(16, 32, 4)
                      .mlp_activations(acts)
                      .hidden_dropout(0)
                      .intermediate_dropout(0);
      made.self_attention().attention().attn_mask_type("padding").attention_dropout(0);
      return made;
    }());
    at::Tensor x = randn({3, 5, 16}, 13).requires_grad_(true);
    const at::Tensor mask = padding_mask({5, 3, 4}, 5, 5);
    at::Tensor y = layer(x, mask);
    // Reference: plain ops on leaf copies of every weight.
    at::Tensor xr = leaf(x);
    std::map<std::string, std::map<std::string, at::Tensor>> refs;
    at::Tensor h = xr + reference_mha(*layer->self_attention, xr, {}, mask, refs["self_attention"]);
    at::Tensor yr = h + reference_mlp(*layer->mlp, h, refs["mlp"]);
    EXPECT_TRUE(Close(y, yr, 1e-5)) << acts[0];
    at::Tensor dy = randn(y.sizes().vec(), 14);
    torch::autograd::backward({y}, {dy});
    torch::autograd::backward({yr}, {dy});
    EXPECT_TRUE(Close(x.grad(), xr.grad(), 1e-5));
    expect_every_gradient(*layer, refs);
  }
}

TEST(TransformerLayer, DecoderAddsCrossAttention) {
  manual_seed(15);
  TransformerLayer layer([&] {
    auto made = TransformerLayerOptions(16, 32, 4)
                    .layer_type("decoder")
                    .hidden_dropout(0)
                    .intermediate_dropout(0);
    made.self_attention().attention().attention_dropout(0);
    return made;
  }());
  at::Tensor x = randn({2, 5, 16}, 16).requires_grad_(true);
  at::Tensor memory = randn({2, 6, 16}, 17).requires_grad_(true);
  const at::Tensor memory_mask = padding_mask({6, 4}, 5, 6);
  at::Tensor y = layer(x, {}, memory, memory_mask);
  at::Tensor xr = leaf(x), mr = leaf(memory);
  std::map<std::string, std::map<std::string, at::Tensor>> refs;
  at::Tensor h = xr + reference_mha(*layer->self_attention, xr, {}, {}, refs["self_attention"]);
  h = h + reference_mha(*layer->cross_attention, h, mr, memory_mask, refs["cross_attention"]);
  at::Tensor yr = h + reference_mlp(*layer->mlp, h, refs["mlp"]);
  EXPECT_TRUE(Close(y, yr, 1e-5));
  at::Tensor dy = randn(y.sizes().vec(), 18);
  torch::autograd::backward({y}, {dy});
  torch::autograd::backward({yr}, {dy});
  EXPECT_TRUE(Close(x.grad(), xr.grad(), 1e-5));
  EXPECT_TRUE(Close(memory.grad(), mr.grad(), 1e-5));
  expect_every_gradient(*layer, refs);
  EXPECT_ERROR(layer(x), "a decoder needs the encoder output (memory)");
  std::ostringstream os;
  layer->pretty_print(os);
  EXPECT_EQ(os.str(),
            "te::nn::TransformerLayer(decoder, hidden_size=16, mlp_hidden_size=32, heads=4, "
            "self_attn_mask=causal, hidden_dropout=0)");
}

TEST(TransformerLayer, SaveLoadCloneAndDtype) {
  manual_seed(20);
  TransformerLayer layer(TransformerLayerOptions(16, 32, 4).layer_type("decoder"));
  std::stringstream stream;
  torch::save(layer, stream);
  manual_seed(21);
  TransformerLayer loaded(TransformerLayerOptions(16, 32, 4).layer_type("decoder"));
  torch::load(loaded, stream);
  auto clone = std::dynamic_pointer_cast<TransformerLayerImpl>(layer->clone());
  ASSERT_TRUE(clone);
  auto mine = layer->named_parameters();
  for (const auto& p : loaded->named_parameters()) {
    EXPECT_TRUE(at::equal(p.value(), mine[p.key()])) << p.key();
  }
  for (const auto& p : clone->named_parameters()) {
    EXPECT_TRUE(at::equal(p.value(), mine[p.key()])) << p.key();
  }
  EXPECT_EQ(named_parameter_axes(*layer).at("self_attention.qkv_kernel"),
            (LogicalAxes{"w_fsdp", "w_joined", "w_tp"}));
  layer->to(at::kDouble);
  layer->eval();
  EXPECT_EQ(layer(at::randn({1, 3, 16}, at::kDouble), {}, at::randn({1, 2, 16}, at::kDouble),
                  at::zeros({1, 1, 3, 2}, at::kBool))
                .scalar_type(),
            at::kDouble);
}

TEST(TransformerLayer, DropoutOffInEvalAndInference) {
  manual_seed(18);
  TransformerLayer layer(TransformerLayerOptions(16, 32, 4));
  at::Tensor x = randn({2, 5, 16}, 19);
  layer->eval();
  at::Tensor a = layer(x);
  {
    // Within rounding: without an autograd graph the GEMMs run on oneDNN (cpu_gemm_library).
    c10::InferenceMode inference;
    EXPECT_TRUE(at::allclose(layer(x), a, 1e-5, 1e-6));
  }
  layer->train();
  EXPECT_FALSE(at::allclose(layer(x), a));
}

}  // namespace
}  // namespace te::nn
