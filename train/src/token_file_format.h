#pragma once

// The token file's layout (train/README.md), shared by its reader (token_file.cpp) and writer
// (token_file_build.cpp). Native byte order (little-endian on every platform te-cpp builds for).

#include <cstdint>
#include <cstring>
#include <string>

#include "te/train/token_file.h"

namespace te::train::detail {

inline constexpr char kMagic[8] = {'T', 'E', 'T', 'O', 'K', 'E', 'N', 'S'};
inline constexpr uint32_t kVersion = 1;
inline constexpr uint32_t kHasLossMask = 1;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t flags;  ///< kHasLossMask
  uint64_t num_tokens;
  uint64_t num_documents;
  uint64_t tokenizer_fingerprint;
  uint64_t source_size;
  int64_t source_mtime_ns;
  uint64_t options_hash;  ///< eos id, data format, text field, special tokens, chat template
  uint64_t reserved[2];
};
static_assert(sizeof(Header) == 80);

inline uint64_t offsets_at(uint64_t num_tokens) {
  return (sizeof(Header) + 4 * num_tokens + 7) / 8 * 8;
}
inline uint64_t mask_at(const Header& h) {
  return offsets_at(h.num_tokens) + 8 * (h.num_documents + 1);
}
inline uint64_t file_size(const Header& h) {
  return mask_at(h) + ((h.flags & kHasLossMask) ? h.num_tokens : 0);
}

/// The header a token file of `data_path` made now would have (its counts zero): the data file's
/// size and modification time (te::Error naming it when it is missing), the options' hash and
/// the tokenizer's fingerprint.
Header expected_header(const std::string& data_path, const te::hf::Tokenizer& tokenizer,
                       const TokenFileOptions& options);

/// Reads and tokenizes `data_path` and writes the token file `path` with `header`'s fields (a
/// temporary file beside it, renamed when complete).
void write_token_file(const std::string& data_path, const std::string& path,
                      const te::hf::Tokenizer& tokenizer, const TokenFileOptions& options,
                      Header header);

}  // namespace te::train::detail
