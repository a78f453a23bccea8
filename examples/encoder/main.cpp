// te-encoder: Transformer Engine's encoder example in C++. Trains the CoLA classifier of TE's
// examples/jax/encoder on one process or on a mesh of ranks (threads are not used: one process
// per rank, launched by --nproc through te-run, or by torchrun / te-run / mpirun), with the
// layout chosen only by the mesh, MeshResource and rules on the command line. The command line
// is options.cpp, the run trainer.cpp; the launch, the layout options and the reporting are
// te::program's (examples/program).

#include "options.h"
#include "te/program/launch.h"
#include "trainer.h"

int main(int argc, char** argv) {
  using namespace encoder;
  Args args;
  if (const int status = parse_args(argc, argv, args); status >= 0) return status;
  Layout layout;
  ColaData data;
  const auto check = [&](int world_size) {
    layout = check_args(args, world_size);
    // Read the data before starting ranks: a bad file is one message, not one per rank. (te-run's
    // ranks read it again, each in its own process.)
    data = read_data(args);
    if (args.mlp_activations != "auto") activations_of(args.mlp_activations, false);
  };
  const auto run = [&](int rank, int world_size) {
    return train(args, layout, data, rank, world_size);
  };
  return te::program::run_main("te-encoder", argc, argv, args.launch, check, run);
}
