// te-encoder: Transformer Engine's encoder example in C++. Trains the CoLA classifier of TE's
// examples/jax/encoder on one process or on a mesh of ranks (threads are not used: one process
// per rank, launched by --nproc through te-run, or by torchrun / te-run / mpirun), with the
// layout chosen only by the mesh, MeshResource and rules on the command line. The command line
// is options.cpp, the run trainer.cpp, what it prints and writes report.cpp.

#include <ATen/Parallel.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "options.h"
#include "te/distributed.h"
#include "te/runtime.h"
#include "trainer.h"

namespace {

using namespace encoder;

// Restarts this program as `nproc` ranks under te-run (found next to this executable, in the
// build tree, or on PATH) and returns its exit status.
int spawn_ranks(int nproc, int argc, char** argv) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  std::vector<std::string> candidates;
  if (!ec) candidates.push_back((self.parent_path() / "te-run").string());
#ifdef TE_RUN_BUILD_PATH
  candidates.push_back(TE_RUN_BUILD_PATH);
#endif
  std::string runner = "te-run";
  for (const auto& c : candidates) {
    if (fs::exists(c)) {
      runner = c;
      break;
    }
  }
  std::vector<std::string> args = {runner, "--nproc", std::to_string(nproc), "--",
                                   ec ? std::string(argv[0]) : self.string()};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--nproc") {
      ++i;
      continue;
    }
    if (a.rfind("--nproc=", 0) == 0) continue;
    args.push_back(a);
  }
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  std::cout.flush();
  execvp(cargs[0], cargs.data());
  std::cerr << "te-encoder: cannot start te-run ('" << runner << "'): " << std::strerror(errno)
            << "; install te-run next to te-encoder or put it on PATH\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (const int status = parse_args(argc, argv, args); status >= 0) return status;

  // Under a launcher (torchrun, te-run, mpirun, srun) this process is one rank of its world.
  std::optional<te::LaunchEnvironment> launch;
  try {
    launch = te::read_launch_environment();
  } catch (const te::Error& e) {
    std::cerr << "te-encoder: " << one_line(e.what()) << "\n";
    return 2;
  }
  const bool launched = launch.has_value();
  const int world_size = launched ? launch->world_size : args.nproc;
  if (launched && args.nproc > 1 && args.nproc != world_size) {
    std::cerr << "te-encoder: --nproc " << args.nproc << " differs from the launcher's world of "
              << world_size << " ranks; drop --nproc under a launcher\n";
    return 2;
  }
  Layout layout;
  ColaData data;
  try {
    layout = check_args(args, world_size);
    // Read the data before starting ranks: a bad file is one message, not one per rank. (te-run's
    // ranks read it again, each in its own process.)
    data = read_data(args);
    if (args.mlp_activations != "auto") activations_of(args.mlp_activations, false);
  } catch (const InputError& e) {
    std::cerr << "te-encoder: " << e.what() << "\n";
    return 2;
  }
  if (!launched && args.nproc > 1) return spawn_ranks(args.nproc, argc, argv);

  try {
    if (args.threads > 0) {
      at::set_num_threads(args.threads);
    } else {
      te::configure_threads();
    }
    int rank = 0;
    if (launched && world_size > 1) {
      te::init_distributed();
      rank = te::world_rank();
    }
    const int status = train(args, layout, data, rank, world_size);
    if (launched && world_size > 1) te::shutdown_distributed();
    return status;
  } catch (const InputError& e) {
    std::cerr << "te-encoder: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "te-encoder: " << e.what() << "\n";
    return 1;
  }
}
