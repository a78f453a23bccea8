#include <te/runtime.h>
#include <te/sharding.h>

#include <iostream>

int main() {
  te::AxisRulesScope rules(te::parse_axis_rules("batch=data,heads=model"));
  const auto spec = te::resolve_logical_axes({"batch", "seqlen", "heads"});
  if (!spec) return 1;
  std::cout << "consumer: " << te::to_string(*spec) << "\n";
  te::configure_threads();
  std::cout << te::build_info();
  return 0;
}
