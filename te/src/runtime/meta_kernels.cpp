// Meta kernels for the ATen operators te-cpp's modules call that a LibTorch lacks (see
// te/runtime/meta.h). Each computes its outputs' shapes and dtypes as the CPU kernel does; none
// reads data. Registered only where running the operator on meta tensors fails.

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <functional>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "te/runtime/meta.h"

namespace te {

namespace {

at::Tensor meta_like(at::IntArrayRef sizes, const at::TensorOptions& options) {
  return at::empty(sizes, options.device(at::kMeta));
}

// [leading dims..., 1 per normalized dim]. Only the count of normalized dims is read, so int[]
// (1.13) and SymInt[] (2.x) arguments read alike.
std::vector<int64_t> stat_shape(const at::Tensor& input, std::size_t normalized_dims) {
  const int64_t axis = input.dim() - static_cast<int64_t>(normalized_dims);
  std::vector<int64_t> shape(input.sizes().begin(), input.sizes().begin() + axis);
  shape.resize(static_cast<std::size_t>(input.dim()), 1);
  return shape;
}

// Statistics of a reduced-precision input are kept in fp32 (LibTorch's opmath type).
at::ScalarType stat_dtype(const at::Tensor& input) {
  const at::ScalarType t = input.scalar_type();
  return t == at::kHalf || t == at::kBFloat16 ? at::kFloat : t;
}

// Kernels are boxed (they read their arguments off the stack), so one kernel fits the
// operator's schema in every LibTorch (1.13's int[] is 2.x's SymInt[]).
using Stack = torch::jit::Stack;

// Pops the operator's arguments; returns them in order.
std::vector<c10::IValue> arguments(const c10::OperatorHandle& op, Stack* stack) {
  const std::size_t n = op.schema().arguments().size();
  std::vector<c10::IValue> args(stack->end() - static_cast<std::ptrdiff_t>(n), stack->end());
  torch::jit::drop(*stack, n);
  return args;
}

at::Tensor optional_tensor(const c10::IValue& v) {
  return v.isNone() ? at::Tensor() : v.toTensor();
}

void layer_norm(const c10::OperatorHandle& op, Stack* stack) {
  const auto args = arguments(op, stack);
  const at::Tensor input = args[0].toTensor();
  const auto stats = stat_shape(input, args[1].toList().size());
  torch::jit::push(*stack, meta_like(input.sizes(), input.options()),
                   meta_like(stats, input.options().dtype(stat_dtype(input))),
                   meta_like(stats, input.options().dtype(stat_dtype(input))));
}

void layer_norm_backward(const c10::OperatorHandle& op, Stack* stack) {
  const auto args = arguments(op, stack);
  const at::Tensor input = args[1].toTensor();
  const at::Tensor weight = optional_tensor(args[5]);
  const at::Tensor bias = optional_tensor(args[6]);
  const auto mask = args[7].toBoolList();
  at::Tensor grad_input, grad_weight, grad_bias;
  if (mask.get(0)) grad_input = meta_like(input.sizes(), input.options());
  if (mask.get(1) && weight.defined()) grad_weight = meta_like(weight.sizes(), weight.options());
  if (mask.get(2) && bias.defined()) grad_bias = meta_like(bias.sizes(), bias.options());
  torch::jit::push(*stack, grad_input, grad_weight, grad_bias);
}

void dropout(const c10::OperatorHandle& op, Stack* stack) {
  const at::Tensor input = arguments(op, stack)[0].toTensor();
  torch::jit::push(*stack, meta_like(input.sizes(), input.options()),
                   meta_like(input.sizes(), input.options().dtype(at::kBool)));
}

// The first argument's shape and dtype (relu, roll, dropout's backward).
void same(const c10::OperatorHandle& op, Stack* stack) {
  const at::Tensor self = arguments(op, stack)[0].toTensor();
  torch::jit::push(*stack, meta_like(self.sizes(), self.options()));
}

void where(const c10::OperatorHandle& op, Stack* stack) {
  const auto args = arguments(op, stack);
  const at::Tensor condition = args[0].toTensor(), self = args[1].toTensor(),
                   other = args[2].toTensor();
  const auto shape = at::infer_size(at::infer_size(condition.sizes(), self.sizes()), other.sizes());
  torch::jit::push(*stack, meta_like(shape, self.options().dtype(at::result_type(self, other))));
}

void abs(const c10::OperatorHandle& op, Stack* stack) {
  // Of a complex tensor, its real dtype (LibTorch's abs); otherwise the same dtype.
  const at::Tensor self = arguments(op, stack)[0].toTensor();
  torch::jit::push(
      *stack,
      meta_like(self.sizes(), self.options().dtype(c10::toRealValueType(self.scalar_type()))));
}

// A reduction of every element (max(), min()): a 0-dim tensor of the same dtype.
void reduce_all(const c10::OperatorHandle& op, Stack* stack) {
  const at::Tensor self = arguments(op, stack)[0].toTensor();
  torch::jit::push(*stack, meta_like({}, self.options()));
}

void index_select(const c10::OperatorHandle& op, Stack* stack) {
  const auto args = arguments(op, stack);
  const at::Tensor self = args[0].toTensor(), index = args[2].toTensor();
  std::vector<int64_t> shape(self.sizes().begin(), self.sizes().end());
  if (!shape.empty()) {
    shape[static_cast<std::size_t>(at::maybe_wrap_dim(args[1].toInt(), self.dim()))] =
        index.numel();
  }
  torch::jit::push(*stack, meta_like(shape, self.options()));
}

// An int argument's value (1.13's int is 2.x's SymInt; a plan's are concrete).
int64_t int_arg(const c10::IValue& v) { return v.isInt() ? v.toInt() : v.toSymInt().expect_int(); }

// embedding_dense_backward(grad_output, indices, num_weights, ...): the table's gradient,
// [num_weights, embedding dim] in grad_output's dtype.
void embedding_dense_backward(const c10::OperatorHandle& op, Stack* stack) {
  const auto args = arguments(op, stack);
  const at::Tensor grad = args[0].toTensor();
  torch::jit::push(*stack, meta_like({int_arg(args[2]), grad.size(-1)}, grad.options()));
}

at::Tensor m(std::vector<int64_t> sizes, at::ScalarType dtype = at::kFloat) {
  return at::empty(sizes, at::TensorOptions().device(at::kMeta).dtype(dtype));
}

// Whether `call` runs on meta tensors in this LibTorch.
bool runs(const std::function<void()>& call) {
  try {
    call();
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

template <void (*Kernel)(const c10::OperatorHandle&, Stack*)>
torch::CppFunction boxed() {
  return torch::CppFunction::makeFromBoxedFunction<Kernel>();
}

void register_missing() {
  // One library fragment for the lifetime of the process (LibTorch keeps a pointer to it); held
  // by a static, so leak checkers see it reachable.
  static torch::Library* const lib =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__, __LINE__);
  const at::Tensor x = m({2, 3, 4});
  const at::Tensor w = m({4});
  if (!runs([&] { at::native_layer_norm(x, {4}, w, w, 1e-5); })) {
    lib->impl("native_layer_norm", boxed<&layer_norm>());
  }
  if (!runs([&] {
        at::native_layer_norm_backward(x, x, {4}, m({2, 3, 1}), m({2, 3, 1}), w, w,
                                       {true, true, true});
      })) {
    lib->impl("native_layer_norm_backward", boxed<&layer_norm_backward>());
  }
  if (!runs([&] { at::native_dropout(x, 0.5, true); })) {
    lib->impl("native_dropout", boxed<&dropout>());
  }
  if (!runs([&] { at::native_dropout_backward(x, m({2, 3, 4}, at::kBool), 2.0); })) {
    lib->impl("native_dropout_backward", boxed<&same>());
  }
  if (!runs([&] { at::where(m({2, 3, 4}, at::kBool), x, x); })) {
    lib->impl("where.self", boxed<&where>());
  }
  if (!runs([&] { at::abs(x); })) lib->impl("abs", boxed<&abs>());
  if (!runs([&] { at::relu(x); })) lib->impl("relu", boxed<&same>());
  if (!runs([&] { at::roll(x, {1}, {0}); })) lib->impl("roll", boxed<&same>());
  if (!runs([&] { x.max(); })) lib->impl("max", boxed<&reduce_all>());
  if (!runs([&] { x.min(); })) lib->impl("min", boxed<&reduce_all>());
  if (!runs([&] { x.index_select(0, m({1}, at::kLong)); })) {
    lib->impl("index_select", boxed<&index_select>());
  }
  if (!runs([&] { at::embedding_dense_backward(x, m({2, 3}, at::kLong), 5, -1, false); })) {
    lib->impl("embedding_dense_backward", boxed<&embedding_dense_backward>());
  }
}

}  // namespace

void ensure_meta_kernels() {
  static std::once_flag once;
  std::call_once(once, register_missing);
}

}  // namespace te
