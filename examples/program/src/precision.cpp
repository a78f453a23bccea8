#include "te/program/precision.h"

#include <CLI/CLI.hpp>
#include <vector>

namespace te::program {

namespace {

std::vector<std::string> fp8_choices() {
  std::vector<std::string> out{"none"};
  for (const std::string& name : te::fp8::recipe_names()) out.push_back(name);
  return out;
}

}  // namespace

void add_fp8_option(CLI::App& app, std::string& fp8) {
  app.add_option("--fp8", fp8, "FP8 GEMMs: none, or a recipe: " + te::fp8::recipe_summary())
      ->check(CLI::IsMember(fp8_choices()))
      ->capture_default_str();
}

std::optional<te::fp8::Recipe> recipe_of(const std::string& name) {
  if (name == "none") return std::nullopt;
  return te::fp8::recipe_named(name);
}

}  // namespace te::program
