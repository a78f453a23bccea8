// The token file's reader: a read-only memory map (te/train/token_file.h).

#include "te/train/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "te/error.h"
#include "token_file_format.h"

namespace te::train {

struct TokenFile::Mapping {
  std::string path;
  void* data = nullptr;
  size_t size = 0;
  detail::Header header{};

  ~Mapping() {
    if (data != nullptr) ::munmap(data, size);
  }
  const char* bytes() const { return static_cast<const char*>(data); }
};

namespace {

std::shared_ptr<TokenFile::Mapping> map_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TE_CHECK(fd >= 0, path, ": cannot open the token file (", std::strerror(errno), ")");
  struct stat st {};
  const bool stated = ::fstat(fd, &st) == 0;
  auto map = std::make_shared<TokenFile::Mapping>();
  map->path = path;
  map->size = stated ? static_cast<size_t>(st.st_size) : 0;
  if (map->size >= sizeof(detail::Header)) {
    void* p = ::mmap(nullptr, map->size, PROT_READ, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) map->data = p;
  }
  ::close(fd);
  TE_CHECK(map->data != nullptr && std::memcmp(map->bytes(), detail::kMagic, 8) == 0, path,
           ": not a te-train token file; delete it or name another --token-file");
  std::memcpy(&map->header, map->data, sizeof(detail::Header));
  return map;
}

// The mapping when its version and size are right, else nullptr (a file to rebuild).
std::shared_ptr<const TokenFile::Mapping> map_if_complete(const std::string& path) {
  auto map = map_file(path);
  if (map->header.version != detail::kVersion || map->size != detail::file_size(map->header))
    return nullptr;
  return map;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

std::string token_file_path(const std::string& data_path, const TokenFileOptions& options) {
  return options.path.empty() ? data_path + ".tokens" : options.path;
}

TokenFile TokenFile::open_or_build(const std::string& data_path, const te::hf::Tokenizer& tokenizer,
                                   const TokenFileOptions& options) {
  const std::string path = token_file_path(data_path, options);
  const detail::Header want = detail::expected_header(data_path, tokenizer, options);
  if (exists(path)) {
    if (auto map = map_if_complete(path)) {
      TE_CHECK(map->header.tokenizer_fingerprint == want.tokenizer_fingerprint, path,
               ": this token file was made with another tokenizer than the model's; delete it "
               "to have it rebuilt, or pass the model it was made with");
      if (map->header.source_size == want.source_size &&
          map->header.source_mtime_ns == want.source_mtime_ns &&
          map->header.options_hash == want.options_hash)
        return TokenFile(map);
    }
  }
  detail::write_token_file(data_path, path, tokenizer, options, want);
  TokenFile file(map_file(path));
  file.built_ = true;
  return file;
}

TokenFile TokenFile::open(const std::string& path) {
  auto map = map_file(path);
  TE_CHECK(map->header.version == detail::kVersion, path, ": token file version ",
           map->header.version, ", this te-train reads version ", detail::kVersion,
           "; delete it to have it rebuilt");
  TE_CHECK(map->size == detail::file_size(map->header), path, ": a truncated token file (",
           map->size, " bytes, its header says ", detail::file_size(map->header),
           "); delete it to have it rebuilt");
  return TokenFile(map);
}

const std::string& TokenFile::path() const { return map_->path; }
int64_t TokenFile::num_tokens() const { return static_cast<int64_t>(map_->header.num_tokens); }
int64_t TokenFile::num_documents() const {
  return static_cast<int64_t>(map_->header.num_documents);
}
const uint32_t* TokenFile::tokens() const {
  return reinterpret_cast<const uint32_t*>(map_->bytes() + sizeof(detail::Header));
}
const int64_t* TokenFile::document_offsets() const {
  return reinterpret_cast<const int64_t*>(map_->bytes() +
                                          detail::offsets_at(map_->header.num_tokens));
}
const uint8_t* TokenFile::loss_mask() const {
  if (!(map_->header.flags & detail::kHasLossMask)) return nullptr;
  return reinterpret_cast<const uint8_t*>(map_->bytes() + detail::mask_at(map_->header));
}
uint64_t TokenFile::tokenizer_fingerprint() const { return map_->header.tokenizer_fingerprint; }

}  // namespace te::train
