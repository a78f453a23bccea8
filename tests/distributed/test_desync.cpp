// Desync detection (DistributedOptions::check_collectives / TE_CHECK_COLLECTIVES=1): ranks that
// run different collectives, or the same one on different shapes, stop with a te::Error on every
// rank naming both calls, instead of hanging or exchanging garbage; matching ranks run as before.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "../expect_error.h"
#include "te/distributed.h"

namespace te {
namespace {

DistributedOptions checked() {
  DistributedOptions options;
  options.check_collectives = true;
  options.timeout = std::chrono::seconds(30);
  return options;
}

// Runs fn(rank, mesh) on 2 thread ranks over a ("data") mesh; returns each rank's te::Error text.
template <typename Fn>
std::vector<std::string> errors_of(Fn fn, const DistributedOptions& options = checked()) {
  std::vector<std::string> errors(2);
  run_local_ranks(
      2,
      [&](int rank) {
        DeviceMesh mesh({2}, {"data"});
        try {
          fn(rank, mesh);
        } catch (const te::Error& e) {
          errors[static_cast<std::size_t>(rank)] = e.what();
        }
      },
      options);
  return errors;
}

void expect_names(const std::string& message, const std::vector<std::string>& words) {
  for (const auto& w : words) {
    EXPECT_NE(message.find(w), std::string::npos) << message << "\n  should name: " << w;
  }
}

TEST(Desync, ADifferentCollectiveStopsEveryRankNamingBothCalls) {
  const auto errors = errors_of([](int rank, const DeviceMesh& mesh) {
    if (rank == 0) {
      DTensor::from_local(at::ones({4, 8}), mesh, {Partial{}}).redistribute({Replicate{}});
    } else {
      DTensor::from_local(at::ones({2, 8}), mesh, {Shard{0}}).redistribute({Replicate{}});
    }
  });
  for (const auto& e : errors) {
    expect_names(e, {"collectives out of step over mesh axis 'data'",
                     "all_reduce(sum) of Float [4, 8], collective #1",
                     "all_gather(dim 0) of Float [4, 8], collective #1"});
  }
}

TEST(Desync, TheSameCollectiveOnAnotherShapeIsNamed) {
  const auto errors = errors_of([](int rank, const DeviceMesh& mesh) {
    const int64_t rows = rank == 0 ? 4 : 6;
    DTensor::from_local(at::ones({rows, 8}), mesh, {Partial{}}).redistribute({Replicate{}});
  });
  for (const auto& e : errors) {
    expect_names(e, {"all_reduce(sum) of Float [4, 8]", "all_reduce(sum) of Float [6, 8]"});
  }
}

TEST(Desync, ARankThatSkipsACollectiveIsCaughtAtTheNextOne) {
  const auto errors = errors_of([](int rank, const DeviceMesh& mesh) {
    if (rank == 0) {  // a constraint only rank 0 reaches
      DTensor::from_local(at::ones({2, 3}), mesh, {Shard{0}}).redistribute({Replicate{}});
    }
    DTensor::from_local(at::ones({4, 8}), mesh, {Partial{}}).redistribute({Replicate{}});
  });
  for (const auto& e : errors) {
    expect_names(e, {"all_gather(dim 0) of Float [4, 3], collective #1",
                     "all_reduce(sum) of Float [4, 8], collective #1"});
  }
}

TEST(Desync, MatchingRanksRunAsBeforeUnevenPiecesIncluded) {
  std::vector<at::Tensor> out(2);
  const auto errors = errors_of([&](int rank, const DeviceMesh& mesh) {
    // 5 rows over 2 ranks: pieces of 3 and 2 rows, the same collective in whole terms.
    const at::Tensor piece = at::arange(rank == 0 ? 0 : 24, rank == 0 ? 24 : 40).view({-1, 8});
    const DTensor x = DTensor::from_local(piece.to(at::kFloat), mesh, {Shard{0}},
                                          std::vector<int64_t>{5, 8});
    const DTensor y = x.redistribute({Replicate{}}).redistribute({Shard{1}});
    out[static_cast<std::size_t>(rank)] = y.full_tensor();
  });
  EXPECT_EQ(errors, std::vector<std::string>(2));
  const at::Tensor whole = at::arange(40).view({5, 8}).to(at::kFloat);
  for (const auto& t : out) EXPECT_TRUE(at::equal(t, whole));
}

TEST(Desync, TheEnvironmentVariableTurnsItOnAndIsChecked) {
  ::setenv("TE_CHECK_COLLECTIVES", "1", 1);
  const auto errors = errors_of(
      [](int rank, const DeviceMesh& mesh) {
        DTensor::from_local(at::ones({rank == 0 ? 2 : 3, 2}), mesh, {Partial{}})
            .redistribute({Replicate{}});
      },
      DistributedOptions{});
  for (const auto& e : errors) expect_names(e, {"collectives out of step"});
  ::setenv("TE_CHECK_COLLECTIVES", "yes", 1);
  EXPECT_ERROR(run_local_ranks(2, [](int) {}), "TE_CHECK_COLLECTIVES='yes' is not 0 or 1");
  ::unsetenv("TE_CHECK_COLLECTIVES");
}

}  // namespace
}  // namespace te
