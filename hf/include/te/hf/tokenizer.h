#pragma once

// te::hf::Tokenizer: a Hugging Face model's tokenizer read from its own files (tokenizer.json, or
// BERT's vocab.txt with tokenizer_config.json), encoding and decoding exactly as the `tokenizers`
// library does (tests/interop/check_tokenizers.py holds every id to it). Unicode comes from ICU.
//
// Example:
//   te::hf::Tokenizer tok = te::hf::Tokenizer::from_pretrained("all-MiniLM-L6-v2/");
//   te::hf::Encoding e = tok.encode("Hello, world!");   // [CLS] hello , world ! [SEP]
//   te::hf::Batch b = tok.encode_batch({"a sentence", "another one"}, {.max_length = 256});
//   std::string text = tok.decode(e.ids);               // "hello, world!"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "te/gen/detokenizer.h"

namespace te::hf {

struct GgufHeader;

/// One text's tokens.
struct Encoding {
  std::vector<int64_t> ids;
  std::vector<int64_t> type_ids;  ///< the post-processor's token types (BERT's segment ids)
  bool truncated = false;         ///< tokens were cut to max_length
};

/// Texts padded to the longest: ids, attention_mask (1 token, 0 padding), token_type_ids, all
/// [batch, longest] int64, and which texts were truncated.
struct Batch {
  at::Tensor ids, attention_mask, token_type_ids;
  std::vector<bool> truncated;
};

struct EncodeOptions {
  /// Add the model's special tokens ([CLS] ... [SEP] for BERT).
  bool add_special_tokens = true;
  /// At most this many tokens, special tokens included (0: no limit); the text's own tokens are
  /// cut from the end and Encoding::truncated says so.
  int64_t max_length = 0;
};

/// Encodings padded to the longest with `pad_id` (right), as encode_batch returns them.
Batch pad(const std::vector<Encoding>& encodings, int64_t pad_id);

/// Also te::gen's Detokenizer: what an Engine's stop strings and TextStream decode with.
class Tokenizer : public te::gen::Detokenizer {
 public:
  /// `dir`/tokenizer.json, else `dir`/vocab.txt (a BERT WordPiece vocabulary, configured by
  /// tokenizer_config.json beside it). te::Error naming the directory when it holds neither.
  static Tokenizer from_pretrained(const std::string& dir);
  /// A tokenizer.json, a vocab.txt or a GGUF file: te::Error naming the file and field for a kind
  /// te-cpp does not implement (model, normalizer, pre-tokenizer, post-processor, decoder), never
  /// ignored.
  static Tokenizer from_file(const std::string& path);
  /// tokenizer.json's text (`path` names it in errors), or the file.
  static Tokenizer from_json(std::string_view json_text, const std::string& path);
  static Tokenizer from_json_file(const std::string& path);
  /// BERT's vocab.txt (one token per line), configured by tokenizer_config.json beside it
  /// (do_lower_case, strip_accents, tokenize_chinese_chars, the special tokens).
  static Tokenizer from_vocab_txt(const std::string& path);
  /// A GGUF file's tokenizer metadata, as the model's own tokenizer splits and merges: byte-level
  /// BPE (tokenizer.ggml.model "gpt2", the split tokenizer.ggml.pre names in llama.cpp's table)
  /// SentencePiece BPE ("llama", merges from the scores, byte fallback) or WordPiece ("bert");
  /// control tokens special, BOS and EOS as add_bos_token and add_eos_token say. te::Error naming
  /// the key for another model or pre-tokenizer, or missing tokens, merges, scores or ids.
  static Tokenizer from_gguf(const std::string& path);
  /// The same from a header already read (read_gguf_header, parse_gguf_header: a file in memory).
  static Tokenizer from_gguf(const GgufHeader& header);

  Encoding encode(std::string_view text, const EncodeOptions& options = {}) const;
  Batch encode_batch(const std::vector<std::string>& texts,
                     const EncodeOptions& options = {}) const;
  /// Tokens back to text (the model's decoder); special tokens left out unless asked for.
  std::string decode(const std::vector<int64_t>& ids,
                     bool skip_special_tokens = true) const override;

  int64_t vocab_size() const;
  std::optional<int64_t> token_to_id(const std::string& token) const;
  /// te::Error naming an id outside the vocabulary.
  std::string id_to_token(int64_t id) const;
  /// The id padding uses (the post-processor's or the [PAD] token's; 0 when there is none).
  int64_t pad_id() const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace te::hf
