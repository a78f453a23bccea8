// Process-level settings: intra-op threads from OMP_NUM_THREADS, or the core count divided by the
// ranks a launcher started on this host.

#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <sys/resource.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "te/runtime.h"

namespace te {
namespace {

// Clears what configure_threads reads (OMP_NUM_THREADS and the launchers' rank variables: the
// suite may itself run under srun or torchrun) and restores it, and LibTorch's thread count,
// after each test.
class ThreadsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* n : kNames) {
      if (const char* v = std::getenv(n)) saved_[n] = v;
      unsetenv(n);
    }
    threads_ = at::get_num_threads();
  }
  void TearDown() override {
    for (const char* n : kNames) {
      unsetenv(n);
      if (saved_.count(n)) setenv(n, saved_[n].c_str(), 1);
    }
    at::set_num_threads(threads_);
  }
  static constexpr const char* kNames[] = {
      "OMP_NUM_THREADS",      "RANK",         "WORLD_SIZE",           "LOCAL_RANK",
      "LOCAL_WORLD_SIZE",     "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "OMPI_COMM_WORLD_RANK",
      "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"};
  std::map<std::string, std::string> saved_;
  int threads_ = 1;
};

// A world of 16 ranks, one per node: each rank gets every core of its node, not cores / 16; two
// per node: half each.
TEST_F(ThreadsTest, RanksPerNodeDivideTheCores) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  setenv("RANK", "9", 1);
  setenv("WORLD_SIZE", "16", 1);
  setenv("LOCAL_WORLD_SIZE", "1", 1);
  EXPECT_EQ(configure_threads(), cores);
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  EXPECT_EQ(configure_threads(), std::max(1, cores / 2));
  setenv("OMP_NUM_THREADS", "3", 1);  // the user's choice wins
  EXPECT_EQ(configure_threads(), 3);
}

TEST_F(ThreadsTest, DefaultsToTheCoreCount) {
  unsetenv("OMP_NUM_THREADS");
  EXPECT_EQ(configure_threads(), static_cast<int>(std::thread::hardware_concurrency()));
  EXPECT_EQ(at::get_num_threads(), static_cast<int>(std::thread::hardware_concurrency()));
}

TEST_F(ThreadsTest, HonoursOmpNumThreads) {
  setenv("OMP_NUM_THREADS", "1", 1);
  EXPECT_EQ(configure_threads(), 1);
  EXPECT_EQ(at::get_num_threads(), 1);
}

TEST_F(ThreadsTest, RejectsAMalformedOmpNumThreads) {
  for (const char* bad : {"zero", "0", "-2", "3x"}) {
    setenv("OMP_NUM_THREADS", bad, 1);
    try {
      configure_threads();
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("OMP_NUM_THREADS='" + std::string(bad) + "'"),
                std::string::npos);
    }
  }
}

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define TE_CLANG_SANITIZER 1
#endif
#endif
#ifndef TE_CLANG_SANITIZER
#define TE_CLANG_SANITIZER 0
#endif

int64_t minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// A decode step's pattern: a few blocks of a few MiB allocated, written and freed together, again
// and again. With glibc's defaults the freed top of the heap (over twice the largest block) is
// trimmed, so every round faults its pages in afresh; kept, the rounds after the first reuse them.
TEST(KeepFreedMemory, RoundsOfLargeBlocksReuseTheirPages) {
#if !defined(__GLIBC__)
  GTEST_SKIP() << "not glibc: keep_freed_memory is a no-op";
#elif defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || TE_CLANG_SANITIZER
  GTEST_SKIP() << "a sanitizer's allocator serves malloc here, not glibc's";
#endif
  for (const char* env : {"GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"}) {
    if (std::getenv(env) != nullptr) GTEST_SKIP() << env << " is set: the user's settings stand";
  }
  ASSERT_TRUE(keep_freed_memory());
  constexpr std::size_t kBlock = 6u << 20;
  constexpr int kBlocks = 4, kRounds = 10;
  auto round = [] {
    std::vector<char*> blocks;
    for (int b = 0; b < kBlocks; ++b) {
      blocks.push_back(static_cast<char*>(std::malloc(kBlock)));
      std::memset(blocks.back(), b + 1, kBlock);
    }
    for (char* block : blocks) std::free(block);
  };
  round();
  const int64_t before = minor_faults();
  for (int r = 0; r < kRounds; ++r) round();
  const int64_t pages = static_cast<int64_t>(kRounds) * kBlocks * kBlock / 4096;
  // Fresh pages every round would be `pages` faults (fewer with huge pages, still one per 2 MiB).
  EXPECT_LT(minor_faults() - before, pages / 100) << "of " << pages << " pages written";
}

TEST(BuildInfo, NamesVersionsAndBlas) {
  const std::string info = build_info();
  EXPECT_NE(info.find("te-cpp 0.1.0"), std::string::npos) << info;
  EXPECT_NE(info.find("LibTorch " + std::to_string(TORCH_VERSION_MAJOR) + "."), std::string::npos);
  EXPECT_NE(info.find("BLAS: "), std::string::npos);
  EXPECT_EQ(info.find("BLAS: unknown"), std::string::npos) << info;
}

}  // namespace
}  // namespace te
