#pragma once

// The token file: a data file tokenized once and memory-mapped read-only after (train/README.md
// gives the layout). Written to a temporary file beside it and renamed, so a crash never leaves a
// half-written one; reused while the source file's size and modification time, the options and
// the tokenizer's fingerprint are those it was made with. A source that changed, or other
// options, rebuild it; another tokenizer is an error (deleting the file, or giving the model it
// was made with, is the user's choice).
//
// Example:
//   auto tok = te::hf::Tokenizer::from_pretrained("SmolLM2-135M/");
//   te::train::TokenFile file = te::train::TokenFile::open_or_build(
//       "corpus.jsonl", tok, {.eos_id = 0});   // writes corpus.jsonl.tokens the first time
//   file.num_tokens(); file.tokens()[0];

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "te/gen/chat_template.h"
#include "te/hf/tokenizer.h"
#include "te/train/source.h"

namespace te::train {

struct TokenFileOptions {
  /// The id appended to each text document (te-train passes the model's EOS).
  int64_t eos_id = -1;
  /// Where the token file goes ("": the data file's path + ".tokens").
  std::string path;
  SourceOptions source;
  /// Tokenize text documents with the model's special tokens (a BOS before each, for Llama).
  bool add_special_tokens = false;
  /// The chat template conversations are rendered with (required for chat data).
  std::optional<te::gen::ChatTemplate> chat_template;
  /// A progress bar on stderr while tokenizing (a TTY's; one line every 10% otherwise).
  bool progress = true;
};

class TokenFile {
 public:
  /// Maps `token_file_path` (TokenFileOptions::path) if it is valid for `data_path`, `tokenizer`
  /// and `options`; else reads, tokenizes and writes it, then maps it. te::Error naming the token
  /// file when another tokenizer made it, and read_source's errors for the data file.
  static TokenFile open_or_build(const std::string& data_path, const te::hf::Tokenizer& tokenizer,
                                 const TokenFileOptions& options);
  /// Maps a token file as it is (no source or tokenizer check); te::Error naming it when it is
  /// missing, truncated or not a token file.
  static TokenFile open(const std::string& path);

  const std::string& path() const;
  int64_t num_tokens() const;
  int64_t num_documents() const;
  /// num_tokens() ids.
  const uint32_t* tokens() const;
  /// num_documents() + 1 offsets into tokens(): document d is [offsets[d], offsets[d + 1]).
  const int64_t* document_offsets() const;
  /// num_tokens() flags (1: a training target), or nullptr when every token is one (text data).
  const uint8_t* loss_mask() const;
  uint64_t tokenizer_fingerprint() const;
  /// Whether open_or_build wrote the file (false: it reused one).
  bool built() const { return built_; }

  struct Mapping;

 private:
  explicit TokenFile(std::shared_ptr<const Mapping> map) : map_(std::move(map)) {}
  std::shared_ptr<const Mapping> map_;
  bool built_ = false;
};

/// The token file of `data_path` under `options` ("" path: data_path + ".tokens").
std::string token_file_path(const std::string& data_path, const TokenFileOptions& options);

}  // namespace te::train
