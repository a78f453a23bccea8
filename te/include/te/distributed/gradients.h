#pragma once

// Bucketed gradient reduction for data parallelism: instead of one all-reduce per parameter as
// backward reaches it, parameters' partial gradients are summed in a few large all-reduces.

#include <cstdint>
#include <memory>

namespace te {

/// While alive on this thread, the all-reduces that make replicated parameters' gradients whole
/// (data parallel: a parameter used on batch-sharded inputs) are deferred; finish() runs them as
/// all-reduces of flat buckets of up to `bucket_bytes` per mesh row and adds the sums to each
/// parameter's .grad(). Only the deferred contributions are summed: a gradient a parameter gets
/// otherwise (a tied use, earlier micro-batches) is left as it is. The deferred part reaches
/// .grad() only in finish(), so it is for loss.backward(): torch::autograd::grad and parameter
/// hooks do not see it. After finish() the gradients of a further backward are reduced at once.
/// Other gradient collectives (FSDP reduce-scatters, tensor-parallel all-reduces of activations)
/// run as usual.
///
/// Example:
///   {
///     te::GradientBuckets buckets;
///     loss.backward();
///     buckets.finish();   // now every .grad() is whole
///   }
class GradientBuckets {
 public:
  explicit GradientBuckets(int64_t bucket_bytes = 25 * 1024 * 1024);
  /// Finishes if finish() was not called (swallowing errors: call finish() to see them).
  ~GradientBuckets();
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;

  /// Runs the deferred all-reduces. Every rank must call it after the same backward.
  void finish();
  /// How many parameter gradients are waiting.
  int64_t pending() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace te
