#pragma once

// Logical axis names, rules that map them to mesh axes, and Flax's resolution algorithm.
//
// This header is pure C++17: no LibTorch, no mesh. It is the contract every module relies on when
// it calls with_sharding_constraint(x, {"batch", "seqlen", "heads"}).

#include <cstddef>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace te {

/// The mesh axes one tensor dim is sharded over, major to minor. {} means not sharded.
using MeshAxes = std::vector<std::string>;

/// One logical name per tensor dim; std::nullopt marks a dim that takes part in no rule.
using LogicalAxes = std::vector<std::optional<std::string>>;

/// `logical` is sharded over `mesh`. A rule with an empty `mesh` pins the dim to replicated: later
/// rules for the same name can no longer shard it.
struct AxisRule {
  std::string logical;
  MeshAxes mesh;

  friend bool operator==(const AxisRule& a, const AxisRule& b) {
    return a.logical == b.logical && a.mesh == b.mesh;
  }
  friend bool operator!=(const AxisRule& a, const AxisRule& b) { return !(a == b); }
};

/// Rules in priority order: earlier rules win.
using AxisRules = std::vector<AxisRule>;

/// The resolved layout: for each tensor dim, the mesh axes it is sharded over.
struct PartitionSpec {
  std::vector<MeshAxes> dims;

  std::size_t size() const { return dims.size(); }
  const MeshAxes& operator[](std::size_t i) const { return dims[i]; }
  /// True when no dim is sharded.
  bool is_replicated() const;

  friend bool operator==(const PartitionSpec& a, const PartitionSpec& b) {
    return a.dims == b.dims;
  }
  friend bool operator!=(const PartitionSpec& a, const PartitionSpec& b) { return !(a == b); }
};

/// JAX's spelling: PartitionSpec('data', None, ('fsdp', 'tp')).
std::string to_string(const PartitionSpec& spec);
/// ('batch', None, 'heads').
std::string to_string(const LogicalAxes& axes);
/// The syntax parse_axis_rules reads: "data", "(fsdp,tp)", or "" for not sharded.
std::string to_string(const MeshAxes& mesh);
/// "batch=(data,fsdp)"; the printer parse_axis_rules round-trips with.
std::string to_string(const AxisRule& rule);
/// "batch=(data,fsdp),heads=model,hidden=".
std::string to_string(const AxisRules& rules);

std::ostream& operator<<(std::ostream& os, const PartitionSpec& spec);
std::ostream& operator<<(std::ostream& os, const AxisRule& rule);

/// Flax linen's logical_to_mesh_axes: walk the rules in order; a rule shards the dim it names only
/// if that dim is still unassigned and none of its mesh axes is used by another dim (all or
/// nothing for a tuple). Unnamed and unassigned dims end as not sharded.
///
/// Throws te::Error when a logical name occurs on two dims (name it twice and the second dim
/// could never be sharded consistently), or when a rule is malformed (empty name, a mesh axis
/// repeated inside one rule).
///
/// Example:
///   logical_to_mesh_axes({"bar", "foo", "baz"},
///                        {{"foo", {"model"}}, {"bar", {"model"}}, {"baz", {"data"}}})
///   == PartitionSpec(None, 'model', 'data')
PartitionSpec logical_to_mesh_axes(const LogicalAxes& axes, const AxisRules& rules);

/// What happened to one dim during resolution.
struct DimResolution {
  std::optional<std::string> logical;  ///< the dim's logical name (nullopt: unnamed)
  MeshAxes mesh;                       ///< what it resolved to
  /// Index into the rules of the rule that assigned it; nullopt when no rule did.
  std::optional<std::size_t> rule;
};

/// What happened to one rule during resolution.
struct RuleOutcome {
  enum class Kind {
    kAssigned,       ///< assigned its mesh axes (or pinned replicated) to `dim`
    kDimAssigned,    ///< `dim` was already assigned by rule `other`
    kMeshAxisTaken,  ///< mesh axis `mesh_axis` is already used by dim `other`
    kNoSuchDim,      ///< no dim carries this rule's logical name
  };
  Kind kind = Kind::kNoSuchDim;
  std::size_t dim = 0;    ///< the dim this rule names (unused for kNoSuchDim)
  std::size_t other = 0;  ///< the assigning rule (kDimAssigned) or the holding dim (kMeshAxisTaken)
  std::string mesh_axis;  ///< the contested mesh axis (kMeshAxisTaken)
};

/// The full trace of Flax resolution; logical_to_mesh_axes and explain_logical_axes are views of it.
struct Resolution {
  std::vector<DimResolution> dims;
  std::vector<RuleOutcome> rules;  ///< one per input rule, same order

  PartitionSpec spec() const;
  /// Logical names of the named dims that no rule assigned, in dim order.
  std::vector<std::string> unassigned() const;
};

/// The one pure function behind the rule machinery.
Resolution resolve_with_rules(const LogicalAxes& axes, const AxisRules& rules);

/// Human-readable account of a resolution: per dim which rule assigned it, and for each rule that
/// names a dim but was skipped, why (dim already assigned by rule i / mesh axis taken by dim k).
std::string explain_logical_axes(const LogicalAxes& axes, const AxisRules& rules);

/// Reads rules written as `name=value` separated by commas, where value is a mesh axis name, a
/// parenthesised list of mesh axes, or nothing (pinned replicated):
///   "batch=(data,fsdp),heads=model,hidden="
/// Whitespace between tokens is ignored; names are letters, digits, '_', '-', '.'. A syntax error
/// throws te::Error with the position (0-based) and what was expected there.
AxisRules parse_axis_rules(std::string_view text);

/// Throws te::Error when a logical name occurs on two dims or is the empty string.
void validate_logical_axes(const LogicalAxes& axes);

/// Throws te::Error naming the rule when a rule has an empty logical name, an empty mesh axis
/// name, or repeats a mesh axis inside its own tuple.
void validate_axis_rules(const AxisRules& rules);

}  // namespace te
