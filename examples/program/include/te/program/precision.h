#pragma once

// A training program's FP8 option: --fp8 none or one of te::fp8's recipes by name.

#include <optional>
#include <string>

#include "te/fp8.h"

namespace CLI {
class App;
}

namespace te::program {

/// Adds --fp8 (none, or a recipe of te::fp8::recipe_names(); default: `fp8` as given).
void add_fp8_option(CLI::App& app, std::string& fp8);

/// The FP8 recipe of --fp8 (none: nullopt).
std::optional<te::fp8::Recipe> recipe_of(const std::string& name);

}  // namespace te::program
