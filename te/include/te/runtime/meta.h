#pragma once

// Running a model on shapes alone: meta tensors (LibTorch's device of tensors with a shape and a
// dtype but no data) and counting the bytes a computation allocates. te::nn::plan runs a model's
// training step this way to size it on any mesh from one process; the same counter measures a
// real step, so the two can be compared.

#include <c10/core/DeviceType.h>

#include <cstdint>
#include <memory>

namespace te {

/// Makes the ATen operators te-cpp's modules call runnable on meta tensors: LibTorch 1.13 has no
/// meta kernel for some of them (native_layer_norm and its backward, where, abs, max,
/// index_select, embedding_dense_backward, ...), and each one it lacks gets one here, computing
/// output shapes and dtypes as the CPU kernel does. An operator that already runs on meta is left
/// alone (LibTorch 2.x has most). Idempotent and thread-safe; te::nn::plan calls it.
void ensure_meta_kernels();

/// Counts the bytes this thread allocates on one device type (CPU or meta) while alive: the
/// bytes live now (allocated through the counter and not yet freed) and the peak of that since
/// construction or reset_peak(). Storage freed later, on any thread, is subtracted from the
/// counter that allocated it. Counters on one thread nest: each sees every allocation made
/// during its life. Installs a counting wrapper around the device type's allocator on first use
/// (kept for the life of the process, passing every call through to the allocator it wraps).
class AllocationCounter {
 public:
  explicit AllocationCounter(c10::DeviceType device_type = c10::DeviceType::CPU);
  ~AllocationCounter();
  AllocationCounter(const AllocationCounter&) = delete;
  AllocationCounter& operator=(const AllocationCounter&) = delete;

  /// Bytes allocated through this counter and still live.
  int64_t live_bytes() const;
  /// The most bytes live at once since construction or the last reset_peak().
  int64_t peak_bytes() const;
  /// Restarts the peak from the bytes live now.
  void reset_peak();

  struct State;

 private:
  std::shared_ptr<State> state_;
  c10::DeviceType device_type_;
};

}  // namespace te
