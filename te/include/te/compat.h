#pragma once

// The one place where LibTorch versions differ for te-cpp. Debian 12 ships LibTorch 1.13 (CPU);
// GPU machines use an official LibTorch 2.x. Code elsewhere tests these macros, never versions.
//
// The Gloo backend calls c10d::ProcessGroupGloo directly: its collectives have the same
// signatures whether it derives from c10d::ProcessGroup (1.13) or c10d::Backend (2.x).

#include <torch/csrc/api/include/torch/version.h>

#include <sstream>
#include <string>
#include <type_traits>

#define TE_TORCH_VERSION_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||             \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

/// at::scaled_dot_product_attention exists from 2.0 on (with a `scale` argument from 2.1).
#define TE_HAS_SDPA TE_TORCH_VERSION_AT_LEAST(2, 0)

/// scaled_dot_product_attention takes `enable_gqa` (fewer key/value heads than query heads)
/// from 2.5 on.
#define TE_SDPA_HAS_GQA TE_TORCH_VERSION_AT_LEAST(2, 5)

/// LibTorch's float8_e4m3fn / float8_e5m2 dtypes exist from 2.1 on.
#define TE_HAS_FLOAT8 TE_TORCH_VERSION_AT_LEAST(2, 1)

/// scaled_dot_product_attention has a cuDNN backend, switched by at::Context::setSDPUseCuDNN,
/// from 2.5 on.
#define TE_HAS_CUDNN_SDPA TE_TORCH_VERSION_AT_LEAST(2, 5)

/// c10d::TCPStoreOptions::useLibUV exists from 2.3 on (and defaults to true from 2.4).
#define TE_TCPSTORE_HAS_LIBUV TE_TORCH_VERSION_AT_LEAST(2, 3)

/// Autocast is switched per device type (at::autocast::set_autocast_enabled(at::kCPU, ...)) from
/// 2.4 on; before, through the CPU-specific set_cpu_enabled / set_autocast_cpu_dtype.
#define TE_AUTOCAST_BY_DEVICE TE_TORCH_VERSION_AT_LEAST(2, 4)

/// c10::Allocator::allocate is non-const, and copy_data a pure virtual member, from 2.3 on.
#define TE_ALLOCATOR_MUTABLE TE_TORCH_VERSION_AT_LEAST(2, 3)
#if TE_ALLOCATOR_MUTABLE
#define TE_ALLOCATE_CONST
#else
#define TE_ALLOCATE_CONST const
#endif

namespace te::compat {

/// The key torch::optim keeps a parameter's state under (`Key`: the state map's key_type): the
/// address of its TensorImpl, printed to a string in LibTorch 1.13 (c10::guts::to_string), the
/// pointer itself in 2.x.
template <typename Key>
Key optimizer_state_key(void* tensor_impl) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream os;
    os << tensor_impl;
    return os.str();
  } else {
    return tensor_impl;
  }
}

/// The name of a backend number at::_fused_sdp_choice returns (sdp::SDPBackend).
inline const char* sdp_backend_name(int64_t choice) {
  switch (choice) {
    case 0:
      return "math";
    case 1:
      return "flash_attention";
    case 2:
      return "efficient_attention";
    case 3:
      return "cudnn_attention";
    case 4:
      return "overrideable";
    default:
      return "error";
  }
}

}  // namespace te::compat
