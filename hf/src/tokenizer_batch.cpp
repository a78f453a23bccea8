// te::hf::Tokenizer::encode_batch: texts padded into tensors (the only part of the tokenizer
// that needs LibTorch; tokenizer.cpp stays free of it for the fuzz target).

#include <ATen/ATen.h>

#include <algorithm>

#include "te/error.h"
#include "te/hf/tokenizer.h"

namespace te::hf {

Batch pad(const std::vector<Encoding>& all, int64_t pad_id) {
  TE_CHECK(!all.empty(), "tokenizer: a batch of no texts");
  std::size_t longest = 0;
  for (const Encoding& e : all) longest = std::max(longest, e.ids.size());
  const auto n = static_cast<int64_t>(all.size());
  const auto s = static_cast<int64_t>(longest);
  Batch b;
  b.ids = at::full({n, s}, pad_id, at::kLong);
  b.attention_mask = at::zeros({n, s}, at::kLong);
  b.token_type_ids = at::zeros({n, s}, at::kLong);
  for (int64_t i = 0; i < n; ++i) {
    const Encoding& e = all[static_cast<std::size_t>(i)];
    const auto len = static_cast<int64_t>(e.ids.size());
    b.truncated.push_back(e.truncated);
    if (len == 0) continue;
    b.ids[i].narrow(0, 0, len).copy_(at::tensor(e.ids));
    b.token_type_ids[i].narrow(0, 0, len).copy_(at::tensor(e.type_ids));
    b.attention_mask[i].narrow(0, 0, len).fill_(1);
  }
  return b;
}

Batch Tokenizer::encode_batch(const std::vector<std::string>& texts,
                              const EncodeOptions& options) const {
  TE_CHECK(!texts.empty(), "tokenizer: encode_batch of no texts");
  std::vector<Encoding> all;
  for (const std::string& text : texts) all.push_back(encode(text, options));
  return pad(all, pad_id());
}

}  // namespace te::hf
