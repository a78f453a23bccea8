#pragma once

// CPU autocast to a low-precision dtype for one scope, off again however the scope ends: what
// te-encoder --dtype bf16 runs under, for the tests (its switch moved in LibTorch 2.4:
// te/compat.h).

#include <ATen/autocast_mode.h>

#include "te/compat.h"

namespace te::test {

class CpuAutocast {
 public:
  explicit CpuAutocast(bool on, at::ScalarType dtype = at::kBFloat16) { set(on, dtype); }
  ~CpuAutocast() {
    set(false, at::kBFloat16);
    at::autocast::clear_cache();
  }
  CpuAutocast(const CpuAutocast&) = delete;
  CpuAutocast& operator=(const CpuAutocast&) = delete;

 private:
  static void set(bool on, at::ScalarType dtype) {
#if TE_AUTOCAST_BY_DEVICE
    at::autocast::set_autocast_dtype(at::kCPU, dtype);
    at::autocast::set_autocast_enabled(at::kCPU, on);
#else
    at::autocast::set_autocast_cpu_dtype(dtype);
    at::autocast::set_cpu_enabled(on);
#endif
  }
};

}  // namespace te::test
