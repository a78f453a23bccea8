// Scopes, the TE default table, extend_logical_axis_rules, resolve_logical_axes with fallbacks,
// the once-per-process warning, thread locality and exception safety.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "../expect_error.h"
#include "te/sharding.h"

namespace te {
namespace {

PartitionSpec P(std::vector<MeshAxes> dims) { return PartitionSpec{std::move(dims)}; }
const MeshAxes None{};

// Captures warnings for the duration of a test, and re-arms the once-per-process warning.
class WarningCapture {
 public:
  WarningCapture() {
    reset_deprecation_warnings();
    previous_ = set_warning_handler([this](std::string_view m) {
      std::lock_guard<std::mutex> lock(mutex_);
      messages_.emplace_back(m);
    });
  }
  ~WarningCapture() { set_warning_handler(previous_); }
  std::vector<std::string> messages() {
    std::lock_guard<std::mutex> lock(mutex_);
    return messages_;
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> messages_;
  WarningHandler previous_;
};

// ---- scopes ----------------------------------------------------------------------------------

TEST(AxisRulesScope, NestsAndRestores) {
  EXPECT_TRUE(current_axis_rules().empty());
  {
    AxisRulesScope outer(parse_axis_rules("batch=data"));
    EXPECT_EQ(to_string(current_axis_rules()), "batch=data");
    {
      // The inner scope replaces the outer rules (Flax semantics), it does not merge.
      AxisRulesScope inner(parse_axis_rules("heads=model"));
      EXPECT_EQ(to_string(current_axis_rules()), "heads=model");
      EXPECT_EQ(*resolve_logical_axes({"batch", "heads"}), P({None, {"model"}}));
    }
    EXPECT_EQ(to_string(current_axis_rules()), "batch=data");
  }
  EXPECT_TRUE(current_axis_rules().empty());
}

TEST(AxisRulesScope, OutOfOrderDestructionKeepsTheStackConsistent) {
  auto outer = std::make_unique<AxisRulesScope>(parse_axis_rules("a=x"));
  auto inner = std::make_unique<AxisRulesScope>(parse_axis_rules("b=y"));
  outer.reset();  // leaves first: the inner one stays in force
  EXPECT_EQ(to_string(current_axis_rules()), "b=y");
  inner.reset();
  EXPECT_TRUE(current_axis_rules().empty());
}

TEST(AxisRulesScope, ValidatesRules) {
  EXPECT_ERROR(AxisRulesScope({{"a", {"x", "x"}}}), "names mesh axis 'x' twice");
  EXPECT_TRUE(current_axis_rules().empty());
}

TEST(MeshResourceScope, NestsAndRestores) {
  EXPECT_FALSE(current_mesh_resource());
  {
    MeshResourceScope outer(MeshResource{"data"});
    EXPECT_EQ(current_mesh_resource()->dp, "data");
    {
      MeshResourceScope inner(parse_mesh_resource("tp=model"));
      EXPECT_FALSE(current_mesh_resource()->dp);
      EXPECT_EQ(current_mesh_resource()->tp, "model");
    }
    EXPECT_EQ(current_mesh_resource()->dp, "data");
  }
  EXPECT_FALSE(current_mesh_resource());
}

TEST(MeshResourceScope, RejectsTpAndTpspTogether) {
  MeshResource r;
  r.tp = "model";
  r.tpsp = "model2";
  try {
    MeshResourceScope scope(r);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tp and tpsp are both set"), std::string::npos);
  }
  EXPECT_FALSE(current_mesh_resource());
  EXPECT_ERROR(te_default_axis_rules(r),
               "MeshResource(tp='model', tpsp='model2'): tp and tpsp are both set");
}

TEST(MeshResourceScope, RejectsTwoRolesOnOneAxisAndEmptyNames) {
  MeshResource both{"data"};
  both.fsdp = "data";
  EXPECT_ERROR(MeshResourceScope scope(both), "roles dp and fsdp both name mesh axis 'data'");
  MeshResource empty_name;
  empty_name.cp = "";
  EXPECT_ERROR(MeshResourceScope scope(empty_name), "role cp names the empty mesh axis");
  // ep may share the data axis.
  MeshResource ep_on_data{"data"};
  ep_on_data.ep = "data";
  EXPECT_NO_THROW(MeshResourceScope scope(ep_on_data));
}

// ---- the TE table ----------------------------------------------------------------------------

TEST(TeDefaultAxisRules, DataAndFsdp) {
  MeshResource r;
  r.dp = "data";
  r.fsdp = "fsdp";
  EXPECT_EQ(to_string(te_default_axis_rules(r)),
            "batch=(data,fsdp),seqlen=,seqlen_tp=,seqlen_cp=,heads=,hidden=,hidden_tp=,joined=,"
            "w_no_shard=,w_fsdp=fsdp,w_tp=,w_joined=");
  r.fsdp.reset();
  EXPECT_EQ(te_default_axis_rules(r)[0], (AxisRule{"batch", {"data"}}));
  r.dp.reset();
  r.fsdp = "fsdp";
  EXPECT_EQ(te_default_axis_rules(r)[0], (AxisRule{"batch", {"fsdp"}}));
}

TEST(TeDefaultAxisRules, TensorAndSequenceParallel) {
  MeshResource tp;
  tp.tp = "model";
  tp.cp = "ctx";
  EXPECT_EQ(to_string(te_default_axis_rules(tp)),
            "batch=,seqlen=,seqlen_tp=,seqlen_cp=ctx,heads=model,hidden=,hidden_tp=model,joined=,"
            "w_no_shard=,w_fsdp=,w_tp=model,w_joined=");
  MeshResource tpsp;
  tpsp.tpsp = "model";
  EXPECT_EQ(to_string(te_default_axis_rules(tpsp)),
            "batch=,seqlen=,seqlen_tp=model,seqlen_cp=,heads=model,hidden=,hidden_tp=model,"
            "joined=,w_no_shard=,w_fsdp=,w_tp=model,w_joined=");
}

TEST(TeDefaultAxisRules, NeedsAMeshResourceInScope) {
  try {
    te_default_axis_rules();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MeshResourceScope"), std::string::npos);
  }
  MeshResourceScope scope(MeshResource{"data"});
  EXPECT_EQ(te_default_axis_rules()[0], (AxisRule{"batch", {"data"}}));
}

// ---- extend_logical_axis_rules ---------------------------------------------------------------

TEST(ExtendLogicalAxisRules, AppendsTheEntriesTheUserDidNotName) {
  MeshResourceScope scope(parse_mesh_resource("dp=data,tp=model"));
  const AxisRules user = parse_axis_rules("embed=model,batch=data,vocab=(data,model)");
  const AxisRules extended = extend_logical_axis_rules(user);
  EXPECT_EQ(to_string(extended),
            "embed=model,batch=data,vocab=(data,model),seqlen=,seqlen_tp=,seqlen_cp=,heads=model,"
            "hidden=,hidden_tp=model,joined=,w_no_shard=,w_fsdp=,w_tp=model,w_joined=");
  // User order first, and the result resolves like any rules.
  AxisRulesScope rules(extended);
  EXPECT_EQ(*resolve_logical_axes({"batch", "seqlen", "heads", std::nullopt}),
            P({{"data"}, None, {"model"}, None}));
}

TEST(ExtendLogicalAxisRules, ThrowsOnADivergingEntryNamingBothValues) {
  MeshResourceScope scope(parse_mesh_resource("dp=data,tp=model"));
  try {
    extend_logical_axis_rules(parse_axis_rules("heads=data"));
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("axis 'heads'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("given heads=data"), std::string::npos) << msg;
    EXPECT_NE(msg.find("has heads=model"), std::string::npos) << msg;
  }
  // Two entries for a TE name diverge even if one of them agrees.
  EXPECT_ERROR(extend_logical_axis_rules(parse_axis_rules("heads=model,heads=")),
               "the rules diverge from TE's on axis 'heads'");
  // An agreeing single entry is kept in place, not duplicated.
  const AxisRules extended = extend_logical_axis_rules(parse_axis_rules("seqlen=,heads=model"));
  EXPECT_EQ(std::count_if(extended.begin(), extended.end(),
                          [](const AxisRule& r) { return r.logical == "heads"; }),
            1);
  EXPECT_EQ(extended.size(), 12u);
}

TEST(ExtendLogicalAxisRules, NeedsAMeshResource) {
  try {
    extend_logical_axis_rules(parse_axis_rules("embed=model"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Fp8Autocast"), std::string::npos);
  }
}

// ---- resolve_logical_axes --------------------------------------------------------------------

TEST(ResolveLogicalAxes, NothingInScopeMeansNoConstraint) {
  WarningCapture warnings;
  EXPECT_FALSE(resolve_logical_axes({"batch", "seqlen"}));
  EXPECT_TRUE(warnings.messages().empty());
  // ... but a repeated name is reported on one device too.
  EXPECT_ERROR(resolve_logical_axes({"batch", "heads", "seqlen", "seqlen"}),
               "logical axis 'seqlen' occurs more than once");
}

TEST(ResolveLogicalAxes, UserRulesWithEachFallback) {
  AxisRulesScope rules(parse_axis_rules("batch=data,heads=model,hidden="));
  const LogicalAxes axes = {"batch", "seqlen", "heads", "hidden", "mlp"};
  EXPECT_EQ(*resolve_logical_axes(axes), P({{"data"}, None, {"model"}, None, None}));
  EXPECT_EQ(*resolve_logical_axes(axes, RulesFallback::kAxisIsUnsharded),
            P({{"data"}, None, {"model"}, None, None}));
  EXPECT_FALSE(resolve_logical_axes(axes, RulesFallback::kNoConstraint));
  try {
    resolve_logical_axes(axes, RulesFallback::kRaiseError);
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    // The pinned 'hidden' is assigned (to replicated), so it is not in the list.
    EXPECT_NE(msg.find("'hidden', 'mlp'): 'seqlen', 'mlp' match no applicable rule"),
              std::string::npos)
        << msg;
  }
  // Every dim matched: the strict fallbacks constrain normally.
  EXPECT_EQ(*resolve_logical_axes({"batch", std::nullopt}, RulesFallback::kRaiseError),
            P({{"data"}, None}));
  EXPECT_EQ(*resolve_logical_axes({"batch", std::nullopt}, RulesFallback::kNoConstraint),
            P({{"data"}, None}));
}

TEST(ResolveLogicalAxes, RaiseErrorNamesAxesWhoseRulesWereAllSkipped) {
  // Flax counts a dim whose rules were all skipped as unassigned, hence unmatched.
  AxisRulesScope rules(parse_axis_rules("batch=data,heads=data"));
  EXPECT_ERROR(resolve_logical_axes({"batch", "heads"}, RulesFallback::kRaiseError),
               "'heads' matches no applicable rule");
}

TEST(ResolveLogicalAxes, UserRulesWinOverTheMeshResource) {
  WarningCapture warnings;
  MeshResourceScope resource(parse_mesh_resource("dp=data,tp=model"));
  AxisRulesScope rules(parse_axis_rules("batch=model"));
  EXPECT_EQ(*resolve_logical_axes({"batch", "heads"}), P({{"model"}, None}));
  EXPECT_TRUE(warnings.messages().empty());
}

TEST(ResolveLogicalAxes, EmptyRulesScopeFallsBackToTheTeTable) {
  WarningCapture warnings;
  MeshResourceScope resource(parse_mesh_resource("tp=model"));
  AxisRulesScope rules({});
  EXPECT_EQ(*resolve_logical_axes({"batch", "heads"}), P({None, {"model"}}));
  EXPECT_EQ(warnings.messages().size(), 1u);
}

TEST(ResolveLogicalAxes, TeTableFallbackWarnsOncePerProcess) {
  WarningCapture warnings;
  MeshResourceScope resource(parse_mesh_resource("dp=data,tpsp=model"));
  EXPECT_EQ(*resolve_logical_axes({"batch", "seqlen_tp", "hidden"}),
            P({{"data"}, {"model"}, None}));
  EXPECT_EQ(*resolve_logical_axes({"batch", "seqlen", "heads", std::nullopt}),
            P({{"data"}, None, {"model"}, None}));
  std::thread([] {
    MeshResourceScope r(MeshResource{"d"});
    resolve_logical_axes({"batch"});
  }).join();
  const auto messages = warnings.messages();
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_NE(messages[0].find("deprecated"), std::string::npos);
  EXPECT_NE(messages[0].find("extend_logical_axis_rules"), std::string::npos);
  // The TE table also applies the fallback: a name outside it is unmatched.
  EXPECT_ERROR(resolve_logical_axes({"batch", "embed"}, RulesFallback::kRaiseError),
               "'embed' matches no applicable rule");
  EXPECT_FALSE(resolve_logical_axes({"batch", "embed"}, RulesFallback::kNoConstraint));
}

TEST(ResolveLogicalAxes, RepeatedNameThrowsUnderTheTeTableToo) {
  WarningCapture warnings;
  MeshResourceScope resource(parse_mesh_resource("dp=data"));
  EXPECT_ERROR(resolve_logical_axes({"batch", "heads", "seqlen", "seqlen"}),
               "logical axis 'seqlen' occurs more than once");
}

TEST(WarningHandler, NullRestoresTheDefaultAndReturnsThePrevious) {
  int calls = 0;
  WarningHandler previous = set_warning_handler([&](std::string_view) { ++calls; });
  WarningHandler mine = set_warning_handler(nullptr);
  ASSERT_TRUE(mine);
  mine("x");
  EXPECT_EQ(calls, 1);
  set_warning_handler(previous);
}

// ---- threads ---------------------------------------------------------------------------------

TEST(Threads, ANewThreadSeesNoScope) {
  AxisRulesScope rules(parse_axis_rules("batch=data"));
  MeshResourceScope resource(MeshResource{"data"});
  std::thread([] {
    EXPECT_TRUE(current_axis_rules().empty());
    EXPECT_FALSE(current_mesh_resource());
    EXPECT_FALSE(resolve_logical_axes({"batch"}));
  }).join();
}

TEST(Threads, SixteenThreadsResolveConcurrentlyUnderTheirOwnScopes) {
  constexpr int kThreads = 16;
  constexpr int kIterations = 2000;
  WarningCapture warnings;
  std::atomic<int> failures{0};
  std::atomic<int> arrived{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string mine = "axis" + std::to_string(t);
      // Even threads use their own rules; odd threads the TE table of their own MeshResource.
      std::optional<AxisRulesScope> rules;
      std::optional<MeshResourceScope> resource;
      if (t % 2 == 0) {
        rules.emplace(AxisRules{{"batch", {mine}}, {"heads", {"m" + std::to_string(t)}}});
      } else {
        MeshResource r;
        r.dp = mine;
        r.tp = "m" + std::to_string(t);
        resource.emplace(r);
      }
      const PartitionSpec expected = P({{mine}, None, {"m" + std::to_string(t)}});
      // Start together so the resolutions really overlap.
      arrived.fetch_add(1);
      while (arrived.load() < kThreads) std::this_thread::yield();
      for (int i = 0; i < kIterations; ++i) {
        if (i % 100 == 0) {
          // A short-lived nested scope must not leak into any other thread.
          AxisRulesScope nested({{"batch", {"nested"}}});
          if (*resolve_logical_axes({"batch"}) != P({{"nested"}})) ++failures;
        }
        const auto spec = resolve_logical_axes({"batch", "seqlen", "heads"});
        if (!spec || *spec != expected) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(warnings.messages().size(), 1u);  // once per process, even under contention
}

TEST(Threads, CapturedContextCarriesIntoAWorker) {
  AxisRulesScope rules(parse_axis_rules("batch=data"));
  MeshResourceScope resource(parse_mesh_resource("dp=data,tp=model"));
  const ShardingContext context = capture_sharding_context();
  std::thread([&] {
    ShardingContextScope scope(context);
    EXPECT_EQ(to_string(current_axis_rules()), "batch=data");
    EXPECT_EQ(current_mesh_resource()->tp, "model");
  }).join();

  auto task =
      bind_sharding_context([](const LogicalAxes& axes) { return resolve_logical_axes(axes); });
  std::optional<PartitionSpec> from_worker;
  std::thread([&] { from_worker = task(LogicalAxes{"batch", "heads"}); }).join();
  ASSERT_TRUE(from_worker);
  EXPECT_EQ(*from_worker, P({{"data"}, None}));
}

TEST(Threads, CapturedEmptyContextMasksTheWorkersOwn) {
  const ShardingContext nothing = capture_sharding_context();
  EXPECT_FALSE(nothing.rules);
  EXPECT_FALSE(nothing.mesh_resource);
  AxisRulesScope rules(parse_axis_rules("batch=data"));
  MeshResourceScope resource(MeshResource{"data"});
  {
    ShardingContextScope scope(nothing);
    EXPECT_TRUE(current_axis_rules().empty());
    EXPECT_FALSE(current_mesh_resource());
    EXPECT_FALSE(resolve_logical_axes({"batch"}));
  }
  EXPECT_EQ(to_string(current_axis_rules()), "batch=data");
  EXPECT_TRUE(current_mesh_resource());
}

// ---- exception safety ------------------------------------------------------------------------

TEST(ExceptionSafety, ScopesRestoreWhenAnExceptionUnwinds) {
  AxisRulesScope outer(parse_axis_rules("batch=data"));
  try {
    AxisRulesScope inner(parse_axis_rules("batch=model"));
    MeshResourceScope resource(MeshResource{"data"});
    ShardingContextScope ctx(ShardingContext{});
    resolve_logical_axes({"batch", "batch"});  // throws: repeated name
    FAIL();
  } catch (const Error&) {
  }
  EXPECT_EQ(to_string(current_axis_rules()), "batch=data");
  EXPECT_FALSE(current_mesh_resource());
}

TEST(ExceptionSafety, AFailedScopeConstructionLeavesNothingBehind) {
  MeshResource bad;
  bad.tp = "a";
  bad.tpsp = "b";
  try {
    MeshResourceScope scope(bad);
  } catch (const Error&) {
  }
  ShardingContext ctx;
  ctx.mesh_resource = bad;
  EXPECT_ERROR(ShardingContextScope scope(ctx),
               "MeshResource(tp='a', tpsp='b'): tp and tpsp are both set");
  EXPECT_FALSE(current_mesh_resource());
  EXPECT_TRUE(current_axis_rules().empty());
}

}  // namespace
}  // namespace te
