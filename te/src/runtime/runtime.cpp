#include "te/runtime/runtime.h"

#include <ATen/Parallel.h>
#include <ATen/Version.h>

#include <algorithm>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>

#include "te/compat.h"
#include "te/error.h"
#include "te/runtime/launch.h"

namespace te {

int configure_threads() {
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  // The ranks a launcher started on this host share its cores (a SLURM or torchrun rank that
  // started a team of every core's threads would oversubscribe the host): the ranks per node
  // divide them, whatever the world's size.
  if (const auto launch = read_launch_environment()) {
    threads = std::max(1, threads / launch->local_world_size);
  }
  if (const char* env = std::getenv("OMP_NUM_THREADS"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long value = std::strtol(env, &end, 10);
    TE_CHECK(end != env && *end == '\0' && value > 0 && value <= 4096, "OMP_NUM_THREADS='", env,
             "' is not a positive thread count; set it to e.g. 2, or unset it to use every core");
    threads = static_cast<int>(value);
  }
  if (threads < 1) threads = 1;
  at::set_num_threads(threads);
  return at::get_num_threads();
}

bool keep_freed_memory(bool large_blocks_too) {
#if defined(__GLIBC__)
  // Settings the user made for glibc stand.
  for (const char* env : {"GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"}) {
    if (std::getenv(env) != nullptr) return false;
  }
  constexpr int kMmapThreshold = 32 << 20;  // glibc's largest (DEFAULT_MMAP_THRESHOLD_MAX, 64-bit)
  constexpr int kTrimThreshold = 1 << 30;
  return mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 &&
         mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1 &&
         (!large_blocks_too || mallopt(M_MMAP_MAX, 0) == 1);
#else
  (void)large_blocks_too;
  return false;
#endif
}

namespace {
// The BLAS line of LibTorch's build configuration, e.g. "BLAS_INFO=open".
std::string blas_of(const std::string& config) {
  std::istringstream lines(config);
  std::string line;
  while (std::getline(lines, line)) {
    const auto pos = line.find("BLAS_INFO=");
    if (pos != std::string::npos) {
      const auto end = line.find(',', pos);
      return line.substr(pos + 10, end == std::string::npos ? std::string::npos : end - pos - 10);
    }
  }
  return "unknown";
}
}  // namespace

std::string build_info() {
  std::ostringstream os;
  os << "te-cpp " << TE_VERSION << "\n";
  os << "LibTorch " << TORCH_VERSION_MAJOR << "." << TORCH_VERSION_MINOR << "."
     << TORCH_VERSION_PATCH << "\n";
#ifdef TE_WITH_CUDA
  os << "CUDA kernels: built\n";
#else
  os << "CUDA kernels: not built\n";
#endif
  os << "intra-op threads: " << at::get_num_threads() << "\n";
  os << "BLAS: " << blas_of(at::show_config()) << "\n";
  return os.str();
}

}  // namespace te
