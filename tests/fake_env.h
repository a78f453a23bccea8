#pragma once

// An environment of a test's own for the functions that read one through te::EnvLookup (the
// launchers' variables, GLOO_SOCKET_IFNAME), so a test never touches the process's.

#include <map>
#include <string>

#include "te/runtime/launch.h"

namespace te::test {

using Env = std::map<std::string, std::string>;

inline EnvLookup env_of(Env vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

}  // namespace te::test
