// The GGUF header parser, without LibTorch (fuzz/fuzz_gguf.cpp feeds it directly). Layout:
// ggml's GGUF spec (docs/gguf.md of ggml); the block formats are te/kernels/ggml.h's.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <vector>

#include "gguf_io.h"
#include "te/error.h"
#include "te/hf/gguf.h"

namespace te::hf {

namespace {

// Bounded little-endian reads from the file, through a small window.
class Cursor {
 public:
  Cursor(const std::function<void(void*, std::size_t, int64_t)>& read, int64_t size,
         const std::string& path)
      : read_(read), size_(size), path_(path) {}
  [[noreturn]] void fail(const std::string& field, const std::string& message) const {
    TE_FAIL("gguf: '", path_, "': ", field, ": ", message, " (at byte ", pos_, " of ", size_,
            "); the file is damaged or not GGUF");
  }
  int64_t pos() const { return pos_; }
  int64_t left() const { return size_ - pos_; }
  void bytes(void* out, int64_t n, const std::string& field) {
    if (n < 0 || n > left()) fail(field, "needs " + std::to_string(n) + " bytes past the end");
    if (n > 0) read_(out, static_cast<std::size_t>(n), pos_);
    pos_ += n;
  }
  template <typename T>
  T scalar(const std::string& field) {
    unsigned char b[sizeof(T)];
    bytes(b, sizeof(T), field);
    uint64_t v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(b[i]) << (8 * i);
    T out;
    std::memcpy(&out, &v, sizeof(T));  // little-endian host (x86-64, aarch64)
    return out;
  }
  // A count of items of at least `min_bytes` each: at most what the rest of the file can hold.
  uint64_t count(bool wide, int64_t min_bytes, const std::string& field) {
    const uint64_t n = wide ? scalar<uint64_t>(field) : scalar<uint32_t>(field);
    if (n > static_cast<uint64_t>(left() / std::max<int64_t>(min_bytes, 1))) {
      fail(field, std::to_string(n) + " items cannot fit in the rest of the file");
    }
    return n;
  }
  // Metadata arrays may hold at most this many elements in all (a real vocabulary and its
  // merges are a few hundred thousand), so a hostile file cannot make te-cpp hold many times its
  // size in memory.
  void spend(uint64_t elements, const std::string& field) {
    if (elements > budget_) {
      fail(field, "metadata arrays of more than 2^24 elements in all are not read by te-cpp");
    }
    budget_ -= elements;
  }
  std::string text(bool wide, const std::string& field, uint64_t max = UINT64_MAX) {
    const uint64_t n = count(wide, 1, field);
    if (n > max)
      fail(field, "a string of " + std::to_string(n) + " bytes, over " + std::to_string(max));
    std::string s(n, '\0');
    bytes(s.data(), static_cast<int64_t>(n), field);
    return s;
  }

 private:
  const std::function<void(void*, std::size_t, int64_t)>& read_;
  int64_t size_, pos_ = 0;
  uint64_t budget_ = uint64_t{1} << 24;
  const std::string& path_;
};

// GGUF value types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool, 8 string, 9 array,
// 10 u64, 11 i64, 12 f64.
int64_t scalar_bytes(uint32_t type) {
  static const int64_t kBytes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
  return type < 13 ? kBytes[type] : 0;
}

void read_scalar(Cursor& c, uint32_t type, GgufValue& v, bool into_array,
                 const std::string& field) {
  int64_t i = 0;
  double f = 0;
  bool is_float = false;
  switch (type) {
    case 0:
      i = c.scalar<uint8_t>(field);
      break;
    case 1:
      i = c.scalar<int8_t>(field);
      break;
    case 2:
      i = c.scalar<uint16_t>(field);
      break;
    case 3:
      i = c.scalar<int16_t>(field);
      break;
    case 4:
      i = c.scalar<uint32_t>(field);
      break;
    case 5:
      i = c.scalar<int32_t>(field);
      break;
    case 6:
      f = c.scalar<float>(field), is_float = true;
      break;
    case 7: {
      const uint8_t b = c.scalar<uint8_t>(field);
      if (b > 1) c.fail(field, "a bool of value " + std::to_string(b));
      i = b;
      break;
    }
    case 10: {
      const uint64_t u = c.scalar<uint64_t>(field);
      if (u > static_cast<uint64_t>(INT64_MAX)) c.fail(field, "a u64 beyond int64");
      i = static_cast<int64_t>(u);
      break;
    }
    case 11:
      i = c.scalar<int64_t>(field);
      break;
    case 12:
      f = c.scalar<double>(field), is_float = true;
      break;
    default:
      c.fail(field, "value type " + std::to_string(type) + " is not a GGUF scalar type");
  }
  if (into_array) {
    if (is_float)
      v.numbers.push_back(f);
    else
      v.integers.push_back(i);
  } else {
    if (is_float)
      v.number = f;
    else
      v.integer = i;
  }
}

GgufValue read_value(Cursor& c, uint32_t type, bool wide, const std::string& field) {
  GgufValue v;
  v.type = type;
  if (type == 8) {
    v.string = c.text(wide, field);
  } else if (type == 9) {
    v.element_type = c.scalar<uint32_t>(field + " (array type)");
    if (v.element_type == 9) c.fail(field, "arrays of arrays are not read by te-cpp");
    const bool strings = v.element_type == 8;
    const int64_t each = strings ? (wide ? 8 : 4) : scalar_bytes(v.element_type);
    if (each == 0) {
      c.fail(field, "array element type " + std::to_string(v.element_type) + " is unknown");
    }
    const uint64_t n = c.count(wide, each, field + " (array length)");
    c.spend(n, field);
    for (uint64_t k = 0; k < n; ++k) {
      if (strings)
        v.strings.push_back(c.text(wide, field));
      else
        read_scalar(c, v.element_type, v, true, field);
    }
  } else {
    read_scalar(c, type, v, false, field);
  }
  return v;
}

}  // namespace

GgufHeader parse_gguf_header(const std::function<void(void*, std::size_t, int64_t)>& read,
                             int64_t size, const std::string& path) {
  Cursor c(read, size, path);
  char magic[4];
  c.bytes(magic, 4, "magic");
  if (std::memcmp(magic, "GGUF", 4) != 0) c.fail("magic", "the file does not start with GGUF");
  GgufHeader h;
  h.path = path;
  h.version = c.scalar<uint32_t>("version");
  if (h.version != 2 && h.version != 3) {
    c.fail("version", "GGUF version " + std::to_string(h.version) +
                          " is not supported (te-cpp reads versions 2 and 3)");
  }
  const bool wide = true;  // versions 2 and 3: 64-bit counts and lengths
  // A tensor's entry is at least a name length, n_dims, one dim, type and offset: 28 bytes.
  const uint64_t n_tensors = c.count(wide, 28, "tensor_count");
  const uint64_t n_kv = c.count(wide, 13, "metadata_kv_count");
  if (n_kv > 65536) c.fail("metadata_kv_count", std::to_string(n_kv) + " keys, over 65536");
  for (uint64_t k = 0; k < n_kv; ++k) {
    // GGUF's own limit on a key's length.
    const std::string key = c.text(wide, "metadata key " + std::to_string(k), 65535);
    const uint32_t type = c.scalar<uint32_t>("metadata '" + key + "' type");
    if (h.metadata.count(key)) c.fail("metadata '" + key + "'", "the key appears twice");
    h.metadata[key] = read_value(c, type, wide, "metadata '" + key + "'");
  }
  for (uint64_t t = 0; t < n_tensors; ++t) {
    GgufTensor info;
    info.name = c.text(wide, "tensor " + std::to_string(t) + " name");
    const std::string field = "tensor '" + info.name + "'";
    const uint32_t n_dims = c.scalar<uint32_t>(field + " n_dims");
    if (n_dims < 1 || n_dims > 4) c.fail(field, std::to_string(n_dims) + " dims (ggml has 1 to 4)");
    int64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = c.scalar<uint64_t>(field + " dim");
      if (ne == 0 || ne > (uint64_t{1} << 40) ||
          numel > (int64_t{1} << 40) / static_cast<int64_t>(ne)) {
        c.fail(field, "dim " + std::to_string(d) + " of " + std::to_string(ne) +
                          " makes no tensor te-cpp can hold");
      }
      info.shape.insert(info.shape.begin(), static_cast<int64_t>(ne));  // ggml's ne reversed
      numel *= static_cast<int64_t>(ne);
    }
    info.type = c.scalar<uint32_t>(field + " type");
    const auto [per_block, block_bytes] = ggml::block_shape(info.type, "'" + path + "': " + field);
    if (info.shape.back() % per_block != 0) {
      c.fail(field, "rows of " + std::to_string(info.shape.back()) +
                        " elements are not whole blocks of " + std::to_string(per_block));
    }
    info.bytes = numel / per_block * block_bytes;
    const uint64_t offset = c.scalar<uint64_t>(field + " offset");
    if (offset > static_cast<uint64_t>(size)) c.fail(field, "offset beyond the file");
    info.offset = static_cast<int64_t>(offset);
    h.tensors.push_back(std::move(info));
  }
  int64_t alignment = 32;
  if (const auto it = h.metadata.find("general.alignment"); it != h.metadata.end()) {
    alignment = it->second.integer;
    if (it->second.type > 12 || it->second.type == 8 || it->second.type == 9 || alignment <= 0 ||
        alignment > (1 << 20) || (alignment & (alignment - 1)) != 0) {
      c.fail("general.alignment", "must be a power of two up to 1 MiB");
    }
  }
  const int64_t data_start = (c.pos() + alignment - 1) / alignment * alignment;
  for (GgufTensor& t : h.tensors) {
    if (t.offset % alignment != 0 || t.offset > size - data_start ||
        t.bytes > size - data_start - t.offset) {
      c.fail("tensor '" + t.name + "'", "its " + std::to_string(t.bytes) + " bytes at offset " +
                                            std::to_string(t.offset) +
                                            " (aligned?) do not lie inside the file's data");
    }
    t.offset += data_start;
  }
  return h;
}

const GgufValue* GgufHeader::value(const std::string& key) const {
  const auto it = metadata.find(key);
  return it == metadata.end() ? nullptr : &it->second;
}

std::optional<int64_t> GgufHeader::integer(const std::string& key) const {
  const GgufValue* v = value(key);
  if (v == nullptr) return std::nullopt;
  TE_CHECK(v->type <= 5 || v->type == 7 || v->type == 10 || v->type == 11, "gguf: '", path,
           "': metadata '", key, "' is not an integer (type ", v->type, ")");
  return v->integer;
}

std::optional<double> GgufHeader::number(const std::string& key) const {
  const GgufValue* v = value(key);
  if (v == nullptr) return std::nullopt;
  if (v->type == 6 || v->type == 12) return v->number;
  TE_CHECK(v->type <= 5 || v->type == 10 || v->type == 11, "gguf: '", path, "': metadata '", key,
           "' is not a number (type ", v->type, ")");
  return static_cast<double>(v->integer);
}

std::optional<std::string> GgufHeader::string(const std::string& key) const {
  const GgufValue* v = value(key);
  if (v == nullptr) return std::nullopt;
  TE_CHECK(v->type == 8, "gguf: '", path, "': metadata '", key, "' is not a string (type ",
           v->type, ")");
  return v->string;
}

namespace detail {

void read_exactly(int fd, void* data, std::size_t n, int64_t offset, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, offset);
    if (r < 0 && errno == EINTR) continue;
    TE_CHECK(r > 0, "gguf: reading '", path, "' failed at byte ", offset, ": ",
             r < 0 ? std::strerror(errno) : "the file ends there");
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += r;
  }
}

GgufHeader read_gguf_header(int fd, int64_t size, const std::string& path) {
  std::vector<char> window;
  int64_t window_at = 0;
  auto read = [&](void* out, std::size_t n, int64_t offset) {
    if (n > (1u << 20)) return read_exactly(fd, out, n, offset, path);
    if (offset < window_at ||
        offset + static_cast<int64_t>(n) > window_at + static_cast<int64_t>(window.size())) {
      window_at = offset;
      window.resize(static_cast<std::size_t>(std::min<int64_t>(size - offset, 1 << 20)));
      read_exactly(fd, window.data(), window.size(), offset, path);
    }
    std::memcpy(out, window.data() + (offset - window_at), n);
  };
  return parse_gguf_header(read, size, path);
}

}  // namespace detail

GgufHeader read_gguf_header(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  TE_CHECK(fd >= 0, "gguf: cannot open '", path, "': ", std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  TE_CHECK(::fstat(fd, &st) == 0, "gguf: cannot stat '", path, "'");
  return detail::read_gguf_header(fd, st.st_size, path);
}

}  // namespace te::hf
