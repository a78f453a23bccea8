// Scopes, the TE default table, extend_logical_axis_rules, resolve_logical_axes with fallbacks,
// the once-per-process warning, thread locality and exception safety.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
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

// TE refuses tp and tpsp together only when both are active, i.e. on axes of more than one
// device (transformer_engine/jax/sharding.py at d0067d0, _validate_mesh_resource_configuration
// L54-L68); te did so whenever both were set.
TEST(MeshResourceScope, TpAndTpspTogetherOnlyWhenBothActive) {
  MeshResource r;
  r.tp = "model";
  r.tpsp = "model2";
  EXPECT_NO_THROW(MeshResourceScope scope(r));
  EXPECT_NO_THROW(parse_mesh_resource("tp=model,tpsp=model2"));
  EXPECT_ERROR(te_default_axis_rules(r, parse_mesh_shape("model=2,model2=2")),
               "MeshResource(tp='model', tpsp='model2'): tp and tpsp are both active (set, on "
               "mesh axes of more than one device in model=2,model2=2)");
  // No mesh known (TE builds no table then): nothing to refuse, tpsp shards the heads.
  EXPECT_EQ(te_default_axis_rules(r, std::nullopt)[4], (AxisRule{"heads", {"model2"}}));
  // One of them on a size-1 axis: the other one shards heads.
  EXPECT_EQ(te_default_axis_rules(r, parse_mesh_shape("model=2,model2=1"))[4],
            (AxisRule{"heads", {"model"}}));
  EXPECT_EQ(te_default_axis_rules(r, parse_mesh_shape("model=1,model2=2"))[4],
            (AxisRule{"heads", {"model2"}}));
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

// TE 2.8+ (d0067d0, get_sharding_map_logic_axis_to_mesh_axis L95-L111): batch goes to fsdp when
// fsdp is active (set, on an axis of more than one device), else to dp; never the (dp, fsdp)
// tuple te gave before.
TEST(TeDefaultAxisRules, DataAndFsdp) {
  MeshResource r;
  r.dp = "data";
  r.fsdp = "fsdp";
  EXPECT_EQ(to_string(te_default_axis_rules(r, parse_mesh_shape("data=2,fsdp=2"))),
            "batch=fsdp,seqlen=,seqlen_tp=,seqlen_cp=,heads=,hidden=,hidden_tp=,joined=,"
            "w_no_shard=,w_fsdp=fsdp,w_tp=,w_joined=");
  EXPECT_EQ(te_default_axis_rules(r, parse_mesh_shape("data=2,fsdp=1"))[0],
            (AxisRule{"batch", {"data"}}));
  EXPECT_EQ(te_default_axis_rules(r, std::nullopt)[0], (AxisRule{"batch", {"fsdp"}}));
  // w_fsdp keeps the fsdp axis whatever its size, as TE's table does.
  EXPECT_EQ(te_default_axis_rules(r, parse_mesh_shape("data=2,fsdp=1"))[9],
            (AxisRule{"w_fsdp", {"fsdp"}}));
  r.fsdp.reset();
  EXPECT_EQ(te_default_axis_rules(r)[0], (AxisRule{"batch", {"data"}}));
  r.dp.reset();
  r.fsdp = "fsdp";
  EXPECT_EQ(te_default_axis_rules(r)[0], (AxisRule{"batch", {"fsdp"}}));
  // fsdp inactive and no dp: batch is not sharded.
  EXPECT_EQ(te_default_axis_rules(r, parse_mesh_shape("fsdp=1"))[0], (AxisRule{"batch", {}}));
}

// The table written as TE writes it (the dict of get_sharding_map_logic_axis_to_mesh_axis at
// d0067d0, L98-L111), against te's over every combination of unset / size-1 / size-2 roles.
TEST(TeDefaultAxisRules, EqualsTeJaxTableOnEveryRoleSizeCombination) {
  const char* roles[] = {"dp", "fsdp", "tp", "tpsp", "cp"};
  int checked = 0;
  for (int code = 0; code < 243; ++code) {  // 3^5: unset, size 1, size 2 for each role
    std::string resource_text;
    MeshShape shape;
    std::map<std::string, std::optional<std::string>> resource;
    std::map<std::string, int64_t> size;
    for (int i = 0, c = code; i < 5; ++i, c /= 3) {
      if (c % 3 == 0) continue;
      const std::string axis = std::string("m_") + roles[i];
      resource[roles[i]] = axis;
      size[roles[i]] = c % 3;
      shape.names.push_back(axis);
      shape.sizes.push_back(c % 3);
      resource_text += (resource_text.empty() ? "" : ",") + std::string(roles[i]) + "=" + axis;
    }
    auto active = [&](const char* role) { return resource.count(role) && size[role] > 1; };
    if (active("tp") && active("tpsp")) {
      EXPECT_ERROR(te_default_axis_rules(parse_mesh_resource(resource_text), shape),
                   "tp and tpsp are both active");
      continue;
    }
    auto get = [&](const char* role) {
      return resource.count(role) ? MeshAxes{*resource[role]} : MeshAxes{};
    };
    const MeshAxes tensor = active("tpsp") ? get("tpsp") : get("tp");
    const std::map<std::string, MeshAxes> te_jax = {
        {"batch", active("fsdp") ? get("fsdp") : get("dp")},
        {"seqlen", {}},
        {"seqlen_tp", get("tpsp")},
        {"seqlen_cp", get("cp")},
        {"heads", tensor},
        {"hidden", {}},
        {"hidden_tp", tensor},
        {"joined", {}},
        {"w_no_shard", {}},
        {"w_fsdp", get("fsdp")},
        {"w_tp", tensor},
        {"w_joined", {}},
    };
    const AxisRules mine = te_default_axis_rules(
        resource_text.empty() ? MeshResource{} : parse_mesh_resource(resource_text), shape);
    ASSERT_EQ(mine.size(), te_jax.size());
    for (const AxisRule& rule : mine) {
      EXPECT_EQ(rule.mesh, te_jax.at(rule.logical)) << rule.logical << " under " << resource_text
                                                    << " on " << shape.to_string();
    }
    ++checked;
  }
  EXPECT_GT(checked, 200);
}

TEST(TeDefaultAxisRules, ReadsTheMeshInScopeAndNamesAMissingAxis) {
  const MeshResource r = parse_mesh_resource("dp=data,fsdp=fsdp");
  {
    MeshShapeScope mesh(parse_mesh_shape("data=4,fsdp=1"));
    EXPECT_EQ(te_default_axis_rules(r)[0], (AxisRule{"batch", {"data"}}));
    MeshResourceScope scope(r);
    EXPECT_EQ(*resolve_logical_axes({"batch", "w_fsdp"}), P({{"data"}, {"fsdp"}}));
    {
      MeshShapeScope inner(parse_mesh_shape("data=2,fsdp=2"));  // the table follows the mesh
      EXPECT_EQ(*resolve_logical_axes({"batch", "w_fsdp"}), P({{"fsdp"}, {}}));
    }
    EXPECT_EQ(*resolve_logical_axes({"batch", "w_fsdp"}), P({{"data"}, {"fsdp"}}));
  }
  EXPECT_FALSE(current_mesh_shape());
  MeshShapeScope other(parse_mesh_shape("data=2"));
  EXPECT_ERROR(te_default_axis_rules(r),
               "MeshResource(dp='data', fsdp='fsdp'): role fsdp names mesh axis 'fsdp', which the "
               "mesh (data=2) does not have");
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
  bad.dp = "a";
  try {
    MeshResourceScope scope(bad);
  } catch (const Error&) {
  }
  ShardingContext ctx;
  ctx.mesh_resource = bad;
  EXPECT_ERROR(ShardingContextScope scope(ctx),
               "MeshResource(dp='a', tp='a'): roles dp and tp both name mesh axis 'a'");
  EXPECT_FALSE(current_mesh_resource());
  EXPECT_TRUE(current_axis_rules().empty());
}

}  // namespace
}  // namespace te
