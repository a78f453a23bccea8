#pragma once

// The one place where LibTorch versions differ for te-cpp. Debian 12 ships LibTorch 1.13 (CPU);
// GPU machines use an official LibTorch 2.x. Code elsewhere tests these macros, never versions.

#include <torch/csrc/api/include/torch/version.h>

#define TE_TORCH_VERSION_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||             \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

/// at::scaled_dot_product_attention exists from 2.0 on.
#define TE_HAS_SDPA TE_TORCH_VERSION_AT_LEAST(2, 0)
/// Float8 dtypes (at::kFloat8_e4m3fn, at::kFloat8_e5m2) exist from 2.1 on.
#define TE_HAS_FLOAT8_DTYPES TE_TORCH_VERSION_AT_LEAST(2, 1)
/// From 2.0 on c10d's process-group implementations derive from c10d::Backend; before, from
/// c10d::ProcessGroup.
#define TE_C10D_HAS_BACKEND TE_TORCH_VERSION_AT_LEAST(2, 0)
