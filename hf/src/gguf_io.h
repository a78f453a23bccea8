#pragma once

// Reading a GGUF file by offset, without LibTorch (gguf_format.cpp): what GgufFile
// (gguf.cpp) and read_gguf_header share.

#include <cstddef>
#include <cstdint>
#include <string>

#include "te/hf/gguf.h"

namespace te::hf::detail {

/// n bytes at `offset` of the open file `fd` into data; te::Error naming `path` when the read
/// fails or the file ends first.
void read_exactly(int fd, void* data, std::size_t n, int64_t offset, const std::string& path);

/// parse_gguf_header over the open file `fd` of `size` bytes, read through a 1 MiB window (a
/// vocabulary is thousands of small strings).
GgufHeader read_gguf_header(int fd, int64_t size, const std::string& path);

}  // namespace te::hf::detail
