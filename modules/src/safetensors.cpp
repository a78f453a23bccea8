#include "te/nn/safetensors.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

#include "checkpoint_format.h"
#include "te/error.h"

namespace te::nn {

namespace {

struct DtypeName {
  at::ScalarType type;
  std::string_view name;
};
constexpr DtypeName kDtypes[] = {
    {at::kFloat, "F32"}, {at::kDouble, "F64"}, {at::kHalf, "F16"}, {at::kBFloat16, "BF16"},
    {at::kLong, "I64"},  {at::kInt, "I32"},    {at::kShort, "I16"}, {at::kChar, "I8"},
    {at::kByte, "U8"},   {at::kBool, "BOOL"},
};

void read_at(int fd, void* data, std::size_t n, int64_t offset, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, offset);
    if (r < 0 && errno == EINTR) continue;
    TE_CHECK(r >= 0, "safetensors: reading '", path, "' failed: ", std::strerror(errno));
    TE_CHECK(r > 0, "safetensors: '", path, "' is truncated: it ends before byte ", offset + n,
             "; the file is incomplete or damaged");
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += r;
  }
}

}  // namespace

const char* safetensors_dtype_name(at::ScalarType type) {
  for (const DtypeName& d : kDtypes) {
    if (d.type == type) return d.name.data();
  }
  TE_FAIL("safetensors: dtype ", type, " has no safetensors name");
}

at::ScalarType safetensors_scalar_type(std::string_view name, const std::string& where) {
  for (const DtypeName& d : kDtypes) {
    if (d.name == name) return d.type;
  }
  TE_FAIL("safetensors: ", where, " has dtype '", name,
          "', which te-cpp cannot hold in a LibTorch tensor (F64, F32, F16, BF16, I64, I32, I16, "
          "I8, U8, BOOL)");
}

uint32_t crc32_of(const void* data, std::size_t n) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    const uInt chunk = static_cast<uInt>(std::min<std::size_t>(n, 1u << 30));
    crc = ::crc32(crc, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

void write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors) {
  std::map<std::string, format::HeaderEntry> entries;
  std::vector<at::Tensor> data;
  int64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    TE_CHECK(t.defined(), "write_safetensors: tensor '", name, "' is undefined");
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    format::HeaderEntry& e = entries[name];
    e.dtype = safetensors_dtype_name(c.scalar_type());
    e.shape = c.sizes().vec();
    e.begin = offset;
    e.end = offset + static_cast<int64_t>(c.numel() * c.element_size());
    offset = e.end;
    data.push_back(std::move(c));
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  TE_CHECK(out.good(), "write_safetensors: cannot create '", path, "'");
  const std::string header = format::header_bytes(entries);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const at::Tensor& c : data) {
    out.write(static_cast<const char*>(c.data_ptr()),
              static_cast<std::streamsize>(c.numel() * c.element_size()));
  }
  out.close();
  TE_CHECK(out.good(), "write_safetensors: writing '", path, "' failed (a full disk?)");
}

struct SafetensorsReader::State {
  int fd = -1;
  std::string path;
  format::SafetensorsHeader header;
  ~State() {
    if (fd >= 0) ::close(fd);
  }
  const format::HeaderEntry& entry(const std::string& name) const {
    const auto it = header.tensors.find(name);
    TE_CHECK(it != header.tensors.end(), "safetensors: '", path, "' has no tensor '", name, "'");
    return it->second;
  }
};

SafetensorsReader::SafetensorsReader(const std::string& path) : state_(std::make_unique<State>()) {
  state_->path = path;
  state_->fd = ::open(path.c_str(), O_RDONLY);
  TE_CHECK(state_->fd >= 0, "safetensors: cannot open '", path, "': ", std::strerror(errno));
  struct stat s {};
  TE_CHECK(::fstat(state_->fd, &s) == 0, "safetensors: cannot stat '", path, "'");
  const int64_t size = s.st_size;
  unsigned char le[8] = {};
  if (size >= 8) read_at(state_->fd, le, 8, 0, path);
  const uint64_t n = format::header_length(le, size, path);
  std::string text(n, '\0');
  read_at(state_->fd, text.data(), n, 8, path);
  state_->header = format::parse_header(text, size, path);
}

SafetensorsReader::~SafetensorsReader() = default;
SafetensorsReader::SafetensorsReader(SafetensorsReader&&) noexcept = default;
SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&&) noexcept = default;

const std::string& SafetensorsReader::path() const { return state_->path; }

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : state_->header.tensors) out.push_back(name);
  return out;
}

bool SafetensorsReader::contains(const std::string& name) const {
  return state_->header.tensors.count(name) != 0;
}

const std::string& SafetensorsReader::dtype(const std::string& name) const {
  return state_->entry(name).dtype;
}

const std::vector<int64_t>& SafetensorsReader::shape(const std::string& name) const {
  return state_->entry(name).shape;
}

at::Tensor SafetensorsReader::read(const std::string& name, int64_t* bytes_read) {
  const std::vector<int64_t>& s = shape(name);
  return read(name, std::vector<int64_t>(s.size(), 0), s, {}, bytes_read);
}

at::Tensor SafetensorsReader::read(const std::string& name, const std::vector<int64_t>& lo,
                                   const std::vector<int64_t>& hi,
                                   const std::vector<uint32_t>& crc32_blocks,
                                   int64_t* bytes_read) {
  const format::HeaderEntry& h = state_->entry(name);
  const std::string& path = state_->path;
  const std::vector<int64_t>& shape = h.shape;
  const int64_t nd = static_cast<int64_t>(shape.size());
  TE_CHECK(static_cast<int64_t>(lo.size()) == nd && static_cast<int64_t>(hi.size()) == nd,
           "safetensors: reading '", name, "' in '", path, "': the box has ", lo.size(), " and ",
           hi.size(), " bounds for a ", nd, "-dim tensor");
  for (int64_t d = 0; d < nd; ++d) {
    TE_CHECK(0 <= lo[d] && lo[d] <= hi[d] && hi[d] <= shape[d], "safetensors: reading '", name,
             "' in '", path, "': box [", lo[d], ", ", hi[d], ") of dim ", d, " is outside ",
             format::shape_text(shape));
  }
  const at::ScalarType type = safetensors_scalar_type(h.dtype, "'" + name + "' in '" + path + "'");
  at::Tensor whole = at::empty(shape, at::TensorOptions().dtype(type));
  const int64_t es = static_cast<int64_t>(whole.element_size());
  const int64_t bytes = whole.numel() * es;  // == h.end - h.begin, checked by parse_header
  const bool verify = !crc32_blocks.empty();
  const int64_t blocks = format::block_count(bytes);
  TE_CHECK(!verify || static_cast<int64_t>(crc32_blocks.size()) == blocks,
           "internal: safetensors: ", crc32_blocks.size(), " checksums for the ", blocks,
           " blocks of '", name, "' in '", path, "'");
  // The byte ranges of the box's rows (all dims but the last), row-major; with checksums,
  // widened to whole blocks. Adjacent ranges are merged into one read.
  std::vector<std::pair<int64_t, int64_t>> ranges;
  auto add = [&](int64_t b0, int64_t b1) {
    if (b0 >= b1) return;
    if (verify) {
      b0 = b0 / format::kBlockBytes * format::kBlockBytes;
      b1 = std::min(bytes, format::block_count(b1) * format::kBlockBytes);
    }
    if (!ranges.empty() && b0 <= ranges.back().second) {
      ranges.back().second = std::max(ranges.back().second, b1);
    } else {
      ranges.emplace_back(b0, b1);
    }
  };
  bool empty = false;
  for (int64_t d = 0; d < nd; ++d) empty = empty || lo[d] == hi[d];
  if (nd == 0) {
    add(0, bytes);
  } else if (!empty) {
    std::vector<int64_t> stride(static_cast<std::size_t>(nd), 1);
    for (int64_t d = nd - 2; d >= 0; --d) stride[d] = stride[d + 1] * shape[d + 1];
    std::vector<int64_t> idx(lo.begin(), lo.end());
    const int64_t last = nd - 1;
    while (true) {
      int64_t first = 0;
      for (int64_t d = 0; d < nd; ++d) first += idx[d] * stride[d];
      add(first * es, (first + hi[last] - lo[last]) * es);
      int64_t d = last - 1;
      for (; d >= 0; --d) {
        if (++idx[d] < hi[d]) break;
        idx[d] = lo[d];
      }
      if (d < 0) break;
    }
  }
  auto* data = static_cast<unsigned char*>(whole.data_ptr());
  for (const auto& [b0, b1] : ranges) {
    read_at(state_->fd, data + b0, static_cast<std::size_t>(b1 - b0),
            state_->header.data_start + h.begin + b0, path);
    if (bytes_read != nullptr) *bytes_read += b1 - b0;
    if (!verify) continue;
    for (int64_t kb = b0; kb < b1; kb += format::kBlockBytes) {
      const int64_t k = kb / format::kBlockBytes;
      const uint32_t crc =
          crc32_of(data + kb, static_cast<std::size_t>(std::min(format::kBlockBytes, bytes - kb)));
      TE_CHECK(crc == crc32_blocks[k], "checkpoint: tensor '", name, "' in '", path,
               "' fails its checksum in block ", k, " (bytes ", kb, "..): CRC-32 ", crc,
               ", the index says ", crc32_blocks[k], "; the file is damaged");
    }
  }
  at::Tensor box = whole;
  for (int64_t d = 0; d < nd; ++d) box = box.narrow(d, lo[d], hi[d] - lo[d]);
  return box.is_contiguous() && box.numel() == whole.numel() ? whole : box.contiguous();
}

}  // namespace te::nn
