#include <te/fp8.h>
#include <te/nn.h>
#include <te/runtime.h>
#include <te/sharding.h>

#include <iostream>

int main() {
  te::AxisRulesScope rules(te::parse_axis_rules("batch=data,heads=model"));
  const auto spec = te::resolve_logical_axes({"batch", "seqlen", "heads"});
  if (!spec) return 1;
  std::cout << "consumer: " << te::to_string(*spec) << "\n";
  // An FP8 forward through an installed module.
  te::nn::Dense dense(16, 8);
  {
    te::Fp8Autocast fp8(true, te::fp8::DelayedScaling{});
    dense(at::ones({2, 16})).sum().backward();
  }
  std::cout << "consumer: FP8 scale " << dense->fp8_meta->fwd_scale[0].item<float>() << "\n";
  te::configure_threads();
  std::cout << te::build_info();
  return 0;
}
