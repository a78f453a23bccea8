#pragma once

// The scopes a thread has open that backward reads: the gradient buckets of data parallelism
// (GradientBuckets) and the live CommTrace recorders. Autograd runs the backward of CPU tensors
// on the thread that calls backward(), but that of CUDA tensors on threads of its own (one per
// device), which have none of the caller's thread-local scopes. So every te autograd node keeps
// the scopes of the thread that built it (ScopeCapture::current() at forward) and lends them to
// the thread that runs its backward (ScopeLoan): gradients are bucketed and collectives traced
// exactly as when backward runs on the caller's thread.
//
// A user's own autograd function whose backward runs te collectives does the same:
//
//   struct MyFn : torch::autograd::Function<MyFn> {
//     static at::Tensor forward(AutogradContext* ctx, ...) {
//       ctx->saved_data["scopes"] = te::ScopeCapture::current().to_ivalue(); ...
//     }
//     static variable_list backward(AutogradContext* ctx, variable_list g) {
//       te::ScopeLoan loan(te::ScopeCapture::from_ivalue(ctx->saved_data["scopes"])); ...
//     }
//   };

#include <ATen/core/ivalue.h>

#include <memory>

namespace te {

namespace detail {
struct ThreadScopes;
}

/// The scopes in effect on the calling thread: its own, or those lent to it.
class ScopeCapture {
 public:
  static ScopeCapture current();
  /// For an autograd context's saved_data (a capsule), and back.
  c10::IValue to_ivalue() const;
  static ScopeCapture from_ivalue(const c10::IValue& value);

 private:
  friend class ScopeLoan;
  std::shared_ptr<detail::ThreadScopes> scopes_;
};

/// Lends captured scopes to the calling thread for the guard's lifetime: what it records
/// (CommTrace) and defers (GradientBuckets) goes to them. Nests; restores what was in effect.
class ScopeLoan {
 public:
  explicit ScopeLoan(const ScopeCapture& scopes);
  ~ScopeLoan();
  ScopeLoan(const ScopeLoan&) = delete;
  ScopeLoan& operator=(const ScopeLoan&) = delete;
};

}  // namespace te
