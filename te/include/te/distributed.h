#pragma once

// Umbrella header of the distributed layer: world, DeviceMesh, placements, DTensor,
// with_sharding_constraint, CommTrace,
// the scopes backward reads. Needs LibTorch; includes the sharding layer.

#include "te/distributed/comm_trace.h"
#include "te/distributed/dtensor.h"
#include "te/distributed/gradients.h"
#include "te/distributed/mesh.h"
#include "te/distributed/placement.h"
#include "te/distributed/scopes.h"
#include "te/distributed/world.h"
#include "te/error.h"
#include "te/sharding.h"
