#pragma once

// The one place where LibTorch versions differ for te-cpp. Debian 12 ships LibTorch 1.13 (CPU);
// GPU machines use an official LibTorch 2.x. Code elsewhere tests these macros, never versions.
//
// The distributed layer calls c10d::ProcessGroupGloo directly: its collectives have the same
// signatures whether it derives from c10d::ProcessGroup (1.13) or c10d::Backend (2.x).

#include <torch/csrc/api/include/torch/version.h>

#define TE_TORCH_VERSION_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||             \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

/// at::scaled_dot_product_attention exists from 2.0 on (with a `scale` argument from 2.1).
#define TE_HAS_SDPA TE_TORCH_VERSION_AT_LEAST(2, 0)

/// LibTorch's float8_e4m3fn / float8_e5m2 dtypes exist from 2.1 on.
#define TE_HAS_FLOAT8 TE_TORCH_VERSION_AT_LEAST(2, 1)

/// Autocast is switched per device type (at::autocast::set_autocast_enabled(at::kCPU, ...)) from
/// 2.4 on; before, through the CPU-specific set_cpu_enabled / set_autocast_cpu_dtype.
#define TE_AUTOCAST_BY_DEVICE TE_TORCH_VERSION_AT_LEAST(2, 4)
