// Desync detection (DistributedOptions::check_collectives / TE_CHECK_COLLECTIVES=1): ranks that
// run different collectives, or the same one on different shapes, stop with a te::Error on every
// rank naming both calls, instead of hanging or exchanging garbage; matching ranks run as before.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <functional>
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
    const DTensor x =
        DTensor::from_local(piece.to(at::kFloat), mesh, {Shard{0}}, std::vector<int64_t>{5, 8});
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

// Meshes are compared whatever check_collectives says: a rank that builds another mesh would
// otherwise wait on rows nobody joins until the timeout.
TEST(Desync, RanksThatBuildDifferentMeshesAreNamedAtOnce) {
  DistributedOptions options;
  options.timeout = std::chrono::seconds(60);
  std::vector<std::string> errors(3);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_ERROR(run_local_ranks(
                   3,
                   [&](int rank) {
                     DeviceMesh same({3}, {"x"});  // mesh #0 agrees
                     try {
                       DeviceMesh grid({rank == 2 ? 3 : 1, rank == 2 ? 1 : 3}, {"data", "model"});
                     } catch (const te::Error& e) {
                       errors[static_cast<std::size_t>(rank)] = e.what();
                       throw;
                     }
                   },
                   options),
               "DeviceMesh #1 differs between ranks");
  for (const auto& e : errors) {
    expect_names(e, {"rank(s) 0, 1 built DeviceMesh(data=1, model=3)",
                     "rank(s) 2 built DeviceMesh(data=3, model=1)",
                     "every rank must construct the same meshes"});
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

// Rank 1 runs `elsewhere` instead of building the mesh rank 0 builds. Returns rank 0's
// te::Error, and what run_local_ranks rethrew (rank 1's own error, if any).
struct Waited {
  std::string rank0, rethrown;
};
Waited rank0_waiting_for_rank1(std::chrono::milliseconds timeout,
                               const std::function<void()>& elsewhere) {
  DistributedOptions options;
  options.timeout = timeout;
  Waited out;
  try {
    run_local_ranks(
        2,
        [&](int rank) {
          if (rank == 1) return elsewhere();
          try {
            DeviceMesh mesh({2}, {"data"});
          } catch (const te::Error& e) {
            out.rank0 = e.what();
          }
        },
        options);
  } catch (const te::Error& e) {
    out.rethrown = e.what();
  }
  return out;
}

// A rank that fails before it reaches a mesh is named by the ranks waiting at that mesh as soon
// as it leaves, with its reason, not at the timeout.
TEST(Desync, ARankThatNeverReachesAMeshIsNamedWithItsReason) {
  const auto start = std::chrono::steady_clock::now();
  const Waited w = rank0_waiting_for_rank1(std::chrono::seconds(60),
                                           [] { TE_FAIL("rank 1 could not read its data"); });
  expect_names(w.rethrown, {"could not read its data"});
  expect_names(w.rank0, {"rank 0: rank(s) 1 of 2 did not reach DeviceMesh #0",
                         "rank 1 left with an error: rank 1 could not read its data"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

// A rank that stays alive but never builds the mesh (busy elsewhere: no error recorded, just
// absent): the others give up at the timeout and say so, naming it.
TEST(Desync, ARankThatNeverBuildsTheMeshIsNamedAtTheTimeout) {
  const Waited w = rank0_waiting_for_rank1(std::chrono::milliseconds(1500), [] {});
  expect_names(w.rank0, {"rank 0: rank(s) 1 of 2 did not reach DeviceMesh #0 (this rank built "
                         "DeviceMesh(data=2)) within 1.5 s",
                         "every rank must run the same collective steps in the same order"});
}

}  // namespace
}  // namespace te
