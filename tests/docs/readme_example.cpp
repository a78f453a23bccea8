// README.md's first example, compiled and run by the suite (test docs.readme_example); the
// test docs.consistent checks that README.md's C++ block is exactly the code between the markers.
#include <ATen/ATen.h>

#include <iostream>

// README begin
#include <te/nn.h>

// Two ranks as threads (processes: te::init_distributed() under te-run, torchrun or srun).
void first_model() {
  te::run_local_ranks(2, [](int) {
    te::DeviceMesh mesh({2}, {"model"});
    te::MeshScope on_mesh(mesh);
    // The user's rules, extended with TE's table for the roles the MeshResource names.
    te::MeshResourceScope roles(te::parse_mesh_resource("tp=model"));
    te::AxisRulesScope rules(te::extend_logical_axis_rules(te::parse_axis_rules("embed=model")));
    te::nn::manual_seed(0);  // every layout initialises the same global weights
    te::nn::TransformerLayer layer(te::nn::TransformerLayerOptions(256, 1024, 8));
    auto x = te::DTensor::distribute(  // the same whole tensor on every rank
        at::linspace(-1, 1, 64 * 32 * 256).view({64, 32, 256}), mesh, {te::Replicate()});
    x = te::with_sharding_constraint(x, {"batch", "seqlen", "hidden"});
    te::DTensor y = layer(x);  // heads and MLP columns split over the two ranks
    y.full_tensor().sum().backward();
  });
}
// README end

int main() {
  first_model();
  std::cout << "the README's example ran on 2 ranks" << std::endl;
  return 0;
}
