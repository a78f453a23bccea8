// te's kernels split loops over LibTorch's intra-op threads (te/runtime/parallel.h,
// cmake/TeParallel.cmake): a file built as te builds its kernel files runs a split loop on as
// many threads as at::set_num_threads gives LibTorch, one when it gives one.

#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <set>
#include <thread>

#include "te/runtime/parallel.h"

namespace {

// The threads a loop of `n` single-item tasks ran on (each task long enough for all to join).
std::size_t threads_of_a_split_loop(int64_t n) {
  std::mutex mutex;
  std::set<std::thread::id> seen;
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      std::lock_guard<std::mutex> lock(mutex);
      seen.insert(std::this_thread::get_id());
    }
  });
  return seen.size();
}

TEST(KernelThreads, SplitLoopsRunOnLibTorchsThreads) {
  const int before = at::get_num_threads();
  at::set_num_threads(2);
  EXPECT_EQ(threads_of_a_split_loop(16), 2u);
  at::set_num_threads(1);
  EXPECT_EQ(threads_of_a_split_loop(16), 1u);
  at::set_num_threads(before);
}

}  // namespace
