#include "te/program/layout.h"

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <algorithm>

#include "te/input_error.h"
#include "te/program/report.h"

namespace te::program {

namespace {

te::MeshShape parse_mesh(const std::string& text) {
  try {
    return te::parse_mesh_shape(text);
  } catch (const te::Error& e) {
    throw te::InputError(std::string("--") + e.what());
  }
}

// Every mesh axis a MeshResource or rule names must be an axis of the mesh.
void check_axis(const te::MeshShape& mesh, const std::string& axis, const std::string& where) {
  if (std::find(mesh.names.begin(), mesh.names.end(), axis) != mesh.names.end()) return;
  std::string have;
  for (const auto& n : mesh.names) have += (have.empty() ? "" : ", ") + n;
  throw te::InputError(where + " names mesh axis '" + axis + "', which the mesh (" +
                       mesh.to_string() + ") lacks; its axes are: " + have);
}

// The mesh axes the mesh resource and the rules name exist on --mesh, and one of them is given.
void check_layout_axes(const Layout& layout) {
  if (layout.mesh) {
    if (!layout.resource && !layout.rules) {
      throw te::InputError("--mesh " + layout.mesh->to_string() +
                           " needs --mesh-resource or --rules to map the model's logical axes "
                           "onto it (e.g. --mesh-resource dp=data)");
    }
    if (layout.resource) {
      const te::MeshResource& r = *layout.resource;
      for (const te::MeshRole& role : te::kMeshRoles) {
        if (r.*role.axis) check_axis(*layout.mesh, *(r.*role.axis), "--mesh-resource");
      }
    }
    if (layout.rules) {
      for (const te::AxisRule& rule : *layout.rules) {
        for (const std::string& axis : rule.mesh) {
          check_axis(*layout.mesh, axis, "--rules entry '" + te::to_string(rule) + "'");
        }
      }
    }
  }
  // One process: rules and roles are validated and resolve to nothing.
}

// With a MeshResource and no --rules, the program's own rules (if any) extended by TE's table;
// with --extend-te-rules, --rules extended so (TE's model-parallel example does both).
void extend_with_te_table(const LayoutArgs& args, const DefaultRules& default_rules,
                          Layout& layout) {
  if (!layout.resource || (layout.rules && !args.extend_te_rules)) return;
  if (!layout.rules && !default_rules) return;  // TE's table is in effect without rules
  // TE's table reads the mesh's axis sizes (a role on an axis of one device is inactive).
  std::optional<te::MeshShapeScope> sizes;
  if (layout.mesh) sizes.emplace(*layout.mesh);
  te::MeshResourceScope scope(*layout.resource);
  try {
    const te::AxisRules base = layout.rules ? *layout.rules : default_rules(*layout.resource);
    layout.rules = te::extend_logical_axis_rules(base);
  } catch (const te::Error& e) {
    throw te::InputError("--rules: " + one_line(e.what()));
  }
}

// The data-parallel size and whether the heads are split (what the rules make of the logical
// batch and heads axes), and the line that describes the layout.
void measure_layout(const LayoutArgs& args, Layout& layout) {
  if (!layout.mesh) {
    layout.description = "one process";
    return;
  }
  std::optional<te::MeshResourceScope> resource;
  if (layout.resource) resource.emplace(*layout.resource);
  std::optional<te::AxisRulesScope> rules;
  if (layout.rules) rules.emplace(*layout.rules);
  if (const auto spec = te::resolve_logical_axes({"batch", "heads"})) {
    for (const auto& axis : (*spec)[0]) {
      const auto it = std::find(layout.mesh->names.begin(), layout.mesh->names.end(), axis);
      layout.data_parallel *= layout.mesh->sizes[std::size_t(it - layout.mesh->names.begin())];
    }
    layout.tensor_parallel = !(*spec)[1].empty();
  }
  if (const auto spec = te::resolve_logical_axes({"batch", "seqlen"})) {
    layout.splits_sequence = !(*spec)[1].empty();
  }
  // Alone: attention's q/k/v name seqlen_cp where the activations name seqlen, and both may
  // map to one mesh axis.
  if (const auto spec = te::resolve_logical_axes({"seqlen_cp"})) {
    layout.context_parallel = !(*spec)[0].empty();
    for (const auto& axis : (*spec)[0]) {
      const auto it = std::find(layout.mesh->names.begin(), layout.mesh->names.end(), axis);
      layout.context_parallel_ranks *=
          layout.mesh->sizes[std::size_t(it - layout.mesh->names.begin())];
    }
  }
  layout.description = "mesh " + layout.mesh->to_string();
  if (layout.resource) layout.description += ", mesh resource " + te::to_string(*layout.resource);
  if (!args.rules.empty()) layout.description += ", rules " + args.rules;
}

}  // namespace

void add_layout_options(CLI::App& app, LayoutArgs& args, const std::string& rules_help) {
  app.add_option("--mesh", args.mesh,
                 "Device mesh, e.g. data=2,model=2 (its size must equal the number of ranks; "
                 "default with several ranks: data=N)");
  app.add_option("--mesh-resource", args.mesh_resource,
                 "Parallelism roles of the mesh axes (TE's MeshResource), e.g. dp=data,tpsp=model "
                 "or fsdp=data; ep=AXIS splits a mixture of experts' experts over AXIS (tokens "
                 "sent to them by all-to-all when the batch splits over it too: dp=data,ep=data) "
                 "(default with several ranks and no --mesh: dp=data)");
  app.add_option("--rules", args.rules,
                 rules_help.empty()
                     ? "Logical axis rules, e.g. 'batch=data,heads=model'. Without them, a "
                       "--mesh-resource maps the model's axes with TE's table"
                     : rules_help);
  app.add_flag("--extend-te-rules", args.extend_te_rules,
               "Extend --rules with TE's default table derived from --mesh-resource");
}

Layout make_layout(const LayoutArgs& args, int world_size, const DefaultRules& default_rules) {
  Layout layout;
  if (!args.mesh.empty()) {
    layout.mesh = parse_mesh(args.mesh);
  } else if (world_size > 1) {
    layout.mesh = te::MeshShape{{world_size}, {"data"}};  // data parallel by default
  }
  if (layout.mesh && layout.mesh->size() != world_size) {
    throw te::InputError("--mesh " + layout.mesh->to_string() + " has " +
                         std::to_string(layout.mesh->size()) + " ranks but the world has " +
                         std::to_string(world_size) +
                         (world_size == 1 ? " (start ranks with --nproc N or a launcher)" : ""));
  }
  if (!args.mesh_resource.empty()) {
    try {
      layout.resource = te::parse_mesh_resource(args.mesh_resource);
    } catch (const te::Error& e) {
      throw te::InputError("--mesh-resource: " + one_line(e.what()));
    }
  } else if (layout.mesh && args.mesh.empty() && args.rules.empty()) {
    layout.resource = te::parse_mesh_resource("dp=data");
  }
  if (!args.rules.empty()) {
    try {
      layout.rules = te::parse_axis_rules(args.rules);
    } catch (const te::Error& e) {
      throw te::InputError("--rules: " + one_line(e.what()));
    }
  }
  if (args.extend_te_rules && !layout.resource) {
    throw te::InputError("--extend-te-rules needs --mesh-resource (TE's table is derived from it)");
  }
  check_layout_axes(layout);
  extend_with_te_table(args, default_rules, layout);
  measure_layout(args, layout);
  return layout;
}

double reduce_over_ranks(const te::DeviceMesh& mesh, double v, te::ReduceOp op) {
  std::vector<int64_t> dims(static_cast<std::size_t>(mesh.ndim()));
  for (std::size_t d = 0; d < dims.size(); ++d) dims[d] = static_cast<int64_t>(d);
  return mesh.all_reduce(at::full({}, v, at::kDouble), op, dims).item<double>();
}

void check_global_batch(const Layout& layout, int64_t global_batch, const std::string& option) {
  if (global_batch % layout.data_parallel == 0) return;
  throw te::InputError(option + " " + std::to_string(global_batch) +
                       " (the global batch) is not divisible by the data-parallel size " +
                       std::to_string(layout.data_parallel));
}

LayoutScope::LayoutScope(const Layout& layout) {
  if (layout.mesh) mesh_.emplace(layout.mesh->sizes, layout.mesh->names);
  if (mesh_) mesh_scope_.emplace(*mesh_);
  if (layout.resource) resource_scope_.emplace(*layout.resource);
  if (layout.rules) rules_scope_.emplace(*layout.rules);
}

}  // namespace te::program
