#include "te/hf/ranks.h"

#include "te/distributed.h"
#include "te/error.h"
#include "te/sharding/mesh_shape.h"

namespace te::hf {

void run_on_ranks(const RankOptions& options,
                  const std::function<void(int rank, const te::DeviceMesh& mesh)>& fn) {
  const MeshShape shape = parse_mesh_shape(
      options.mesh.empty() ? "model=" + std::to_string(options.nproc) : options.mesh);
  TE_CHECK(shape.size() == options.nproc, "--mesh ", shape.to_string(), " has ", shape.size(),
           " ranks, not --nproc ", options.nproc);
  std::string resource = options.mesh_resource;
  if (resource.empty()) {
    for (const std::string& n : shape.names) {
      if (n == "model") resource += std::string(resource.empty() ? "" : ",") + "tp=model";
      if (n == "data") resource += std::string(resource.empty() ? "" : ",") + "dp=data";
    }
  }
  const MeshResource mesh_resource = parse_mesh_resource(resource);
  std::string rules = options.rules;
  if (rules.empty() && mesh_resource.tp == "model") rules = "vocab=model";
  const AxisRules axis_rules = parse_axis_rules(rules);
  run_local_ranks(options.nproc, [&](int rank) {
    DeviceMesh mesh(shape.sizes, shape.names);
    MeshScope on(mesh);
    MeshResourceScope tp(mesh_resource);
    AxisRulesScope scope(extend_logical_axis_rules(axis_rules));
    fn(rank, mesh);
  });
}

}  // namespace te::hf
