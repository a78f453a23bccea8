// te-train: trains or fine-tunes a decoder language model (any family of te::hf's registry) on one
// process or on a mesh of ranks (one process per rank: --nproc through te-run, or torchrun /
// te-run / mpirun), with the layout chosen by the mesh, MeshResource and rules on the command
// line. The command line is options.cpp, the model model.cpp, the run run.cpp; the step is
// te::train::LmTrainer's and the launch, layout options and reports te::program's.

#include "args.h"
#include "te/program/launch.h"

int main(int argc, char** argv) {
  train::Args args;
  if (const int status = train::parse_args(argc, argv, args); status >= 0) return status;
  te::program::Layout layout;
  const auto check = [&](int world_size) { layout = train::check_args(args, world_size); };
  const auto run = [&](int rank, int world_size) {
    return train::run(args, layout, rank, world_size);
  };
  return te::program::run_main("te-train", argc, argv, args.launch, check, run);
}
