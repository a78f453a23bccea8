#include "te/hf/gguf.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "gguf_io.h"
#include "te/error.h"

namespace te::hf {

struct GgufFile::State {
  int fd = -1;
  std::string path;
  int64_t size = 0;
  GgufHeader header;
  std::map<std::string, std::size_t> by_name;
  std::shared_ptr<const unsigned char> map;
  ~State() {
    if (fd >= 0) ::close(fd);
  }
  void read_at(void* data, std::size_t n, int64_t offset) const {
    detail::read_exactly(fd, data, n, offset, path);
  }
};

GgufFile::GgufFile(const std::string& path) : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.path = path;
  s.fd = ::open(path.c_str(), O_RDONLY);
  TE_CHECK(s.fd >= 0, "gguf: cannot open '", path, "': ", std::strerror(errno));
  struct stat st {};
  TE_CHECK(::fstat(s.fd, &st) == 0, "gguf: cannot stat '", path, "'");
  s.size = st.st_size;
  s.header = detail::read_gguf_header(s.fd, s.size, path);
  for (std::size_t i = 0; i < s.header.tensors.size(); ++i) {
    TE_CHECK(s.by_name.emplace(s.header.tensors[i].name, i).second, "gguf: '", path,
             "' has two tensors named '", s.header.tensors[i].name, "'");
  }
}

GgufFile::~GgufFile() = default;
GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;

const std::string& GgufFile::path() const { return state_->path; }
const GgufHeader& GgufFile::header() const { return state_->header; }

const GgufTensor* GgufFile::tensor(const std::string& name) const {
  const auto it = state_->by_name.find(name);
  return it == state_->by_name.end() ? nullptr : &state_->header.tensors[it->second];
}

const GgufValue* GgufFile::value(const std::string& key) const {
  return state_->header.value(key);
}
std::optional<int64_t> GgufFile::integer(const std::string& key) const {
  return state_->header.integer(key);
}
std::optional<double> GgufFile::number(const std::string& key) const {
  return state_->header.number(key);
}
std::optional<std::string> GgufFile::string(const std::string& key) const {
  return state_->header.string(key);
}

at::Tensor GgufFile::read(const std::string& name, const std::vector<int64_t>& lo,
                          const std::vector<int64_t>& hi, int64_t* bytes_read) {
  const GgufTensor* t = tensor(name);
  TE_CHECK(t != nullptr, "gguf: '", path(), "' has no tensor '", name, "'");
  const int64_t nd = static_cast<int64_t>(t->shape.size());
  TE_CHECK(static_cast<int64_t>(lo.size()) == nd && static_cast<int64_t>(hi.size()) == nd,
           "gguf: reading '", name, "' in '", path(), "': a box of ", lo.size(), " dims for a ", nd,
           "-dim tensor");
  std::vector<int64_t> out_shape;
  int64_t rows = 1;
  for (int64_t d = 0; d < nd; ++d) {
    TE_CHECK(0 <= lo[d] && lo[d] <= hi[d] && hi[d] <= t->shape[d], "gguf: reading '", name,
             "' in '", path(), "': box [", lo[d], ", ", hi[d], ") of dim ", d, " is outside ",
             at::IntArrayRef(t->shape));
    out_shape.push_back(hi[d] - lo[d]);
    if (d < nd - 1) rows *= hi[d] - lo[d];
  }
  at::Tensor out = at::empty(out_shape, at::kFloat);
  if (out.numel() == 0) return out;
  const auto [per_block, block_bytes] = ggml::block_shape(t->type, name);
  const int64_t width = t->shape.back(), row_bytes = width / per_block * block_bytes;
  const int64_t b0 = lo.back() / per_block, b1 = (hi.back() + per_block - 1) / per_block;
  const int64_t skip = lo.back() - b0 * per_block, cols = hi.back() - lo.back();
  // Each wanted row's blocks; rows that follow each other in the file are read in one go.
  std::vector<int64_t> starts;
  starts.reserve(static_cast<std::size_t>(rows));
  std::vector<int64_t> idx(lo.begin(), lo.end());
  for (int64_t r = 0; r < rows; ++r) {
    int64_t flat = 0;
    for (int64_t d = 0; d < nd - 1; ++d) flat = flat * t->shape[d] + idx[d];
    starts.push_back(t->offset + flat * row_bytes + b0 * block_bytes);
    for (int64_t d = nd - 2; d >= 0; --d) {
      if (++idx[d] < hi[d]) break;
      idx[d] = lo[d];
    }
  }
  const int64_t span = (b1 - b0) * block_bytes;
  std::vector<unsigned char> raw(static_cast<std::size_t>(rows * span));
  for (int64_t r = 0; r < rows;) {
    int64_t e = r + 1;
    while (e < rows && span == row_bytes && starts[e] == starts[e - 1] + span) ++e;
    state_->read_at(raw.data() + r * span, static_cast<std::size_t>((e - r) * span), starts[r]);
    if (bytes_read != nullptr) *bytes_read += (e - r) * span;
    r = e;
  }
  std::vector<float> row((b1 - b0) * per_block);
  float* dst = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    ggml::dequantize(t->type, raw.data() + r * span, static_cast<int64_t>(row.size()),
                     row.data());
    std::memcpy(dst + r * cols, row.data() + skip, static_cast<std::size_t>(cols) * sizeof(float));
  }
  return out;
}

std::shared_ptr<const unsigned char> GgufFile::mapped() {
  State& s = *state_;
  if (s.map) return s.map;
  TE_CHECK(s.size > 0, "gguf: '", s.path, "' is empty");
  // MAP_POPULATE maps the pages the page cache holds now, so the first GEMMs do not fault them in
  // one by one.
  void* p = ::mmap(nullptr, static_cast<std::size_t>(s.size), PROT_READ, MAP_PRIVATE | MAP_POPULATE,
                   s.fd, 0);
  TE_CHECK(p != MAP_FAILED, "gguf: cannot map '", s.path, "' into memory: ", std::strerror(errno),
           "; load with LoadOptions::dequantize_gguf = true to read it instead");
  const std::size_t n = static_cast<std::size_t>(s.size);
  s.map = std::shared_ptr<const unsigned char>(static_cast<const unsigned char*>(p),
                                               [n](const unsigned char* q) {
                                                 ::munmap(const_cast<unsigned char*>(q), n);
                                               });
  return s.map;
}

}  // namespace te::hf
