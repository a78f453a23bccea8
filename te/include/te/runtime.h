#pragma once

// Umbrella header of process-level settings (needs LibTorch).

#include "te/compat.h"
#include "te/error.h"
#include "te/runtime/launch.h"
#include "te/runtime/runtime.h"
