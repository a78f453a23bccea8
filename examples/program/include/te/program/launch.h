#pragma once

// How a training program starts: on one process, as N ranks it restarts itself as under te-run
// (--nproc), or as one rank of a launcher's world (torchrun, te-run, mpirun, srun); its threads;
// joining and leaving the distributed world. Messages start with the program's name.

#include <functional>
#include <string>

namespace CLI {
class App;
}

namespace te::program {

/// The launch options of a training program's command line.
struct LaunchArgs {
  int nproc = 1;    // --nproc: local ranks to start through te-run
  int threads = 0;  // --threads: intra-op threads per rank (0: OMP_NUM_THREADS, else the cores)
};

/// Adds --nproc (`program_name` is named in its help).
void add_nproc_option(CLI::App& app, LaunchArgs& args, const std::string& program_name);
/// Adds --threads.
void add_threads_option(CLI::App& app, LaunchArgs& args);

/// Restarts this program as `nproc` ranks under te-run (found next to this executable, at
/// TE_RUN_BUILD_PATH in the build tree, else on PATH), with its command line less --nproc.
/// Returns only when te-run cannot be started: 2, after saying why on stderr.
int spawn_ranks(const char* program_name, int nproc, int argc, char** argv);

/// Checks made before any rank starts, given the world's size (throw te::InputError).
using CheckFn = std::function<void(int world_size)>;
/// The run on this rank of `world_size`; returns the exit status.
using RunFn = std::function<int(int rank, int world_size)>;

/// A training program's main() after its command line is parsed: reads the launcher's
/// environment, checks --nproc against its world, runs `check` once (before any rank starts, so
/// bad input is one message), restarts as --nproc ranks through te-run when not launched, else
/// sets the threads and keeps freed memory in the heap (te::keep_freed_memory with large blocks),
/// joins the world (several ranks), runs `run` and leaves the world. Returns
/// the exit status: a te::InputError or a bad launch environment is "NAME: message" on stderr
/// and 2; any other exception from `run` is "NAME: message" and 1.
int run_main(const char* program_name, int argc, char** argv, const LaunchArgs& launch,
             const CheckFn& check, const RunFn& run);

}  // namespace te::program
