#pragma once

// Umbrella header of the sharding layer: logical axes, rules, scopes, the TE default table.
// Pure C++17; it does not pull in LibTorch.

#include "te/error.h"
#include "te/sharding/axis_rules.h"
#include "te/sharding/context.h"
#include "te/sharding/mesh_shape.h"
