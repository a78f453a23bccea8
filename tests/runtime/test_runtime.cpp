// Process-level settings: intra-op threads from OMP_NUM_THREADS or the core count.

#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <cstdlib>
#include <thread>

#include "te/runtime.h"

namespace te {
namespace {

// Restores OMP_NUM_THREADS and LibTorch's thread count after each test.
class ThreadsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* v = std::getenv("OMP_NUM_THREADS")) saved_ = v;
    threads_ = at::get_num_threads();
  }
  void TearDown() override {
    if (saved_) {
      setenv("OMP_NUM_THREADS", saved_->c_str(), 1);
    } else {
      unsetenv("OMP_NUM_THREADS");
    }
    at::set_num_threads(threads_);
  }
  std::optional<std::string> saved_;
  int threads_ = 1;
};

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
