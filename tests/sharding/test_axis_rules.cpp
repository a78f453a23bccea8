// Flax linen resolution (logical_to_mesh_axes), its trace, and explain_logical_axes.

#include <gtest/gtest.h>

#include "../expect_error.h"
#include "te/sharding.h"

namespace te {
namespace {

PartitionSpec P(std::vector<MeshAxes> dims) { return PartitionSpec{std::move(dims)}; }
const MeshAxes None{};

// ---- Flax's own examples ---------------------------------------------------------------------

TEST(LogicalToMeshAxes, FlaxPriorityExamples) {
  const AxisRules rules = {{"foo", {"model"}}, {"bar", {"model"}}, {"baz", {"data"}}};
  EXPECT_EQ(logical_to_mesh_axes({"foo", "bar", "baz"}, rules), P({{"model"}, None, {"data"}}));
  EXPECT_EQ(logical_to_mesh_axes({"bar", "foo", "baz"}, rules), P({None, {"model"}, {"data"}}));
  EXPECT_EQ(logical_to_mesh_axes({"baz", "bar", "foo"}, rules), P({{"data"}, None, {"model"}}));
  EXPECT_EQ(logical_to_mesh_axes({"baz", "bar", "foo", "unassigned"}, rules),
            P({{"data"}, None, {"model"}, None}));
}

TEST(LogicalToMeshAxes, FlaxOverrideExamples) {
  // ('bar', None) pins bar; the second foo rule never applies because foo is already assigned.
  const AxisRules rules = {{"baz", {"data"}}, {"bar", {}}, {"foo", {"model"}}, {"foo", {"data"}}};
  EXPECT_EQ(logical_to_mesh_axes({"baz", "bar", "foo"}, rules), P({{"data"}, None, {"model"}}));
  EXPECT_EQ(logical_to_mesh_axes({"baz", "bar", "foo"}, {{"baz", {"model"}}}),
            P({{"model"}, None, None}));
}

TEST(LogicalToMeshAxes, FlaxDocstringExample) {
  const AxisRules rules = {
      {"batch", {"X"}}, {"features", {"X"}}, {"heads", {"Y"}}, {"batch", {"Z"}}};
  EXPECT_EQ(logical_to_mesh_axes({"batch", "length", "heads", "features"}, rules),
            P({{"X"}, None, {"Y"}, None}));
}

TEST(LogicalToMeshAxes, FlaxRuleSetsOneAndTwo) {
  const AxisRules rules1 = {{"foo", {"data"}}, {"bar", {"model"}}, {"baz", {}}};
  const AxisRules rules2 = {{"foo", {"model"}}, {"bar", {}}, {"baz", {"data"}}};
  EXPECT_EQ(logical_to_mesh_axes({"foo", "bar"}, rules1), P({{"data"}, {"model"}}));
  EXPECT_EQ(logical_to_mesh_axes({"foo", "bar"}, rules2), P({{"model"}, None}));
}

// ---- each clause of the algorithm ------------------------------------------------------------

TEST(LogicalToMeshAxes, FirstApplicableRuleWins) {
  const AxisRules rules = {{"batch", {"data"}}, {"batch", {"model"}}};
  EXPECT_EQ(logical_to_mesh_axes({"batch"}, rules), P({{"data"}}));
}

TEST(LogicalToMeshAxes, LaterRuleAppliesWhenEarlierMeshAxisTaken) {
  // embed takes 'model' first, so heads falls through to its second rule.
  const AxisRules rules = {{"embed", {"model"}}, {"heads", {"model"}}, {"heads", {"data"}}};
  EXPECT_EQ(logical_to_mesh_axes({"heads", "embed"}, rules), P({{"data"}, {"model"}}));
}

TEST(LogicalToMeshAxes, MeshAxisUsedAtMostOnce) {
  const AxisRules rules = {{"a", {"x"}}, {"b", {"x"}}, {"c", {"x"}}};
  EXPECT_EQ(logical_to_mesh_axes({"a", "b", "c"}, rules), P({{"x"}, None, None}));
}

TEST(LogicalToMeshAxes, TupleIsAllOrNothing) {
  // 'fsdp' is taken by w, so the tuple (data, fsdp) cannot apply even though 'data' is free.
  const AxisRules rules = {{"w", {"fsdp"}}, {"batch", {"data", "fsdp"}}, {"batch", {"data"}}};
  EXPECT_EQ(logical_to_mesh_axes({"batch", "w"}, rules), P({{"data"}, {"fsdp"}}));
  // When every axis is free, the whole tuple shards the dim, major to minor.
  EXPECT_EQ(logical_to_mesh_axes({"batch"}, rules), P({{"data", "fsdp"}}));
}

TEST(LogicalToMeshAxes, TupleBlocksEachOfItsAxes) {
  const AxisRules rules = {{"batch", {"data", "fsdp"}}, {"w", {"fsdp"}}, {"v", {"data"}}};
  EXPECT_EQ(logical_to_mesh_axes({"batch", "w", "v"}, rules), P({{"data", "fsdp"}, None, None}));
}

TEST(LogicalToMeshAxes, EmptyMeshPinsReplicated) {
  const AxisRules rules = {{"hidden", {}}, {"hidden", {"model"}}};
  EXPECT_EQ(logical_to_mesh_axes({"hidden"}, rules), P({None}));
  const Resolution res = resolve_with_rules({"hidden"}, rules);
  ASSERT_TRUE(res.dims[0].rule.has_value());  // assigned (to replicated), not unmatched
  EXPECT_EQ(*res.dims[0].rule, 0u);
  EXPECT_TRUE(res.unassigned().empty());
  EXPECT_EQ(res.rules[1].kind, RuleOutcome::Kind::kDimAssigned);
}

TEST(LogicalToMeshAxes, UnnamedDimsPassThrough) {
  const AxisRules rules = {{"batch", {"data"}}, {"heads", {"model"}}};
  EXPECT_EQ(logical_to_mesh_axes({"batch", std::nullopt, "heads", std::nullopt}, rules),
            P({{"data"}, None, {"model"}, None}));
  // Unnamed dims may repeat: only names must be unique.
  EXPECT_EQ(logical_to_mesh_axes({std::nullopt, std::nullopt}, rules), P({None, None}));
}

TEST(LogicalToMeshAxes, UnassignedEndsUnsharded) {
  EXPECT_EQ(logical_to_mesh_axes({"seqlen", "hidden"}, {}), P({None, None}));
  EXPECT_EQ(logical_to_mesh_axes({}, {{"a", {"x"}}}), P({}));
}

TEST(LogicalToMeshAxes, RepeatedNameThrowsNamingIt) {
  // The seed's bug: attention weights constrained (batch, heads, seqlen, seqlen).
  const AxisRules rules = {{"batch", {"data"}}};
  try {
    logical_to_mesh_axes({"batch", "heads", "seqlen", "seqlen"}, rules);
    FAIL() << "expected te::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'seqlen' occurs more than once"), std::string::npos) << msg;
    EXPECT_NE(msg.find("dims 2 and 3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("std::nullopt"), std::string::npos) << msg;  // says what to do
  }
  // A repeated name throws even with no rules at all (Flax checks names first).
  EXPECT_ERROR(logical_to_mesh_axes({"a", "a"}, {}), "logical axis 'a' occurs more than once");
}

TEST(LogicalToMeshAxes, MalformedRulesThrow) {
  EXPECT_ERROR(logical_to_mesh_axes({"a"}, {{"", {"x"}}}),
               "axis rule 0 (=x) has an empty logical name");
  EXPECT_ERROR(logical_to_mesh_axes({"a"}, {{"a", {""}}}),
               "axis rule 0 for 'a' has an empty mesh axis name");
  try {
    logical_to_mesh_axes({"a"}, {{"a", {"x", "x"}}});
    FAIL() << "expected te::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("names mesh axis 'x' twice"), std::string::npos);
  }
  EXPECT_ERROR(logical_to_mesh_axes({std::string()}, {}), "dim 0 has an empty name");
}

// ---- the trace -------------------------------------------------------------------------------

TEST(ResolveWithRules, RecordsEveryRuleOutcome) {
  const AxisRules rules = {
      {"batch", {"data"}},   // 0: assigned dim 0
      {"heads", {"data"}},   // 1: 'data' taken by dim 0
      {"heads", {"model"}},  // 2: assigned dim 1
      {"heads", {"x"}},      // 3: dim 1 already assigned by 2
      {"embed", {"x"}},      // 4: no such dim
  };
  const Resolution res = resolve_with_rules({"batch", "heads", "seqlen"}, rules);
  ASSERT_EQ(res.rules.size(), 5u);
  EXPECT_EQ(res.rules[0].kind, RuleOutcome::Kind::kAssigned);
  EXPECT_EQ(res.rules[0].dim, 0u);
  EXPECT_EQ(res.rules[1].kind, RuleOutcome::Kind::kMeshAxisTaken);
  EXPECT_EQ(res.rules[1].mesh_axis, "data");
  EXPECT_EQ(res.rules[1].other, 0u);
  EXPECT_EQ(res.rules[2].kind, RuleOutcome::Kind::kAssigned);
  EXPECT_EQ(res.rules[3].kind, RuleOutcome::Kind::kDimAssigned);
  EXPECT_EQ(res.rules[3].other, 2u);
  EXPECT_EQ(res.rules[4].kind, RuleOutcome::Kind::kNoSuchDim);
  EXPECT_EQ(res.unassigned(), std::vector<std::string>{"seqlen"});
  EXPECT_EQ(res.spec(), P({{"data"}, {"model"}, None}));
}

// ---- printing --------------------------------------------------------------------------------

TEST(PartitionSpecPrinting, JaxSpelling) {
  EXPECT_EQ(to_string(P({{"data"}, None, {"fsdp", "tp"}})),
            "PartitionSpec('data', None, ('fsdp', 'tp'))");
  EXPECT_EQ(to_string(P({})), "PartitionSpec()");
  EXPECT_EQ(to_string(LogicalAxes{"batch", std::nullopt}), "('batch', None)");
  EXPECT_TRUE(P({None, None}).is_replicated());
  EXPECT_FALSE(P({None, {"x"}}).is_replicated());
}

// ---- explain ---------------------------------------------------------------------------------

TEST(ExplainLogicalAxes, SaysWhichRuleAssignedAndWhyOthersWereSkipped) {
  const AxisRules rules = {{"batch", {"data"}},  {"hidden", {}},       {"heads", {"data"}},
                           {"heads", {"model"}}, {"batch", {"model"}}, {"vocab", {"x"}}};
  const std::string text =
      explain_logical_axes({"batch", "seqlen", "heads", "hidden", std::nullopt}, rules);
  const std::string expected =
      "logical axes ('batch', 'seqlen', 'heads', 'hidden', None) -> "
      "PartitionSpec('data', None, 'model', None, None)\n"
      "  dim 0 'batch' -> 'data': by rule 0 (batch=data)\n"
      "  dim 1 'seqlen' -> None: no rule names it, not sharded\n"
      "  dim 2 'heads' -> 'model': by rule 3 (heads=model)\n"
      "  dim 3 'hidden' -> None: by rule 1 (hidden=), pinned replicated\n"
      "  dim 4 -> None: unnamed, not sharded\n"
      "  rule 2 (heads=data) skipped: mesh axis 'data' taken by dim 0 'batch'\n"
      "  rule 4 (batch=model) skipped: dim 0 'batch' already assigned by rule 0\n"
      "  rules naming no dim: 5 (vocab)\n";
  EXPECT_EQ(text, expected);
}

TEST(ExplainLogicalAxes, NamesDimsWhoseEveryRuleWasSkipped) {
  const AxisRules rules = {{"a", {"x"}}, {"b", {"x"}}};
  const std::string text = explain_logical_axes({"a", "b"}, rules);
  EXPECT_NE(text.find("dim 1 'b' -> None: every rule naming it was skipped, not sharded"),
            std::string::npos)
      << text;
}

TEST(ErrorMessages, CarrySourceLocation) {
  try {
    logical_to_mesh_axes({"a", "a"}, {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[sharding/axis_rules.cpp:"), std::string::npos)
        << e.what();
  }
  // te::Error is a std::runtime_error, so generic handlers catch it.
  EXPECT_THROW(logical_to_mesh_axes({"a", "a"}, {}), std::runtime_error);
}

}  // namespace
}  // namespace te
