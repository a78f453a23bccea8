#pragma once

// Reading safetensors files by the piece: a file's header (every tensor's dtype, shape and data
// range, checked against the file's size), and any box of a tensor read with as few bytes as
// the box needs: the rows of a tensor that a rank owns, not the tensor. load_checkpoint reads
// te-cpp checkpoints with it (verifying each 1 MiB block's CRC-32), te::hf reads Hugging Face
// checkpoints (model.safetensors and sharded sets) with it.
//
// Example (the first 128 rows of a [32000, 4096] table):
//   te::nn::SafetensorsReader file("model.safetensors");
//   at::Tensor rows = file.read("model.embed_tokens.weight", {0, 0}, {128, 4096});

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace te::nn {

/// The safetensors name of a dtype ("F32", "BF16", ...); te::Error for one it has none for.
const char* safetensors_dtype_name(at::ScalarType type);
/// The dtype of a safetensors name; te::Error naming `name` (and `where` it was found) for one
/// LibTorch has no dtype for.
at::ScalarType safetensors_scalar_type(std::string_view name, const std::string& where);

/// CRC-32 (zlib's) of `n` bytes.
uint32_t crc32_of(const void* data, std::size_t n);

/// Writes `tensors` (CPU or not, any layout) to a new safetensors file at `path`, replacing
/// it: the header, then each tensor's bytes in name order. te::Error naming the file when it
/// cannot be written, and naming the tensor for a dtype safetensors has no name for.
void write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors);

/// One open safetensors file. Not thread-safe (one reader per thread).
class SafetensorsReader {
 public:
  /// Opens `path` and parses its header: te::Error naming the file for one that is missing,
  /// unreadable, truncated or whose header is damaged.
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&&) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&&) noexcept;

  const std::string& path() const;
  /// The tensors the header names, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const;
  /// A tensor's safetensors dtype name and shape; te::Error naming the file for a name it lacks.
  const std::string& dtype(const std::string& name) const;
  const std::vector<int64_t>& shape(const std::string& name) const;

  /// The elements [lo, hi) of tensor `name` (per dim), in the file's dtype, as a contiguous CPU
  /// tensor of shape hi - lo. Reads only the bytes of the box's rows, merged where adjacent;
  /// with `crc32_blocks` (one per format block of 1 MiB of the tensor's data), whole blocks,
  /// each verified: a mismatch is a te::Error naming the tensor, file and block. Adds the bytes
  /// read to `*bytes_read` when given.
  at::Tensor read(const std::string& name, const std::vector<int64_t>& lo,
                  const std::vector<int64_t>& hi, const std::vector<uint32_t>& crc32_blocks = {},
                  int64_t* bytes_read = nullptr);
  /// The whole tensor.
  at::Tensor read(const std::string& name, int64_t* bytes_read = nullptr);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace te::nn
