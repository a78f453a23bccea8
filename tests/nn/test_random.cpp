// Layout-invariant dropout: the mask statistics, determinism per seed and call, a piece equals the
// slice of the whole, Partial inputs, and a tensor-parallel TransformerLayer in training whose
// replicated output is bit-identical on every rank and equal to one process.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "../distributed/dist_test_util.h"
#include "../expect_error.h"
#include "nn_test_util.h"
#include "te/nn.h"

namespace te::nn {
namespace {

namespace F = functional;

TEST(Dropout, KeepRateAndScaleOverAMillionElements) {
  for (double p : {0.1, 0.3, 0.5}) {
    manual_seed(7);
    const at::Tensor y = F::dropout(at::ones({1000, 1000}), p, true);
    const at::Tensor kept = y.ne(0);
    const double n = 1e6, keep = kept.sum().item<double>() / n;
    const double sigma = std::sqrt(p * (1 - p) / n);
    EXPECT_LT(std::abs(keep - (1 - p)), 4 * sigma) << "p " << p << " keep rate " << keep;
    // Every kept element is exactly 1 / (1 - p).
    const float scale = static_cast<float>(1.0 / (1.0 - p));
    EXPECT_TRUE(at::equal(y.masked_select(kept), at::full({kept.sum().item<int64_t>()}, scale)))
        << "p " << p;
  }
}

TEST(Dropout, SameSeedSameMaskAndEachCallDrawsAFreshOne) {
  const at::Tensor x = at::ones({64, 33});
  manual_seed(3);
  const at::Tensor a1 = F::dropout(x, 0.3, true), a2 = F::dropout(x, 0.3, true);
  EXPECT_EQ(rng_state().calls, 2u);
  manual_seed(3);
  const at::Tensor b1 = F::dropout(x, 0.3, true);
  EXPECT_TRUE(at::equal(a1, b1));
  EXPECT_FALSE(at::equal(a1, a2));
  manual_seed(4);
  EXPECT_FALSE(at::equal(a1, F::dropout(x, 0.3, true)));
  // set_rng_state replays a call.
  set_rng_state({3, 1});
  EXPECT_TRUE(at::equal(a2, F::dropout(x, 0.3, true)));
  // Evaluation and p = 0 draw nothing.
  const RngState before = rng_state();
  EXPECT_TRUE(at::equal(F::dropout(x, 0.3, false), x));
  EXPECT_TRUE(at::equal(F::dropout(x, 0.0, true), x));
  EXPECT_EQ(rng_state().calls, before.calls);
}

TEST(Dropout, APieceIsTheSliceOfTheWholeMask) {
  const at::Tensor x = test::randn({5, 4, 3, 160}, 1);
  manual_seed(9);
  const at::Tensor whole = F::dropout(x, 0.2, true);
  manual_seed(9);
  const at::Tensor piece = x.narrow(0, 1, 3).narrow(1, 2, 2).narrow(3, 37, 101).contiguous();
  const at::Tensor y = F::dropout(piece, 0.2, true, {5, 4, 3, 160}, {1, 2, 0, 37});
  EXPECT_TRUE(at::equal(y, whole.narrow(0, 1, 3).narrow(1, 2, 2).narrow(3, 37, 101)));
}

// Rows gathered from anywhere in the global tensor (a mixture of experts' permuted rows) get the
// global tensor's rows of the mask, whatever order they come in.
TEST(Dropout, GatheredRowsGetTheirRowsOfTheWholeMask) {
  const at::Tensor x = test::randn({12, 40}, 3);
  manual_seed(7);
  const at::Tensor whole = F::dropout(x, 0.3, true);
  const at::Tensor ids = at::tensor(std::vector<int64_t>{9, 2, 2, 11, 0});
  manual_seed(7);
  const at::Tensor rows = x.index_select(0, ids).narrow(1, 15, 20).contiguous();
  const at::Tensor y = F::dropout_rows(rows, 0.3, true, {12, 40}, ids, 15);
  EXPECT_TRUE(at::equal(y, whole.index_select(0, ids).narrow(1, 15, 20)));
  EXPECT_ERROR(F::dropout_rows(rows, 0.3, true, {12, 40}, ids.to(at::kInt), 15),
               "dropout_rows: row_ids must be int64 [5], one per row");
  EXPECT_ERROR(F::dropout_rows(rows, 0.3, true, {12, 40}, ids, 25),
               "dropout_rows: columns 25 .. 44 lie outside the global 40");
  EXPECT_ERROR(F::dropout_rows(rows, 0.3, true, {10, 40}, ids, 15),
               "dropout_rows: row id 11 lies outside the global 10 rows");
}

TEST(Dropout, GradientIsTheSameMask) {
  const at::Tensor x = test::randn({17, 31}, 2).requires_grad_(true);
  manual_seed(1);
  const at::Tensor y = F::dropout(x, 0.25, true);
  y.backward(at::ones_like(y));
  // y = x * m, so dy/dx = m = y / x.
  EXPECT_TRUE(at::allclose(x.grad(), y.detach() / x.detach(), 1e-6, 1e-6));
}

TEST(Dropout, OtherDtypesGetTheSameMask) {
  const at::Tensor x = at::ones({8, 40});
  for (at::ScalarType t : {at::kBFloat16, at::kHalf, at::kDouble}) {
    manual_seed(5);
    const at::Tensor ref = F::dropout(x, 0.3, true);
    manual_seed(5);
    const at::Tensor y = F::dropout(x.to(t), 0.3, true);
    EXPECT_EQ(y.scalar_type(), t);
    EXPECT_TRUE(at::equal(y.ne(0), ref.ne(0))) << t;
  }
}

TEST(Dropout, BadInputIsNamed) {
  const at::Tensor x = at::ones({4, 4});
  try {
    F::dropout(x, 1.0, true);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dropout: probability 1 is not in [0, 1)"),
              std::string::npos)
        << e.what();
  }
  try {
    F::dropout(x, 0.1, true, {4, 5}, {0, 2});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dim 1 of the piece (offset 2, length 4) lies outside "
                                         "the global size 5"),
              std::string::npos)
        << e.what();
  }
  try {
    TransformerLayer(TransformerLayerOptions(8, 16, 2).hidden_dropout(-0.1));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hidden_dropout -0.1 is not in [0, 1)"), std::string::npos)
        << e.what();
  }
}

// On 2x2 (data, model): Shard, Replicate and Partial DTensors against one process's mask.
TEST(Dropout, EveryPlacementDrawsItsSliceOfTheGlobalMask) {
  const at::Tensor x = test::randn({6, 5, 7}, 4);
  manual_seed(11);
  const at::Tensor want = F::dropout(x, 0.3, true);
  run_local_ranks(4, [&](int rank) {
    DeviceMesh mesh({2, 2}, {"data", "model"});
    const std::vector<std::vector<Placement>> layouts = {{Shard{0}, Shard{2}},
                                                         {Shard{0}, Replicate{}},
                                                         {Replicate{}, Replicate{}},
                                                         {Shard{1}, Shard{1}},
                                                         {Shard{2}, Shard{0}}};
    for (const auto& placements : layouts) {
      manual_seed(11);
      const DTensor dx = DTensor::distribute(x, mesh, placements);
      const DTensor y = F::dropout(dx, 0.3, true);
      EXPECT_TRUE(at::equal(y.to_local(), te::test::piece_of(want, mesh, placements, rank)))
          << "rank " << rank << " " << dx.to_string();
      EXPECT_TRUE(at::equal(y.full_tensor(), want));
    }
    // Partial over model: every summand masked alike; reducing gives the mask of the sum.
    manual_seed(11);
    const int64_t m = mesh.coordinate(1);
    const at::Tensor part = m == 0 ? x * 0.25 : x * 0.75;
    const DTensor partial =
        DTensor::from_local(te::test::piece_of(part, mesh, {Shard{0}, Replicate{}}, rank), mesh,
                            {Shard{0}, Partial{}}, std::vector<int64_t>{6, 5, 7});
    const DTensor y = F::dropout(partial, 0.3, true);
    EXPECT_TRUE(is_partial(y.placements()[1]));
    EXPECT_TRUE(at::allclose(y.full_tensor(), want, 1e-6, 1e-6)) << "rank " << rank;
  });
}

// The report: a tensor-parallel TransformerLayer in training, input replicated, held
// different values on the two ranks. Now the replicas are bit-identical and equal one process.
TEST(Dropout, TensorParallelTransformerLayerReplicasAreBitIdentical) {
  auto options = [&] {
    auto made = TransformerLayerOptions(32, 64, 4).hidden_dropout(0.3).intermediate_dropout(0.1);
    made.self_attention().attention().attn_mask_type("padding").attention_dropout(0.2);
    return made;
  }();
  const at::Tensor x = test::randn({4, 6, 32}, 8);
  const at::Tensor mask = at::zeros({4, 1, 6, 6}, at::kBool);
  manual_seed(2);
  TransformerLayer single(options);
  const at::Tensor want = single(x, mask).detach();
  std::vector<at::Tensor> outputs(2);
  run_local_ranks(2, [&](int rank) {
    DeviceMesh mesh({2}, {"model"});
    MeshScope on_mesh(mesh);
    AxisRulesScope rules(parse_axis_rules("heads=model,hidden_tp=model,w_tp=model"));
    manual_seed(2);
    TransformerLayer layer(options);
    const DTensor y = layer(DTensor::distribute(x, mesh, {Replicate{}}), mask);
    ASSERT_TRUE(is_replicate(y.placements()[0])) << y.to_string();
    outputs[static_cast<std::size_t>(rank)] = y.to_local().detach().clone();
  });
  EXPECT_TRUE(at::equal(outputs[0], outputs[1]))
      << "max difference " << (outputs[0] - outputs[1]).abs().max().item<double>();
  EXPECT_TRUE(test::Close(outputs[0], want, 1e-5));
}

}  // namespace
}  // namespace te::nn
