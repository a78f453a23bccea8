#pragma once

// GGUF files (llama.cpp's format, versions 2 and 3): the metadata key/values, the tensor table,
// and any box of a tensor read with only the bytes of its blocks and dequantized to float32:
// F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS,
// MXFP4 (the block layouts of ggml, as gguf-py's
// quants.py dequantizes them; tests/interop/check_gguf.py holds te-cpp to it). The parser takes
// untrusted files: every count, length and offset is checked against the file's size, and a
// damaged or hostile file ends in a te::Error naming the file and the field (fuzz/fuzz_gguf.cpp).
//
// Example:
//   te::hf::GgufFile file("SmolLM2-135M-Instruct.Q4_1.gguf");
//   const int64_t layers = *file.integer("llama.block_count");
//   at::Tensor rows = file.read("blk.0.attn_q.weight", {0, 0}, {64, 576});   // float32

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "te/kernels/ggml.h"

namespace at {
class Tensor;
}

namespace te::hf {

/// ggml's tensor types that te-cpp reads (te/kernels/ggml.h).
using GgmlType = ggml::Type;

/// One metadata value: a scalar (integers and bools as `integer`, floats as `number`), a
/// string, or an array of one of those.
struct GgufValue {
  uint32_t type = 0;  ///< GGUF's value type (0 u8 .. 12 f64; 9 array)
  int64_t integer = 0;
  double number = 0;
  std::string string;
  uint32_t element_type = 0;  ///< arrays: the elements' type
  std::vector<int64_t> integers;
  std::vector<double> numbers;
  std::vector<std::string> strings;
};

struct GgufTensor {
  std::string name;
  std::vector<int64_t> shape;  ///< row-major (ggml's ne reversed): a [out, in] weight
  uint32_t type = 0;           ///< a GgmlType
  int64_t offset = 0;          ///< of its data in the file
  int64_t bytes = 0;
};

/// What a GGUF file's header says, with every tensor's data checked to lie in the file.
struct GgufHeader {
  std::string path;  ///< the file, as errors name it
  uint32_t version = 0;
  std::map<std::string, GgufValue> metadata;
  std::vector<GgufTensor> tensors;  ///< in file order

  /// A metadata value (nullptr when absent), and typed reads (nullopt when absent; te::Error
  /// naming the file and the key when it has another type).
  const GgufValue* value(const std::string& key) const;
  std::optional<int64_t> integer(const std::string& key) const;
  std::optional<double> number(const std::string& key) const;
  std::optional<std::string> string(const std::string& key) const;
};

/// Parses a GGUF header from `read(data, n, offset)`, which fills n bytes from the file's
/// offset (callers check offset + n <= size first), in a file of `size` bytes; `path` names it
/// in errors. te::Error for a bad magic, a version other than 2 or 3, a count, string or array
/// that cannot fit in the file, an unknown value type, a tensor of a type te-cpp cannot read
/// (named), a shape whose rows are not whole blocks, data outside the file.
GgufHeader parse_gguf_header(const std::function<void(void*, std::size_t, int64_t)>& read,
                             int64_t size, const std::string& path);

/// The header of the GGUF file at `path` (its tensors' data is not read). te::Error as
/// parse_gguf_header's, or naming the file when it cannot be opened or read.
GgufHeader read_gguf_header(const std::string& path);

/// One open GGUF file. Not thread-safe (one per thread).
class GgufFile {
 public:
  explicit GgufFile(const std::string& path);
  ~GgufFile();
  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;

  const std::string& path() const;
  const GgufHeader& header() const;
  /// A tensor by name (nullptr when absent).
  const GgufTensor* tensor(const std::string& name) const;
  /// header()'s metadata reads (GgufHeader::value, integer, number, string).
  const GgufValue* value(const std::string& key) const;
  std::optional<int64_t> integer(const std::string& key) const;
  std::optional<double> number(const std::string& key) const;
  std::optional<std::string> string(const std::string& key) const;

  /// The elements [lo, hi) of tensor `name`, dequantized to a float32 CPU tensor of shape
  /// hi - lo: only the blocks holding them are read. Adds the bytes read to `*bytes_read`.
  at::Tensor read(const std::string& name, const std::vector<int64_t>& lo,
                  const std::vector<int64_t>& hi, int64_t* bytes_read = nullptr);

  /// The whole file mapped read-only (once; the mapping lives while a copy of the pointer does,
  /// past this GgufFile): where the rows of weights held in their blocks point
  /// (te::nn::BlockMatrix). te::Error naming the file when it cannot be mapped.
  std::shared_ptr<const unsigned char> mapped();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace te::hf
