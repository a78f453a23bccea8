// The communicator of a simulated world (backend.h, make_simulated_backend): no transport, so a
// mesh of any size can be made in one process and every collective still runs through
// collectives.cpp (placements, uneven pieces, CommTrace) to size a model (te::nn::plan).

#include <ATen/ATen.h>

#include "te/distributed/backend.h"

namespace te::comm {

namespace {

class SimulatedBackend final : public Backend {
 public:
  explicit SimulatedBackend(const BackendSetup& setup) : rank_(setup.rank), size_(setup.size) {}

  bool moves(const c10::Device&) const override { return true; }
  at::ScalarType reduce_dtype(at::ScalarType dtype) const override { return dtype; }

  const char* all_reduce(at::Tensor& t, ReduceOp op) override {
    if (op == ReduceOp::kSum) t.mul_(size_);
    return kName;
  }
  const char* all_gather(const at::Tensor& in, at::Tensor& out) override {
    out.view({size_, in.numel()}).copy_(in.reshape({1, -1}));
    return kName;
  }
  const char* reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) override {
    out.copy_(in.view({size_, out.numel()})[rank_]);
    if (op == ReduceOp::kSum) out.mul_(size_);
    return kName;
  }
  const char* all_to_all(const at::Tensor& in, at::Tensor& out, const std::vector<int64_t>& in_sizes,
                         const std::vector<int64_t>& out_sizes) override {
    // Row rank s sends this rank its piece for this rank: a copy of this rank's own, where the
    // sizes agree (uneven pieces differ between ranks; their bytes are left zero).
    int64_t in_offset = 0;
    for (int s = 0; s < rank_; ++s) in_offset += in_sizes[static_cast<std::size_t>(s)];
    const int64_t mine = in_sizes[static_cast<std::size_t>(rank_)];
    int64_t out_offset = 0;
    for (int s = 0; s < size_; ++s) {
      const int64_t n = out_sizes[static_cast<std::size_t>(s)];
      at::Tensor piece = out.narrow(0, out_offset, n);
      if (n == mine) {
        piece.copy_(in.narrow(0, in_offset, n));
      } else {
        piece.zero_();
      }
      out_offset += n;
    }
    return kName;
  }
  // Row rank `from` sends what this rank sends: a copy, where the sizes agree.
  const char* send_recv(const at::Tensor& send, int /*to*/, at::Tensor& recv, int /*from*/,
                        int /*size*/) override {
    if (send.numel() == recv.numel()) {
      recv.copy_(send.view_as(recv));
    } else {
      recv.zero_();
    }
    return kName;
  }
  void barrier() override {}

 private:
  static constexpr const char* kName = "simulated";
  int rank_;
  int size_;
};

}  // namespace

std::unique_ptr<Backend> make_simulated_backend(const BackendSetup& setup) {
  return std::make_unique<SimulatedBackend>(setup);
}

}  // namespace te::comm
