#pragma once

// A fresh directory under the system's temporary directory, removed with everything in it when
// the object goes out of scope.

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace te::test {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "te_test") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "_XXXXXX")).string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace te::test
