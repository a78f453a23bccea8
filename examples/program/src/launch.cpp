#include "te/program/launch.h"

#include <ATen/Parallel.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "te/distributed.h"
#include "te/input_error.h"
#include "te/program/report.h"
#include "te/runtime.h"

namespace te::program {

void add_nproc_option(CLI::App& app, LaunchArgs& args, const std::string& program_name) {
  app.add_option("--nproc", args.nproc,
                 "Start this many local ranks through te-run (across machines, start " +
                     program_name +
                     " under te-run --nnodes, torchrun, srun or mpirun instead: README)")
      ->check(CLI::PositiveNumber);
}

void add_threads_option(CLI::App& app, LaunchArgs& args) {
  app.add_option("--threads", args.threads,
                 "Intra-op threads per rank (default: OMP_NUM_THREADS, else the core count)")
      ->check(CLI::NonNegativeNumber);
}

int spawn_ranks(const char* program_name, int nproc, int argc, char** argv) {
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
  std::cerr << program_name << ": cannot start te-run ('" << runner
            << "'): " << std::strerror(errno) << "; install te-run next to " << program_name
            << " or put it on PATH\n";
  return 2;
}

namespace {

// Sets the threads and the allocator, joins the world (several launched ranks), runs, leaves the
// world.
int run_rank(const std::optional<te::LaunchEnvironment>& launch, int world_size,
             const LaunchArgs& args, const RunFn& run) {
  // A training step frees and allocates blocks of hundreds of MiB each step: kept in the heap.
  te::keep_freed_memory(/*large_blocks_too=*/true);
  if (args.threads > 0) {
    at::set_num_threads(args.threads);
  } else {
    te::configure_threads();
  }
  const bool joins = launch.has_value() && world_size > 1;
  int rank = 0;
  if (joins) {
    te::init_distributed();
    rank = te::world_rank();
  }
  const int status = run(rank, world_size);
  if (joins) te::shutdown_distributed();
  return status;
}

}  // namespace

int run_main(const char* program_name, int argc, char** argv, const LaunchArgs& launch,
             const CheckFn& check, const RunFn& run) {
  // Under a launcher (torchrun, te-run, mpirun, srun) this process is one rank of its world.
  std::optional<te::LaunchEnvironment> env;
  try {
    env = te::read_launch_environment();
  } catch (const te::Error& e) {
    std::cerr << program_name << ": " << one_line(e.what()) << "\n";
    return 2;
  }
  const bool launched = env.has_value();
  const int world_size = launched ? env->world_size : launch.nproc;
  if (launched && launch.nproc > 1 && launch.nproc != world_size) {
    std::cerr << program_name << ": --nproc " << launch.nproc
              << " differs from the launcher's world of " << world_size
              << " ranks; drop --nproc under a launcher\n";
    return 2;
  }
  try {
    check(world_size);
  } catch (const te::InputError& e) {
    std::cerr << program_name << ": " << e.what() << "\n";
    return 2;
  }
  if (!launched && launch.nproc > 1) return spawn_ranks(program_name, launch.nproc, argc, argv);
  try {
    return run_rank(env, world_size, launch, run);
  } catch (const te::InputError& e) {
    std::cerr << program_name << ": " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << program_name << ": " << e.what() << "\n";
    return 1;
  }
}

}  // namespace te::program
