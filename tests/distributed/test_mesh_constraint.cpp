// DeviceMesh layout and errors, run_local_ranks, CommTrace counts and bytes per transition,
// with_sharding_constraint through rules and the TE table, visualize_sharding.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <atomic>
#include <thread>

#include "../expect_error.h"
#include "dist_test_util.h"
#include "te/distributed.h"

namespace te {
namespace {

using test::piece_of;
using test::seeded_integers;

// ---- chunks ----------------------------------------------------------------------------------

TEST(Chunks, FollowTorchChunk) {
  const int64_t lengths[] = {2, 2, 1, 0};
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(chunk_of(5, 4, i).length, lengths[i]);
  EXPECT_EQ(chunk_of(5, 4, 2).offset, 4);
  EXPECT_EQ(chunk_of(5, 4, 3).offset, 5);
  EXPECT_EQ(chunk_of(8, 4, 3).offset, 6);
  EXPECT_EQ(chunk_of(0, 2, 1).length, 0);
  EXPECT_EQ(chunk_of(3, 1, 0).length, 3);
  EXPECT_ERROR(chunk_of(3, 2, 2), "chunk_of(size=3, parts=2, index=2)");
}

// ---- mesh ------------------------------------------------------------------------------------

TEST(DeviceMeshTest, RowMajorCoordinatesAndRows) {
  run_local_ranks(4, [](int rank) {
    DeviceMesh mesh({2, 2}, {"data", "model"});
    EXPECT_EQ(mesh.rank(), rank);
    EXPECT_EQ(mesh.coordinate("data"), rank / 2);
    EXPECT_EQ(mesh.coordinate("model"), rank % 2);
    EXPECT_EQ(mesh.size("model"), 2);
    EXPECT_EQ(mesh.size(), 4);
    const std::vector<int64_t> model_row = {rank / 2 * 2, rank / 2 * 2 + 1};
    const std::vector<int64_t> data_row = {rank % 2, rank % 2 + 2};
    EXPECT_EQ(mesh.group_ranks(1), model_row);
    EXPECT_EQ(mesh.group_ranks(0), data_row);
    EXPECT_EQ(mesh.coordinates_of(3), (std::vector<int64_t>{1, 1}));
    EXPECT_EQ(mesh.to_string(), "DeviceMesh(data=2, model=2)");
    // A second mesh over the same world gets its own groups, and both work.
    DeviceMesh flat({4}, {"all"});
    at::Tensor one = at::ones({1});
    EXPECT_EQ(DTensor::from_local(one, flat, {Partial{}}).full_tensor().item<float>(), 4.0f);
    EXPECT_EQ(DTensor::from_local(one, mesh, {Partial{}, Replicate{}}).full_tensor().item<float>(),
              2.0f);
  });
}

TEST(DeviceMeshTest, SizeMismatchNamesBoth) {
  run_local_ranks(2, [](int) {
    try {
      DeviceMesh mesh({3}, {"data"});
      FAIL();
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("has 3 ranks but the world has 2"), std::string::npos) << msg;
    }
  });
  // Not distributed: a world of one.
  EXPECT_ERROR(DeviceMesh({2}, {"data"}), "the mesh ('data') has 2 ranks but the world has 1");
  DeviceMesh single({1, 1}, {"data", "model"});
  EXPECT_EQ(single.size(), 1);
}

TEST(DeviceMeshTest, UnknownAxisListsTheAxes) {
  DeviceMesh mesh({1, 1}, {"data", "model"});
  try {
    mesh.size("tensor");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mesh axis 'tensor' is not in DeviceMesh(data=1, "
                                         "model=1); its axes are 'data', 'model'"),
              std::string::npos)
        << e.what();
  }
  EXPECT_ERROR(DeviceMesh({2}, {"a", "b"}), "1 sizes but 2 axis names");
  EXPECT_ERROR(DeviceMesh({1, 1}, {"a", "a"}), "axis name 'a' is used twice");
  EXPECT_ERROR(DeviceMesh({0}, {"a"}), "axis 'a' has size 0");
}

TEST(DeviceMeshTest, MeshScopeNests) {
  EXPECT_EQ(current_mesh(), nullptr);
  DeviceMesh a({1}, {"a"});
  DeviceMesh b({1}, {"b"});
  {
    MeshScope sa(a);
    EXPECT_EQ(*current_mesh(), a);
    {
      MeshScope sb(b);
      EXPECT_EQ(*current_mesh(), b);
    }
    EXPECT_EQ(*current_mesh(), a);
  }
  EXPECT_EQ(current_mesh(), nullptr);
}

// ---- run_local_ranks -------------------------------------------------------------------------

TEST(RunLocalRanks, RanksAreThreadsWithTheirOwnWorld) {
  std::atomic<int> seen{0};
  run_local_ranks(3, [&](int rank) {
    EXPECT_EQ(world_rank(), rank);
    EXPECT_EQ(world_size(), 3);
    EXPECT_TRUE(is_distributed());
    seen.fetch_add(1 << rank);
  });
  EXPECT_EQ(seen.load(), 7);
  EXPECT_EQ(world_size(), 1);
  EXPECT_EQ(world_rank(), 0);
}

TEST(RunLocalRanks, EachRankGetsItsShareOfTheIntraOpThreads) {
  const int caller = at::get_num_threads();
  at::set_num_threads(4);
  std::vector<int> seen(2, 0);
  run_local_ranks(2,
                  [&](int rank) { seen[static_cast<std::size_t>(rank)] = at::get_num_threads(); });
  EXPECT_EQ(seen, std::vector<int>({2, 2}));
  EXPECT_EQ(at::get_num_threads(), 4);  // the caller's count is back
  DistributedOptions options;
  options.threads_per_rank = 3;
  run_local_ranks(
      2, [&](int rank) { seen[static_cast<std::size_t>(rank)] = at::get_num_threads(); }, options);
  EXPECT_EQ(seen, std::vector<int>({3, 3}));
  run_local_ranks(3, [&](int) { EXPECT_EQ(at::get_num_threads(), 1); });  // at least one each
  options.threads_per_rank = -1;
  EXPECT_ERROR(run_local_ranks(
                   2, [](int) {}, options),
               "threads_per_rank must be 0");
  at::set_num_threads(caller);
}

TEST(RunLocalRanks, CarriesTheCallersShardingContext) {
  AxisRulesScope rules(parse_axis_rules("batch=data"));
  run_local_ranks(2, [](int) { EXPECT_EQ(to_string(current_axis_rules()), "batch=data"); });
}

TEST(RunLocalRanks, RethrowsTheFirstFailureAfterAllRanksFinish) {
  DistributedOptions options;
  options.timeout = std::chrono::seconds(20);
  std::atomic<int> finished{0};
  try {
    run_local_ranks(
        3,
        [&](int rank) {
          DeviceMesh mesh({3}, {"x"});
          if (rank == 1) {
            finished.fetch_add(1);
            throw Error("rank 1 gave up");
          }
          // The survivors block in a collective rank 1 never joins; its departure closes the
          // connections, so they fail fast instead of waiting for the timeout.
          try {
            DTensor::from_local(at::ones({2}), mesh, {Partial{}}).full_tensor();
          } catch (const Error& e) {
            const std::string msg = e.what();
            EXPECT_NE(msg.find("all_reduce over mesh axis 'x' (ranks [0, 1, 2]) failed on rank " +
                               std::to_string(rank) +
                               ": missing rank 1 left with an error: rank 1 gave up"),
                      std::string::npos)
                << msg;
            finished.fetch_add(1);
            throw;
          }
        },
        options);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "rank 1 gave up");
  }
  EXPECT_EQ(finished.load(), 3);
}

TEST(RunLocalRanks, ASurvivorNamesTheFirstRankToLeaveFirst) {
  // Rank 1 gives up; rank 0 fails on it and leaves too; rank 2 comes to the collective late and
  // finds both gone. It must name rank 1, the cause, before rank 0.
  DistributedOptions options;
  options.timeout = std::chrono::seconds(20);
  std::string late;
  try {
    run_local_ranks(
        3,
        [&](int rank) {
          DeviceMesh mesh({3}, {"x"});
          if (rank == 1) throw Error("rank 1 gave up");
          if (rank == 2) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
          try {
            DTensor::from_local(at::ones({2}), mesh, {Partial{}}).full_tensor();
          } catch (const Error& e) {
            if (rank == 2) late = e.what();
            throw;
          }
        },
        options);
    FAIL();
  } catch (const Error&) {
  }
  const auto first = late.find("rank 1 left with an error: rank 1 gave up");
  const auto second = late.find("rank 0 left with an error");
  ASSERT_NE(first, std::string::npos) << late;
  if (second != std::string::npos) EXPECT_LT(first, second) << late;
}

TEST(RunLocalRanks, ACapturedContextCarriesRankMeshAndRulesIntoAWorker) {
  run_local_ranks(2, [](int rank) {
    DeviceMesh mesh({2}, {"data"});
    MeshScope scope(mesh);
    AxisRulesScope rules(parse_axis_rules("batch=data"));
    const DistributedContext context = capture_distributed_context();
    at::Tensor result;
    std::thread worker([&] {
      EXPECT_EQ(current_mesh(), nullptr);  // a new thread starts bare
      DistributedContextScope in(context);
      EXPECT_EQ(world_rank(), rank);
      EXPECT_EQ(*current_mesh(), mesh);
      DTensor x = DTensor::distribute(seeded_integers({4, 2}, 9), mesh, {Replicate{}});
      result = with_sharding_constraint(x, {"batch", std::nullopt}).to_local();
    });
    worker.join();
    EXPECT_TRUE(at::equal(result, piece_of(seeded_integers({4, 2}, 9), mesh, {Shard{0}}, rank)));
    // An empty context masks the thread's own.
    DistributedContextScope none(DistributedContext{});
    EXPECT_EQ(current_mesh(), nullptr);
    EXPECT_TRUE(current_axis_rules().empty());
  });
}

// ---- CommTrace: exact counts and bytes per transition ------------------------------------------

struct TraceCase {
  std::vector<Placement> src, dst;
  Collective kind;
  int64_t forward_count;
  int64_t forward_bytes;  // for a [8, 4] double tensor on mesh {2}
  int64_t backward_count;
};

TEST(CommTraceTest, CountsAndBytesOfEachTransitionOnTwoRanks) {
  const int64_t full = 8 * 4 * 8;  // bytes of the [8, 4] double tensor
  const std::vector<TraceCase> cases = {
      {{Shard{0}}, {Replicate{}}, Collective::kAllGather, 1, full, 0},
      {{Replicate{}}, {Shard{0}}, Collective::kAllGather, 0, 0, 1},
      {{Partial{}}, {Replicate{}}, Collective::kAllReduce, 1, full, 0},
      {{Partial{}}, {Shard{1}}, Collective::kReduceScatter, 1, full, 1},
      {{Shard{0}}, {Shard{1}}, Collective::kAllToAll, 1, full / 2, 1},
      {{Shard{0}}, {Shard{0}}, Collective::kAllGather, 0, 0, 0},
      {{Replicate{}}, {Replicate{}}, Collective::kAllGather, 0, 0, 0},
  };
  run_local_ranks(2, [&](int) {
    DeviceMesh mesh({2}, {"x"});
    for (const TraceCase& c : cases) {
      const std::string what = to_string(c.src) + " -> " + to_string(c.dst);
      at::Tensor local =
          piece_of(seeded_integers({8, 4}, 1), mesh, c.src, mesh.rank()).requires_grad_(true);
      DTensor x = DTensor::from_local(local, mesh, c.src);
      CommTrace forward;
      DTensor y = x.redistribute(c.dst);
      EXPECT_EQ(forward.count(c.kind, "x"), c.forward_count) << what << "\n" << forward.table();
      EXPECT_EQ(forward.bytes(c.kind, "x"), c.forward_bytes) << what;
      EXPECT_EQ(forward.total_count(), c.forward_count) << what << "\n" << forward.table();
      CommTrace backward;
      torch::autograd::backward({y.to_local()}, {at::ones_like(y.to_local())});
      EXPECT_EQ(backward.total_count(), c.backward_count) << what << "\n" << backward.table();
    }
  });
}

TEST(CommTraceTest, SizeOneMeshDimsMoveNothingAndTableReadsWell) {
  run_local_ranks(2, [](int) {
    DeviceMesh mesh({1, 2}, {"one", "two"});
    at::Tensor t = seeded_integers({4, 2}, 2);
    DTensor x = DTensor::distribute(t, mesh, {Shard{0}, Replicate{}});
    CommTrace trace;
    DTensor y = x.redistribute({Replicate{}, Replicate{}});
    EXPECT_EQ(trace.total_count(), 0);
    DTensor z = y.redistribute({Replicate{}, Shard{0}}).redistribute({Shard{1}, Replicate{}});
    EXPECT_EQ(trace.total_count(), 1);
    EXPECT_EQ(trace.count(Collective::kAllGather, "two"), 1);
    EXPECT_EQ(trace.table(),
              "collective      mesh axis   count        bytes\n"
              "all_gather      two             1           64\n");
  });
}

TEST(CommTraceTest, TwoDimMeshPlan) {
  run_local_ranks(4, [](int) {
    DeviceMesh mesh({2, 2}, {"data", "model"});
    at::Tensor t = seeded_integers({8, 4}, 3);
    DTensor x = DTensor::from_local(piece_of(t, mesh, {Shard{0}, Replicate{}}, mesh.rank()), mesh,
                                    {Shard{0}, Partial{}});
    CommTrace trace;
    // Partial over model -> reduce-scatter into the nested shard of dim 0; nothing on data.
    DTensor y = x.redistribute({Shard{0}, Shard{0}});
    EXPECT_EQ(trace.count(Collective::kReduceScatter, "model"), 1);
    EXPECT_EQ(trace.bytes(Collective::kReduceScatter, "model"), 4 * 4 * 8);
    EXPECT_EQ(trace.total_count(), 1);
    // Shard(0) on both -> nothing but data: the minor shard must come apart first.
    trace.clear();
    DTensor z = y.redistribute({Replicate{}, Shard{0}});
    EXPECT_EQ(trace.count(Collective::kAllGather, "model"), 1);
    EXPECT_EQ(trace.count(Collective::kAllGather, "data"), 1);
    EXPECT_EQ(trace.total_count(), 2);
    EXPECT_TRUE(
        at::equal(z.to_local(), piece_of(t * 2, mesh, {Replicate{}, Shard{0}}, mesh.rank())));
  });
}

// ---- with_sharding_constraint ----------------------------------------------------------------

TEST(WithShardingConstraint, FollowsTheRulesOnTheCurrentMesh) {
  run_local_ranks(4, [](int) {
    DeviceMesh mesh({2, 2}, {"data", "model"});
    MeshScope scope(mesh);
    AxisRulesScope rules(parse_axis_rules("batch=data,heads=model,vocab=(data,model)"));
    at::Tensor t = seeded_integers({4, 6, 2}, 4);
    DTensor x = DTensor::distribute(t, mesh, {Replicate{}, Replicate{}});
    DTensor y = with_sharding_constraint(x, {"batch", "heads", std::nullopt});
    EXPECT_EQ(to_string(y.placements()), "[Shard(0), Shard(1)]");
    EXPECT_TRUE(at::equal(y.full_tensor(), t));
    // A tuple shards one dim over both axes, major to minor.
    DTensor v = with_sharding_constraint(x, {"vocab", std::nullopt, std::nullopt});
    EXPECT_EQ(to_string(v.placements()), "[Shard(0), Shard(0)]");
    EXPECT_EQ(v.to_local().size(0), 1);
    // No rule for any name: replicated.
    DTensor r = with_sharding_constraint(y, {"seqlen", std::nullopt, std::nullopt});
    EXPECT_EQ(to_string(r.placements()), "[Replicate(), Replicate()]");
    // kNoConstraint leaves the layout alone when a name matches nothing.
    DTensor same = with_sharding_constraint(y, {"seqlen", "heads", std::nullopt},
                                            RulesFallback::kNoConstraint);
    EXPECT_EQ(same.placements(), y.placements());
  });
}

// One dim over a tuple of mesh axes, (data, model) on a 2x2 mesh: data splits the rows first
// (major), model splits each half again (minor). The pieces are written out by hand, not derived
// from local_chunks, for an even dim (8 rows) and an uneven one (7 rows: torch.chunk gives data
// 4 + 3, then model 2 + 2 and 2 + 1).
TEST(WithShardingConstraint, ATupleShardsMajorToMinorByHand) {
  run_local_ranks(4, [](int rank) {
    DeviceMesh mesh({2, 2}, {"data", "model"});
    MeshScope scope(mesh);
    AxisRulesScope rules(parse_axis_rules("vocab=(data,model)"));
    // rank = 2 * data + model; rows [begin, end) per rank.
    const int64_t even[4][2] = {{0, 2}, {2, 4}, {4, 6}, {6, 8}};
    const int64_t uneven[4][2] = {{0, 2}, {2, 4}, {4, 6}, {6, 7}};
    for (const auto& [rows, want] : {std::pair<int64_t, const int64_t(*)[2]>{8, even},
                                     std::pair<int64_t, const int64_t(*)[2]>{7, uneven}}) {
      const at::Tensor t = at::arange(rows * 3, at::kFloat).view({rows, 3});
      DTensor x = DTensor::distribute(t, mesh, {Replicate{}, Replicate{}});
      DTensor v = with_sharding_constraint(x, {"vocab", std::nullopt});
      EXPECT_EQ(to_string(v.placements()), "[Shard(0), Shard(0)]");
      const int64_t begin = want[rank][0], end = want[rank][1];
      EXPECT_TRUE(at::equal(v.to_local(), t.slice(0, begin, end)))
          << rows << " rows, rank " << rank << ": got " << v.to_local();
      EXPECT_TRUE(at::equal(v.full_tensor(), t));
    }
    // The tuple the other way round is out of the mesh's order.
    AxisRulesScope reversed(parse_axis_rules("vocab=(model,data)"));
    DTensor x = DTensor::distribute(at::zeros({8, 3}), mesh, {Replicate{}, Replicate{}});
    EXPECT_ERROR(with_sharding_constraint(x, {"vocab", std::nullopt}),
                 "over mesh axes out of the mesh's order");
  });
}

TEST(WithShardingConstraint, UsesTheTeTableUnderAMeshResource) {
  set_warning_handler([](std::string_view) {});
  run_local_ranks(2, [](int) {
    DeviceMesh mesh({2}, {"tp"});
    MeshScope scope(mesh);
    MeshResourceScope resource(parse_mesh_resource("tpsp=tp"));
    at::Tensor t = seeded_integers({2, 4, 6}, 5);
    DTensor x = DTensor::distribute(t, mesh, {Replicate{}});
    EXPECT_EQ(to_string(with_sharding_constraint(x, {"batch", "seqlen_tp", "hidden"}).placements()),
              "[Shard(1)]");
    EXPECT_EQ(to_string(with_sharding_constraint(x, {"batch", "seqlen", "hidden_tp"}).placements()),
              "[Shard(2)]");
  });
  set_warning_handler(nullptr);
}

TEST(WithShardingConstraint, ReducesPartialInputs) {
  run_local_ranks(2, [](int rank) {
    DeviceMesh mesh({2}, {"tp"});
    MeshScope scope(mesh);
    AxisRulesScope rules(parse_axis_rules("seqlen=tp"));
    at::Tensor t = seeded_integers({2, 4}, 6);
    DTensor p = DTensor::from_local(rank == 0 ? t * 3 : t * -2, mesh, {Partial{}});
    CommTrace trace;
    DTensor sp = with_sharding_constraint(p, {"seqlen", "hidden"});  // Megatron-SP's reduce-scatter
    EXPECT_EQ(trace.count(Collective::kReduceScatter, "tp"), 1);
    EXPECT_TRUE(at::equal(sp.to_local(), piece_of(t, mesh, {Shard{0}}, rank)));
    DTensor rep = with_sharding_constraint(p, {"batch", "hidden"});  // TP's all-reduce
    EXPECT_EQ(trace.count(Collective::kAllReduce, "tp"), 1);
    EXPECT_TRUE(at::equal(rep.to_local(), t));
  });
}

TEST(WithShardingConstraint, ReportsBadInput) {
  run_local_ranks(2, [](int) {
    DeviceMesh mesh({2}, {"data"});
    DeviceMesh other({2}, {"data"});
    MeshScope scope(mesh);
    AxisRulesScope rules(parse_axis_rules("batch=data,heads=model"));
    DTensor x = DTensor::distribute(at::zeros({3, 4}), mesh, {Replicate{}});
    try {
      with_sharding_constraint(x, {"batch"});
      FAIL();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("1 logical axes ('batch') for a 2-dim tensor"),
                std::string::npos)
          << e.what();
    }
    try {
      with_sharding_constraint(x, {std::nullopt, "heads"});
      FAIL();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("mesh axis 'model', which DeviceMesh(data=2) does not"),
                std::string::npos)
          << e.what();
    }
    ConstraintOptions even;
    even.require_even = true;
    try {
      with_sharding_constraint(x, {"batch", std::nullopt}, even);
      FAIL();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("dim 0 ('batch') has size 3"), std::string::npos)
          << e.what();
    }
    EXPECT_NO_THROW(with_sharding_constraint(x, {"batch", std::nullopt}));  // torch.chunk: 2, 1
    DTensor y = DTensor::distribute(at::zeros({3, 4}), other, {Replicate{}});
    EXPECT_ERROR(with_sharding_constraint(y, {"batch", std::nullopt}),
                 "the tensor lives on DeviceMesh(data=2) but the current mesh is another "
                 "(DeviceMesh(data=2), the same shape but a separate DeviceMesh");
    EXPECT_ERROR(with_sharding_constraint(x, {"batch", "batch"}),
                 "logical axis 'batch' occurs more than once");
  });
}

TEST(WithShardingConstraint, NoMeshOrPlainTensor) {
  AxisRulesScope rules(parse_axis_rules("batch=data"));
  at::Tensor t = at::zeros({2, 3});
  // One device: the plain overload validates and returns the tensor itself.
  EXPECT_TRUE(with_sharding_constraint(t, {"batch", std::nullopt}).is_same(t));
  EXPECT_ERROR(with_sharding_constraint(t, {"batch"}),
               "1 logical axes ('batch') for a 2-dim tensor");
  EXPECT_ERROR(with_sharding_constraint(t, {"batch", "batch"}),
               "logical axis 'batch' occurs more than once");
  DeviceMesh single({1}, {"data"});
  DTensor x = DTensor::distribute(t, single, {Replicate{}});
  // No mesh in scope: unchanged.
  EXPECT_EQ(with_sharding_constraint(x, {"batch", std::nullopt}).placements(), x.placements());
  run_local_ranks(2, [](int) {
    DeviceMesh mesh({2}, {"data"});
    MeshScope scope(mesh);
    at::Tensor plain = at::zeros({2, 3});
    try {
      with_sharding_constraint(plain, {"batch", std::nullopt});
      FAIL();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("a plain at::Tensor has no layout"), std::string::npos);
    }
    EXPECT_NO_THROW(with_sharding_constraint(plain, {"seqlen", std::nullopt}));  // replicated
  });
}

// ---- visualize_sharding ----------------------------------------------------------------------

TEST(VisualizeSharding, PinnedOutput) {
  run_local_ranks(4, [](int rank) {
    DeviceMesh mesh({2, 2}, {"data", "model"});
    DTensor x = DTensor::distribute(at::zeros({5, 4}), mesh, {Shard{0}, Shard{1}});
    const std::string text = visualize_sharding(x);
    EXPECT_EQ(text,
              "DTensor(sizes=[5, 4], mesh=DeviceMesh(data=2, model=2), placements=[Shard(0), "
              "Shard(1)])\n"
              "rank 0 (data=0, model=0): [0:3, 0:2]\n"
              "rank 1 (data=0, model=1): [0:3, 2:4]\n"
              "rank 2 (data=1, model=0): [3:5, 0:2]\n"
              "rank 3 (data=1, model=1): [3:5, 2:4]\n")
        << "rank " << rank;
    DTensor p = DTensor::from_local(at::zeros({rank % 2 == 0 ? 1 : 0, 4}), mesh,
                                    {Partial{}, Shard{0}}, std::vector<int64_t>{1, 4});
    EXPECT_EQ(visualize_sharding(p),
              "DTensor(sizes=[1, 4], mesh=DeviceMesh(data=2, model=2), placements=[Partial(sum), "
              "Shard(0)])\n"
              "rank 0 (data=0, model=0): [0:1, 0:4] partial(sum) over 'data'\n"
              "rank 1 (data=0, model=1): [1:1, 0:4] partial(sum) over 'data' (empty)\n"
              "rank 2 (data=1, model=0): [0:1, 0:4] partial(sum) over 'data'\n"
              "rank 3 (data=1, model=1): [1:1, 0:4] partial(sum) over 'data' (empty)\n");
  });
}

}  // namespace
}  // namespace te
