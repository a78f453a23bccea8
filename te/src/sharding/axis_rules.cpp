#include "te/sharding/axis_rules.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <sstream>

#include "te/error.h"

namespace te {

namespace {

std::string quoted(const std::string& s) { return "'" + s + "'"; }

std::string dim_label(const LogicalAxes& axes, std::size_t d) {
  std::string out = "dim " + std::to_string(d);
  if (axes[d]) out += " " + quoted(*axes[d]);
  return out;
}

std::string jax_mesh_axes(const MeshAxes& mesh) {
  if (mesh.empty()) return "None";
  if (mesh.size() == 1) return quoted(mesh[0]);
  std::string out = "(";
  for (std::size_t i = 0; i < mesh.size(); ++i) {
    out += (i ? ", " : "") + quoted(mesh[i]);
  }
  return out + ")";
}

}  // namespace

bool PartitionSpec::is_replicated() const {
  return std::all_of(dims.begin(), dims.end(), [](const MeshAxes& m) { return m.empty(); });
}

std::string to_string(const PartitionSpec& spec) {
  std::string out = "PartitionSpec(";
  for (std::size_t i = 0; i < spec.dims.size(); ++i) {
    out += (i ? ", " : "") + jax_mesh_axes(spec.dims[i]);
  }
  return out + ")";
}

std::string to_string(const LogicalAxes& axes) {
  std::string out = "(";
  for (std::size_t i = 0; i < axes.size(); ++i) {
    out += (i ? ", " : "") + (axes[i] ? quoted(*axes[i]) : std::string("None"));
  }
  return out + ")";
}

std::string to_string(const MeshAxes& mesh) {
  if (mesh.size() == 1) return mesh[0];
  std::string out = mesh.empty() ? "" : "(";
  for (std::size_t i = 0; i < mesh.size(); ++i) out += (i ? "," : "") + mesh[i];
  return mesh.empty() ? out : out + ")";
}

std::string to_string(const AxisRule& rule) { return rule.logical + "=" + to_string(rule.mesh); }

std::string to_string(const AxisRules& rules) {
  std::string out;
  for (std::size_t i = 0; i < rules.size(); ++i) out += (i ? "," : "") + to_string(rules[i]);
  return out;
}

std::ostream& operator<<(std::ostream& os, const PartitionSpec& spec) {
  return os << to_string(spec);
}
std::ostream& operator<<(std::ostream& os, const AxisRule& rule) { return os << to_string(rule); }

void validate_axis_rules(const AxisRules& rules) {
  for (std::size_t r = 0; r < rules.size(); ++r) {
    const AxisRule& rule = rules[r];
    TE_CHECK(!rule.logical.empty(), "axis rule ", r, " (", to_string(rule),
             ") has an empty logical name; give the logical axis it maps");
    for (std::size_t i = 0; i < rule.mesh.size(); ++i) {
      TE_CHECK(!rule.mesh[i].empty(), "axis rule ", r, " for ", quoted(rule.logical),
               " has an empty mesh axis name; name a mesh axis, or give no mesh axes to pin it "
               "replicated");
      for (std::size_t j = 0; j < i; ++j) {
        TE_CHECK(rule.mesh[i] != rule.mesh[j], "axis rule ", r, " (", to_string(rule),
                 ") names mesh axis ", quoted(rule.mesh[i]),
                 " twice; a dim can be sharded over a mesh axis only once");
      }
    }
  }
}

std::vector<std::string> Resolution::unassigned() const {
  std::vector<std::string> out;
  for (const DimResolution& d : dims) {
    if (d.logical && !d.rule) out.push_back(*d.logical);
  }
  return out;
}

PartitionSpec Resolution::spec() const {
  PartitionSpec spec;
  spec.dims.reserve(dims.size());
  for (const DimResolution& d : dims) spec.dims.push_back(d.mesh);
  return spec;
}

void validate_logical_axes(const LogicalAxes& axes) {
  for (std::size_t i = 0; i < axes.size(); ++i) {
    if (!axes[i]) continue;
    TE_CHECK(!axes[i]->empty(), "logical axes ", to_string(axes), ": dim ", i,
             " has an empty name; use std::nullopt for an unnamed dim");
    for (std::size_t j = 0; j < i; ++j) {
      TE_CHECK(axes[j] != axes[i], "logical axis ", quoted(*axes[i]), " occurs more than once in ",
               to_string(axes), " (dims ", j, " and ", i,
               "); name each dim at most once and leave the others unnamed (std::nullopt)");
    }
  }
}

Resolution resolve_with_rules(const LogicalAxes& axes, const AxisRules& rules) {
  validate_logical_axes(axes);
  validate_axis_rules(rules);

  Resolution res;
  res.dims.resize(axes.size());
  for (std::size_t d = 0; d < axes.size(); ++d) res.dims[d].logical = axes[d];
  res.rules.resize(rules.size());

  // mesh axis -> the dim that holds it
  auto holder_of = [&](const std::string& mesh_axis) -> std::optional<std::size_t> {
    for (std::size_t d = 0; d < res.dims.size(); ++d) {
      const MeshAxes& m = res.dims[d].mesh;
      if (std::find(m.begin(), m.end(), mesh_axis) != m.end()) return d;
    }
    return std::nullopt;
  };

  for (std::size_t r = 0; r < rules.size(); ++r) {
    const AxisRule& rule = rules[r];
    RuleOutcome& out = res.rules[r];
    auto it = std::find(axes.begin(), axes.end(), std::optional<std::string>(rule.logical));
    if (it == axes.end()) {
      out.kind = RuleOutcome::Kind::kNoSuchDim;
      continue;
    }
    const std::size_t dim = static_cast<std::size_t>(it - axes.begin());
    out.dim = dim;
    if (res.dims[dim].rule) {
      out.kind = RuleOutcome::Kind::kDimAssigned;
      out.other = *res.dims[dim].rule;
      continue;
    }
    bool taken = false;
    for (const std::string& mesh_axis : rule.mesh) {
      if (auto holder = holder_of(mesh_axis)) {
        out.kind = RuleOutcome::Kind::kMeshAxisTaken;
        out.other = *holder;
        out.mesh_axis = mesh_axis;
        taken = true;
        break;
      }
    }
    if (taken) continue;
    out.kind = RuleOutcome::Kind::kAssigned;
    res.dims[dim].mesh = rule.mesh;
    res.dims[dim].rule = r;
  }
  return res;
}

PartitionSpec logical_to_mesh_axes(const LogicalAxes& axes, const AxisRules& rules) {
  return resolve_with_rules(axes, rules).spec();
}

std::string explain_logical_axes(const LogicalAxes& axes, const AxisRules& rules) {
  const Resolution res = resolve_with_rules(axes, rules);
  std::ostringstream os;
  os << "logical axes " << to_string(axes) << " -> " << to_string(res.spec()) << "\n";
  auto rule_label = [&](std::size_t r) {
    return "rule " + std::to_string(r) + " (" + to_string(rules[r]) + ")";
  };
  for (std::size_t d = 0; d < res.dims.size(); ++d) {
    const DimResolution& dim = res.dims[d];
    os << "  " << dim_label(axes, d) << " -> " << jax_mesh_axes(dim.mesh) << ": ";
    if (!dim.logical) {
      os << "unnamed, not sharded";
    } else if (dim.rule) {
      os << "by " << rule_label(*dim.rule);
      if (dim.mesh.empty()) os << ", pinned replicated";
    } else {
      const bool named_by_a_rule =
          std::any_of(rules.begin(), rules.end(), [&](const AxisRule& r) {
            return r.logical == *dim.logical;
          });
      os << (named_by_a_rule ? "every rule naming it was skipped, not sharded"
                             : "no rule names it, not sharded");
    }
    os << "\n";
  }
  std::vector<std::size_t> unused;
  for (std::size_t r = 0; r < res.rules.size(); ++r) {
    const RuleOutcome& out = res.rules[r];
    switch (out.kind) {
      case RuleOutcome::Kind::kAssigned:
        break;
      case RuleOutcome::Kind::kDimAssigned:
        os << "  " << rule_label(r) << " skipped: " << dim_label(axes, out.dim)
           << " already assigned by rule " << out.other << "\n";
        break;
      case RuleOutcome::Kind::kMeshAxisTaken:
        os << "  " << rule_label(r) << " skipped: mesh axis " << quoted(out.mesh_axis)
           << " taken by " << dim_label(axes, out.other) << "\n";
        break;
      case RuleOutcome::Kind::kNoSuchDim:
        unused.push_back(r);
        break;
    }
  }
  if (!unused.empty()) {
    os << "  rules naming no dim:";
    for (std::size_t r : unused) os << " " << r << " (" << rules[r].logical << ")";
    os << "\n";
  }
  return os.str();
}

// ---------------------------------------------------------------------------------------------
// parse_axis_rules

namespace {

class RuleParser {
 public:
  explicit RuleParser(std::string_view text) : text_(text) {}

  AxisRules parse() {
    AxisRules rules;
    skip_space();
    if (at_end()) return rules;
    while (true) {
      AxisRule rule;
      rule.logical = name("a logical axis name");
      expect('=');
      skip_space();
      if (peek() == '(') {
        ++pos_;
        skip_space();
        if (peek() != ')') {
          while (true) {
            rule.mesh.push_back(name("a mesh axis name"));
            if (peek() == ',') {
              ++pos_;
              continue;
            }
            break;
          }
        }
        expect(')');
      } else if (is_name_char(peek())) {
        rule.mesh.push_back(name("a mesh axis name"));
      }  // else: empty value, pinned replicated
      rules.push_back(std::move(rule));
      skip_space();
      if (at_end()) break;
      expect(',');
    }
    validate_axis_rules(rules);
    return rules;
  }

 private:
  static bool is_name_char(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  }
  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }
  void skip_space() {
    while (!at_end() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }

  [[noreturn]] void fail(const std::string& expected) const {
    const std::string found = at_end() ? "end of input" : "'" + std::string(1, text_[pos_]) + "'";
    TE_FAIL("parse_axis_rules: at position ", pos_, " expected ", expected, ", found ", found,
            "\n  ", text_, "\n  ", std::string(pos_, ' '),
            "^\n  rules are written as name=mesh_axis, name=(axis1,axis2) or name= (replicated), "
            "separated by commas");
  }

  std::string name(const char* what) {
    skip_space();
    const std::size_t start = pos_;
    while (!at_end() && is_name_char(text_[pos_])) ++pos_;
    if (pos_ == start) fail(what);
    std::string out(text_.substr(start, pos_ - start));
    skip_space();
    return out;
  }

  void expect(char c) {
    skip_space();
    if (peek() != c) fail(std::string("'") + c + "'");
    ++pos_;
    skip_space();
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

}  // namespace

AxisRules parse_axis_rules(std::string_view text) { return RuleParser(text).parse(); }

}  // namespace te
