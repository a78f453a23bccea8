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
    {at::kFloat, "F32"}, {at::kDouble, "F64"}, {at::kHalf, "F16"},  {at::kBFloat16, "BF16"},
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

namespace {

// (file byte, destination byte, length) of each run to read, merged where both are adjacent.
struct Run {
  int64_t from, to, length;
};

// The runs that read the box [lo, hi) of a tensor of `shape` (`es`-byte elements, `bytes` in
// all): its rows, straight into the box; or, to verify checksums, the whole blocks that hold
// them, to their own places in a tensor-sized buffer.
std::vector<Run> runs_of_box(const std::vector<int64_t>& shape, const std::vector<int64_t>& lo,
                             const std::vector<int64_t>& hi, int64_t es, int64_t bytes,
                             bool verify) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  std::vector<Run> runs;
  auto add = [&](int64_t b0, int64_t b1, int64_t to) {
    if (verify) {
      b0 = b0 / format::kBlockBytes * format::kBlockBytes;
      b1 = std::min(bytes, format::block_count(b1) * format::kBlockBytes);
      to = b0;
      if (!runs.empty() && b0 <= runs.back().from + runs.back().length) {
        runs.back().length = std::max(runs.back().length, b1 - runs.back().from);
        return;
      }
    } else if (!runs.empty() && runs.back().from + runs.back().length == b0 &&
               runs.back().to + runs.back().length == to) {
      runs.back().length += b1 - b0;
      return;
    }
    runs.push_back({b0, to, b1 - b0});
  };
  if (nd == 0) {
    add(0, bytes, 0);
  } else {
    std::vector<int64_t> stride(static_cast<std::size_t>(nd), 1);
    for (int64_t d = nd - 2; d >= 0; --d) stride[d] = stride[d + 1] * shape[d + 1];
    std::vector<int64_t> idx(lo.begin(), lo.end());
    const int64_t last = nd - 1, row_bytes = (hi[last] - lo[last]) * es;
    for (int64_t row = 0;; ++row) {
      int64_t first = 0;
      for (int64_t d = 0; d < nd; ++d) first += idx[d] * stride[d];
      add(first * es, first * es + row_bytes, row * row_bytes);
      int64_t d = last - 1;
      for (; d >= 0; --d) {
        if (++idx[d] < hi[d]) break;
        idx[d] = lo[d];
      }
      if (d < 0) break;
    }
  }
  return runs;
}

}  // namespace

at::Tensor SafetensorsReader::read(const std::string& name, const std::vector<int64_t>& lo,
                                   const std::vector<int64_t>& hi,
                                   const std::vector<uint32_t>& crc32_blocks, int64_t* bytes_read) {
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
             te::shape_text(shape));
  }
  const at::ScalarType type = safetensors_scalar_type(h.dtype, "'" + name + "' in '" + path + "'");
  const int64_t es = static_cast<int64_t>(c10::elementSize(type));
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  const int64_t bytes = numel * es;  // == h.end - h.begin, checked by parse_header
  const bool verify = !crc32_blocks.empty();
  const int64_t blocks = format::block_count(bytes);
  TE_CHECK(!verify || static_cast<int64_t>(crc32_blocks.size()) == blocks,
           "internal: safetensors: ", crc32_blocks.size(), " checksums for the ", blocks,
           " blocks of '", name, "' in '", path, "'");
  std::vector<int64_t> box_shape;
  for (int64_t d = 0; d < nd; ++d) box_shape.push_back(hi[d] - lo[d]);
  // Without checksums the box's rows (all dims but the last) are read straight into it, rows
  // that follow each other in the file in one read. With them, whole 1 MiB blocks are read into
  // a buffer the size of the tensor (only the blocks' pages are touched) and each verified.
  at::Tensor out = at::empty(box_shape, at::TensorOptions().dtype(type));
  if (out.numel() == 0) return out;
  at::Tensor whole = verify ? at::empty(shape, at::TensorOptions().dtype(type)) : at::Tensor();
  auto* dst = static_cast<unsigned char*>(verify ? whole.data_ptr() : out.data_ptr());
  const std::vector<Run> runs = runs_of_box(shape, lo, hi, es, bytes, verify);
  for (const Run& r : runs) {
    read_at(state_->fd, dst + r.to, static_cast<std::size_t>(r.length),
            state_->header.data_start + h.begin + r.from, path);
    if (bytes_read != nullptr) *bytes_read += r.length;
    if (!verify) continue;
    for (int64_t kb = r.from; kb < r.from + r.length; kb += format::kBlockBytes) {
      const int64_t k = kb / format::kBlockBytes;
      const uint32_t crc =
          crc32_of(dst + kb, static_cast<std::size_t>(std::min(format::kBlockBytes, bytes - kb)));
      TE_CHECK(crc == crc32_blocks[k], "safetensors: tensor '", name, "' in '", path,
               "' fails its checksum in block ", k, " (bytes ", kb, "..): CRC-32 ", crc,
               ", the index says ", crc32_blocks[k], "; the file is damaged");
    }
  }
  if (!verify) return out;
  at::Tensor box = whole;
  for (int64_t d = 0; d < nd; ++d) box = box.narrow(d, lo[d], hi[d] - lo[d]);
  out.copy_(box);
  return out;
}

}  // namespace te::nn
