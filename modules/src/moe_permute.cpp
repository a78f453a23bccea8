// Token permutation for mixture of experts (te/nn/moe.h): TE's moe_permute, moe_permute_with_probs,
// moe_permute_and_pad_with_probs, moe_unpermute and moe_sort_chunks_by_index (permutation.py at
// d0067d0da; the orders of its references in tests/pytorch/test_permutation.py). One map,
// `Permutation`, records for every row the token it holds and its slot in the routing map, so
// that unpermuting and merging by probabilities is one formula for mask and index maps.

#include <ATen/ATen.h>

#include "forward.h"
#include "te/error.h"
#include "te/nn/moe.h"

namespace te::nn::functional {

namespace {

using te::nn::detail::dtype_and_shape;
using te::nn::detail::shape_of;

void check_tokens(const at::Tensor& tokens, const char* who) {
  TE_CHECK(tokens.defined() && tokens.dim() == 2, who, ": tokens are ", shape_of(tokens),
           "; give [tokens, hidden] (flatten batch and sequence first)");
}

std::vector<int64_t> to_vector(const at::Tensor& counts) {
  const at::Tensor c = counts.to(at::kCPU, at::kLong).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

// A Permutation from its rows' `source` (the token of each routed row, grouped by expert) and
// `slot` (its place in the routing map), spread with padding rows (-1) so that each expert's
// rows are a multiple of `align`.
Permutation lay_out(at::Tensor source, at::Tensor slot, std::vector<int64_t> rows_per_expert,
                    int64_t num_tokens, int64_t slots_per_token, int64_t align) {
  Permutation p;
  p.num_tokens = num_tokens;
  p.slots_per_token = slots_per_token;
  if (align > 1) {
    std::vector<int64_t> destination;
    destination.reserve(source.size(0));
    int64_t at = 0;
    for (int64_t& rows : rows_per_expert) {
      for (int64_t r = 0; r < rows; ++r) destination.push_back(at + r);
      rows = (rows + align - 1) / align * align;
      at += rows;
    }
    const at::Tensor where = at::tensor(destination, source.options());
    source = at::full({at}, -1, source.options()).index_copy_(0, where, source);
    slot = at::full({at}, -1, slot.options()).index_copy_(0, where, slot);
  }
  p.source = source;
  p.slot = slot;
  p.rows_per_expert = std::move(rows_per_expert);
  return p;
}

// Rows of `values` ([n, ...]) at `index` (-1: a zero row), differentiable in `values`.
at::Tensor gather_rows(const at::Tensor& values, const at::Tensor& index) {
  const at::Tensor real = index.ge(0);
  if (real.all().item<bool>()) return values.index_select(0, index);
  const at::Tensor places = real.nonzero().squeeze(1);
  std::vector<int64_t> shape = values.sizes().vec();
  shape[0] = index.size(0);
  return at::zeros(shape, values.options())
      .index_copy(0, places, values.index_select(0, index.index_select(0, places)));
}

Permutation permute_mask(const at::Tensor& tokens, const at::Tensor& routing_map, int64_t align,
                         const char* who) {
  check_tokens(tokens, who);
  TE_CHECK(routing_map.defined() && routing_map.dim() == 2 &&
               routing_map.size(0) == tokens.size(0) &&
               (routing_map.scalar_type() == at::kBool ||
                at::isIntegralType(routing_map.scalar_type(), /*includeBool=*/false)),
           who, ": routing_map is ", dtype_and_shape(routing_map), "; give a bool or integer [",
           tokens.size(0), ", experts] map for tokens ", tokens.sizes());
  TE_CHECK(align >= 1, who, ": align ", align, " must be at least 1");
  const int64_t experts = routing_map.size(1);
  const at::Tensor by_expert = routing_map.ne(0).t().to(tokens.device());  // [experts, tokens]
  const at::Tensor routed = by_expert.nonzero();  // (expert, token), expert-major
  const at::Tensor expert = routed.select(1, 0), source = routed.select(1, 1).contiguous();
  return lay_out(source, source * experts + expert, to_vector(by_expert.sum(1)), tokens.size(0),
                 experts, align);
}

}  // namespace

Permutation moe_permute(const at::Tensor& tokens, const at::Tensor& routing_map, int64_t align) {
  Permutation p = permute_mask(tokens, routing_map, align, "moe_permute");
  p.tokens = gather_rows(tokens, p.source);
  return p;
}

Permutation moe_permute_with_probs(const at::Tensor& tokens, const at::Tensor& probs,
                                   const at::Tensor& routing_map, int64_t align) {
  Permutation p = permute_mask(tokens, routing_map, align, "moe_permute_with_probs");
  TE_CHECK(probs.defined() && probs.sizes() == routing_map.sizes() &&
               at::isFloatingType(probs.scalar_type()) && probs.device() == tokens.device(),
           "moe_permute_with_probs: probs are ", shape_of(probs),
           "; give floating-point probabilities shaped as routing_map ", routing_map.sizes(),
           " on the tokens' device (", tokens.device(), ")");
  p.tokens = gather_rows(tokens, p.source);
  p.probs = gather_rows(probs.reshape({-1}), p.slot);
  return p;
}

Permutation moe_permute_indices(const at::Tensor& tokens, const at::Tensor& indices,
                                int64_t num_experts, int64_t num_out_tokens) {
  const char* who = "moe_permute_indices";
  check_tokens(tokens, who);
  TE_CHECK(indices.defined() && (indices.dim() == 1 || indices.dim() == 2) &&
               indices.size(0) == tokens.size(0) &&
               at::isIntegralType(indices.scalar_type(), /*includeBool=*/false),
           who, ": indices are ", dtype_and_shape(indices), "; give integer expert indices [",
           tokens.size(0), ", topk] for tokens ", tokens.sizes());
  TE_CHECK(num_experts >= 1, who, ": num_experts ", num_experts, " must be positive");
  const int64_t topk = indices.dim() == 1 ? 1 : indices.size(1);
  const at::Tensor flat = indices.reshape({-1}).to(tokens.device(), at::kLong);
  if (flat.numel() > 0) {
    const int64_t low = flat.min().item<int64_t>(), high = flat.max().item<int64_t>();
    TE_CHECK(low >= 0 && high < num_experts, who, ": an expert index (", low < 0 ? low : high,
             ") is outside [0, ", num_experts, ")");
  }
  const int64_t total = flat.numel();
  TE_CHECK(num_out_tokens >= 0 && num_out_tokens <= total, who, ": num_out_tokens ", num_out_tokens,
           " is not in [0, ", total, "] (0: every routed row)");
  const int64_t rows = num_out_tokens == 0 ? total : num_out_tokens;
  at::Tensor experts, order;
  std::tie(experts, order) = at::sort(flat, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  order = order.narrow(0, 0, rows).contiguous();
  Permutation p = lay_out(at::div(order, topk, "floor"), order,
                          to_vector(at::bincount(experts.narrow(0, 0, rows), {}, num_experts)),
                          tokens.size(0), topk, 1);
  p.tokens = tokens.index_select(0, p.source);
  return p;
}

at::Tensor moe_unpermute(const at::Tensor& rows, const Permutation& map,
                         const at::Tensor& merging_probs) {
  TE_CHECK(rows.defined() && rows.dim() == 2 && map.source.defined() &&
               rows.size(0) == map.source.size(0),
           "moe_unpermute: rows are ", shape_of(rows), "; give [",
           map.source.defined() ? map.source.size(0) : 0,
           ", hidden]: one per row of the Permutation, in its order");
  at::Tensor source = map.source, slot = map.slot, values = rows;
  const at::Tensor real = source.ge(0);
  if (!real.all().item<bool>()) {
    const at::Tensor places = real.nonzero().squeeze(1);
    source = source.index_select(0, places);
    slot = slot.index_select(0, places);
    values = values.index_select(0, places);
  }
  const at::ScalarType type = at::promote_types(rows.scalar_type(), at::kFloat);
  values = values.to(type);
  if (merging_probs.defined()) {
    TE_CHECK(merging_probs.dim() == 2 && merging_probs.size(0) == map.num_tokens &&
                 merging_probs.size(1) == map.slots_per_token &&
                 at::isFloatingType(merging_probs.scalar_type()) &&
                 merging_probs.device() == rows.device(),
             "moe_unpermute: merging_probs are ", merging_probs.sizes(), " on ",
             merging_probs.device(), "; give [", map.num_tokens, ", ", map.slots_per_token,
             "], floating point, on the rows' device (", rows.device(),
             "): the routing map's shape (experts for a mask map, topk for an index map)");
    values = values * merging_probs.reshape({-1}).index_select(0, slot).to(type).unsqueeze(1);
  }
  return at::zeros({map.num_tokens, rows.size(1)}, values.options())
      .index_add(0, source, values)
      .to(rows.scalar_type());
}

at::Tensor moe_sort_chunks_by_index(const at::Tensor& x, const std::vector<int64_t>& split_sizes,
                                    const std::vector<int64_t>& sorted_index) {
  TE_CHECK(x.defined() && x.dim() >= 1, "moe_sort_chunks_by_index: give x [rows, ...]");
  const auto chunks = static_cast<int64_t>(split_sizes.size());
  int64_t total = 0;
  for (const int64_t n : split_sizes) {
    TE_CHECK(n >= 0, "moe_sort_chunks_by_index: a split size (", n, ") is negative");
    total += n;
  }
  TE_CHECK(total == x.size(0), "moe_sort_chunks_by_index: split_sizes sum to ", total,
           " rows; x has ", x.size(0));
  std::vector<bool> seen(split_sizes.size(), false);
  TE_CHECK(static_cast<int64_t>(sorted_index.size()) == chunks,
           "moe_sort_chunks_by_index: sorted_index has ", sorted_index.size(), " entries for ",
           chunks, " chunks; give a permutation of the chunks");
  for (const int64_t i : sorted_index) {
    TE_CHECK(i >= 0 && i < chunks && !seen[i], "moe_sort_chunks_by_index: sorted_index ",
             c10::ArrayRef<int64_t>(sorted_index), " is not a permutation of 0..", chunks - 1);
    seen[i] = true;
  }
  std::vector<int64_t> start(split_sizes.size(), 0);
  for (int64_t i = 1; i < chunks; ++i) start[i] = start[i - 1] + split_sizes[i - 1];
  std::vector<int64_t> order;
  order.reserve(total);
  for (const int64_t i : sorted_index)
    for (int64_t r = 0; r < split_sizes[i]; ++r) order.push_back(start[i] + r);
  return x.index_select(0, at::tensor(order, x.options().dtype(at::kLong)));
}

}  // namespace te::nn::functional
