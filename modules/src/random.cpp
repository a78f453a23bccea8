#include "te/nn/random.h"

#include <ATen/ATen.h>
#include "te/runtime/parallel.h"

#include <torch/csrc/autograd/custom_function.h>

#include "te/error.h"
#include "te/kernels/philox.h"

#ifdef TE_TORCH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace te::nn {

namespace {

RngState& stream() {
  thread_local RngState state;
  return state;
}

}  // namespace

RngState rng_state() { return stream(); }
void set_rng_state(const RngState& state) { stream() = state; }

}  // namespace te::nn

namespace te::nn::functional {

namespace {

#ifdef TE_TORCH_CUDA
// One dropout call on a CUDA piece: the multipliers are recomputed from (seed, call, box) by the
// kernel in forward and again for the gradient, so no mask is drawn on the host or stored.
struct DeviceDropoutCall : torch::CustomClassHolder {
  std::vector<int64_t> global, offsets, lengths;
  uint64_t seed = 0, call = 0;
  uint32_t threshold = 0;
  float scale = 1.0f;

  at::Tensor apply(const at::Tensor& x_in) const {
    const at::Tensor x = x_in.contiguous();
    at::Tensor out = at::empty_like(x);
    // The CPU path multiplies by its mask converted to x's dtype: the kept value is
    // x * (scale rounded to that dtype), so the kernel takes the same rounded scale.
    const int code = kernel_code(x.scalar_type());
    const float s = code == 1   ? static_cast<float>(c10::Half(scale))
                    : code == 2 ? static_cast<float>(c10::BFloat16(scale))
                                : scale;
    const kernels::GlobalBox box{global.data(), offsets.data(), lengths.data(),
                                 static_cast<int>(lengths.size())};
    const c10::cuda::CUDAGuard guard(x.device());
    kernels::cuda::dropout_apply(box, seed, call, threshold, s, x.data_ptr(), out.data_ptr(), code,
                                 c10::cuda::getCurrentCUDAStream().stream());
    return out;
  }

  // The kernel's dtype code, or -1 for a dtype it does not take.
  static int kernel_code(at::ScalarType t) {
    return t == at::kFloat ? 0 : t == at::kHalf ? 1 : t == at::kBFloat16 ? 2 : -1;
  }
};

class DeviceDropout : public torch::autograd::Function<DeviceDropout> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            c10::intrusive_ptr<DeviceDropoutCall> call) {
    ctx->saved_data["call"] = c10::IValue::make_capsule(call);
    return call->apply(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto call =
        c10::static_intrusive_pointer_cast<DeviceDropoutCall>(ctx->saved_data["call"].toCapsule());
    return {call->apply(grads[0]), at::Tensor()};
  }
};
#endif

}  // namespace

at::Tensor dropout(const at::Tensor& x, double p, bool training) {
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  return dropout(x, p, training, shape, std::vector<int64_t>(shape.size(), 0));
}

at::Tensor dropout(const at::Tensor& local, double p, bool training,
                   const std::vector<int64_t>& global_shape, const std::vector<int64_t>& offsets) {
  TE_CHECK(p >= 0 && p < 1, "dropout: probability ", p, " is not in [0, 1)");
  if (!training || p == 0) return local;
  const int64_t ndim = local.dim();
  TE_CHECK(static_cast<int64_t>(global_shape.size()) == ndim &&
               static_cast<int64_t>(offsets.size()) == ndim,
           "dropout: the piece ", local.sizes(), " needs a global shape and offsets of ", ndim,
           " dims, got ", global_shape.size(), " and ", offsets.size());
  std::vector<int64_t> lengths(local.sizes().begin(), local.sizes().end());
  for (int64_t d = 0; d < ndim; ++d) {
    TE_CHECK(offsets[d] >= 0 && offsets[d] + lengths[d] <= global_shape[d], "dropout: dim ", d,
             " of the piece (offset ", offsets[d], ", length ", lengths[d],
             ") lies outside the global size ", global_shape[d]);
  }
  RngState& s = stream();
  const uint64_t call = s.calls++;
  if (local.numel() == 0) return local;
  // A 0-dim tensor is one row of one element.
  const std::vector<int64_t> one = {1}, zero = {0};
  const bool scalar = ndim == 0;
  const kernels::GlobalBox box{
      scalar ? one.data() : global_shape.data(), scalar ? zero.data() : offsets.data(),
      scalar ? one.data() : lengths.data(), scalar ? 1 : static_cast<int>(ndim)};
  const uint32_t threshold = kernels::drop_threshold(p);
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  const uint64_t seed = s.seed;
#ifdef TE_TORCH_CUDA
  // Other dtypes (double) and more dims than the kernel takes draw the mask on the host.
  if (local.is_cuda() && DeviceDropoutCall::kernel_code(local.scalar_type()) >= 0 &&
      box.ndim <= kernels::cuda::kMaxDropoutDims) {
    auto c = c10::make_intrusive<DeviceDropoutCall>();
    c->global.assign(box.global_sizes, box.global_sizes + box.ndim);
    c->offsets.assign(box.offsets, box.offsets + box.ndim);
    c->lengths.assign(box.lengths, box.lengths + box.ndim);
    c->seed = seed;
    c->call = call;
    c->threshold = threshold;
    c->scale = scale;
    return DeviceDropout::apply(local, c);
  }
#endif
  // Shapes alone (te::nn::plan): the mask a real run would multiply by, without drawing it.
  if (local.is_meta()) return local * at::empty(local.sizes(), local.options());
  const int64_t row_len = scalar ? 1 : lengths.back();
  const int64_t rows = local.numel() / row_len;
  at::Tensor mask = at::empty(local.sizes(), local.options().dtype(at::kFloat).device(at::kCPU));
  float* out = mask.data_ptr<float>();
  // About 32K elements per task.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(row_len, 1));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    kernels::dropout_multipliers(box, begin, end, seed, call, threshold, scale,
                                 out + begin * row_len);
  });
  // Any other CUDA tensor (a te built without CUDA over a CUDA LibTorch, doubles, over 8 dims)
  // gets the mask copied over; the values are the same.
  if (local.scalar_type() != at::kFloat || !local.device().is_cpu()) {
    mask = mask.to(local.device(), local.scalar_type());
  }
  return local * mask;
}

at::Tensor dropout_rows(const at::Tensor& local, double p, bool training,
                        const std::vector<int64_t>& global_shape, const at::Tensor& row_ids,
                        int64_t col_offset) {
  TE_CHECK(p >= 0 && p < 1, "dropout_rows: probability ", p, " is not in [0, 1)");
  if (!training || p == 0) return local;
  TE_CHECK(local.dim() == 2 && global_shape.size() == 2, "dropout_rows: give rows [n, width] of a ",
           "[rows, columns] tensor; got ", local.sizes(), " of ",
           c10::ArrayRef<int64_t>(global_shape));
  TE_CHECK(
      row_ids.dim() == 1 && row_ids.size(0) == local.size(0) && row_ids.scalar_type() == at::kLong,
      "dropout_rows: row_ids must be int64 [", local.size(0), "], one per row; got ",
      row_ids.scalar_type(), " ", row_ids.sizes());
  const int64_t width = local.size(1);
  TE_CHECK(col_offset >= 0 && col_offset + width <= global_shape[1], "dropout_rows: columns ",
           col_offset, " .. ", col_offset + width - 1, " lie outside the global ", global_shape[1]);
  RngState& s = stream();
  const uint64_t call = s.calls++;
  if (local.numel() == 0) return local;
  if (local.is_meta()) return local * at::empty(local.sizes(), local.options());
  const at::Tensor ids = row_ids.cpu().contiguous();
  const int64_t* id = ids.data_ptr<int64_t>();
  const int64_t rows = local.size(0);
  for (int64_t r = 0; r < rows; ++r) {
    TE_CHECK(id[r] >= 0 && id[r] < global_shape[0], "dropout_rows: row id ", id[r],
             " lies outside the global ", global_shape[0], " rows");
  }
  const uint32_t threshold = kernels::drop_threshold(p);
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  const uint64_t seed = s.seed;
  at::Tensor mask = at::empty(local.sizes(), local.options().dtype(at::kFloat).device(at::kCPU));
  float* out = mask.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(width, 1));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    const int64_t lengths[2] = {1, width};
    for (int64_t r = begin; r < end; ++r) {
      const int64_t offsets[2] = {id[r], col_offset};
      const kernels::GlobalBox box{global_shape.data(), offsets, lengths, 2};
      kernels::dropout_multipliers(box, 0, 1, seed, call, threshold, scale, out + r * width);
    }
  });
  // A CUDA or non-float tensor gets the host's mask copied over: the same values.
  if (local.scalar_type() != at::kFloat || !local.device().is_cpu()) {
    mask = mask.to(local.device(), local.scalar_type());
  }
  return local * mask;
}

DTensor dropout(const DTensor& x, double p, bool training) {
  TE_CHECK(p >= 0 && p < 1, "dropout: probability ", p, " is not in [0, 1)");
  if (!training || p == 0) return x;
  const auto chunks = local_chunks(x.sizes(), x.mesh(), x.placements(), x.mesh().rank());
  std::vector<int64_t> offsets;
  offsets.reserve(chunks.size());
  for (const Chunk& c : chunks) offsets.push_back(c.offset);
  return DTensor::from_local(dropout(x.to_local(), p, true, x.sizes(), offsets), x.mesh(),
                             x.placements(), x.sizes());
}

namespace {

// The drop_path multipliers of the `rows` samples at `offset` of `batch`: [rows, 1, ..., 1].
at::Tensor sample_multipliers(const at::Tensor& x, double p, int64_t batch, int64_t offset) {
  std::vector<int64_t> local(static_cast<std::size_t>(x.dim()), 1), global = local,
                                                                    offsets(local.size(), 0);
  local[0] = x.size(0);
  global[0] = batch;
  offsets[0] = offset;
  return dropout(at::ones(local, x.options().requires_grad(false)), p, true, global, offsets);
}

void check_drop_path(int64_t dim, double p) {
  TE_CHECK(p >= 0 && p < 1, "drop_path: probability ", p, " is not in [0, 1)");
  TE_CHECK(dim >= 1, "drop_path: the input needs a batch dim (dim 0)");
}

}  // namespace

at::Tensor drop_path(const at::Tensor& x, double p, bool training) {
  check_drop_path(x.dim(), p);
  if (!training || p == 0) return x;
  return x * sample_multipliers(x, p, x.size(0), 0);
}

DTensor drop_path(const DTensor& x, double p, bool training) {
  check_drop_path(x.dim(), p);
  if (!training || p == 0) return x;
  // Linear in x, so a Partial x keeps its placement (each summand gets the same multipliers).
  const auto chunks = local_chunks(x.sizes(), x.mesh(), x.placements(), x.mesh().rank());
  const at::Tensor& local = x.to_local();
  return DTensor::from_local(local * sample_multipliers(local, p, x.size(0), chunks[0].offset),
                             x.mesh(), x.placements(), x.sizes());
}

}  // namespace te::nn::functional
