// Every transition of every placement pair on meshes {2}, {4}, {2,2}, even and uneven shapes:
// values and gradients against the same math on one process. Ranks are threads with their own
// Gloo groups (run_local_ranks).

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "../expect_error.h"
#include "dist_test_util.h"
#include "te/distributed.h"

namespace te {
namespace {

using test::piece_of;

// Per-rank weights along a Partial mesh dim whose reduction gives back the value exactly.
double partial_weight(ReduceOp op, int64_t coord, int64_t n) {
  static const double two[] = {3, -2};
  static const double four[] = {3, -1, -2, 1};
  const double w = n == 1 ? 1.0 : (n == 2 ? two[coord] : four[coord]);
  return op == ReduceOp::kAvg ? w * static_cast<double>(n) : w;
}

// This rank's local tensor for `placements` such that the DTensor's value is `global`.
at::Tensor make_local(const at::Tensor& global, const DeviceMesh& mesh,
                      const std::vector<Placement>& placements) {
  at::Tensor local = piece_of(global, mesh, placements, mesh.rank());
  for (std::size_t i = 0; i < placements.size(); ++i) {
    if (const auto* p = std::get_if<Partial>(&placements[i])) {
      const int64_t c = mesh.coordinate(static_cast<int64_t>(i));
      const int64_t n = mesh.size(static_cast<int64_t>(i));
      if (p->op == ReduceOp::kSum || p->op == ReduceOp::kAvg) {
        local = local * partial_weight(p->op, c, n);
      } else {
        // Every rank but one per element holds a smaller (max) / larger (min) value.
        at::Tensor idx = at::arange(local.numel(), local.options()).view(local.sizes());
        at::Tensor offset = at::remainder(idx + static_cast<double>(c), static_cast<double>(n));
        local = p->op == ReduceOp::kMax ? local - offset : local + offset;
      }
    }
  }
  return local;
}

// d(value)/d(local) for the Partial dims of `placements`, times the incoming gradient piece.
at::Tensor expected_grad(const at::Tensor& grad_global, const DeviceMesh& mesh,
                         const std::vector<Placement>& placements) {
  std::vector<Placement> layout = placements;
  double scale = 1.0;
  for (std::size_t i = 0; i < layout.size(); ++i) {
    if (const auto* p = std::get_if<Partial>(&layout[i])) {
      // The value is sum_c local_c (or that over n for avg): each local's weight in it.
      if (p->op == ReduceOp::kAvg) scale /= static_cast<double>(mesh.size(static_cast<int64_t>(i)));
      layout[i] = Replicate{};
    }
  }
  return piece_of(grad_global, mesh, layout, mesh.rank()) * scale;
}

std::vector<std::vector<Placement>> all_layouts(int64_t mesh_ndim, bool with_partial, ReduceOp op) {
  std::vector<Placement> choices = {Replicate{}, Shard{0}, Shard{1}};
  if (with_partial) choices.push_back(Partial{op});
  std::vector<std::vector<Placement>> out = {{}};
  for (int64_t d = 0; d < mesh_ndim; ++d) {
    std::vector<std::vector<Placement>> next;
    for (const auto& prefix : out) {
      for (const Placement& c : choices) {
        auto p = prefix;
        p.push_back(c);
        next.push_back(p);
      }
    }
    out = next;
  }
  return out;
}

struct MeshCase {
  std::vector<int64_t> shape;
  std::vector<std::string> names;
  ReduceOp op;
};

class RedistributeAllPairs : public ::testing::TestWithParam<MeshCase> {};

TEST_P(RedistributeAllPairs, ValuesAndGradientsMatchOneProcess) {
  const MeshCase& mc = GetParam();
  int64_t world = 1;
  for (int64_t s : mc.shape) world *= s;
  run_local_ranks(static_cast<int>(world), [&](int rank) {
    DeviceMesh mesh(mc.shape, mc.names);
    const auto srcs = all_layouts(mesh.ndim(), true, mc.op);
    const auto dsts = all_layouts(mesh.ndim(), false, mc.op);
    // Even, uneven (torch.chunk: 5 over 4 -> 2,2,1,0) and smaller-than-mesh shapes.
    const std::vector<std::vector<int64_t>> shapes = {{4, 8}, {5, 3}, {7, 2}};
    for (const auto& shape : shapes) {
      at::Tensor global = test::seeded_integers(shape, 11);
      at::Tensor grad_global = test::seeded_integers(shape, 12);
      for (const auto& src : srcs) {
        for (const auto& dst : dsts) {
          const std::string what = "shape " + test::text(shape) + " " + to_string(src) + " -> " +
                                   to_string(dst) + " on rank " + std::to_string(rank);
          at::Tensor local = make_local(global, mesh, src).requires_grad_(true);
          DTensor x = DTensor::from_local(local, mesh, src, shape);
          DTensor y = x.redistribute(dst);
          ASSERT_EQ(y.sizes(), shape) << what;
          ASSERT_EQ(y.placements(), dst) << what;
          at::Tensor want = make_local(global, mesh, dst);
          ASSERT_TRUE(at::equal(y.to_local(), want))
              << what << "\n got " << y.to_local() << "\n want " << want;

          const bool has_extreme = std::any_of(src.begin(), src.end(), [](const Placement& p) {
            return is_partial(p) && (std::get<Partial>(p).op == ReduceOp::kMax ||
                                     std::get<Partial>(p).op == ReduceOp::kMin);
          });
          if (has_extreme) continue;  // their gradient has its own test below
          at::Tensor grad_in = piece_of(grad_global, mesh, dst, mesh.rank());
          torch::autograd::backward({y.to_local()}, {grad_in});
          ASSERT_TRUE(local.grad().defined()) << what;
          at::Tensor want_grad = expected_grad(grad_global, mesh, src);
          ASSERT_TRUE(at::allclose(local.grad(), want_grad, 0, 0))
              << what << "\n got " << local.grad() << "\n want " << want_grad;
        }
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Meshes, RedistributeAllPairs,
                         ::testing::Values(MeshCase{{2}, {"x"}, ReduceOp::kSum},
                                           MeshCase{{4}, {"x"}, ReduceOp::kSum},
                                           MeshCase{{2, 2}, {"a", "b"}, ReduceOp::kSum},
                                           MeshCase{{2}, {"x"}, ReduceOp::kAvg},
                                           MeshCase{{2, 2}, {"a", "b"}, ReduceOp::kAvg},
                                           MeshCase{{4}, {"x"}, ReduceOp::kMax},
                                           MeshCase{{2, 2}, {"a", "b"}, ReduceOp::kMin}),
                         [](const ::testing::TestParamInfo<MeshCase>& info) {
                           std::string name;
                           for (int64_t s : info.param.shape)
                             name += (name.empty() ? "" : "x") + std::to_string(s);
                           return name + "_" + to_string(info.param.op);
                         });

TEST(Redistribute, UnevenRowsRoundTripExactly) {
  // 5 rows over 4 ranks: 2, 2, 1, 0.
  run_local_ranks(4, [](int rank) {
    DeviceMesh mesh({4}, {"x"});
    at::Tensor global = at::randn({5, 3}, at::TensorOptions().dtype(at::kFloat));
    // The same tensor everywhere: broadcast rank 0's through a Replicate round trip.
    global = DTensor::from_local(rank == 0 ? global : at::zeros_like(global), mesh, {Partial{}},
                                 std::vector<int64_t>{5, 3})
                 .full_tensor();
    DTensor x = DTensor::distribute(global, mesh, {Shard{0}});
    const int64_t expected_rows[] = {2, 2, 1, 0};
    EXPECT_EQ(x.to_local().size(0), expected_rows[rank]);
    EXPECT_TRUE(at::equal(x.full_tensor(), global));
    EXPECT_TRUE(
        at::equal(x.redistribute({Shard{1}}).redistribute({Shard{0}}).to_local(), x.to_local()));
  });
}

TEST(Redistribute, PartialMaxGradientGoesToTheHolderSplitAmongTies) {
  run_local_ranks(2, [](int rank) {
    DeviceMesh mesh({2}, {"x"});
    // Element 0: rank 0 holds the max; element 1: rank 1; element 2: a tie.
    at::Tensor local = (rank == 0 ? at::tensor({5.0, 1.0, 4.0}) : at::tensor({2.0, 3.0, 4.0}))
                           .requires_grad_(true);
    DTensor x = DTensor::from_local(local, mesh, {Partial{ReduceOp::kMax}});
    at::Tensor y = x.full_tensor();
    EXPECT_TRUE(at::equal(y, at::tensor({5.0, 3.0, 4.0})));
    torch::autograd::backward({y}, {at::tensor({10.0, 20.0, 30.0})});
    const at::Tensor want =
        rank == 0 ? at::tensor({10.0, 0.0, 15.0}) : at::tensor({0.0, 20.0, 15.0});
    EXPECT_TRUE(at::equal(local.grad(), want)) << local.grad();
  });
}

TEST(Redistribute, ToPartialIsAnErrorThatSaysWhy) {
  run_local_ranks(2, [](int) {
    DeviceMesh mesh({2}, {"x"});
    DTensor x = DTensor::distribute(at::ones({4}), mesh, {Replicate{}});
    try {
      x.redistribute({Partial{}});
      FAIL();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("Partial values arise from computation"),
                std::string::npos)
          << e.what();
    }
    DTensor p = DTensor::from_local(at::ones({4}), mesh, {Partial{ReduceOp::kSum}});
    EXPECT_ERROR(p.redistribute({Partial{ReduceOp::kMax}}),
                 "redistribute to Partial(max) on mesh dim 0 (from Partial(sum)) is not possible");
    EXPECT_NO_THROW(p.redistribute({Partial{ReduceOp::kSum}}));
  });
}

// torch refuses Partial placements of mixed reduce ops but sum with avg (torch 2.11,
// distributed/tensor/_utils.py assert_no_mixed_partial_types, called by from_local,
// distribute_tensor and redistribute): max over one mesh dim and avg over the other gave 8 or 6
// here depending on which dim te reduced first.
TEST(Redistribute, MixedPartialReduceOpsAreRefusedAsTorchRefusesThem) {
  run_local_ranks(4, [](int rank) {
    DeviceMesh mesh({2, 2}, {"a", "b"});
    const at::Tensor local = at::full({2}, static_cast<double>(2 * rank + 2));
    EXPECT_ERROR(
        DTensor::from_local(local, mesh, {Partial{ReduceOp::kMax}, Partial{ReduceOp::kAvg}}),
        "DTensor::from_local: placements [Partial(max), Partial(avg)] mix Partial reduce "
        "ops (max, avg); only sum with avg commute");
    EXPECT_ERROR(
        DTensor::from_local(local, mesh, {Partial{ReduceOp::kMin}, Partial{ReduceOp::kSum}}),
        "mix Partial reduce ops (min, sum)");
    // Sum with avg commute: either order gives the same value, and te gives it.
    DTensor x =
        DTensor::from_local(local, mesh, {Partial{ReduceOp::kSum}, Partial{ReduceOp::kAvg}});
    // Ranks hold 2, 4, 6, 8 at (a, b) = (0, 0), (0, 1), (1, 0), (1, 1): avg over b then sum over a
    // = 3 + 7 = 10 = sum over a then avg over b.
    EXPECT_TRUE(at::equal(x.full_tensor(), at::full({2}, 10.0)));
    DTensor same =
        DTensor::from_local(local, mesh, {Partial{ReduceOp::kMax}, Partial{ReduceOp::kMax}});
    EXPECT_TRUE(at::equal(same.full_tensor(), at::full({2}, 8.0)));
  });
}

TEST(Redistribute, AvgOfIntegersIsRefused) {
  run_local_ranks(2, [](int) {
    DeviceMesh mesh({2}, {"x"});
    DTensor p = DTensor::from_local(at::ones({4}, at::kLong), mesh, {Partial{ReduceOp::kAvg}});
    EXPECT_ERROR(p.full_tensor(),
                 "all_reduce over mesh axis 'x': Partial(avg) of a Long tensor would truncate");
  });
}

TEST(Redistribute, EveryCollectiveAlgorithmGivesTheSameResult) {
  for (GatherAlgorithm gather : {GatherAlgorithm::kPaddedAllReduce, GatherAlgorithm::kAllGather,
                                 GatherAlgorithm::kAllToAll}) {
    for (ReduceScatterAlgorithm rs :
         {ReduceScatterAlgorithm::kAllReduceSlice, ReduceScatterAlgorithm::kAllToAllSum}) {
      DistributedOptions options;
      options.algorithms.gather = gather;
      options.algorithms.reduce_scatter = rs;
      run_local_ranks(
          4,
          [](int rank) {
            DeviceMesh mesh({4}, {"x"});
            for (const std::vector<int64_t>& shape :
                 std::vector<std::vector<int64_t>>{{8, 3}, {5, 3}, {3, 2}}) {
              at::Tensor global = test::seeded_integers(shape, 3);
              DTensor s = DTensor::distribute(global, mesh, {Shard{0}});
              EXPECT_TRUE(at::equal(s.full_tensor(), global));
              at::Tensor part = global * (rank == 0 ? 4.0 : -1.0);
              DTensor p = DTensor::from_local(part, mesh, {Partial{}});
              EXPECT_TRUE(at::equal(p.redistribute({Shard{0}}).to_local(),
                                    piece_of(global, mesh, {Shard{0}}, rank)));
              EXPECT_TRUE(at::equal(p.redistribute({Shard{1}}).to_local(),
                                    piece_of(global, mesh, {Shard{1}}, rank)));
              // Bool and integer tensors travel too.
              at::Tensor flags = global.gt(0);
              EXPECT_TRUE(
                  at::equal(DTensor::distribute(flags, mesh, {Shard{0}}).full_tensor(), flags));
            }
          },
          options);
    }
  }
}

TEST(DTensorApi, ToLocalWithPartialGradPlacementsAllReducesInBackward) {
  // Megatron's f: identity forward, all-reduce of the partial input gradients backward.
  run_local_ranks(2, [](int rank) {
    DeviceMesh mesh({2}, {"tp"});
    at::Tensor x = at::tensor({1.0, 2.0}).requires_grad_(true);
    DTensor dx = DTensor::from_local(x, mesh, {Replicate{}});
    CommTrace trace;
    at::Tensor local = dx.to_local({Partial{}});
    EXPECT_EQ(trace.total_count(), 0);
    torch::autograd::backward({local}, {at::tensor({1.0, 1.0}) * (rank + 1)});
    EXPECT_TRUE(at::equal(x.grad(), at::tensor({3.0, 3.0})));
    EXPECT_EQ(trace.count(Collective::kAllReduce, "tp"), 1);
  });
}

TEST(DTensorApi, GatherWithPartialGradientsReduceScattersInBackward) {
  // FSDP: the weight is gathered for use; each rank's weight gradient is a partial sum, which
  // goes straight back to the weight's shard as one reduce-scatter.
  run_local_ranks(2, [](int rank) {
    DeviceMesh mesh({2}, {"fsdp"});
    const at::Tensor w_global = test::seeded_integers({4, 3}, 1);
    at::Tensor w_local = piece_of(w_global, mesh, {Shard{0}}, rank).requires_grad_(true);
    DTensor w = DTensor::from_local(w_local, mesh, {Shard{0}});
    CommTrace trace;
    at::Tensor full = w.redistribute({Replicate{}}, {Partial{}}).to_local();
    EXPECT_TRUE(at::equal(full, w_global));
    EXPECT_EQ(trace.count(Collective::kAllGather, "fsdp"), 1);
    torch::autograd::backward({full}, {at::ones({4, 3}, at::kDouble) * (rank + 1)});
    EXPECT_EQ(trace.count(Collective::kReduceScatter, "fsdp"), 1);
    EXPECT_EQ(trace.bytes(Collective::kReduceScatter, "fsdp"), 4 * 3 * 8);
    EXPECT_EQ(trace.total_count(), 2);
    EXPECT_TRUE(at::equal(w_local.grad(), at::full({2, 3}, 3.0, at::kDouble)));
    EXPECT_ERROR(w.redistribute({Partial{}}, {Replicate{}}),
                 "redistribute to Partial(sum) on mesh dim 0 (from Shard(0)) is not possible");
  });
}

TEST(DTensorApi, StepByStepGradientHintMovesNoMoreThanTheFusedForm) {
  // PyTorch's test_to_local_grad_hint idiom: x.redistribute({Replicate}).to_local({Partial}).
  // Its backward must reduce-scatter, as redistribute({Replicate}, {Partial}) does, not
  // all-reduce the whole gradient and slice it.
  run_local_ranks(2, [](int rank) {
    DeviceMesh mesh({2}, {"fsdp"});
    const at::Tensor w_global = test::seeded_integers({4, 3}, 1);
    at::Tensor w_local = piece_of(w_global, mesh, {Shard{0}}, rank).requires_grad_(true);
    const DTensor w = DTensor::from_local(w_local, mesh, {Shard{0}});
    const at::Tensor g = at::ones({4, 3}, at::kDouble) * (rank + 1);

    int64_t step_count = 0, step_bytes = 0;
    {
      CommTrace step_by_step;
      const at::Tensor full = w.redistribute({Replicate{}}).to_local({Partial{}});
      EXPECT_TRUE(at::equal(full, w_global));
      torch::autograd::backward({full}, {g});
      EXPECT_EQ(step_by_step.count(Collective::kAllGather, "fsdp"), 1);
      EXPECT_EQ(step_by_step.count(Collective::kReduceScatter, "fsdp"), 1);
      EXPECT_EQ(step_by_step.count(Collective::kAllReduce, "fsdp"), 0);
      EXPECT_EQ(step_by_step.total_count(), 2);
      step_count = step_by_step.total_count();
      step_bytes = step_by_step.bytes(Collective::kReduceScatter, "fsdp");
    }
    const at::Tensor grad = w_local.grad().clone();
    EXPECT_TRUE(at::equal(grad, at::full({2, 3}, 3.0, at::kDouble)));

    w_local.mutable_grad() = at::Tensor();
    {
      CommTrace fused;
      torch::autograd::backward({w.redistribute({Replicate{}}, {Partial{}}).to_local()}, {g});
      EXPECT_TRUE(at::equal(w_local.grad(), grad));
      EXPECT_EQ(fused.bytes(Collective::kReduceScatter, "fsdp"), step_bytes);
      EXPECT_EQ(fused.total_count(), step_count);
    }

    // Without a gradient hint, the step-by-step form keeps its own backward (slice).
    w_local.mutable_grad() = at::Tensor();
    CommTrace plain;
    torch::autograd::backward({w.redistribute({Replicate{}}).to_local()}, {g});
    EXPECT_EQ(plain.total_count(), 1);  // the forward all-gather only
    EXPECT_TRUE(at::equal(w_local.grad(), piece_of(g, mesh, {Shard{0}}, rank)));
  });
}

TEST(DTensorApi, FromLocalChecksPieceSizes) {
  run_local_ranks(4, [](int rank) {
    DeviceMesh mesh({4}, {"x"});
    const int64_t rows = rank < 2 ? 2 : (rank == 2 ? 1 : 0);
    DTensor ok =
        DTensor::from_local(at::zeros({rows, 3}), mesh, {Shard{0}}, std::vector<int64_t>{5, 3});
    EXPECT_EQ(ok.sizes(), (std::vector<int64_t>{5, 3}));
    // Without a global shape, pieces are taken as even.
    DTensor even = DTensor::from_local(at::zeros({2, 3}), mesh, {Shard{-2}});
    EXPECT_EQ(even.sizes(), (std::vector<int64_t>{8, 3}));
    EXPECT_EQ(std::get<Shard>(even.placements()[0]).dim, 0);
    try {
      DTensor::from_local(at::zeros({2, 3}), mesh, {Shard{0}}, std::vector<int64_t>{5, 3});
      if (rank >= 2) FAIL();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(rank) + " holds 2 of dim 0"),
                std::string::npos)
          << e.what();
    }
    EXPECT_ERROR(DTensor::from_local(at::zeros({2}), mesh, {Shard{1}}),
                 "Shard(1) on mesh axis 'x' names dim 1 of a 1-dim tensor");
    EXPECT_ERROR(DTensor::from_local(at::zeros({2}), mesh, {Shard{0}, Replicate{}}),
                 "2 placements [Shard(0), Replicate()] for DeviceMesh(x=4)");
    EXPECT_ERROR(DTensor::distribute(at::zeros({2}), mesh, {Partial{}}),
                 "Partial(sum) on mesh axis 'x': a whole tensor cannot be split");
  });
}

}  // namespace
}  // namespace te

namespace te {
namespace {

// DeviceMesh's own collectives for bytes (what checkpoints exchange): every rank's string in rank
// order, whatever their lengths (empty included), on one and two mesh dims; and a barrier.
TEST(MeshCollectives, AllGatherOfStringsAndBarrier) {
  EXPECT_EQ(DeviceMesh({1}, {"x"}).all_gather("alone"), std::vector<std::string>{"alone"});
  run_local_ranks(4, [](int rank) {
    const std::vector<std::string> expected = {"", "r1", std::string(300, 'b'), "rank three"};
    for (const auto& [shape, names] :
         {std::pair<std::vector<int64_t>, std::vector<std::string>>{{4}, {"x"}},
          {{2, 2}, {"data", "model"}}}) {
      DeviceMesh mesh(shape, names);
      EXPECT_EQ(mesh.all_gather(expected[static_cast<std::size_t>(rank)]), expected);
      mesh.barrier();
    }
  });
}

// A gather over some mesh dims (the rows through this rank, in coordinate order), and a broadcast
// from any root, bytes 0-255 and lengths 0 and 5000 included.
TEST(MeshCollectives, AllGatherOverDimsAndBroadcast) {
  EXPECT_EQ(DeviceMesh({1}, {"x"}).broadcast("alone"), "alone");
  std::string all_bytes(5000, '\0');
  for (std::size_t i = 0; i < all_bytes.size(); ++i) all_bytes[i] = static_cast<char>(i % 256);
  run_local_ranks(4, [&](int rank) {
    DeviceMesh mesh({2, 2}, {"data", "model"});  // rank = 2 * data + model
    const std::string mine = "r" + std::to_string(rank);
    const int data = rank / 2, model = rank % 2;
    EXPECT_EQ(
        mesh.all_gather(mine, {0}),
        (std::vector<std::string>{"r" + std::to_string(model), "r" + std::to_string(2 + model)}));
    EXPECT_EQ(mesh.all_gather(mine, {1}),
              (std::vector<std::string>{"r" + std::to_string(2 * data),
                                        "r" + std::to_string(2 * data + 1)}));
    EXPECT_EQ(mesh.all_gather(mine, {0, 1}), (std::vector<std::string>{"r0", "r1", "r2", "r3"}));
    for (int root = 0; root < 4; ++root) {
      const std::string from_root = root == 2 ? all_bytes : "root " + std::to_string(root);
      EXPECT_EQ(mesh.broadcast(rank == root ? from_root : "ignored", root), from_root);
    }
    EXPECT_EQ(mesh.broadcast(rank == 0 ? "" : "ignored"), "");
    EXPECT_ERROR(mesh.broadcast("x", 4), "DeviceMesh::broadcast: root 4 is not a rank of");
    EXPECT_ERROR(mesh.all_gather("x", {2}), "has no dim 2 to gather over");
    EXPECT_ERROR(mesh.all_gather("x", {1, 1}), "all_gather over dim 1 twice");
  });
}

// A ring step along one mesh dim (context parallelism's K/V pass): each rank gets the tensor of
// the rank `shift` places back along that dim, for shifts forward, back, wrapping and none, in
// any dtype; each step is one send_recv record of the bytes sent. Under TE_COMM_BACKEND=store
// it runs on Backend::send_recv's default (an all-to-all with empty pieces).
TEST(MeshCollectives, RingShiftPassesAlongEachRow) {
  EXPECT_TRUE(at::equal(DeviceMesh({1}, {"x"}).ring_shift(at::ones({3}), 0, 1), at::ones({3})));
  run_local_ranks(4, [](int rank) {
    DeviceMesh line({4}, {"cp"});
    CommTrace trace;
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
      const at::Tensor mine = (at::arange(6, at::kFloat).view({2, 3}) + 10 * rank).to(dtype);
      for (int64_t shift : {1, -1, 2, 5, 0}) {
        const int64_t from = ((rank - shift) % 4 + 4) % 4;
        const at::Tensor got = line.ring_shift(mine, 0, shift);
        EXPECT_EQ(got.scalar_type(), dtype);
        EXPECT_TRUE(at::equal(got, (at::arange(6, at::kFloat).view({2, 3}) + 10 * from).to(dtype)))
            << "rank " << rank << " shift " << shift << " " << dtype;
      }
    }
    // Five shifts of three dtypes, of which the shifts by 0 move nothing.
    EXPECT_EQ(trace.count(Collective::kSendRecv, "cp"), 12);
    EXPECT_EQ(trace.bytes(Collective::kSendRecv, "cp"), 4 * (6 * 4 + 6 * 2 + 6 * 8));
    const bool gloo = std::getenv("TE_COMM_BACKEND") == nullptr;  // else the store's default
    for (const CommRecord& r : trace.records()) {
      EXPECT_EQ(r.primitive, gloo ? "send/recv" : "store_all_to_all");
    }
    DeviceMesh grid({2, 2}, {"data", "cp"});  // rank = 2 * data + cp
    const at::Tensor got = grid.ring_shift(at::full({2}, rank, at::kInt), 1, 1);
    EXPECT_TRUE(at::equal(got, at::full({2}, 2 * (rank / 2) + (rank % 2 + 1) % 2, at::kInt)));
    const at::Tensor down = grid.ring_shift(at::full({1}, rank, at::kInt), 0, -1);
    EXPECT_TRUE(at::equal(down, at::full({1}, (rank + 2) % 4, at::kInt)));
    EXPECT_ERROR(grid.ring_shift(at::ones({1}), 2, 1), "has no dim 2 to pass a ring along");
    at::Tensor into = at::empty({2}, at::kInt);
    EXPECT_EQ(grid.ring_shift(at::full({2}, rank, at::kInt), 1, 1, into).data_ptr(),
              into.data_ptr());
    EXPECT_TRUE(at::equal(into, got));
    EXPECT_ERROR(grid.ring_shift(at::ones({2}), 1, 1, at::empty({3})),
                 "the buffer to receive into ([3]) must be contiguous and of the sent tensor's");
  });
}

// A ragged all-to-all of rows (expert parallelism's token exchange): rank r sends (r + s) % 3
// rows to rank s, so some pieces are empty and rank 0 sends itself nothing; then one rank sends
// no row at all and another receives none. Each round is one all_to_all record of the rows sent;
// bad counts are named.
TEST(MeshCollectives, AllToAllRowsCarriesRaggedRowsIncludingNone) {
  EXPECT_TRUE(at::equal(DeviceMesh({1}, {"x"}).all_to_all_rows(at::ones({2, 3}), 0, {2}, {2}),
                        at::ones({2, 3})));
  run_local_ranks(3, [](int rank) {
    DeviceMesh line({3}, {"ep"});
    CommTrace trace;
    // Row values name their sender and their place: 100 * sender + 10 * receiver + i.
    auto rows_for = [](int64_t from, int64_t to, int64_t n) {
      return (at::arange(n, at::kFloat) + 100 * from + 10 * to).unsqueeze(1).repeat({1, 2});
    };
    for (int round = 0; round < 20; ++round) {
      const bool lopsided = round % 2 == 1;  // rank 1 sends nothing, rank 2 receives nothing
      auto count = [&](int64_t from, int64_t to) -> int64_t {
        if (lopsided) return from == 1 || to == 2 ? 0 : 2;
        return (from + to) % 3;
      };
      std::vector<int64_t> send, recv;
      std::vector<at::Tensor> mine, want;
      for (int64_t s = 0; s < 3; ++s) {
        send.push_back(count(rank, s));
        recv.push_back(count(s, rank));
        mine.push_back(rows_for(rank, s, send.back()));
        want.push_back(rows_for(s, rank, recv.back()));
      }
      for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
        const at::Tensor got = line.all_to_all_rows(at::cat(mine).to(dtype), 0, send, recv);
        EXPECT_EQ(got.scalar_type(), dtype);
        EXPECT_TRUE(at::equal(got.to(at::kFloat), at::cat(want)))
            << "rank " << rank << " round " << round;
      }
    }
    EXPECT_EQ(trace.count(Collective::kAllToAll, "ep"), 40);
    EXPECT_ERROR(line.all_to_all_rows(at::ones({2, 2}), 0, {1, 1}, {1, 1, 0}),
                 "2 send and 3 receive counts for a row of 3 ranks");
    EXPECT_ERROR(line.all_to_all_rows(at::ones({2, 2}), 0, {1, 0, 0}, {0, 0, 0}),
                 "the send counts add up to 1 rows, but 2 are given");
    EXPECT_ERROR(line.all_to_all_rows(at::ones({2, 2}), 1, {2, 0, 0}, {0, 0, 0}),
                 "has no dim 1 to exchange rows along");
  });
}

// An error of the communication backend itself is reported as such, at once, not blamed on peers
// that are alive (Gloo in LibTorch 1.13 has no int16; that rejection stands for any backend
// error). bf16 and fp16, which Gloo lacks too, travel as fp32 and come back exact.
TEST(CollectiveErrors, ABackendErrorIsNotAMissingPeer) {
  run_local_ranks(2, [](int rank) {
    DeviceMesh mesh({2}, {"x"});
    const auto start = std::chrono::steady_clock::now();
    const DTensor shorts =
        DTensor::from_local(at::full({2}, rank + 1, at::kShort), mesh, {Partial{}});
    try {
      shorts.full_tensor();
      // A backend that does take int16 must still sum it right.
      EXPECT_TRUE(at::equal(shorts.full_tensor(), at::full({2}, 3, at::kShort)));
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("all_reduce over mesh axis 'x' (ranks [0, 1]) failed on rank " +
                         std::to_string(rank) + ": the communication backend rejected the call"),
                std::string::npos)
          << msg;
      EXPECT_EQ(msg.find("did not arrive"), std::string::npos) << msg;
      EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
      if (rank == 0) std::cout << "int16 all-reduce: " << msg << "\n";
    }
    for (at::ScalarType t : {at::kBFloat16, at::kHalf}) {
      const at::Tensor whole = at::arange(6, at::kFloat).to(t).view({2, 3}) / 7;
      const DTensor x = DTensor::distribute(whole, mesh, {Shard{1}});
      EXPECT_TRUE(at::equal(x.full_tensor(), whole)) << t;
      const DTensor p = DTensor::from_local(whole, mesh, {Partial{}});
      EXPECT_EQ(p.full_tensor().scalar_type(), t);
      EXPECT_TRUE(at::equal(p.full_tensor(), (whole.to(at::kFloat) * 2).to(t))) << t;
    }
  });
}

}  // namespace
}  // namespace te
