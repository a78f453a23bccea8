// The Gloo backend: CPU tensors through c10d::ProcessGroupGloo (CUDA tensors staged through host
// memory). Gloo in LibTorch 1.13 has no reduce-scatter and a slow all-gather, so both run on the
// primitive CollectiveAlgorithms names (bench/bench_collectives measured the defaults).

#include "te/distributed/backend.h"
#include "te/error.h"

#ifdef TE_WITH_GLOO

#include <ATen/ATen.h>

#include <cstdint>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

namespace te::comm {

namespace {

c10d::ReduceOp gloo_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:  // summed, then divided: Gloo has no AVG
      return c10d::ReduceOp::SUM;
    case ReduceOp::kMax:
      return c10d::ReduceOp::MAX;
    case ReduceOp::kMin:
      return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

// A CPU tensor to hand Gloo: `t` itself on the CPU, else a host copy written back by `finish`.
struct Host {
  explicit Host(at::Tensor& t) : original(t), cpu(t.is_cpu() ? t : t.cpu()) {}
  void finish() {
    if (!original.is_cpu()) original.copy_(cpu);
  }
  at::Tensor& original;
  at::Tensor cpu;
};

at::Tensor host_of(const at::Tensor& t) { return t.is_cpu() ? t : t.cpu(); }

class GlooBackend final : public Backend {
 public:
  GlooBackend(c10::intrusive_ptr<c10d::ProcessGroupGloo> pg, const BackendSetup& setup)
      : pg_(std::move(pg)), rank_(setup.rank), size_(setup.size), algorithms_(setup.algorithms) {}

  bool moves(const c10::Device& device) const override {
    return device.is_cpu() || device.is_cuda();
  }

  // Gloo reduces no bools: 0/1 in uint8 reduce the same way under sum, max and min. LibTorch
  // 1.13's Gloo has no bfloat16 at all, and would sum fp16 in fp16 at every hop: both are reduced
  // in fp32 (exact for them) and rounded back once, so every rank gets the bits one process's
  // fp32 sum rounds to.
  at::ScalarType reduce_dtype(at::ScalarType dtype) const override {
    switch (dtype) {
      case at::kBool:
        return at::kByte;
      case at::kBFloat16:
      case at::kHalf:
        return at::kFloat;
      default:
        return dtype;
    }
  }

  const char* all_reduce(at::Tensor& t, ReduceOp op) override {
    Host h(t);
    reduce_in_place(h.cpu, op);
    h.finish();
    return "allreduce";
  }

  const char* all_gather(const at::Tensor& in_any, at::Tensor& out) override {
    const at::Tensor in = host_of(in_any);
    Host h(out);
    const int64_t n = in.numel();
    const char* primitive = "";
    switch (algorithms_.gather) {
      case GatherAlgorithm::kPaddedAllReduce: {
        // Zeros everywhere but this rank's piece; the sum is the concatenation (x + 0 == x,
        // exactly, for integers of any bits). Summed as the widest integer that tiles the
        // bytes: Gloo sums uint8 about 2x slower than int64 (bench_collectives).
        h.cpu.zero_();
        h.cpu.narrow(0, rank_ * n, n).copy_(in);
        at::Tensor words = h.cpu;
        for (at::ScalarType wide : {at::kLong, at::kInt}) {
          const int64_t size = static_cast<int64_t>(c10::elementSize(wide));
          if (h.cpu.scalar_type() == at::kByte && h.cpu.numel() % size == 0 &&
              reinterpret_cast<std::uintptr_t>(h.cpu.data_ptr()) % size == 0) {
            words = h.cpu.view(wide);
            break;
          }
        }
        reduce_in_place(words, ReduceOp::kSum);
        primitive = "allreduce";
        break;
      }
      case GatherAlgorithm::kAllGather: {
        std::vector<at::Tensor> inputs{in};
        std::vector<std::vector<at::Tensor>> outputs(1);
        for (int64_t s = 0; s < size_; ++s) outputs[0].push_back(h.cpu.narrow(0, s * n, n));
        pg_->allgather(outputs, inputs)->wait();
        primitive = "allgather";
        break;
      }
      case GatherAlgorithm::kAllToAll: {
        at::Tensor input = in.repeat({size_});
        exchange(input, h.cpu, std::vector<int64_t>(size_, n), std::vector<int64_t>(size_, n));
        primitive = "alltoall_base";
        break;
      }
    }
    h.finish();
    return primitive;
  }

  const char* reduce_scatter(const at::Tensor& in_any, at::Tensor& out, ReduceOp op) override {
    const at::Tensor in = host_of(in_any);
    Host h(out);
    const int64_t n = h.cpu.numel();
    const char* primitive = "";
    switch (algorithms_.reduce_scatter) {
      case ReduceScatterAlgorithm::kAllReduceSlice: {
        at::Tensor whole = in.clone();
        reduce_in_place(whole, op);
        h.cpu.copy_(whole.narrow(0, rank_ * n, n));
        primitive = "allreduce";
        break;
      }
      case ReduceScatterAlgorithm::kAllToAllSum: {
        // Piece s goes to row rank s; what arrives is everyone's copy of this rank's piece.
        at::Tensor received = at::empty_like(in);
        exchange(in, received, std::vector<int64_t>(size_, n), std::vector<int64_t>(size_, n));
        at::sum_out(h.cpu, received.view({size_, n}), {0}, false, h.cpu.scalar_type());
        if (op == ReduceOp::kAvg) h.cpu.div_(static_cast<double>(size_));
        primitive = "alltoall_base";
        break;
      }
    }
    h.finish();
    return primitive;
  }

  const char* all_to_all(const at::Tensor& in_any, at::Tensor& out,
                         const std::vector<int64_t>& in_sizes,
                         const std::vector<int64_t>& out_sizes) override {
    const at::Tensor in = host_of(in_any);
    Host h(out);
    exchange(in, h.cpu, in_sizes, out_sizes);
    h.finish();
    return "alltoall_base";
  }

  // Both posted before either is waited on: a ring's ranks all send and receive at once.
  const char* send_recv(const at::Tensor& send_any, int to, at::Tensor& recv, int from,
                        int /*size*/) override {
    std::vector<at::Tensor> out{host_of(send_any).contiguous()};
    Host h(recv);
    std::vector<at::Tensor> in{h.cpu};
    auto sent = pg_->send(out, to, kPointToPointTag);
    auto received = pg_->recv(in, from, kPointToPointTag);
    sent->wait();
    received->wait();
    h.finish();
    return "send/recv";
  }

  void barrier() override { pg_->barrier()->wait(); }

 private:
  static constexpr int kPointToPointTag = 0;

  void reduce_in_place(at::Tensor& t, ReduceOp op) {
    std::vector<at::Tensor> tensors{t};
    c10d::AllreduceOptions options;
    options.reduceOp = gloo_op(op);
    pg_->allreduce(tensors, options)->wait();
    if (op == ReduceOp::kAvg) t.div_(static_cast<double>(size_));
  }

  void exchange(const at::Tensor& in, at::Tensor& out, std::vector<int64_t> in_sizes,
                std::vector<int64_t> out_sizes) {
    at::Tensor input = in;
    pg_->alltoall_base(out, input, out_sizes, in_sizes)->wait();
  }

  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  int64_t rank_;
  int64_t size_;
  CollectiveAlgorithms algorithms_;
};

}  // namespace

std::unique_ptr<Backend> make_gloo_backend(const BackendSetup& setup) {
  auto options = c10d::ProcessGroupGloo::Options::create(setup.timeout);
  options->devices.push_back(
      setup.gloo_host.empty() ? c10d::ProcessGroupGloo::createDefaultDevice()
                              : c10d::ProcessGroupGloo::createDeviceForHostname(setup.gloo_host));
  // Collectives are issued synchronously by one thread per rank: one worker is enough.
  options->threads = 1;
  auto pg =
      c10::make_intrusive<c10d::ProcessGroupGloo>(setup.store, setup.rank, setup.size, options);
  // Connecting is done for this rank when its own pairs are up, not its peers'. Without this
  // barrier a rank that returns at once and drops the group (a test with no collective) can
  // close a pair another rank is still handshaking on ("Connection closed by peer").
  pg->barrier()->wait();
  return std::make_unique<GlooBackend>(std::move(pg), setup);
}

bool gloo_built() { return true; }

}  // namespace te::comm

#else  // no Gloo in this LibTorch

namespace te::comm {

std::unique_ptr<Backend> make_gloo_backend(const BackendSetup& setup) {
  TE_FAIL("rank ", setup.ranks.at(static_cast<std::size_t>(setup.rank)),
          " needs a Gloo communicator (CPU tensors), but this te-cpp was built without Gloo (its "
          "LibTorch has no c10d Gloo, or Gloo's headers were missing); keep tensors on the GPU "
          "(NCCL), or build against a LibTorch with Gloo");
}

bool gloo_built() { return false; }

}  // namespace te::comm

#endif
