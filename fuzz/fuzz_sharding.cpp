// libFuzzer target: the rule and MeshResource parsers, and resolution over what they accept.
// Input: three lines, "rules\nmesh resource\nlogical axes" (axes comma-separated, _ for an
// unnamed dim). Every parser either succeeds or throws te::Error; anything else (another
// exception, a crash, a sanitizer report) is a bug. Parsed rules must print back to text that
// parses to the same rules.
//   bash scripts/fuzz.sh [seconds per target]
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "te/error.h"
#include "te/sharding.h"

namespace {

std::vector<std::string_view> lines_of(std::string_view text) {
  std::vector<std::string_view> out;
  while (out.size() < 2) {
    const auto nl = text.find('\n');
    if (nl == std::string_view::npos) break;
    out.push_back(text.substr(0, nl));
    text.remove_prefix(nl + 1);
  }
  out.push_back(text);
  while (out.size() < 3) out.emplace_back();
  return out;
}

te::LogicalAxes axes_of(std::string_view text) {
  te::LogicalAxes axes;
  while (!text.empty() && axes.size() < 16) {
    const auto comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    if (item == "_") {
      axes.emplace_back(std::nullopt);
    } else {
      axes.emplace_back(std::string(item));
    }
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return axes;
}

[[noreturn]] void bug(const std::string& what) {
  std::fprintf(stderr, "fuzz_sharding: %s\n", what.c_str());
  __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto lines = lines_of(text);
  std::optional<te::AxisRules> rules;
  try {
    rules = te::parse_axis_rules(lines[0]);
    const std::string printed = te::to_string(*rules);
    const te::AxisRules again = te::parse_axis_rules(printed);
    if (te::to_string(again) != printed) {
      bug("rules '" + printed + "' print back as '" + te::to_string(again) + "'");
    }
    te::validate_axis_rules(*rules);
  } catch (const te::Error&) {
    rules.reset();
  }
  try {
    const te::MeshResource resource = te::parse_mesh_resource(lines[1]);
    (void)te::to_string(resource);
  } catch (const te::Error&) {
  }
  if (rules) {
    try {
      const te::LogicalAxes axes = axes_of(lines[2]);
      te::validate_logical_axes(axes);
      const te::Resolution r = te::resolve_with_rules(axes, *rules);
      if (r.dims.size() != axes.size()) bug("resolution lost dims");
      (void)te::to_string(r.spec());
      (void)te::explain_logical_axes(axes, *rules);
    } catch (const te::Error&) {
    }
  }
  return 0;
}
