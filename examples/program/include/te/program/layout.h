#pragma once

// A training run's layout from its command line: the device mesh (--mesh), the parallelism roles
// of its axes (--mesh-resource, TE's MeshResource) and the logical axis rules (--rules,
// --extend-te-rules), parsed and checked before any rank starts (te::InputError naming the
// option), and what they make of the model's batch and heads.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "te/distributed.h"
#include "te/sharding.h"

namespace CLI {
class App;
}

namespace te::program {

/// The layout options of a command line, as given.
struct LayoutArgs {
  std::string mesh;           // --mesh, e.g. data=2,model=2
  std::string mesh_resource;  // --mesh-resource, e.g. dp=data,tpsp=model
  std::string rules;          // --rules, e.g. batch=data,heads=model
  bool extend_te_rules = false;
};

/// Adds --mesh, --mesh-resource, --rules and --extend-te-rules. `rules_help` is --rules' help
/// (what the program does without rules); empty: that TE's table maps the model's axes.
void add_layout_options(CLI::App& app, LayoutArgs& args, const std::string& rules_help = "");

/// The layout of a run: the mesh (none on one process), MeshResource and rules.
struct Layout {
  std::optional<te::MeshShape> mesh;
  std::optional<te::MeshResource> resource;
  std::optional<te::AxisRules> rules;
  std::string description;             // "one process", or "mesh data=2, mesh resource dp=data"
  int64_t data_parallel = 1;           // ranks the logical batch axis is split over
  bool tensor_parallel = false;        // the logical heads axis split over some mesh axis
  bool splits_sequence = false;        // the logical seqlen axis (of batch, seqlen) split over one
  bool context_parallel = false;       // the logical seqlen_cp axis split over a mesh axis
  int64_t context_parallel_ranks = 1;  // ranks the logical seqlen_cp axis is split over
};

/// The rules a program maps its own logical axes with when --mesh-resource is given without
/// --rules, called with the MeshResource and the mesh's sizes in scope (TE's table can be read
/// there); make_layout extends them with TE's table.
using DefaultRules = std::function<te::AxisRules(const te::MeshResource& resource)>;

/// The layout --mesh, --mesh-resource and --rules describe for `world_size` ranks, checked
/// (te::InputError naming the option). Without --mesh, several ranks make the mesh data=N with
/// the role dp=data. With a MeshResource and no --rules, the rules are `default_rules`' extended
/// with TE's table (none: TE's table alone, in effect); --extend-te-rules extends --rules so.
Layout make_layout(const LayoutArgs& args, int world_size,
                   const DefaultRules& default_rules = nullptr);

/// Every rank's `v` reduced by `op` over the whole mesh (a collective: every rank calls it).
double reduce_over_ranks(const te::DeviceMesh& mesh, double v, te::ReduceOp op);

/// te::InputError unless the layout's data-parallel size divides `global_batch` (`option`
/// names it).
void check_global_batch(const Layout& layout, int64_t global_batch,
                        const std::string& option = "--batch-size");

/// A rank's run under its layout: the mesh (built collectively: every rank makes it), its
/// MeshScope, the MeshResource and the rules in scope while this lives. Nothing where the layout
/// has none (one process).
class LayoutScope {
 public:
  explicit LayoutScope(const Layout& layout);
  /// The mesh in scope, nullptr on one process.
  const te::DeviceMesh* mesh() const { return mesh_ ? &*mesh_ : nullptr; }

 private:
  std::optional<te::DeviceMesh> mesh_;
  std::optional<te::MeshScope> mesh_scope_;
  std::optional<te::MeshResourceScope> resource_scope_;
  std::optional<te::AxisRulesScope> rules_scope_;
};

}  // namespace te::program
