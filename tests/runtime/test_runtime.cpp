// Process-level settings: intra-op threads from OMP_NUM_THREADS, or the core count divided by the
// ranks a launcher started on this host.

#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>

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

TEST(BuildInfo, NamesVersionsAndBlas) {
  const std::string info = build_info();
  EXPECT_NE(info.find("te-cpp 0.1.0"), std::string::npos) << info;
  EXPECT_NE(info.find("LibTorch " + std::to_string(TORCH_VERSION_MAJOR) + "."), std::string::npos);
  EXPECT_NE(info.find("BLAS: "), std::string::npos);
  EXPECT_EQ(info.find("BLAS: unknown"), std::string::npos) << info;
}

}  // namespace
}  // namespace te
