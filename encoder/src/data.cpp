#include "te/encoder/data.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace encoder {

int64_t Encoded::size() const { return ids.size(0); }

Encoded encode(const std::vector<Example>& examples, const Vocabulary& vocab, int64_t max_seq_len) {
  const int64_t n = static_cast<int64_t>(examples.size());
  Encoded out;
  out.ids = at::full({n, max_seq_len}, Vocabulary::kPad, at::kLong);
  out.lengths = at::empty({n}, at::kLong);
  out.labels = at::empty({n}, at::kLong);
  auto ids = out.ids.accessor<int64_t, 2>();
  auto lengths = out.lengths.accessor<int64_t, 1>();
  auto labels = out.labels.accessor<int64_t, 1>();
  for (int64_t i = 0; i < n; ++i) {
    const auto tokens = tokenize(examples[static_cast<std::size_t>(i)].sentence);
    const int64_t len = std::min<int64_t>(static_cast<int64_t>(tokens.size()), max_seq_len);
    out.was_truncated.push_back(static_cast<int64_t>(tokens.size()) > max_seq_len);
    if (out.was_truncated.back()) ++out.truncated;
    for (int64_t j = 0; j < len; ++j) ids[i][j] = vocab.id(tokens[static_cast<std::size_t>(j)]);
    lengths[i] = len;
    labels[i] = examples[static_cast<std::size_t>(i)].label;
  }
  return out;
}

at::Tensor padding_mask(const at::Tensor& lengths, int64_t max_seq_len) {
  const at::Tensor pad = at::arange(max_seq_len, at::kLong).view({1, -1}) >= lengths.view({-1, 1});
  return pad.unsqueeze(2).logical_or(pad.unsqueeze(1)).unsqueeze(1);
}

}  // namespace encoder
