#pragma once

// CoLA for the encoder example, the tensor side: padded batches of token ids and their attention
// masks. The text side (TSV files, tokenizer, vocabulary) is text.h.

#include <ATen/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "te/encoder/text.h"

namespace encoder {

/// A tokenized, padded data set: ids [n, max_seq_len] (int64), lengths [n], labels [n].
struct Encoded {
  at::Tensor ids, lengths, labels;
  int64_t truncated = 0;            // sentences longer than max_seq_len
  std::vector<bool> was_truncated;  // per sentence
  int64_t size() const;
};
Encoded encode(const std::vector<Example>& examples, const Vocabulary& vocab, int64_t max_seq_len);

/// The attention mask of a batch: [batch, 1, seq, seq] bool, true where the query or the key is
/// padding (TE's encoder example masks both).
at::Tensor padding_mask(const at::Tensor& lengths, int64_t max_seq_len);

}  // namespace encoder
