// parse_axis_rules / parse_mesh_resource and their printers.

#include <gtest/gtest.h>

#include "../expect_error.h"
#include "te/sharding.h"

namespace te {
namespace {

TEST(ParseAxisRules, ReadsTheDocumentedForm) {
  const AxisRules rules = parse_axis_rules("batch=(data,fsdp),heads=model,hidden=");
  const AxisRules expected = {{"batch", {"data", "fsdp"}}, {"heads", {"model"}}, {"hidden", {}}};
  EXPECT_EQ(rules, expected);
}

TEST(ParseAxisRules, IgnoresWhitespaceAndAcceptsEmptyTuples) {
  const AxisRules rules = parse_axis_rules("  batch = ( data , fsdp ) ,\n w_tp=( ) , x.y-1=z_2 ");
  const AxisRules expected = {{"batch", {"data", "fsdp"}}, {"w_tp", {}}, {"x.y-1", {"z_2"}}};
  EXPECT_EQ(rules, expected);
  EXPECT_TRUE(parse_axis_rules("").empty());
  EXPECT_TRUE(parse_axis_rules("   ").empty());
}

TEST(ParseAxisRules, RoundTripsWithThePrinter) {
  const std::vector<std::string> texts = {
      "batch=(data,fsdp),heads=model,hidden=",
      "a=x",
      "a=,b=,c=(x,y,z)",
      "",
  };
  for (const std::string& text : texts) {
    EXPECT_EQ(to_string(parse_axis_rules(text)), text);
  }
  // Non-canonical spellings print canonically, and the canonical form parses back the same.
  const AxisRules rules = parse_axis_rules("a=(x), b=()");
  EXPECT_EQ(to_string(rules), "a=x,b=");
  EXPECT_EQ(parse_axis_rules(to_string(rules)), rules);
  // And the printer of any rule set parses back to it.
  const AxisRules te_table = te_default_axis_rules(MeshResource{"data", {}, "model", "fsdp"});
  EXPECT_EQ(parse_axis_rules(to_string(te_table)), te_table);
}

struct BadRules {
  std::string text;
  std::size_t position;
  std::string expected;
};

void PrintTo(const BadRules& bad, std::ostream* os) { *os << '"' << bad.text << '"'; }

class ParseAxisRulesErrors : public ::testing::TestWithParam<BadRules> {};

TEST_P(ParseAxisRulesErrors, ReportPositionAndReason) {
  const BadRules& bad = GetParam();
  try {
    parse_axis_rules(bad.text);
    FAIL() << "parsed: " << bad.text;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("at position " + std::to_string(bad.position) + " expected " + bad.expected),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("name=mesh_axis"), std::string::npos) << msg;  // says how to write it
  }
}

INSTANTIATE_TEST_SUITE_P(
    Syntax, ParseAxisRulesErrors,
    ::testing::Values(BadRules{"batch", 5, "'='"}, BadRules{"=data", 0, "a logical axis name"},
                      BadRules{"batch=(data", 11, "')'"},
                      BadRules{"batch=(data,)", 12, "a mesh axis name"},
                      BadRules{"batch=data,", 11, "a logical axis name"},
                      BadRules{"batch=data heads=model", 11, "','"},
                      BadRules{"batch=da$ta", 8, "','"}, BadRules{"ba tch=data", 3, "'='"},
                      BadRules{"batch==data", 6, "','"}),
    [](const ::testing::TestParamInfo<BadRules>& info) {
      return "at" + std::to_string(info.param.position) + "_" + std::to_string(info.index);
    });

TEST(ParseAxisRules, RejectsARuleRepeatingAMeshAxis) {
  EXPECT_ERROR(parse_axis_rules("batch=(data,data)"), "names mesh axis 'data' twice");
}

TEST(ParseMeshResource, ReadsRoles) {
  const MeshResource r = parse_mesh_resource("dp=data, tpsp=model, fsdp=f, pp=p, cp=c, ep=e");
  EXPECT_EQ(r.dp, "data");
  EXPECT_EQ(r.tpsp, "model");
  EXPECT_EQ(r.fsdp, "f");
  EXPECT_EQ(r.pp, "p");
  EXPECT_EQ(r.cp, "c");
  EXPECT_EQ(r.ep, "e");
  EXPECT_FALSE(r.tp);
  EXPECT_EQ(to_string(r),
            "MeshResource(dp='data', tpsp='model', fsdp='f', pp='p', cp='c', ep='e')");
  EXPECT_EQ(parse_mesh_resource(""), MeshResource{});
}

TEST(ParseMeshResource, RejectsBadInput) {
  EXPECT_ERROR(parse_mesh_resource("dq=data"), "unknown role 'dq'");           // unknown role
  EXPECT_ERROR(parse_mesh_resource("dp=data,dp=x"), "role 'dp' given twice");  // role twice
  EXPECT_ERROR(parse_mesh_resource("dp=(data,fsdp)"),
               "role 'dp' must name exactly one mesh axis (got dp=(data,fsdp))");  // tuple
  EXPECT_ERROR(parse_mesh_resource("dp="),
               "role 'dp' must name exactly one mesh axis (got dp=)");                // no axis
  try {
    parse_mesh_resource("dq=data");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown role 'dq'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace te

namespace te {
namespace {

TEST(MeshShapeParse, ReadsNamesAndSizesInOrder) {
  const MeshShape mesh = parse_mesh_shape("data=64,model=16");
  EXPECT_EQ(mesh.names, (std::vector<std::string>{"data", "model"}));
  EXPECT_EQ(mesh.sizes, (std::vector<int64_t>{64, 16}));
  EXPECT_EQ(mesh.size(), 1024);
  EXPECT_EQ(mesh.to_string(), "data=64,model=16");
}

TEST(MeshShapeParse, RefusesMalformedMeshesNamingTheItem) {
  const auto refuses = [](const char* text, const std::string& words) {
    try {
      parse_mesh_shape(text);
      ADD_FAILURE() << text << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refuses("", "mesh is empty");
  refuses("data", "'data' is not NAME=SIZE");
  refuses("=2", "'=2' is not NAME=SIZE");
  refuses("data=2,", "'' is not NAME=SIZE");
  refuses("data=two", "size 'two' of axis 'data' is not a positive integer");
  refuses("data=0", "size '0' of axis 'data'");
  refuses("data=2,data=2", "axis 'data' appears twice");
  refuses("a=4096,b=4096,c=4096", "over 2^24 ranks");
}

}  // namespace
}  // namespace te
