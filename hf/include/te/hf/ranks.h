#pragma once

// Running a Hugging Face model over thread ranks as a command line describes them (te-generate
// and te-serve's --nproc, --mesh, --mesh-resource, --rules): the mesh, TE's MeshResource and the
// logical axis rules, with the defaults a decoder needs to be tensor parallel.

#include <functional>
#include <string>

#include "te/distributed/mesh.h"

namespace te::hf {

struct RankOptions {
  int nproc = 1;
  /// "NAME=SIZE,..." of nproc ranks; "": model=nproc (tensor parallel).
  std::string mesh;
  /// TE's MeshResource; "": tp=model, and dp=data, for the mesh axes of those names.
  std::string mesh_resource;
  /// Logical axis rules over TE's table; "": vocab=model when tp=model (the vocabulary sharded
  /// with the heads), else none.
  std::string rules;
};

/// Runs `fn(rank, mesh)` on options.nproc thread ranks (te::run_local_ranks), each with the mesh,
/// the MeshResource and the rules in scope. te::Error (before any rank starts) for a mesh that
/// does not have nproc ranks or a text that does not parse, naming the option.
void run_on_ranks(const RankOptions& options,
                  const std::function<void(int rank, const te::DeviceMesh& mesh)>& fn);

}  // namespace te::hf
