// libFuzzer target: te-cpp's checkpoint reader without tensors (modules/src/checkpoint_format.*).
// Each input is tried three ways:
//   - as an index (model.safetensors.index.json): it parses, or throws te::Error; what parses
//     writes back to text that parses to the same index;
//   - as a whole safetensors file: its 8-byte length and header parse against the input's size,
//     or throw te::Error; a parsed header writes back to the same entries;
//   - as one rank's piece list of a save.
// Anything else (another exception, a crash, a sanitizer report) is a bug.
//   bash scripts/fuzz.sh [seconds per target]
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "checkpoint_format.h"
#include "te/error.h"

namespace format = te::nn::format;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const format::Index index = format::parse_index(text, "fuzz-index", "load_checkpoint");
    if (!(format::parse_index(format::index_text(index), "again", "load_checkpoint") == index)) {
      __builtin_trap();
    }
  } catch (const te::Error&) {
  }
  try {
    unsigned char le[8] = {};
    if (size >= 8) std::memcpy(le, data, 8);
    const auto n = format::header_length(le, static_cast<int64_t>(size), "fuzz.safetensors");
    const format::SafetensorsHeader header =
        format::parse_header(text.substr(8, n), static_cast<int64_t>(size), "fuzz.safetensors");
    for (const auto& [name, e] : header.tensors) {
      if (e.begin < 0 || e.end < e.begin || header.data_start + e.end > static_cast<int64_t>(size))
        __builtin_trap();
    }
    // Written back (padded) with the data after it, it reads the same.
    std::string again = format::header_bytes(header.tensors);
    const int64_t data_bytes = static_cast<int64_t>(size) - header.data_start;
    again.append(static_cast<std::size_t>(data_bytes), '\0');
    unsigned char le2[8];
    std::memcpy(le2, again.data(), 8);
    const auto n2 = format::header_length(le2, static_cast<int64_t>(again.size()), "again");
    if (!(format::parse_header(std::string_view(again).substr(8, n2),
                               static_cast<int64_t>(again.size()), "again")
              .tensors == header.tensors)) {
      __builtin_trap();
    }
  } catch (const te::Error&) {
  }
  try {
    const auto pieces = format::parse_pieces(text, "rank 1");
    if (!(format::parse_pieces(format::pieces_text(pieces), "again").size() == pieces.size())) {
      __builtin_trap();
    }
  } catch (const te::Error&) {
  }
  return 0;
}
